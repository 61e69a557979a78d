/* util.c - helpers shared by the subcommands. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int cli_exit_code(int status)
{
	switch (status) {
	case FST_OK: return EXIT_OK;
	case FST_EUSAGE: return EXIT_USAGE;
	case FST_EFORMAT: return EXIT_INVALID;
	case FST_EMISMATCH: return EXIT_MISMATCH;
	case FST_EIO: return EXIT_IO;
	case FST_ENOMEM: return EXIT_NOMEM;
	case FST_EDEVICE: return EXIT_DEVICE;
	case FST_EUNSUPPORTED: return EXIT_UNSUPPORTED;
	case FST_ECHANGED: return EXIT_CHANGED;
	case FST_ECANCELED: return EXIT_CANCELED;
	default: return EXIT_IO;
	}
}

bool cli_parse_uint(const char *s, uint64_t max, uint64_t *out)
{
	if (!s || !isdigit((unsigned char)*s))
		return false;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return false;
	*out = v;
	return true;
}

char *cli_printable(const char *s)
{
	size_t n = 0;
	for (const char *p = s; *p; p++)
		n += (unsigned char)*p < 0x20 || *p == 0x7f ? 4 : 1;
	char *out = malloc(n + 1), *o = out;
	if (!out)
		return NULL;
	for (const char *p = s; *p; p++) {
		unsigned char c = (unsigned char)*p;
		if (c < 0x20 || c == 0x7f)
			o += sprintf(o, "\\x%02x", c);
		else
			*o++ = (char)c;
	}
	*o = '\0';
	return out;
}

bool cli_parse_size(const char *s, uint64_t *out)
{
	if (!s)
		return false;
	/* digits, then a fraction of digits at most: strtod alone would take
	 * spaces, signs, exponents, hex, "inf" and "nan" */
	const char *p = s;
	while (isdigit((unsigned char)*p))
		p++;
	if (p == s)
		return false;
	if (*p == '.') {
		const char *frac = ++p;
		while (isdigit((unsigned char)*p))
			p++;
		if (p == frac)
			return false;
	}
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end != p || !(v >= 0))
		return false;
	static const struct {
		const char *unit;
		double mult;
	} units[] = {
		{"", 1},        {"B", 1},       {"K", 0x1p10},  {"KiB", 0x1p10}, {"KB", 1e3},
		{"M", 0x1p20},  {"MiB", 0x1p20}, {"MB", 1e6},   {"G", 0x1p30},  {"GiB", 0x1p30},
		{"GB", 1e9},    {"T", 0x1p40},  {"TiB", 0x1p40}, {"TB", 1e12},
	};
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
		if (strcasecmp(end, units[i].unit) || (strlen(end) > 1 && strcmp(end, units[i].unit)))
			continue;
		double bytes = v * units[i].mult;
		if (bytes >= 0x1p63 || bytes != floor(bytes))
			return false;
		*out = (uint64_t)bytes;
		return true;
	}
	return false;
}

const char *cli_human_bytes(char *buf, size_t size, uint64_t bytes)
{
	static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)bytes;
	int u = 0;
	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, size, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, size, "%.2f %s", v, units[u]);
	return buf;
}

size_t cli_progress_line(char *buf, size_t size, uint64_t done, uint64_t total, double secs,
			 size_t *width)
{
	const int bar = 30;
	double rate = secs > 0 ? (double)done / secs : 0;
	double left = rate > 0 && total > done ? (double)(total - done) / rate : 0;
	int fill = total ? (int)((double)(done < total ? done : total) / (double)total * bar) : bar;
	char d[32], t[32];
	int n = snprintf(buf, size, "\r[%.*s%*s] %s / %s  %.2f GB/s  %.1f s left", fill,
			 "##############################", bar - fill, "",
			 cli_human_bytes(d, sizeof d, done), cli_human_bytes(t, sizeof t, total),
			 rate / 1e9, left);
	size_t len = n < 0 ? 0 : (size_t)n < size ? (size_t)n : size - 1;
	/* The terminal still shows the longest line so far: spaces over its
	 * tail, or it would read "... 2.3 s left ft". */
	size_t visible = len ? len - 1 : 0;
	while (visible < *width && len + 1 < size) {
		buf[len++] = ' ';
		visible++;
	}
	buf[len] = '\0';
	if (visible > *width)
		*width = visible;
	return len;
}

