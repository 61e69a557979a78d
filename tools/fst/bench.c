/*
 * bench.c - `fst bench`: in one run on one machine, fst against the
 * machine's limits and the reference loader, warm and cold.
 *
 * Limits: many threads of pread into memory that is already faulted in (the
 * page cache's copy bandwidth), and O_DIRECT reads into an aligned buffer
 * with the files evicted from the page cache (the storage's bandwidth). The
 * reference is the `safetensors` Python package, run as a subprocess.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void help(FILE *out)
{
	fprintf(out,
		"usage: fst bench PATH [options]\n"
		"\n"
		"Measures, in one run: fst load; a plain sequential read; the parallel-pread\n"
		"limit; the reference safetensors loader (when python3 can import it); and,\n"
		"with the files evicted from the page cache (posix_fadvise DONTNEED), fst\n"
		"load, the O_DIRECT read limit and the reference again. Prints GB/s and\n"
		"ratios.\n"
		"\n" CLI_LOAD_OPTIONS_HELP
		"  --runs N        runs of each warm measurement, best kept (default 3)\n"
		"  --no-cold       skip the cold measurements\n"
		"  --check FILE    also time loads checked against a manifest (fst verify\n"
		"                  --manifest), like the unchecked rows before them\n"
		"  --no-reference  skip the reference loader\n"
		"  --json          print the results as one JSON object\n"
		"  -h, --help      this help\n");
}

struct files {
	size_t n;
	char **path;
	uint64_t *size;
	uint64_t total;
};

/* The checkpoint's files: EXIT_OK or EXIT_NOMEM. */
static int collect_files(const fst_checkpoint *ck, struct files *fs)
{
	fs->n = fst_checkpoint_file_count(ck);
	fs->path = calloc(fs->n, sizeof *fs->path);
	fs->size = calloc(fs->n, sizeof *fs->size);
	if (!fs->path || !fs->size)
		return EXIT_NOMEM;
	for (size_t i = 0; i < fs->n; i++) {
		const fst_file *f = fst_checkpoint_file(ck, i);
		fs->path[i] = strdup(fst_file_path(f));
		fs->size[i] = fst_file_size(f);
		fs->total += fs->size[i];
		if (!fs->path[i])
			return EXIT_NOMEM;
	}
	return EXIT_OK;
}

static void free_files(struct files *fs)
{
	for (size_t i = 0; fs->path && i < fs->n; i++)
		free(fs->path[i]);
	free(fs->path);
	free(fs->size);
}

/* Fraction of the files' pages in the page cache, or -1 with the reason in
 * why when it cannot be told. */
static double resident(const struct files *fs, char *why, size_t whylen)
{
	uint64_t in = 0, all = 0;
	long page = sysconf(_SC_PAGESIZE);
	unsigned char *vec = malloc(1 << 20);
	if (!vec) {
		snprintf(why, whylen, "out of memory for mincore");
		return -1;
	}
	double rc = 0;
	for (size_t i = 0; i < fs->n && rc == 0; i++) {
		if (!fs->size[i])
			continue;
		int fd = open(fs->path[i], O_RDONLY | O_CLOEXEC);
		void *m = fd < 0 ? MAP_FAILED
				 : mmap(NULL, fs->size[i], PROT_READ, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED) {
			snprintf(why, whylen, "%.150s: cannot %s it to measure: %s", fs->path[i],
				 fd < 0 ? "open" : "map", strerror(errno));
			if (fd >= 0)
				close(fd);
			rc = -1;
			break;
		}
		/* Linux's mincore tells the page cache only to a file's owner,
		 * to a caller who could open it for writing, and to root (more
		 * exactly CAP_FOWNER; src/io/residency.c), and calls every page
		 * resident for the others */
		struct stat st;
		if (fstat(fd, &st) || (st.st_uid != geteuid() && geteuid() != 0 &&
				       faccessat(AT_FDCWD, fs->path[i], W_OK, AT_EACCESS))) {
			snprintf(why, whylen,
				 "%.100s: mincore tells its pages only to its owner or a writer",
				 fs->path[i]);
			munmap(m, fs->size[i]);
			close(fd);
			rc = -1;
			break;
		}
		close(fd);
		uint64_t pages = (fs->size[i] + (uint64_t)page - 1) / (uint64_t)page;
		for (uint64_t p = 0; p < pages; p += 1 << 20) {
			uint64_t k = pages - p < (1 << 20) ? pages - p : (1 << 20);
			if (mincore((char *)m + p * (uint64_t)page, k * (uint64_t)page, vec)) {
				snprintf(why, whylen, "%.150s: mincore: %s", fs->path[i],
					 strerror(errno));
				rc = -1;
				break;
			}
			for (uint64_t j = 0; j < k; j++)
				in += vec[j] & 1;
			all += k;
		}
		munmap(m, fs->size[i]);
	}
	free(vec);
	return rc < 0 ? -1 : all ? (double)in / (double)all : 0;
}

