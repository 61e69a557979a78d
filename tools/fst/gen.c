/*
 * gen.c - `fst gen`: write a synthetic checkpoint shaped like a decoder LLM.
 *
 * Values are produced by a counter-based generator (splitmix64 of seed,
 * tensor and position), so any chunk of any tensor can be made on its own and
 * the same seed always gives the same bytes. Floating-point values are kept
 * finite so that frameworks' equality checks work on them.
 */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void help(FILE *out)
{
	fprintf(out,
		"usage: fst gen OUTDIR [--size 1GiB] [--shards 4] [--seed N] [--dtype T] [--misaligned]\n"
		"\n"
		"Writes a synthetic decoder-LLM checkpoint: embedding, per-layer attention\n"
		"(q, k, v, o) and MLP (gate, up, down) projections in BF16, F32 norms, lm_head;\n"
		"model-0000K-of-0000N.safetensors shards and model.safetensors.index.json.\n"
		"\n"
		"  --size SIZE     approximate total tensor bytes (default 1GiB; K/M/G/T are\n"
		"                  powers of 1024, KB/MB/GB/TB of 1000)\n"
		"  --shards N      number of files (default 4)\n"
		"  --seed N        generator seed (default 0); the same seed gives the same bytes\n"
		"  --dtype T       the weights' dtype: BF16 (default), F16 or F32\n"
		"  --misaligned    add odd-sized U8 scale tensors that misalign the tensors after\n"
		"                  them, and start each data section 8 bytes past a 16-byte boundary\n"
		"  -h, --help      this help\n");
}

struct gtensor {
	char name[96];
	fst_dtype dtype;
	uint32_t ndim;
	uint64_t shape[2];
	uint64_t nbytes;
	uint64_t id;
	uint64_t seed;
};

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* 8 bytes of tensor data at word index w. */
static uint64_t word_at(const struct gtensor *t, uint64_t w)
{
	uint64_t r = splitmix64(t->seed ^ (t->id << 44) ^ w);
	switch (t->dtype) {
	case FST_DTYPE_BF16: {
		/* Four finite BF16 values, magnitudes 2^-7 to 2: exponent 120..127. */
		uint64_t out = 0;
		for (int k = 0; k < 4; k++) {
			uint64_t b = (r >> (16 * k)) & 0xFFFF;
			uint64_t v = (b & 0x8000) | ((120 + ((b >> 7) & 7)) << 7) | (b & 0x7F);
			out |= v << (16 * k);
		}
		return out;
	}
	case FST_DTYPE_F16: {
		/* Four finite F16 values, magnitudes 2^-3 to 2: exponent 12..15. */
		uint64_t out = 0;
		for (int k = 0; k < 4; k++) {
			uint64_t b = (r >> (16 * k)) & 0xFFFF;
			uint64_t v = (b & 0x8000) | ((12 + ((b >> 10) & 3)) << 10) | (b & 0x3FF);
			out |= v << (16 * k);
		}
		return out;
	}
	case FST_DTYPE_F32: {
		/* Two F32 values in [1, 2): norms near one. */
		uint64_t lo = 0x3F800000u | (r & 0x7FFFFF);
		uint64_t hi = 0x3F800000u | ((r >> 32) & 0x7FFFFF);
		return lo | (hi << 32);
	}
	default:
		return r;
	}
}

/* Set by SIGINT, SIGTERM and SIGHUP: the next fill fails, and everything
 * this run wrote is removed (the signal's default would leave it). */
static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	interrupted = sig;
}

static int fill(void *ctx, void *buf, uint64_t off, size_t len)
{
	if (interrupted)
		return FST_ECANCELED;
	const struct gtensor *t = ctx;
	unsigned char *p = buf;
	uint64_t pos = off;
	while (len) {
		uint64_t w = pos / 8, skip = pos % 8;
		uint64_t v = word_at(t, w);
		size_t n = 8 - skip < len ? (size_t)(8 - skip) : len;
		for (size_t k = 0; k < n; k++)
			p[k] = (unsigned char)(v >> (8 * (skip + k)));
		p += n;
		pos += n;
		len -= n;
	}
	return 0;
}

struct model {
	struct gtensor *t;
	size_t n, cap;
};

static int add(struct model *m, fst_dtype dtype, uint64_t d0, uint64_t d1, const char *fmt,
	       ...) __attribute__((format(printf, 5, 6))); /* checks the name formats */