double cli_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_error(const char *cmd, const char *fmt, ...)
{
	/* one line (cli.md): the control characters a tensor's or file's name
	 * may hold in the message shown as \xNN */
	char small[1200], *text = small;
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(small, sizeof small, fmt, ap);
	va_end(ap);
	if (len >= (int)sizeof small && (text = malloc((size_t)len + 1))) {
		va_start(ap, fmt);
		vsnprintf(text, (size_t)len + 1, fmt, ap);
		va_end(ap);
	}
	if (!text)
		text = small; /* cut short rather than not said */
	char *shown = cli_printable(text);
	fprintf(stderr, "fst %s: %s", cmd, shown ? shown : text);
	free(shown);
	if (text != small)
		free(text);
	/* A test's failure must not pass for a real one ("out of memory"
	 * with memory to spare): say that one was injected, and where. */
	char where[96];
	long n = fst_fault_last(where, sizeof where);
	if (n == 1)
		fprintf(stderr, " (FST_FAULT injected a failure at %s)", where);
	else if (n > 1)
		fprintf(stderr, " (FST_FAULT injected %ld failures, the last at %s)", n, where);
	fputc('\n', stderr);
}

static fst_open_opts open_opts;
static bool open_opts_set;

static fst_open_opts *remote_opts(void)
{
	if (!open_opts_set) {
		fst_open_opts_init(&open_opts);
		open_opts_set = true;
	}
	return &open_opts;
}

int cli_remote_option(int c, const char *arg)
{
	fst_open_opts *o = remote_opts();
	switch (c) {
	case 1101: o->endpoint = arg; return EXIT_OK;
	case 1102: o->region = arg; return EXIT_OK;
	case 1103: o->profile = arg; return EXIT_OK;
	case 1104: o->unsigned_requests = 1; return EXIT_OK;
	default: return -1;
	}
}

int cli_open_checkpoint(const char *path, fst_checkpoint **out, fst_error *err)
{
	return fst_checkpoint_open_ex(path, remote_opts(), out, err);
}

/* A size of at least 1 byte, or "off" (the option's off value). */
static int size_or_off(const char *cmd, const char *opt, const char *arg, uint64_t off,
		       uint64_t *out)
{
	uint64_t v;
	if (!strcmp(arg, "off")) {
		*out = off;
	} else if (!cli_parse_size(arg, &v) || !v) {
		cli_error(cmd, "%s \"%s\": expected a size of at least 1B, or off", opt, arg);
		return EXIT_USAGE;
	} else {
		*out = v;
	}
	return EXIT_OK;
}