/* Evict the files from the page cache (their clean pages; no privilege
 * needed) and check that they left it: false, with the reason in why, when
 * a call failed or more than 1% of the pages stayed (tmpfs keeps them
 * there; pages mapped or locked by another process stay too). A cold row
 * measured after a false would be a warm one. */
static bool evict(const struct files *fs, double *left, char *why, size_t whylen)
{
	*left = -1;
	for (size_t i = 0; i < fs->n; i++) {
		int fd = open(fs->path[i], O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			snprintf(why, whylen, "%.150s: cannot open: %s", fs->path[i], strerror(errno));
			return false;
		}
		int e = fdatasync(fd) ? errno : 0;
		/* posix_fadvise returns the error, it does not set errno */
		int f = e ? 0 : posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
		close(fd);
		if (e || f) {
			snprintf(why, whylen, "%.150s: %s: %s", fs->path[i],
				 e ? "fdatasync" : "posix_fadvise(DONTNEED)", strerror(e ? e : f));
			return false;
		}
	}
	char rwhy[200] = "";
	*left = resident(fs, rwhy, sizeof rwhy);
	if (*left < 0) {
		snprintf(why, whylen, "cannot tell whether the files left it: %s", rwhy);
		return false;
	}
	if (*left > 0.01) {
		snprintf(why, whylen, "%.0f%% of the files' pages still cached after "
				      "posix_fadvise(DONTNEED)",
			 *left * 100);
		return false;
	}
	return true;
}

/* A plain single-threaded read of every file into one reused buffer. */
static double plain_read(const struct files *fs)
{
	const size_t block = 8u << 20;
	char *buf = malloc(block);
	double t0 = cli_now();
	for (size_t i = 0; buf && i < fs->n; i++) {
		int fd = open(fs->path[i], O_RDONLY);
		if (fd < 0)
			continue;
		while (read(fd, buf, block) > 0) {
		}
		close(fd);
	}
	double dt = cli_now() - t0;
	free(buf);
	return dt;
}

/* ---- parallel read limits */

struct limit {
	const struct files *fs;
	char *dst;        /* total bytes, already faulted in */
	uint64_t chunk;
	bool direct;
	int *fds;
	atomic_uint_fast64_t next; /* global chunk counter over all files */
	uint64_t *first_chunk;     /* per file: index of its first chunk */
	uint64_t nchunks;
	uint64_t *dst_off;         /* per file: where its bytes go */
};

static void *limit_worker(void *arg)
{
	struct limit *l = arg;
	for (;;) {
		uint64_t k = atomic_fetch_add(&l->next, 1);
		if (k >= l->nchunks)
			break;
		size_t f = 0;
		while (f + 1 < l->fs->n && l->first_chunk[f + 1] <= k)
			f++;
		uint64_t off = (k - l->first_chunk[f]) * l->chunk;
		uint64_t n = l->fs->size[f] - off < l->chunk ? l->fs->size[f] - off : l->chunk;
		if (l->direct)
			n = (n + 4095) & ~4095ull;
		if (pread(l->fds[f], l->dst + l->dst_off[f] + off, n, (off_t)off) < 0)
			break;
	}
	return NULL;
}