static int add(struct model *m, fst_dtype dtype, uint64_t d0, uint64_t d1, const char *fmt, ...)
{
	if (m->n == m->cap) {
		m->cap = m->cap ? m->cap * 2 : 256;
		struct gtensor *g = realloc(m->t, m->cap * sizeof *g);
		if (!g)
			return EXIT_NOMEM;
		m->t = g;
	}
	struct gtensor *t = &m->t[m->n];
	memset(t, 0, sizeof *t);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->name, sizeof t->name, fmt, ap);
	va_end(ap);
	t->dtype = dtype;
	t->ndim = d1 ? 2 : 1;
	t->shape[0] = d0;
	t->shape[1] = d1;
	t->nbytes = d0 * (d1 ? d1 : 1) * fst_dtype_bits(dtype) / 8;
	t->id = m->n++;
	return EXIT_OK;
}

static uint64_t round_up(uint64_t v, uint64_t m)
{
	return (v + m - 1) / m * m;
}

/* Choose dimensions so the tensors add up to about size bytes; EXIT_OK or
 * EXIT_NOMEM. */
static int build_model(struct model *m, uint64_t size, bool misaligned, uint64_t seed,
		       fst_dtype wt)
{
	uint64_t h = 64;
	while (h < 8192 && 4 * 12 * (2 * h) * (2 * h) * 2 <= size)
		h *= 2;
	uint64_t kv = h / 4, inter = round_up(h * 8 / 3, 64);
	uint64_t vocab = size / 8 / (2 * h * 2);
	vocab = vocab > 32000 ? 32000 : vocab < 256 ? 256 : round_up(vocab, 64);
	uint64_t layer = 2 * (h * h + 2 * h * kv + h * h + 3 * h * inter) + 2 * 4 * h;
	uint64_t fixed = 2 * (2 * vocab * h) + 4 * h;
	uint64_t layers = size > fixed ? (size - fixed + layer / 2) / layer : 0;
	if (layers < 1)
		layers = 1;
	uint64_t scales = h / 32 * 3 + 1; /* odd: misaligns what follows */

	int bad = add(m, wt, vocab, h, "model.embed_tokens.weight");
	for (uint64_t l = 0; l < layers && !bad; l++) {
		const char *p = "model.layers";
		bad |= add(m, FST_DTYPE_F32, h, 0, "%s.%" PRIu64 ".input_layernorm.weight", p, l);
		bad |= add(m, wt, h, h, "%s.%" PRIu64 ".self_attn.q_proj.weight", p, l);
		bad |= add(m, wt, kv, h, "%s.%" PRIu64 ".self_attn.k_proj.weight", p, l);
		bad |= add(m, wt, kv, h, "%s.%" PRIu64 ".self_attn.v_proj.weight", p, l);
		bad |= add(m, wt, h, h, "%s.%" PRIu64 ".self_attn.o_proj.weight", p, l);
		bad |= add(m, FST_DTYPE_F32, h, 0, "%s.%" PRIu64 ".post_attention_layernorm.weight",
			   p, l);
		if (misaligned)
			bad |= add(m, FST_DTYPE_U8, scales, 0, "%s.%" PRIu64 ".mlp.scales", p, l);
		bad |= add(m, wt, inter, h, "%s.%" PRIu64 ".mlp.gate_proj.weight", p, l);
		bad |= add(m, wt, inter, h, "%s.%" PRIu64 ".mlp.up_proj.weight", p, l);
		bad |= add(m, wt, h, inter, "%s.%" PRIu64 ".mlp.down_proj.weight", p, l);
	}
	bad |= add(m, FST_DTYPE_F32, h, 0, "model.norm.weight");
	bad |= add(m, wt, vocab, h, "lm_head.weight");
	for (size_t i = 0; i < m->n; i++)
		m->t[i].seed = splitmix64(seed);
	return bad;
}

static void shard_name(char *buf, size_t size, uint64_t s, uint64_t shards)
{
	snprintf(buf, size, "model-%05" PRIu64 "-of-%05" PRIu64 ".safetensors", s + 1, shards);
}

/* Remove what a failed or interrupted run left in its staging directory. */
static void remove_staged(const char *stage, uint64_t done, uint64_t shards)
{
	char path[4200], fname[64];
	for (uint64_t s = 0; s <= done && s < shards; s++) {
		shard_name(fname, sizeof fname, s, shards);
		snprintf(path, sizeof path, "%s/%s", stage, fname);
		unlink(path);
		snprintf(path, sizeof path, "%s/%s.tmp", stage, fname);
		unlink(path);
	}
	snprintf(path, sizeof path, "%s/model.safetensors.index.json", stage);
	unlink(path);
}

