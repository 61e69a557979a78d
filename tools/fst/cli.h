/* cli.h - what the fst subcommands share: exit codes, sizes, output. */
#ifndef FST_CLI_H
#define FST_CLI_H

#include "fst.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes, documented in docs/cli.md. */
enum {
	EXIT_OK = 0,
	EXIT_USAGE = 1,       /* bad command line */
	EXIT_INVALID = 2,     /* an input breaks the safetensors / index rules */
	EXIT_MISMATCH = 3,    /* verify: loaded bytes differ from the file */
	EXIT_IO = 4,          /* a file could not be read or written */
	EXIT_NOMEM = 5,       /* out of host memory */
	EXIT_DEVICE = 6,      /* GPU error */
	EXIT_UNSUPPORTED = 7, /* the platform cannot do what was asked */
	EXIT_CHANGED = 8,     /* a file changed while being read */
	EXIT_CANCELED = 9,    /* interrupted */
};

/* Map a libfst status to the exit code above. */
int cli_exit_code(int status);

/* Parse "1GiB", "512MiB", "64K", "1.5G", "100MB", "4096": binary units unless
 * the unit ends in "B" without "i" (KB, MB, GB, TB: powers of 1000). */
bool cli_parse_size(const char *s, uint64_t *out);
/* Parse a non-negative integer that fits in max: decimal digits only (no
 * sign, no leading space, which strtoull would take and " -1" wrap). */
bool cli_parse_uint(const char *s, uint64_t max, uint64_t *out);
/* s for a terminal: each control character (C0 and DEL) as \xNN, so that a
 * name or metadata value from a file cannot move the cursor, clear the
 * screen or forge lines. Returns a copy to free, or NULL out of memory. */
char *cli_printable(const char *s);
/* "1.50 GiB" into buf. */
const char *cli_human_bytes(char *buf, size_t size, uint64_t bytes);
/* The progress bar's line ("\r[###   ] 1.00 GiB / 2.00 GiB  3.21 GB/s  0.3 s
 * left") for done of total bytes after secs seconds, into buf; padded with
 * spaces to *width, the widest line drawn before, which it updates, so a
 * shorter line leaves nothing of a longer one. Returns its length. */
size_t cli_progress_line(char *buf, size_t size, uint64_t done, uint64_t total, double secs,
			 size_t *width);
/* Seconds since an arbitrary point (monotonic). */
double cli_now(void);

/* Print "fst CMD: message" on stderr, and when FST_FAULT injected a failure
 * " (FST_FAULT injected a failure at site SITE, call N)". */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* How remote files are reached (docs/remote.md): inspect, load, verify,
 * bench and doctor take them. */
#define CLI_REMOTE_OPTIONS                                            \
	{"endpoint", required_argument, NULL, 1101},                  \
	{"region", required_argument, NULL, 1102},                    \
	{"profile", required_argument, NULL, 1103},                   \
	{"no-sign-request", no_argument, NULL, 1104}
#define CLI_REMOTE_OPTIONS_HELP                                                             \
	"  --endpoint URL  S3 endpoint, e.g. http://127.0.0.1:9000 (default AWS_ENDPOINT_URL_S3,\n" \
	"                  AWS_ENDPOINT_URL, else AWS; path-style addressing with an endpoint)\n" \
	"  --region NAME   S3 region (default AWS_REGION, AWS_DEFAULT_REGION, the profile's,\n"  \
	"                  else us-east-1)\n"                                                   \
	"  --profile NAME  the profile of ~/.aws/credentials and ~/.aws/config (default\n"      \
	"                  AWS_PROFILE, else default)\n"                                       \
	"  --no-sign-request  unsigned S3 requests (public buckets; also AWS_NO_SIGN_REQUEST=1)\n"
/* Apply one of CLI_REMOTE_OPTIONS; EXIT_OK, or -1 when c is not one. */
int cli_remote_option(int c, const char *arg);
/* fst_checkpoint_open_ex with the remote options given so far. */
int cli_open_checkpoint(const char *path, fst_checkpoint **out, fst_error *err);

/* Load options shared by load, verify and bench (long options only),
 * the remote ones among them. */
#define CLI_LOAD_OPTIONS                                              \
	CLI_REMOTE_OPTIONS,                                           \
	{"device", required_argument, NULL, 1001},                    \
	{"io", required_argument, NULL, 1002},                        \
	{"threads", required_argument, NULL, 1003},                   \
	{"chunk", required_argument, NULL, 1004},                     \
	{"staging", required_argument, NULL, 1005},                   \
	{"pinned", no_argument, NULL, 1006},                          \
	{"gds", required_argument, NULL, 1007},                       \
	{"unified", required_argument, NULL, 1008},                   \
	{"readahead", required_argument, NULL, 1009},                 \
	{"stream", required_argument, NULL, 1010}
