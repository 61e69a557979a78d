/* load.c - `fst load`: load a checkpoint, report what was done and how fast. */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

static void help(FILE *out)
{
	fprintf(out,
		"usage: fst load PATH [options]\n"
		"\n"
		"Loads every tensor of PATH (a .safetensors file, a directory or an index)\n"
		"and prints tensors, bytes, seconds, GB/s and the path chosen and why.\n"
		"\n" CLI_LOAD_OPTIONS_HELP
		"  --json          print the summary as one JSON object\n"
		"  --no-progress   no progress bar (it shows only on a terminal)\n"
		"  --check FILE    check every tensor's XXH3-128 against a manifest written by\n"
		"                  `fst verify --manifest`, while the load streams (exit 3 on a\n"
		"                  mismatch)\n"
		"  -h, --help      this help\n"
		"\n"
		"Exit: 0 loaded, 1 usage, 2 invalid input, 3 --check mismatch, 4 I/O error, 5 out of memory,\n"
		"6 GPU error, 7 unsupported, 8 a file changed during the load.\n");
}

struct bar {
	double t0;
	bool shown;
	size_t width; /* of the widest line drawn */
};

static void progress(void *ctx, uint64_t done, uint64_t total)
{
	struct bar *b = ctx;
	char line[256];
	cli_progress_line(line, sizeof line, done, total, cli_now() - b->t0, &b->width);
	fputs(line, stderr);
	b->shown = true;
}

struct load_args {
	fst_load_opts lo;
	bool as_json, show_progress;
	const char *manifest, *path;
};

/* The command line into a; *done when the command ends here (help, or a
 * usage error). */
static int parse_args(int argc, char **argv, struct load_args *a, bool *done)
{
	static const struct option opts[] = {
		CLI_LOAD_OPTIONS,
		{"json", no_argument, NULL, 'j'},
		{"no-progress", no_argument, NULL, 'P'},
		{"check", required_argument, NULL, 'C'},
		{"help", no_argument, NULL, 'h'},
		{0, 0, 0, 0},
	};
	fst_load_opts_init(&a->lo);
	a->as_json = false;
	a->show_progress = true;
	a->manifest = NULL;
	*done = true;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		int r = cli_load_option("load", c, optarg, &a->lo);
		if (r == EXIT_USAGE)
			return r;
		if (r == EXIT_OK)
			continue;
		switch (c) {
		case 'j': a->as_json = true; break;
		case 'P': a->show_progress = false; break;
		case 'C': a->manifest = optarg; break;
		case 'h': help(stdout); return EXIT_OK;
		default: help(stderr); return EXIT_USAGE;
		}
	}
	if (optind != argc - 1) {
		cli_error("load", optind >= argc ? "no PATH given" : "one PATH expected");
		help(stderr);
		return EXIT_USAGE;
	}
	a->path = argv[optind];
	*done = false;
	return EXIT_OK;
}

/* The summary of a load that took open_secs to open ck and secs in all. */
static int report(const struct load_args *a, const fst_checkpoint *ck, const fst_buffer *buf,
		  size_t checked, double open_secs, double secs)
{
	const char *device = a->lo.device ? a->lo.device : "cpu";
	uint64_t bytes = fst_buffer_tensor_bytes(buf);
	size_t tensors = fst_buffer_tensor_count(buf);
	double gbps = secs > 0 ? (double)bytes / secs / 1e9 : 0;
	if (!a->as_json) {
		char hb[32], rss[32];
		printf("loaded %s onto %s: %zu tensors from %zu file%s, %s in %.3f s (%.2f GB/s)\n",
		       fst_checkpoint_path(ck), device, tensors, fst_checkpoint_file_count(ck),
		       fst_checkpoint_file_count(ck) == 1 ? "" : "s",
		       cli_human_bytes(hb, sizeof hb, bytes), secs, gbps);
		printf("  path: %s\n", fst_buffer_describe(buf));
		printf("  header parsing %.3f s; peak RSS %s\n", open_secs,
		       cli_human_bytes(rss, sizeof rss, cli_peak_rss()));
		return EXIT_OK;
	}
	json_t *o = json_object();
	/* the checkpoint's name: a URL without its secrets */
	bool ok = cli_json_put_path(o, "path", fst_checkpoint_path(ck)) &&
		  cli_json_put(o, "device", cli_json_text(device)) &&
		  cli_json_put(o, "tensors", json_integer((json_int_t)tensors)) &&
		  cli_json_put(o, "bytes", json_integer((json_int_t)bytes)) &&
		  cli_json_put(o, "allocated", json_integer((json_int_t)fst_buffer_size(buf))) &&
		  cli_json_put(o, "files", json_integer((json_int_t)fst_checkpoint_file_count(ck))) &&
		  cli_json_put(o, "open_seconds", json_real(open_secs)) &&
		  cli_json_put(o, "seconds", json_real(secs)) &&
		  cli_json_put(o, "gbps", json_real(gbps)) &&
		  cli_json_put(o, "path_chosen", cli_json_text(fst_buffer_describe(buf))) &&
		  cli_json_put(o, "peak_rss", json_integer((json_int_t)cli_peak_rss()));
	if (a->manifest)
		ok = ok && cli_json_put(o, "checked_tensors", json_integer((json_int_t)checked));
	int rc = cli_print_json("load", o, ok);
	json_decref(o);
	return rc;
}

int cmd_load(int argc, char **argv)
{
	struct load_args a;
	bool done;
	int rc = parse_args(argc, argv, &a, &done);
	if (done)
		return rc;
	rc = cli_check_fault_env("load");
	if (rc)
		return rc;
	struct bar bar = {cli_now(), false, 0};
	if (a.show_progress && !a.as_json && isatty(2)) {
		a.lo.progress = progress;
		a.lo.progress_ctx = &bar;
	}

	double t0 = cli_now();
	fst_checkpoint *ck;
	fst_error err;
	if (cli_open_checkpoint(a.path, &ck, &err)) {
		cli_error("load", "%s", err.message);
		return cli_exit_code(err.code);
	}
	double t1 = cli_now();
	bar.t0 = t1;
	fst_buffer *buf;
	size_t checked = 0;
	if (a.manifest)
		rc = cli_load_checked(ck, &a.lo, a.manifest, &buf, &checked, &err);
	else
		rc = fst_load(ck, &a.lo, &buf, &err);
	double t2 = cli_now();
	if (bar.shown)
		fputc('\n', stderr);
	if (rc) {
		cli_error("load", "%s", err.message);
		fst_checkpoint_close(ck);
		return cli_exit_code(rc);
	}
	if (a.manifest && !a.as_json)
		printf("checked %zu tensors against %s: every digest equal\n", checked, a.manifest);
	rc = report(&a, ck, buf, checked, t1 - t0, t2 - t0);
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
	return rc;
}