/* Move the staged shards into dir, then the index: an index names only
 * shards that are already in place. An old index goes first, so a failure
 * half-way leaves shards without an index, which loads refuse as incomplete
 * or loads whole, never a stale index over new shards. */
static int commit(const char *stage, const char *dir, uint64_t shards)
{
	char from[4200], to[4200], fname[64];
	snprintf(to, sizeof to, "%s/model.safetensors.index.json", dir);
	if (unlink(to) && errno != ENOENT) {
		cli_error("gen", "%s: cannot replace: %s", to, strerror(errno));
		return EXIT_IO;
	}
	for (uint64_t s = 0; s < shards; s++) {
		shard_name(fname, sizeof fname, s, shards);
		snprintf(from, sizeof from, "%s/%s", stage, fname);
		snprintf(to, sizeof to, "%s/%s", dir, fname);
		if (rename(from, to)) {
			cli_error("gen", "%s: cannot move to %s: %s", from, to, strerror(errno));
			return EXIT_IO;
		}
	}
	snprintf(from, sizeof from, "%s/model.safetensors.index.json", stage);
	snprintf(to, sizeof to, "%s/model.safetensors.index.json", dir);
	if (rename(from, to)) {
		cli_error("gen", "%s: cannot move to %s: %s", from, to, strerror(errno));
		return EXIT_IO;
	}
	return EXIT_OK;
}

struct gen_args {
	uint64_t size, shards, seed;
	bool misaligned;
	fst_dtype wt;
	const char *dir;
};

/* The command line into a; *done when the command ends here (help, or a
 * usage error). */