int cli_load_option(const char *cmd, int c, const char *arg, fst_load_opts *o)
{
	uint64_t v;
	if (cli_remote_option(c, arg) == EXIT_OK)
		return EXIT_OK;
	switch (c) {
	case 1001:
		o->device = arg;
		return EXIT_OK;
	case 1002:
		if (!strcmp(arg, "auto")) o->io = FST_IO_AUTO;
		else if (!strcmp(arg, "pread")) o->io = FST_IO_PREAD;
		else if (!strcmp(arg, "uring")) o->io = FST_IO_URING;
		else if (!strcmp(arg, "mmap")) o->io = FST_IO_MMAP;
		else {
			cli_error(cmd, "--io \"%s\": expected auto, pread, uring or mmap", arg);
			return EXIT_USAGE;
		}
		return EXIT_OK;
	case 1003:
		if (!cli_parse_uint(arg, 64, &v) || !v) {
			cli_error(cmd, "--threads \"%s\": expected 1 to 64", arg);
			return EXIT_USAGE;
		}
		o->threads = (unsigned)v;
		return EXIT_OK;
	case 1004:
		if (!cli_parse_size(arg, &v) || v < 4096 || v > (1ull << 30)) {
			cli_error(cmd, "--chunk \"%s\": expected a size from 4KiB to 1GiB", arg);
			return EXIT_USAGE;
		}
		o->chunk_bytes = v;
		return EXIT_OK;
	case 1005:
		if (!cli_parse_size(arg, &v) || v < (1u << 20)) {
			cli_error(cmd, "--staging \"%s\": expected a size of at least 1MiB", arg);
			return EXIT_USAGE;
		}
		o->staging_bytes = v;
		return EXIT_OK;
	case 1006:
		o->pinned = 1;
		return EXIT_OK;
	case 1007:
		if (!strcmp(arg, "auto")) o->gds = FST_GDS_AUTO;
		else if (!strcmp(arg, "on")) o->gds = FST_GDS_ON;
		else if (!strcmp(arg, "off")) o->gds = FST_GDS_OFF;
		else {
			cli_error(cmd, "--gds \"%s\": expected auto, on or off", arg);
			return EXIT_USAGE;
		}
		return EXIT_OK;
	case 1008:
		if (!strcmp(arg, "auto")) o->unified = FST_UNIFIED_AUTO;
		else if (!strcmp(arg, "on")) o->unified = FST_UNIFIED_ON;
		else if (!strcmp(arg, "off")) o->unified = FST_UNIFIED_OFF;
		else {
			cli_error(cmd, "--unified \"%s\": expected auto, on or off", arg);
			return EXIT_USAGE;
		}
		return EXIT_OK;
	case 1009:
		return size_or_off(cmd, "--readahead", arg, FST_READAHEAD_OFF, &o->readahead_bytes);
	case 1010:
		return size_or_off(cmd, "--stream", arg, FST_STREAM_OFF, &o->stream_bytes);
	default:
		return -1;
	}
}

int cli_check_fault_env(const char *cmd)
{
	const char *spec = getenv("FST_FAULT");
	fst_error err;
	if (spec && *spec && fst_fault_set(spec, &err)) {
		cli_error(cmd, "%s", err.message);
		return EXIT_USAGE;
	}
	return EXIT_OK;
}

/* The errno of the first failed write to standard output. stdio does not
 * keep it: once a write fails, the flush at the end may find an empty
 * buffer and succeed, leaving only the error flag. */
static int out_errno;
static bool out_wrapped;

static ssize_t out_write(void *cookie, const char *buf, size_t n)
{
	(void)cookie;
	for (size_t done = 0; done < n;) {
		ssize_t w = write(STDOUT_FILENO, buf + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			if (!out_errno)
				out_errno = w < 0 ? errno : EIO;
			return -1;
		}
		done += (size_t)w;
	}
	return (ssize_t)n;
}

void cli_init_output(void)
{
	cookie_io_functions_t io = {.write = out_write};
	FILE *f = fopencookie(NULL, "w", io);
	if (!f)
		return; /* the plain stream: only the reason may be lost */
	/* the buffering stdio would give fd 1 */
	setvbuf(f, NULL, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, BUFSIZ);
	stdout = f;
	out_wrapped = true;
}

int cli_finish_output(const char *cmd, int rc)
{
	errno = 0;
	bool failed = fflush(stdout) != 0 || ferror(stdout);
	int e = out_errno ? out_errno : errno;
	errno = 0;
	if (fclose(stdout) != 0 && !failed) {
		failed = true;
		e = out_errno ? out_errno : errno;
	}
	/* close(2) can be the first to report a failure (NFS, or a disk that
	 * fills at write-back); EBADF: there was no stdout, and nothing was
	 * written to it, or the writes failed above. */
	if (out_wrapped && close(STDOUT_FILENO) != 0 && errno != EBADF && !failed) {
		failed = true;
		e = errno;
	}
	if (!failed)
		return rc;
	if (e)
		cli_error(cmd, "writing standard output: %s", strerror(e));
	else
		cli_error(cmd, "writing standard output failed");
	return rc == EXIT_OK ? EXIT_IO : rc;
}