#define CLI_LOAD_OPTIONS_HELP                                                          \
	"  --device DEV    cpu (default), cuda or cuda:N\n"                                \
	"  --io METHOD     auto (default), pread, uring or mmap (cpu only)\n"              \
	"  --threads N     reader threads (default: one per CPU, at most 16; cached\n"     \
	"                  files onto a GPU: at most 12; cold files read ahead: 16 at\n"   \
	"                  least; URLs: 16 connections)\n"                                \
	"  --chunk SIZE    bytes per read (default 16MiB; for URLs 8MiB per GET)\n"       \
	"  --staging SIZE  staging budget (default 128MiB cached, 256MiB O_DIRECT)\n"     \
	"  --pinned        cpu: page-lock the destination\n"                             \
	"  --gds POLICY    auto (default), on or off: GPUDirect Storage (docs/gds.md)\n"  \
	"  --unified POLICY auto (default), on or off: one copy into mapped host memory\n" \
	"                  on integrated/coherent GPUs (docs/platforms.md)\n"              \
	"  --readahead SIZE cold files read through the page cache: fetch this far\n"    \
	"                  ahead of the readers (default 1GiB), or off\n"                 \
	"  --stream SIZE   each thread reads SIZE in order before taking the next\n"     \
	"                  stretch: one stream per thread (default off: one queue)\n"    \
	CLI_REMOTE_OPTIONS_HELP

/* Apply one of CLI_LOAD_OPTIONS; returns EXIT_OK, EXIT_USAGE (message
 * printed) or -1 when c is not a load option. */
int cli_load_option(const char *cmd, int c, const char *arg, fst_load_opts *opts);
/* Apply FST_FAULT from the environment, failing loudly on a bad spec. */
int cli_check_fault_env(const char *cmd);
/* The start of every command (main.c): stdout through a stream that keeps
 * the errno of its first failed write, for cli_finish_output's message. */
void cli_init_output(void);
/* The end of every command (main.c): flush and close stdout, and turn a
 * write that failed (a full disk, a closed pipe with SIGPIPE ignored) into
 * EXIT_IO with the reason on stderr, so lost output is never success. An
 * earlier failure's code is kept. Nothing may write to stdout after it. */
int cli_finish_output(const char *cmd, int rc);
/*
 * JSON output that drops nothing. jansson's constructors return NULL for a
 * string that is not UTF-8 (or out of memory), and json_object_set_new and
 * json_array_append_new given NULL fail without a word: an entry would
 * vanish. Every step here reports failure instead, and cli_print_json
 * refuses a document that lost one (exit 5).
 */
bool cli_utf8_valid(const char *s);
/* s as a JSON string; bytes that are not UTF-8 become U+FFFD each. NULL
 * only out of memory. */
json_t *cli_json_text(const char *s);
/* Set or append value (stolen, NULL allowed); false when it did not go in. */
bool cli_json_put(json_t *obj, const char *key, json_t *value);
bool cli_json_push(json_t *arr, json_t *value);
/* obj[key] = the path as cli_json_text makes it, and when the path is not
 * UTF-8 also obj[key + "_bytes"] = its bytes in hex, so nothing is lost. */
bool cli_json_put_path(json_t *obj, const char *key, const char *path);
/* Print doc on stdout (indent 1, keys in order) unless it is NULL or
 * !complete (then exit 5, nothing printed); EXIT_OK, EXIT_NOMEM or EXIT_IO. */
int cli_print_json(const char *cmd, const json_t *doc, bool complete);

/* Write doc (json_dumpf flags) and a newline to the file path: into a
 * temporary file beside it, synced and renamed over it, so that a failed
 * write leaves the old file (or none), never a truncated one; a path that
 * is not a regular file (/dev/stdout, a FIFO) is written in place. Returns
 * 0 or the errno value of the failure. */
int cli_write_json_file(const char *path, const json_t *doc, size_t flags);
/* Peak resident set size of this process, bytes. */
uint64_t cli_peak_rss(void);

/* hash.c: XXH3-128 of a loaded tensor and its block tree (xxh3.h), as 32 hex
 * digits each (either may be NULL), SHA-256 of a file (64 hex digits;
 * returns 0 or an FST_E* code, err naming the file), a path's last component. */
int cli_tensor_digests(const fst_tensor_view *v, char plain[33], char tree[33], fst_error *err);
int cli_file_sha256(const fst_file *f, char hex[65], fst_error *err);
const char *cli_basename(const char *path);
/* Load with the streaming API, checking each tensor against a manifest as
 * it is handed out (its block tree, hashed as the bytes land, or its plain
 * XXH3-128 for manifests without trees); FST_EMISMATCH names the first
 * difference. */
int cli_load_checked(const fst_checkpoint *ck, const fst_load_opts *lo, const char *manifest,
		     fst_buffer **out, size_t *checked, fst_error *err);
/* What cli_load_checked checks before it loads: the XXH3 kernel, and that
 * manifest can be read and is one. */
int cli_check_manifest(const char *manifest, fst_error *err);

int cmd_inspect(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_load(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_doctor(int argc, char **argv);

#endif