static int parse_args(int argc, char **argv, struct gen_args *a, bool *done)
{
	static const struct option opts[] = {
		{"size", required_argument, NULL, 's'},
		{"shards", required_argument, NULL, 'n'},
		{"seed", required_argument, NULL, 'S'},
		{"misaligned", no_argument, NULL, 'm'},
		{"dtype", required_argument, NULL, 'd'},
		{"help", no_argument, NULL, 'h'},
		{0, 0, 0, 0},
	};
	*a = (struct gen_args){.size = 1ull << 30, .shards = 4, .wt = FST_DTYPE_BF16};
	*done = true;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (!cli_parse_size(optarg, &a->size) || a->size == 0) {
				cli_error("gen", "--size \"%s\" is not a size such as 2GiB", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'n':
			if (!cli_parse_uint(optarg, 99999, &a->shards) || a->shards == 0) {
				cli_error("gen", "--shards \"%s\" must be 1 to 99999", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'S':
			if (!cli_parse_uint(optarg, UINT64_MAX, &a->seed)) {
				cli_error("gen", "--seed \"%s\" is not a non-negative integer", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'm': a->misaligned = true; break;
		case 'd':
			a->wt = fst_dtype_from_name(optarg);
			if (a->wt != FST_DTYPE_BF16 && a->wt != FST_DTYPE_F16 && a->wt != FST_DTYPE_F32) {
				cli_error("gen", "--dtype \"%s\": expected BF16, F16 or F32", optarg);
				return EXIT_USAGE;
			}
			break;
		case 'h': help(stdout); return EXIT_OK;
		default: help(stderr); return EXIT_USAGE;
		}
	}
	if (optind != argc - 1) {
		cli_error("gen", optind >= argc ? "no OUTDIR given" : "one OUTDIR expected");
		help(stderr);
		return EXIT_USAGE;
	}
	a->dir = argv[optind];
	if (!*a->dir) {
		cli_error("gen", "OUTDIR is empty");
		return EXIT_USAGE;
	}
	*done = false;
	return EXIT_OK;
}

/* The longest name gen makes inside DIR: "/.fst-gen-PID/" and a shard's
 * staged name, "model-NNNNN-of-NNNNN.safetensors.tmp". */
#define GEN_NAMES_MAX 80

/* dir, like mkdir -p: parents too. *made: the length of the first folder
 * this call created (0: none), for unmake_dirs. dir is shorter than
 * PATH_MAX - GEN_NAMES_MAX (cmd_gen checks). */
static int make_dirs(const char *dir, size_t *made)
{
	char part[PATH_MAX];
	snprintf(part, sizeof part, "%s", dir);
	*made = 0;
	for (char *p = part + 1;; p++) {
		if (*p && *p != '/')
			continue;
		char saved = *p;
		*p = '\0';
		if (mkdir(part, 0755) == 0) {
			if (!*made)
				*made = (size_t)(p - part);
		} else if (errno != EEXIST) {
			cli_error("gen", "%s: cannot create directory: %s", part, strerror(errno));
			return EXIT_IO;
		}
		*p = saved;
		if (!saved)
			return EXIT_OK;
	}
}

/* The folders make_dirs created for dir (made: the first one's length),
 * removed again, the deepest first: a failed run leaves no new folder. */
static void unmake_dirs(const char *dir, size_t made)
{
	char part[PATH_MAX];
	snprintf(part, sizeof part, "%s", dir);
	size_t n = strlen(part);
	while (made) {
		while (n > 1 && part[n - 1] == '/')
			part[--n] = '\0';
		/* every folder from the first made on was made by this run */
		if (n < made || rmdir(part))
			return;
		while (n && part[n - 1] != '/')
			n--;
		part[n] = '\0';
	}
}

/* Shard s of shards, tensors [first, next) of m, into stage; each named in
 * map. */
static int write_shard(const struct model *m, const char *stage, uint64_t s, uint64_t shards,
		       size_t first, size_t next, bool misaligned, json_t *map)
{
	char fname[64], path[4200];
	shard_name(fname, sizeof fname, s, shards);
	snprintf(path, sizeof path, "%s/%s", stage, fname);
	fst_writer_opts wo;
	fst_writer_opts_init(&wo);
	if (misaligned) {
		wo.data_align = 16;
		wo.header_extra = 8;
	}
	fst_writer *w;
	fst_error err;
	if (fst_writer_new(&wo, &w, &err)) {
		cli_error("gen", "%s", err.message);
		return cli_exit_code(err.code);
	}
	fst_writer_metadata(w, "format", "pt", NULL);
	int rc = EXIT_OK;
	for (size_t i = first; i < next && rc == EXIT_OK; i++) {
		struct gtensor *t = &m->t[i];
		if (fst_writer_add_fill(w, t->name, t->dtype, t->ndim, t->shape, fill, t, &err)) {
			cli_error("gen", "%s", err.message);
			rc = cli_exit_code(err.code);
		} else if (json_object_set_new(map, t->name, json_string(fname))) {
			rc = EXIT_NOMEM;
		}
	}
	if (rc == EXIT_OK && fst_writer_finish(w, path, &err)) {
		if (!interrupted)
			cli_error("gen", "%s", err.message);
		rc = cli_exit_code(err.code);
	}
	fst_writer_free(w);
	return rc;
}

/* Every shard of m (total bytes) into stage; *done counts those written. */
static int write_shards(const struct model *m, uint64_t total, const char *stage,
			uint64_t shards, bool misaligned, json_t *map, uint64_t *done)
{
	size_t next = 0;
	uint64_t written = 0;
	int rc = EXIT_OK;
	for (uint64_t s = 0; s < shards && rc == EXIT_OK; s++) {
		/* Shard s takes tensors until the running total nears its share,
		 * leaving at least one tensor for every later shard. */
		uint64_t target = total * (s + 1) / shards, later = shards - s - 1;
		size_t first = next;
		do {
			written += m->t[next++].nbytes;
		} while (next < m->n && (later == 0 || (m->n - next > later &&
						       written + m->t[next].nbytes / 2 <= target)));
		rc = write_shard(m, stage, s, shards, first, next, misaligned, map);
		if (rc == EXIT_OK)
			(*done)++;
	}
	return rc;
}

static int write_index(const char *stage, uint64_t total, json_t *map)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/model.safetensors.index.json", stage);
	json_t *index = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
				  "weight_map", json_incref(map));
	int rc = EXIT_OK;
	errno = 0;
	if (!index || json_dump_file(index, path, JSON_INDENT(2) | JSON_SORT_KEYS)) {
		cli_error("gen", "%s: cannot write%s%s", path, errno ? ": " : "",
			  errno ? strerror(errno) : "");
		rc = index ? EXIT_IO : EXIT_NOMEM;
	}
	json_decref(index);
	return rc;
}

static const int gen_signals[3] = {SIGINT, SIGTERM, SIGHUP};

static void catch_signals(struct sigaction old[3])
{
	struct sigaction sa = {0};
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	for (int k = 0; k < 3; k++)
		sigaction(gen_signals[k], &sa, &old[k]);
}

/* The end of a run whose writing ended with rc: the commit, which no signal
 * may cut short, so it waits until the end; or, after a failure or an
 * interruption, the staged files removed. Then the caller's signal
 * handling back. */
static int settle(const char *stage, const char *dir, uint64_t shards, uint64_t done_shards,
		  int rc, const struct sigaction old[3])
{
	sigset_t all, saved;
	sigfillset(&all);
	sigprocmask(SIG_BLOCK, &all, &saved);
	if (rc == EXIT_OK && !interrupted)
		rc = commit(stage, dir, shards);
	if (rc != EXIT_OK || interrupted)
		remove_staged(stage, done_shards, shards);
	rmdir(stage);
	if (interrupted && rc != EXIT_NOMEM && rc != EXIT_IO) {
		cli_error("gen", "interrupted: %s left as it was", dir);
		rc = EXIT_CANCELED;
	}
	for (int k = 0; k < 3; k++)
		sigaction(gen_signals[k], &old[k], NULL);
	sigprocmask(SIG_SETMASK, &saved, NULL);
	return rc;
}

static int gen_into(const struct gen_args *a);

int cmd_gen(int argc, char **argv)
{
	struct gen_args a;
	bool done;
	int rc = parse_args(argc, argv, &a, &done);
	if (done)
		return rc;
	/* every name gen makes fits: a longer one was cut short, and a folder
	 * of the cut name made */
	if (strlen(a.dir) >= PATH_MAX - GEN_NAMES_MAX) {
		cli_error("gen", "%.60s...: %s (%zu bytes; at most %d)", a.dir,
			  strerror(ENAMETOOLONG), strlen(a.dir), PATH_MAX - GEN_NAMES_MAX - 1);
		return EXIT_IO;
	}
	size_t made;
	rc = make_dirs(a.dir, &made);
	if (rc) {
		unmake_dirs(a.dir, made);
		return rc;
	}
	rc = gen_into(&a);
	if (rc != EXIT_OK)
		unmake_dirs(a.dir, made); /* only folders it made, and only empty ones */
	return rc;
}

/* The checkpoint of a into a.dir, which exists. */
static int gen_into(const struct gen_args *ap)
{
	struct gen_args a = *ap;
	int rc;
	struct model m = {0};
	if (build_model(&m, a.size, a.misaligned, a.seed, a.wt)) {
		cli_error("gen", "out of memory");
		free(m.t);
		return EXIT_NOMEM;
	}
	uint64_t shards = a.shards > m.n ? m.n : a.shards, total = 0;
	for (size_t i = 0; i < m.n; i++)
		total += m.t[i].nbytes;

	/*
	 * Shards are written under a hidden directory inside DIR (loads skip
	 * names starting with '.') and moved into place only once all of them
	 * are complete, the index last: an interrupted or failed run leaves
	 * DIR as it was, never a partial checkpoint that looks whole.
	 */
	char stage[PATH_MAX];
	snprintf(stage, sizeof stage, "%s/.fst-gen-%ld", a.dir, (long)getpid());
	if (mkdir(stage, 0755)) {
		cli_error("gen", "%s: cannot create directory: %s", stage, strerror(errno));
		free(m.t);
		return EXIT_IO;
	}
	struct sigaction old_sa[3];
	catch_signals(old_sa);
	double t0 = cli_now();
	json_t *map = json_object();
	rc = map ? EXIT_OK : EXIT_NOMEM;
	uint64_t done_shards = 0;
	if (rc == EXIT_OK)
		rc = write_shards(&m, total, stage, shards, a.misaligned, map, &done_shards);
	if (rc == EXIT_OK)
		rc = write_index(stage, total, map);
	rc = settle(stage, a.dir, shards, done_shards, rc, old_sa);
	json_decref(map);
	if (rc == EXIT_OK) {
		double dt = cli_now() - t0;
		char hb[32];
		printf("wrote %s: %" PRIu64 " shard%s, %zu tensors, %s in %.2f s%s\n", a.dir, shards,
		       shards == 1 ? "" : "s", m.n, cli_human_bytes(hb, sizeof hb, total), dt,
		       a.misaligned ? " (misaligned)" : "");
	}
	free(m.t);
	return rc;
}