/* Length of the UTF-8 sequence at p when it is one jansson accepts (no
 * overlong form, no surrogate, at most U+10FFFF), else 0. */
static size_t utf8_seq(const unsigned char *p)
{
	unsigned c = p[0];
	if (c < 0x80)
		return 1;
	size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
	if (!n)
		return 0;
	uint32_t cp = c & (0x3F >> (n - 1));
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3F);
	}
	if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
	    (cp >= 0xD800 && cp <= 0xDFFF))
		return 0;
	return n;
}

bool cli_utf8_valid(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	for (size_t n; *p; p += n)
		if (!(n = utf8_seq(p)))
			return false;
	return true;
}

json_t *cli_json_text(const char *s)
{
	if (!s)
		return NULL;
	if (cli_utf8_valid(s))
		return json_string(s);
	size_t len = strlen(s);
	char *out = malloc(3 * len + 1), *o = out;
	if (!out)
		return NULL;
	for (const unsigned char *p = (const unsigned char *)s; *p;) {
		size_t n = utf8_seq(p);
		if (n) {
			memcpy(o, p, n);
			o += n;
			p += n;
		} else {
			memcpy(o, "\xEF\xBF\xBD", 3); /* U+FFFD */
			o += 3;
			p++;
		}
	}
	*o = '\0';
	json_t *j = json_string(out);
	free(out);
	return j;
}

bool cli_json_put(json_t *obj, const char *key, json_t *value)
{
	/* json_object_set_new drops value on failure, NULL included */
	return value && json_object_set_new(obj, key, value) == 0;
}

bool cli_json_push(json_t *arr, json_t *value)
{
	return value && json_array_append_new(arr, value) == 0;
}

bool cli_json_put_path(json_t *obj, const char *key, const char *path)
{
	if (!cli_json_put(obj, key, cli_json_text(path)))
		return false;
	if (cli_utf8_valid(path))
		return true;
	static const char digits[] = "0123456789abcdef";
	size_t len = strlen(path);
	char *hex = malloc(2 * len + 1);
	char *name = malloc(strlen(key) + sizeof "_bytes");
	bool ok = hex && name;
	if (ok) {
		for (size_t i = 0; i < len; i++) {
			hex[2 * i] = digits[(unsigned char)path[i] >> 4];
			hex[2 * i + 1] = digits[(unsigned char)path[i] & 15];
		}
		hex[2 * len] = '\0';
		snprintf(name, strlen(key) + sizeof "_bytes", "%s_bytes", key);
		ok = cli_json_put(obj, name, json_string(hex));
	}
	free(hex);
	free(name);
	return ok;
}

int cli_print_json(const char *cmd, const json_t *doc, bool complete)
{
	if (!doc || !complete) {
		cli_error(cmd, "out of memory building the JSON output (nothing printed)");
		return EXIT_NOMEM;
	}
	if (json_dumpf(doc, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER) == 0 &&
	    fputc('\n', stdout) != EOF)
		return EXIT_OK;
	/* a write error is reported once, by cli_finish_output */
	if (ferror(stdout))
		return EXIT_IO;
	cli_error(cmd, "out of memory writing the JSON output");
	return EXIT_NOMEM;
}

/* Dump doc and a newline to f and flush it; 0 or an errno value. */
static int dump(const json_t *doc, size_t flags, FILE *f)
{
	errno = 0;
	if (!json_dumpf(doc, f, flags) && fputc('\n', f) != EOF && !fflush(f) && !ferror(f))
		return 0;
	/* no write error: the dump itself failed, for want of memory */
	return !ferror(f) ? ENOMEM : errno ? errno : EIO;
}