static double parallel_read(const struct files *fs, char *dst, unsigned threads, bool direct)
{
	struct limit l = {.fs = fs, .dst = dst, .chunk = 16u << 20, .direct = direct};
	l.fds = calloc(fs->n, sizeof *l.fds);
	l.first_chunk = calloc(fs->n + 1, sizeof *l.first_chunk);
	l.dst_off = calloc(fs->n + 1, sizeof *l.dst_off);
	uint64_t off = 0;
	for (size_t i = 0; i < fs->n; i++) {
		l.fds[i] = open(fs->path[i], O_RDONLY | (direct ? O_DIRECT : 0));
		if (l.fds[i] < 0 && direct)
			l.fds[i] = open(fs->path[i], O_RDONLY);
		l.first_chunk[i] = l.nchunks;
		l.nchunks += (fs->size[i] + l.chunk - 1) / l.chunk;
		l.dst_off[i] = off;
		off += (fs->size[i] + l.chunk - 1) / l.chunk * l.chunk;
	}
	atomic_init(&l.next, 0);
	pthread_t *t = calloc(threads, sizeof *t);
	double t0 = cli_now();
	for (unsigned i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, limit_worker, &l);
	for (unsigned i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	double dt = cli_now() - t0;
	for (size_t i = 0; i < fs->n; i++)
		if (l.fds[i] >= 0)
			close(l.fds[i]);
	free(t);
	free(l.fds);
	free(l.first_chunk);
	free(l.dst_off);
	return dt;
}

/* ---- fst and the reference */

/* One timed load (checkpoint open included), checked against manifest
 * unless it is NULL; why gets the path chosen, or the failure. */
static double fst_once(const char *path, const fst_load_opts *lo, const char *manifest,
		       char *why, size_t whylen, int *rc)
{
	double t0 = cli_now();
	fst_checkpoint *ck;
	fst_buffer *buf = NULL;
	fst_error err;
	size_t nchecked = 0;
	*rc = cli_open_checkpoint(path, &ck, &err);
	if (!*rc) {
		*rc = manifest ? cli_load_checked(ck, lo, manifest, &buf, &nchecked, &err)
			       : fst_load(ck, lo, &buf, &err);
		fst_checkpoint_close(ck);
	}
	double dt = cli_now() - t0;
	if (*rc) {
		cli_error("bench", "%s", err.message);
		snprintf(why, whylen, "failed: %s", err.message);
		return 0;
	}
	snprintf(why, whylen, "%s", fst_buffer_describe(buf));
	fst_buffer_release(buf);
	return dt;
}

/* The best of runs loads as fst_once makes them (*first: the first one's
 * time, when not NULL); *rc becomes an exit code on a failure. */
static double fst_best(const char *path, const fst_load_opts *lo, const char *manifest,
		       uint64_t runs, char *why, size_t whylen, double *first, int *rc)
{
	double best = 0;
	for (uint64_t r = 0; r < runs && *rc == EXIT_OK; r++) {
		int lrc;
		double s = fst_once(path, lo, manifest, why, whylen, &lrc);
		if (lrc)
			*rc = cli_exit_code(lrc);
		if (r == 0 && first)
			*first = s;
		best = best == 0 || s < best ? s : best;
	}
	return best;
}

/* "python3 SCRIPT DEVICE FILE... 2>&1", every argument single-quoted for
 * the shell ('\'' inside); NULL out of memory. */
static char *reference_command(const char *script, const char *device, const struct files *fs)
{
	size_t len = strlen(script) + 4 * strlen(device) + 64;
	for (size_t i = 0; i < fs->n; i++)
		len += 4 * strlen(fs->path[i]) + 3;
	char *cmd = malloc(len);
	if (!cmd)
		return NULL;
	snprintf(cmd, len, "python3 %s", script);
	for (size_t i = 0; i <= fs->n; i++) {
		const char *arg = i == 0 ? device : fs->path[i - 1];
		char *p = cmd + strlen(cmd);
		*p++ = ' ';
		*p++ = '\'';
		for (; *arg; arg++) {
			if (*arg == '\'') {
				memcpy(p, "'\\''", 4);
				p += 4;
			} else {
				*p++ = *arg;
			}
		}
		*p++ = '\'';
		*p = '\0';
	}
	strcat(cmd, " 2>&1");
	return cmd;
}

/* The last line cmd prints ("" when it prints none or cannot run). */
static void last_line(const char *cmd, char *line, size_t size)
{
	FILE *p = popen(cmd, "r");
	if (!p)
		return;
	char buf[512];
	while (fgets(buf, sizeof buf, p))
		snprintf(line, size, "%s", buf);
	pclose(p);
}

/* Runs the reference loader in python3; returns seconds, or 0 with a reason. */
static double reference_once(const struct files *fs, const char *device, char *why,
			     size_t whylen)
{
	char script[] =
		"import sys, time\n"
		"dev = sys.argv[1]\n"
		"try:\n"
		"    import torch\n"
		"    from safetensors.torch import load_file\n"
		"    kind = 'safetensors.torch.load_file'\n"
		"except Exception:\n"
		"    if dev != 'cpu':\n"
		"        print('skip torch is needed for', dev); sys.exit(0)\n"
		"    from safetensors.numpy import load_file\n"
		"    kind = 'safetensors.numpy.load_file'\n"
		"if dev.startswith('cuda'):\n"
		"    torch.zeros(1, device=dev); torch.cuda.synchronize()  # context before timing\n"
		"t = time.perf_counter()\n"
		"n = 0\n"
		"for f in sys.argv[2:]:\n"
		"    d = load_file(f, device=dev) if kind.startswith('safetensors.torch') else load_file(f)\n"
		"    n += len(d)\n"
		"if dev.startswith('cuda'):\n"
		"    torch.cuda.synchronize()\n"
		"print('ok', time.perf_counter() - t, n, kind)\n";
	char tmpl[] = "/tmp/fst-bench-ref-XXXXXX";
	int fd = mkstemp(tmpl);
	if (fd < 0 || write(fd, script, strlen(script)) < 0) {
		snprintf(why, whylen, "cannot write a temporary script");
		if (fd >= 0)
			close(fd);
		return 0;
	}
	close(fd);
	char *cmd = reference_command(tmpl, device, fs);
	if (!cmd) {
		unlink(tmpl);
		snprintf(why, whylen, "skipped: out of memory");
		return 0;
	}
	char line[512] = "";
	last_line(cmd, line, sizeof line);
	free(cmd);
	unlink(tmpl);
	double secs = 0;
	char kind[128];
	long n;
	if (sscanf(line, "ok %lf %ld %127s", &secs, &n, kind) == 3) {
		snprintf(why, whylen, "%s", kind);
		return secs;
	}
	line[strcspn(line, "\n")] = '\0';
	snprintf(why, whylen, "skipped: %s", line[0] ? line : "python3 failed");
	return 0;
}

/* An allocator handing out memory that is already faulted in: what a
 * caller that reuses its weight arena gets (the limit's own buffer). */
struct reuse {
	char *p;
	uint64_t len;
};

static void *reuse_alloc(void *ctx, uint64_t size, uint32_t align, int device_type, int device_id)
{
	struct reuse *r = ctx;
	(void)device_id;
	if (device_type != FST_DEVICE_CPU || size > r->len || (uintptr_t)r->p % align)
		return NULL;
	return r->p;
}

static void reuse_free(void *ctx, void *ptr, uint64_t size, int device_type, int device_id)
{
	(void)ctx, (void)ptr, (void)size, (void)device_type, (void)device_id;
}

struct row {
	const char *name;
	double secs;
	char note[FST_ERROR_MSG_MAX + 64]; /* a path chosen, or why it failed or was skipped */
};

/* One bench: what was asked, and what was measured. */
struct bench {
	const char *path, *device, *manifest;
	char *shown; /* path as reports show it: a URL's secrets hidden */
	fst_load_opts lo;
	uint64_t runs;
	bool cold, reference, as_json;
	bool remote; /* URLs: no local limit, no page cache; the load rows only */
	size_t nfiles;
	struct files fs;
	uint64_t tensor_bytes;
	unsigned threads;
	char *dst; /* the limit's destination: span bytes, faulted in */
	uint64_t span;
	struct row rows[14];
	int nrows;
	/* the rows the ratios compare (NULL: not measured) */
	struct row *pread_limit, *h2d, *fst_warm, *checked_warm, *reused, *checked_reused,
		*ref_warm, *odirect, *fst_cold;
	double warm_resident, cold_resident;
	char why[FST_ERROR_MSG_MAX + 16]; /* the last load's path chosen, or why it failed */
	int rc;        /* the exit code so far */
};

static struct row *add_row(struct bench *b, const char *name, double secs, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static struct row *add_row(struct bench *b, const char *name, double secs, const char *fmt, ...)
{
	struct row *r = &b->rows[b->nrows++];
	*r = (struct row){name, secs, ""};
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->note, sizeof r->note, fmt, ap);
	va_end(ap);
	return r;
}

/* A row whose load failed (the exit code moved from before) says why, as
 * cli.md has it: "failed: MESSAGE". */
static void note_failure(struct bench *b, struct row *r, int before)
{
	if (b->rc != before)
		snprintf(r->note, sizeof r->note, "%s", b->why);
}

static struct row *skipped_row(struct bench *b, const char *name, const char *why)
{
	return add_row(b, name, 0, "skipped: cannot evict the page cache (%s)", why);
}

static double keep_best(double best, double s)
{
	return best == 0 || s < best ? s : best;
}

/* The command line into b; *done when the command ends here (help, or a
 * usage error). */
static int parse_args(int argc, char **argv, struct bench *b, bool *done)
{
	static const struct option opts[] = {
		CLI_LOAD_OPTIONS,
		{"runs", required_argument, NULL, 'r'},
		{"check", required_argument, NULL, 'k'},
		{"no-cold", no_argument, NULL, 'C'},
		{"no-reference", no_argument, NULL, 'R'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{0, 0, 0, 0},
	};
	fst_load_opts_init(&b->lo);
	b->runs = 3;
	b->cold = b->reference = true;
	*done = true;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		int r = cli_load_option("bench", c, optarg, &b->lo);
		if (r == EXIT_USAGE)
			return r;
		if (r == EXIT_OK)
			continue;
		switch (c) {
		case 'r':
			if (!cli_parse_uint(optarg, 100, &b->runs) || !b->runs) {
				cli_error("bench", "--runs \"%s\": expected 1 to 100", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'C': b->cold = false; break;
		case 'k': b->manifest = optarg; break;
		case 'R': b->reference = false; break;
		case 'j': b->as_json = true; break;
		case 'h': help(stdout); return EXIT_OK;
		default: help(stderr); return EXIT_USAGE;
		}
	}
	if (optind != argc - 1) {
		cli_error("bench", optind >= argc ? "no PATH given" : "one PATH expected");
		help(stderr);
		return EXIT_USAGE;
	}
	b->path = argv[optind];
	size_t n = fst_display_path(b->path, NULL, 0) + 1;
	if (!(b->shown = malloc(n))) {
		cli_error("bench", "out of memory");
		return EXIT_NOMEM;
	}
	fst_display_path(b->path, b->shown, n);
	b->device = b->lo.device ? b->lo.device : "cpu";
	*done = false;
	return EXIT_OK;
}

/* Everything checked before anything is measured, and the files listed. */
static int prepare(struct bench *b)
{
	int rc = cli_check_fault_env("bench");
	if (rc)
		return rc;
	fst_checkpoint *ck;
	fst_error err;
	if (cli_open_checkpoint(b->path, &ck, &err)) {
		cli_error("bench", "%s", err.message);
		return cli_exit_code(err.code);
	}
	/* Every option, the device included, is checked by the library's own
	 * parser before anything is measured: no row for a bench that cannot
	 * run. */
	char plan[FST_ERROR_MSG_MAX + 64];
	if (fst_load_explain(ck, &b->lo, plan, sizeof plan, &err) ||
	    (b->manifest && cli_check_manifest(b->manifest, &err))) {
		cli_error("bench", "%s", err.message);
		fst_checkpoint_close(ck);
		return cli_exit_code(err.code);
	}
	b->tensor_bytes = fst_checkpoint_total_bytes(ck);
	b->remote = fst_file_is_remote(fst_checkpoint_file(ck, 0));
	b->nfiles = fst_checkpoint_file_count(ck);
	rc = b->remote ? EXIT_OK : collect_files(ck, &b->fs);
	/* room for the reused-memory load: the tensors, each aligned (a
	 * model of many small tensors needs more than its files' bytes) */
	b->span = (b->tensor_bytes + 256 * (uint64_t)fst_checkpoint_tensor_count(ck) +
		   (32u << 20)) & ~(uint64_t)((16u << 20) - 1);
	if (b->remote)
		for (size_t i = 0; i < fst_checkpoint_file_count(ck); i++)
			b->fs.total += fst_file_size(fst_checkpoint_file(ck, i));
	fst_checkpoint_close(ck);
	if (rc) {
		cli_error("bench", "out of memory");
		return rc;
	}
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	b->threads = b->lo.threads ? b->lo.threads
		     : b->remote   ? 16 /* the library's default connections for URLs */
				   : (unsigned)(ncpu < 1 ? 1 : ncpu > 16 ? 16 : ncpu);
	return EXIT_OK;
}

/* The limit's destination: every file's bytes, faulted in before timing. */
static int alloc_limit(struct bench *b)
{
	uint64_t files = 0;
	for (size_t i = 0; i < b->fs.n; i++)
		files += (b->fs.size[i] + (16u << 20) - 1) / (16u << 20) * (16u << 20);
	b->span = files > b->span ? files : b->span;
	char *dst = mmap(NULL, b->span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (dst == MAP_FAILED) {
		cli_error("bench", "cannot allocate %" PRIu64 " bytes for the limit", b->span);
		return EXIT_NOMEM;
	}
	madvise(dst, b->span, MADV_HUGEPAGE);
	memset(dst, 1, b->span);
	b->dst = dst;
	return EXIT_OK;
}

/* On a GPU the copy engine is the other limit: pinned host-to-device. */
static void measure_copy_limit(struct bench *b)
{
	int dev = b->device[4] == ':' ? atoi(b->device + 5) : 0;
	double gbps = 0;
	uint64_t bytes = b->fs.total < (1ull << 30) ? (b->fs.total + (1u << 20)) : (1ull << 30);
	fst_error err;
	if (fst_cuda_h2d_bandwidth(dev, bytes, &gbps, &err)) {
		cli_error("bench", "%s", err.message);
		b->rc = cli_exit_code(err.code);
		return;
	}
	b->h2d = add_row(b, "pinned host-to-device copy limit", (double)b->fs.total / (gbps * 1e9),
			 "16 MiB async copies on one stream, best of 3 over %" PRIu64 " MiB",
			 bytes >> 20);
}

/* The machine's limits, warm: one plain reader, parallel pread, the copy. */
static void measure_limits(struct bench *b)
{
	/* warm: read everything once so the page cache holds it */
	plain_read(&b->fs);
	char rwhy[200] = "";
	b->warm_resident = resident(&b->fs, rwhy, sizeof rwhy);
	if (b->warm_resident < 0)
		cli_error("bench", "page-cache residency unknown: %s", rwhy);
	double best = 0;
	for (uint64_t r = 0; r < b->runs; r++)
		best = keep_best(best, plain_read(&b->fs));
	add_row(b, "plain sequential read (warm)", best, "1 thread, 8 MiB read()");
	best = 0;
	for (uint64_t r = 0; r < b->runs; r++)
		best = keep_best(best, parallel_read(&b->fs, b->dst, b->threads, false));
	b->pread_limit = add_row(b, "parallel pread limit (warm)", best,
				 "%u threads, 16 MiB pread into faulted-in memory", b->threads);
	if (!strncmp(b->device, "cuda", 4))
		measure_copy_limit(b);
}

/* On the CPU, fresh memory costs its page faults (zeroing; in a VM, often
 * much more): the same load into memory already faulted in. */
static void measure_fst_reused(struct bench *b)
{
	struct reuse ru = {b->dst, b->span};
	fst_allocator a = {reuse_alloc, reuse_free, &ru};
	fst_load_opts lr = b->lo;
	lr.allocator = &a;
	int before = b->rc;
	double best = fst_best(b->path, &lr, NULL, b->runs, b->why, sizeof b->why, NULL, &b->rc);
	b->reused = add_row(b, "fst load (warm, reused memory)", best,
			    "into memory already faulted in (an allocator hook)");
	note_failure(b, b->reused, before);
	if (b->manifest && b->rc == EXIT_OK) {
		best = fst_best(b->path, &lr, b->manifest, b->runs, b->why, sizeof b->why, NULL,
				&b->rc);
		b->checked_reused = add_row(b, "fst load --check (warm, reused memory)", best,
					    "the same, block trees hashed as the bytes land, "
					    "against %s",
					    cli_basename(b->manifest));
		note_failure(b, b->checked_reused, EXIT_OK);
	}
}

static void measure_fst_warm(struct bench *b)
{
	double first = 0;
	double best = fst_best(b->path, &b->lo, NULL, b->runs, b->why, sizeof b->why, &first,
			       &b->rc);
	/* The first load of a process also pays for pinning its staging, which
	 * later loads reuse: both are reported. */
	add_row(b, "fst load (warm, first)", first, "the first load of this process");
	b->fst_warm = add_row(b, "fst load (warm)", best, "%s", b->why);
	if (b->manifest && b->rc == EXIT_OK) {
		best = fst_best(b->path, &b->lo, b->manifest, b->runs, b->why, sizeof b->why, NULL,
				&b->rc);
		b->checked_warm = add_row(b, "fst load --check (warm)", best,
					  "the same, block trees hashed as the bytes land, against %s",
					  cli_basename(b->manifest));
		note_failure(b, b->checked_warm, EXIT_OK);
	}
	if (!strcmp(b->device, "cpu") && b->rc == EXIT_OK && b->lo.io != FST_IO_MMAP)
		measure_fst_reused(b);
}

static void measure_reference_warm(struct bench *b)
{
	double best = 0;
	for (uint64_t r = 0; r < b->runs; r++) {
		double s = reference_once(&b->fs, b->device, b->why, sizeof b->why);
		if (s == 0)
			break;
		best = keep_best(best, s);
	}
	b->ref_warm = add_row(b, "reference safetensors (warm)", best, "%s", b->why);
}

/* Each cold row after an eviction of its own, checked. */
static void measure_cold(struct bench *b)
{
	char ewhy[200];
	double left;
	bool evicted = evict(&b->fs, &b->cold_resident, ewhy, sizeof ewhy);
	if (evicted)
		b->odirect = add_row(b, "O_DIRECT read limit (cold)",
				     parallel_read(&b->fs, b->dst, b->threads, true),
				     "%u threads, 16 MiB O_DIRECT pread", b->threads);
	else
		b->odirect = skipped_row(b, "O_DIRECT read limit (cold)", ewhy);
	if (evicted && (evicted = evict(&b->fs, &left, ewhy, sizeof ewhy))) {
		int lrc;
		double secs = fst_once(b->path, &b->lo, NULL, b->why, sizeof b->why, &lrc);
		if (lrc)
			b->rc = cli_exit_code(lrc);
		b->fst_cold = add_row(b, "fst load (cold)", secs, "%s", b->why);
	} else {
		b->fst_cold = skipped_row(b, "fst load (cold)", ewhy);
	}
	if (!b->reference)
		return;
	if (evicted && (evicted = evict(&b->fs, &left, ewhy, sizeof ewhy))) {
		double secs = reference_once(&b->fs, b->device, b->why, sizeof b->why);
		add_row(b, "reference safetensors (cold)", secs, "%s", b->why);
	} else {
		skipped_row(b, "reference safetensors (cold)", ewhy);
	}
}

/* Every row, in the order measured; each step after a failure is skipped. */
static void measure(struct bench *b)
{
	if (b->remote) {
		/* the network is the limit: bench/remote.py measures it beside curl */
		static const char *const rows[] = {"plain sequential read (warm)",
						   "parallel pread limit (warm)"};
		for (int i = 0; i < 2; i++)
			add_row(b, rows[i], 0, "skipped: remote files (bench/remote.py compares with curl)");
		if (!strncmp(b->device, "cuda", 4))
			measure_copy_limit(b);
		b->warm_resident = b->cold_resident = -1;
		measure_fst_warm(b);
		return;
	}
	measure_limits(b);
	measure_fst_warm(b);
	if (b->reference && b->rc == EXIT_OK)
		measure_reference_warm(b);
	if (b->cold && b->rc == EXIT_OK)
		measure_cold(b);
}

/* The text report's first lines. */
static void print_header(const struct bench *b)
{
	char hb[32];
	printf("bench %s on %s: %zu files, %s; %u threads; best of %" PRIu64 " warm runs\n",
	       b->shown, b->device, b->nfiles, cli_human_bytes(hb, sizeof hb, b->fs.total),
	       b->threads, b->runs);
	if (b->remote) {
		printf("remote files: no page cache, no cold runs\n");
		printf("%-38s %9s %9s  %s\n", "measurement", "seconds", "GB/s", "notes");
		return;
	}
	char warm[16] = "unknown", after[16] = "unknown";
	if (b->warm_resident >= 0)
		snprintf(warm, sizeof warm, "%.0f%%", b->warm_resident * 100);
	if (b->cold_resident >= 0)
		snprintf(after, sizeof after, "%.0f%%", b->cold_resident * 100);
	if (!b->cold)
		printf("page cache: %s resident warm; cold runs not measured\n", warm);
	else
		printf("page cache: %s resident warm, %s after eviction\n", warm, after);
	printf("%-38s %9s %9s  %s\n", "measurement", "seconds", "GB/s", "notes");
}

/* Limits move whole files; loaders move tensor bytes. Rates use each one's
 * own byte count. */
#define GB_FILES(b) ((double)(b)->fs.total / 1e9)
#define GB_TENSORS(b) ((double)(b)->tensor_bytes / 1e9)

/* Every row, printed (text) and appended to arr; ok stays true while the
 * JSON has lost nothing. */
static bool put_rows(const struct bench *b, json_t *arr, bool ok)
{
	for (int i = 0; i < b->nrows; i++) {
		const struct row *r = &b->rows[i];
		bool limit = strstr(r->name, "limit") || strstr(r->name, "plain");
		/* rows are timed over the files' bytes (limits) or the tensors'
		 * (loaders); the copy limit's time was derived from the files' */
		double gbps = r->secs > 0 ? (limit ? GB_FILES(b) : GB_TENSORS(b)) / r->secs : 0;
		json_t *row = ok ? json_object() : NULL;
		ok = cli_json_push(arr, row) && cli_json_put(row, "name", json_string(r->name)) &&
		     cli_json_put(row, "seconds", json_real(r->secs)) &&
		     cli_json_put(row, "gbps", json_real(gbps)) &&
		     cli_json_put(row, "notes", cli_json_text(r->note));
		if (!b->as_json)
			printf("%-38s %9.3f %9.2f  %s\n", r->name, r->secs, gbps, r->note);
	}
	return ok;
}

#define RATE(row, gb) ((row) && (row)->secs > 0 ? (gb) / (row)->secs : 0)

/* The ratios between the rows that were measured. */
static bool put_ratios(const struct bench *b, json_t *ratios, bool ok)
{
	double gb_files = GB_FILES(b), gb_tensors = GB_TENSORS(b);
	double fw = RATE(b->fst_warm, gb_tensors), pl = RATE(b->pread_limit, gb_files);
	double rw = RATE(b->ref_warm, gb_tensors);
	double fc = RATE(b->fst_cold, gb_tensors), od = RATE(b->odirect, gb_files);
	if (fw && pl)
		ok = ok && cli_json_put(ratios, "fst_warm_vs_pread_limit", json_real(fw / pl));
	double hl = RATE(b->h2d, gb_files);
	if (fw && pl && hl)
		ok = ok && cli_json_put(ratios, "fst_warm_vs_min_pread_copy_limit",
					json_real(fw / (pl < hl ? pl : hl)));
	if (fw && rw)
		ok = ok && cli_json_put(ratios, "fst_warm_vs_reference", json_real(fw / rw));
	double fr = RATE(b->reused, gb_tensors), fk = RATE(b->checked_reused, gb_tensors);
	double fkw = RATE(b->checked_warm, gb_tensors);
	if (fkw && fw)
		ok = ok && cli_json_put(ratios, "fst_checked_vs_unchecked", json_real(fkw / fw));
	if (fk && fr)
		ok = ok && cli_json_put(ratios, "fst_checked_vs_unchecked_reused_memory",
					json_real(fk / fr));
	if (fr && pl)
		ok = ok && cli_json_put(ratios, "fst_reused_memory_vs_pread_limit",
					json_real(fr / pl));
	if (fc && od)
		ok = ok && cli_json_put(ratios, "fst_cold_vs_odirect_limit", json_real(fc / od));
	return ok;
}

/* The report, as text or one JSON object; returns the exit code. */
static int report(const struct bench *b)
{
	json_t *out = json_object();
	bool ok = cli_json_put_path(out, "path", b->shown) &&
		  cli_json_put(out, "device", cli_json_text(b->device)) &&
		  cli_json_put(out, "file_bytes", json_integer((json_int_t)b->fs.total)) &&
		  cli_json_put(out, "tensor_bytes", json_integer((json_int_t)b->tensor_bytes)) &&
		  cli_json_put(out, "threads", json_integer(b->threads)) &&
		  cli_json_put(out, "runs", json_integer((json_int_t)b->runs)) &&
		  cli_json_put(out, "warm_resident", json_real(b->warm_resident)) &&
		  cli_json_put(out, "cold_resident", json_real(b->cold_resident)) &&
		  cli_json_put(out, "rows", json_array());
	json_t *arr = ok ? json_object_get(out, "rows") : NULL;
	if (!b->as_json)
		print_header(b);
	ok = put_rows(b, arr, ok);
	ok = ok && cli_json_put(out, "ratios", json_object());
	json_t *ratios = ok ? json_object_get(out, "ratios") : NULL;
	ok = put_ratios(b, ratios, ok);
	int rc = b->rc;
	if (b->as_json) {
		int jrc = cli_print_json("bench", out, ok);
		if (rc == EXIT_OK)
			rc = jrc;
	} else if (!ok) {
		/* the ratios line is read from the JSON object */
		cli_error("bench", "out of memory building the ratios");
		if (rc == EXIT_OK)
			rc = EXIT_NOMEM;
	} else {
		printf("ratios:");
		const char *k;
		json_t *v;
		json_object_foreach(ratios, k, v)
			printf(" %s=%.2f", k, json_real_value(v));
		printf("\n");
	}
	json_decref(out);
	return rc;
}

int cmd_bench(int argc, char **argv)
{
	struct bench b = {.cold_resident = -1};
	bool done;
	int rc = parse_args(argc, argv, &b, &done);
	if (done)
		return rc;
	rc = prepare(&b);
	if (rc == EXIT_OK)
		rc = alloc_limit(&b);
	if (rc == EXIT_OK) {
		measure(&b);
		munmap(b.dst, b.span);
		rc = report(&b);
	}
	free_files(&b.fs);
	free(b.shown);
	return rc;
}