/* The file path names: path itself, or where a symbolic link to no file
 * points (the file the link will then name), relative to the link's
 * folder. NULL with errno set on failure. */
static char *dangling_target(const char *path)
{
	struct stat st;
	if (lstat(path, &st) || !S_ISLNK(st.st_mode))
		return strdup(path);
	char link[4096];
	ssize_t n = readlink(path, link, sizeof link - 1);
	if (n < 0)
		return NULL;
	link[n] = '\0';
	const char *slash = strrchr(path, '/');
	if (link[0] == '/' || !slash)
		return strdup(link);
	size_t dir = (size_t)(slash - path) + 1, len = dir + (size_t)n + 1;
	char *t = malloc(len);
	if (t)
		snprintf(t, len, "%.*s%s", (int)dir, path, link);
	return t;
}

int cli_write_json_file(const char *path, const json_t *doc, size_t flags)
{
	/* Not a regular file (/dev/stdout, a FIFO, /dev/full): written in
	 * place, since renaming over it would replace the device or pipe. A
	 * symbolic link is followed, so the file it names is replaced. */
	struct stat st, out;
	bool exists = stat(path, &st) == 0;
	/* this process's own stdout (/dev/stdout, or the file it is
	 * redirected to): through its stream, in order with the text, which a
	 * rename would send into a deleted file */
	if (exists && !fstat(STDOUT_FILENO, &out) && out.st_dev == st.st_dev &&
	    out.st_ino == st.st_ino)
		return dump(doc, flags, stdout);
	if (exists && !S_ISREG(st.st_mode)) {
		FILE *f = fopen(path, "w");
		if (!f)
			return errno;
		int rc = dump(doc, flags, f);
		if (fclose(f) && !rc)
			rc = errno ? errno : EIO;
		return rc;
	}
	char *target = exists ? realpath(path, NULL) : dangling_target(path);
	if (!target)
		return errno;
	size_t len = strlen(target) + sizeof ".tmp.XXXXXX";
	char *tmp = malloc(len);
	if (!tmp) {
		free(target);
		return ENOMEM;
	}
	/* a name the file system takes must not fail on ours: where
	 * NAME.tmp.XXXXXX would pass NAME_MAX, NAME's start, cut to fit */
	const char *slash = strrchr(target, '/');
	size_t base = strlen(slash ? slash + 1 : target), keep = strlen(target);
	if (base + sizeof ".tmp.XXXXXX" - 1 > NAME_MAX && base <= NAME_MAX)
		keep -= base + sizeof ".tmp.XXXXXX" - 1 - NAME_MAX;
	snprintf(tmp, len, "%.*s.tmp.XXXXXX", (int)keep, target);
	int fd = mkstemp(tmp);
	if (fd < 0) {
		int e = errno;
		free(tmp);
		free(target);
		return e;
	}
	/* mkstemp makes it 0600: give it the mode a plain fopen would have, or
	 * that of the file it replaces */
	mode_t mask = umask(0);
	umask(mask);
	int rc = fchmod(fd, exists ? st.st_mode & 07777 : 0666 & ~mask) ? errno : 0;
	FILE *f = rc ? NULL : fdopen(fd, "w");
	if (!f) {
		rc = rc ? rc : errno;
		close(fd);
	} else {
		/* flushed to the disk before the rename, so a crash leaves the
		 * old file or the whole new one */
		rc = dump(doc, flags, f);
		if (!rc && fsync(fd))
			rc = errno;
		if (fclose(f) && !rc)
			rc = errno ? errno : EIO;
	}
	if (!rc && rename(tmp, target))
		rc = errno;
	if (rc)
		unlink(tmp);
	free(tmp);
	free(target);
	return rc;
}

uint64_t cli_peak_rss(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)ru.ru_maxrss * 1024;
}
