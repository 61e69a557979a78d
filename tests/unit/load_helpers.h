/*
 * load_helpers.h - shared by the loading tests (test_plan, test_engine,
 * test_engine_faults): a seeded generator of random checkpoints written with
 * fst_writer, an independent reader of file bytes, and resource counters.
 * Header-only (static inline) so the tests' CMake glob needs no change.
 */
#ifndef FST_TEST_LOAD_HELPERS_H
#define FST_TEST_LOAD_HELPERS_H

#include "helpers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- a small deterministic generator */

static inline uint64_t lh_mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

typedef struct lh_rng {
	uint64_t s;
} lh_rng;

static inline uint64_t lh_next(lh_rng *r)
{
	r->s += 0x9e3779b97f4a7c15ull;
	return lh_mix(r->s);
}

/* Uniform in [0, n) (n > 0). */
static inline uint64_t lh_below(lh_rng *r, uint64_t n)
{
	return lh_next(r) % n;
}

/* ---- random checkpoints */

/* How big and how varied a random checkpoint gets. */
typedef struct lh_shape {
	unsigned max_files;      /* 1..max_files shards */
	unsigned max_tensors;    /* 0..max_tensors per shard */
	uint64_t max_big;        /* largest "big" tensor, bytes */
	unsigned big_percent;    /* chance of a big tensor */
	unsigned empty_percent;  /* chance of a 0-byte tensor */
	bool allow_empty_files;  /* a shard may hold no tensor at all */
} lh_shape;

static inline lh_shape lh_default_shape(void)
{
	lh_shape s = {4, 12, 200000, 10, 12, true};
	return s;
}

struct lh_fill_ctx {
	uint64_t key;
};

/* Tensor bytes: a function of the tensor's key and the position, so no two
 * tensors (and no two 8-byte words of one) look alike. */
static inline int lh_fill(void *ctx, void *buf, uint64_t off, size_t len)
{
	const struct lh_fill_ctx *c = ctx;
	unsigned char *p = buf;
	for (size_t i = 0; i < len; i++) {
		uint64_t pos = off + i;
		p[i] = (unsigned char)(lh_mix(c->key ^ (pos >> 3) * 0x100000001b3ull) >>
				       (8 * (pos & 7)));
	}
	return 0;
}

/* Pick a dtype and shape with about `bytes` bytes (exactly, for U8). */
static inline void lh_pick_type(lh_rng *r, uint64_t bytes, fst_dtype *dt, uint32_t *ndim,
				uint64_t shape[4])
{
	switch (lh_below(r, 6)) {
	case 0: /* BF16 matrix */
		*dt = FST_DTYPE_BF16;
		*ndim = 2;
		shape[0] = 1 + lh_below(r, 8);
		shape[1] = bytes / 2 / shape[0];
		break;
	case 1: /* F32 vector */
		*dt = FST_DTYPE_F32;
		*ndim = 1;
		shape[0] = bytes / 4;
		break;
	case 2: /* a scalar */
		*dt = bytes & 1 ? FST_DTYPE_F64 : FST_DTYPE_I16;
		*ndim = 0;
		break;
	case 3: /* F4: two elements a byte */
		*dt = FST_DTYPE_F4;
		*ndim = 1;
		shape[0] = bytes * 2;
		break;
	default: /* U8 of any (odd) size */
		*dt = FST_DTYPE_U8;
		*ndim = 1;
		shape[0] = bytes;
		break;
	}
}

typedef struct lh_ckpt {
	char dir[600];   /* the checkpoint's directory */
	char path[700];  /* what to open: the directory or its only shard */
	unsigned nfiles;
	size_t ntensors;
	uint64_t total_bytes;
} lh_ckpt;

static inline void lh_rmdir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	size_t dl = strlen(dir);
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		size_t nl = strlen(e->d_name);
		char *p = malloc(dl + nl + 2);
		memcpy(p, dir, dl);
		p[dl] = '/';
		memcpy(p + dl + 1, e->d_name, nl + 1);
		if (unlink(p))
			lh_rmdir(p);
		free(p);
	}
	closedir(d);
	rmdir(dir);
}

/*
 * Write a random checkpoint into a fresh directory test_tmpdir()/name:
 * shards NN.safetensors with random tensors (0-byte, odd-sized, scalars,
 * sub-byte dtypes), random data alignment and header padding. Tensor names
 * are "fF.tT" (F the shard, T the tensor in that shard).
 */
static inline void lh_write_random(const char *name, uint64_t seed, const lh_shape *sh,
				   lh_ckpt *ck)
{
	lh_rng r = {seed};
	memset(ck, 0, sizeof *ck);
	snprintf(ck->dir, sizeof ck->dir, "%s/%s", test_tmpdir(), name);
	lh_rmdir(ck->dir);
	if (mkdir(ck->dir, 0755))
		fail_msg("mkdir %s: %s", ck->dir, strerror(errno));
	ck->nfiles = 1 + (unsigned)lh_below(&r, sh->max_files);
	char file[700] = "";
	for (unsigned f = 0; f < ck->nfiles; f++) {
		fst_writer_opts wo;
		fst_writer_opts_init(&wo);
		static const uint32_t aligns[] = {8, 8, 16, 64, 4096};
		wo.data_align = aligns[lh_below(&r, 5)];
		wo.header_extra = 8 * (uint32_t)lh_below(&r, 4);
		fst_writer *w;
		fst_error err;
		if (fst_writer_new(&wo, &w, &err))
			fail_msg("writer: %s", err.message);
		unsigned nt = (unsigned)lh_below(&r, sh->max_tensors + 1);
		if (!nt && !sh->allow_empty_files)
			nt = 1;
		struct lh_fill_ctx *ctxs = calloc(nt + 1, sizeof *ctxs);
		for (unsigned t = 0; t < nt; t++) {
			uint64_t bytes;
			unsigned dice = (unsigned)lh_below(&r, 100);
			if (dice < sh->empty_percent)
				bytes = 0;
			else if (dice < sh->empty_percent + sh->big_percent)
				bytes = 1 + lh_below(&r, sh->max_big);
			else if (dice < 60)
				bytes = 1 + lh_below(&r, 300);
			else
				bytes = 1 + lh_below(&r, 20000);
			fst_dtype dt;
			uint32_t ndim = 0;
			uint64_t shape[4] = {0};
			lh_pick_type(&r, bytes, &dt, &ndim, shape);
			if (!bytes && ndim == 0) {
				dt = FST_DTYPE_U8;
				ndim = 1;
				shape[0] = 0;
			}
			char tname[64];
			snprintf(tname, sizeof tname, "f%u.t%u", f, t);
			ctxs[t].key = lh_mix(seed * 1000003u + f * 1009u + t);
			if (fst_writer_add_fill(w, tname, dt, ndim, shape, lh_fill, &ctxs[t], &err))
				fail_msg("add %s: %s", tname, err.message);
			ck->ntensors++;
		}
		snprintf(file, sizeof file, "%s/%02u.safetensors", ck->dir, f);
		if (fst_writer_finish(w, file, &err))
			fail_msg("finish %s: %s", file, err.message);
		fst_writer_free(w);
		free(ctxs);
	}
	/* a single shard is sometimes opened as the file itself */
	if (ck->nfiles == 1 && lh_below(&r, 2))
		snprintf(ck->path, sizeof ck->path, "%s", file);
	else
		snprintf(ck->path, sizeof ck->path, "%s", ck->dir);
}

static inline fst_checkpoint *lh_open(const char *path)
{
	fst_checkpoint *ck = NULL;
	fst_error err;
	if (fst_checkpoint_open(path, &ck, &err))
		fail_msg("open %s: %s", path, err.message);
	return ck;
}

/* ---- an independent copy of every file, read with plain read(2) */

typedef struct lh_files {
	size_t n;
	unsigned char **bytes;
	uint64_t *size;
} lh_files;

static inline unsigned char *lh_slurp(const char *path, uint64_t *size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		fail_msg("open %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st))
		fail_msg("stat %s: %s", path, strerror(errno));
	unsigned char *b = malloc((size_t)st.st_size + 1);
	uint64_t done = 0;
	while (done < (uint64_t)st.st_size) {
		ssize_t n = read(fd, b + done, (size_t)st.st_size - done);
		if (n <= 0)
			fail_msg("read %s: %s", path, n ? strerror(errno) : "end of file");
		done += (uint64_t)n;
	}
	close(fd);
	*size = (uint64_t)st.st_size;
	return b;
}

static inline void lh_files_read(const fst_checkpoint *ck, lh_files *fs)
{
	fs->n = fst_checkpoint_file_count(ck);
	fs->bytes = calloc(fs->n + 1, sizeof *fs->bytes);
	fs->size = calloc(fs->n + 1, sizeof *fs->size);
	for (size_t i = 0; i < fs->n; i++)
		fs->bytes[i] = lh_slurp(fst_file_path(fst_checkpoint_file(ck, i)), &fs->size[i]);
}

static inline void lh_files_free(lh_files *fs)
{
	for (size_t i = 0; i < fs->n; i++)
		free(fs->bytes[i]);
	free(fs->bytes);
	free(fs->size);
	memset(fs, 0, sizeof *fs);
}

/* The file bytes of checkpoint tensor i. */
static inline const unsigned char *lh_expected(const fst_checkpoint *ck, const lh_files *fs,
					       size_t i, fst_tensor_info *info)
{
	size_t file;
	assert_int_equal(fst_checkpoint_tensor(ck, i, info, &file), 0);
	assert_true(file < fs->n);
	assert_true(info->file_offset + info->nbytes <= fs->size[file]);
	return fs->bytes[file] + info->file_offset;
}

/* Compare n bytes; on a difference, fail naming the tensor and byte. */
static inline void lh_assert_bytes(const char *what, const void *got, const void *want,
				   uint64_t n)
{
	if (!n || !memcmp(got, want, (size_t)n))
		return;
	const unsigned char *g = got, *w = want;
	uint64_t k = 0;
	while (g[k] == w[k])
		k++;
	fail_msg("%s: byte %" PRIu64 " of %" PRIu64 " differs: loaded 0x%02x, file 0x%02x", what,
		 k, n, g[k], w[k]);
}

/* ---- filters */

/* Keeps a tensor when a hash of its name and the seed falls under percent. */
typedef struct lh_filter {
	uint64_t seed;
	unsigned percent;
	unsigned calls;
} lh_filter;

static inline uint64_t lh_hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static inline bool lh_keeps(const lh_filter *f, const char *name)
{
	return lh_mix(lh_hash_name(name) ^ f->seed) % 100 < f->percent;
}

static inline int lh_filter_fn(void *ctx, const char *name)
{
	lh_filter *f = ctx;
	f->calls++;
	return lh_keeps(f, name);
}

/* ---- on_landed: a recorder of every reported piece */

/* The block size a load uses for landed_block as given (0: the default). */
static inline uint64_t lh_block_of(uint64_t landed_block)
{
	return landed_block ? landed_block : 256u << 10;
}

/*
 * The rules of fst_load_opts.on_landed, checked as pieces arrive (from any
 * reader thread, under lock): the tensor is a selected checkpoint tensor,
 * the piece is not empty, lies inside the tensor, crosses no multiple of
 * the block counted from the tensor's first byte (with whole_blocks, is a
 * whole block), equals the file's bytes and covers no byte twice. The
 * first broken rule is kept in problem (no cmocka asserts off the main
 * thread). fail_at makes that call (1-based, counted over the load) return
 * fail_rc; sleep_every slows every so many calls down, before they record.
 */
typedef struct lh_landed {
	pthread_mutex_t lock;
	size_t n;                   /* checkpoint tensors */
	const unsigned char **want; /* the file's bytes of each */
	uint64_t *nbytes;
	bool *selected;
	unsigned char **cov;        /* a count per byte of each selected tensor */
	uint64_t *reported;         /* bytes reported, per tensor */
	char **names;
	uint64_t block;             /* landed_block as given: 0 is 256 KiB */
	bool whole_blocks;
	unsigned long calls;
	unsigned long fail_at;
	int fail_rc;
	unsigned sleep_every;
	size_t failed_tensor;       /* the tensor of the call that returned fail_rc */
	char problem[512];
} lh_landed;

/* bytes[f]: an independent copy of checkpoint file f. flt NULL: all tensors. */
static inline void lh_landed_init(lh_landed *l, const fst_checkpoint *ck,
				  unsigned char *const *bytes, const lh_filter *flt,
				  uint64_t block, bool whole_blocks)
{
	memset(l, 0, sizeof *l);
	pthread_mutex_init(&l->lock, NULL);
	l->n = fst_checkpoint_tensor_count(ck);
	l->want = calloc(l->n + 1, sizeof *l->want);
	l->nbytes = calloc(l->n + 1, sizeof *l->nbytes);
	l->selected = calloc(l->n + 1, sizeof *l->selected);
	l->cov = calloc(l->n + 1, sizeof *l->cov);
	l->reported = calloc(l->n + 1, sizeof *l->reported);
	l->names = calloc(l->n + 1, sizeof *l->names);
	l->block = block;
	l->whole_blocks = whole_blocks;
	l->failed_tensor = SIZE_MAX;
	for (size_t i = 0; i < l->n; i++) {
		fst_tensor_info info;
		size_t file;
		assert_int_equal(fst_checkpoint_tensor(ck, i, &info, &file), 0);
		l->want[i] = bytes[file] + info.file_offset;
		l->nbytes[i] = info.nbytes;
		l->selected[i] = !flt || lh_keeps(flt, info.name);
		l->names[i] = strdup(info.name);
		if (l->selected[i])
			l->cov[i] = calloc(info.nbytes + 1, 1);
	}
}

static inline void lh_landed_free(lh_landed *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->cov[i]);
		free(l->names[i]);
	}
	free(l->want);
	free(l->nbytes);
	free(l->selected);
	free(l->cov);
	free(l->reported);
	free(l->names);
	pthread_mutex_destroy(&l->lock);
	memset(l, 0, sizeof *l);
}

static inline void lh_landed_problem(lh_landed *l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static inline void lh_landed_problem(lh_landed *l, const char *fmt, ...)
{
	if (l->problem[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->problem, sizeof l->problem, fmt, ap);
	va_end(ap);
}

static inline int lh_on_landed(void *ctx, size_t tensor, uint64_t offset, const void *bytes,
			       uint64_t len)
{
	lh_landed *l = ctx;
	pthread_mutex_lock(&l->lock);
	unsigned long k = ++l->calls;
	pthread_mutex_unlock(&l->lock);
	if (l->sleep_every && k % l->sleep_every == 0)
		usleep(200);
	pthread_mutex_lock(&l->lock);
	const uint64_t b = lh_block_of(l->block);
	if (tensor >= l->n || !l->selected[tensor]) {
		lh_landed_problem(l, "call %lu: tensor %zu %s", k, tensor,
				  tensor >= l->n ? "out of range" : "not selected");
	} else if (!len || !bytes) {
		lh_landed_problem(l, "call %lu: tensor %s: empty piece at byte %" PRIu64, k,
				  l->names[tensor], offset);
	} else if (offset > l->nbytes[tensor] || len > l->nbytes[tensor] - offset) {
		lh_landed_problem(l, "call %lu: tensor %s: [%" PRIu64 ", +%" PRIu64
				     ") past its %" PRIu64 " bytes",
				  k, l->names[tensor], offset, len, l->nbytes[tensor]);
	} else if (offset / b != (offset + len - 1) / b) {
		lh_landed_problem(l, "call %lu: tensor %s: [%" PRIu64 ", +%" PRIu64
				     ") crosses a multiple of the block %" PRIu64,
				  k, l->names[tensor], offset, len, b);
	} else if (l->whole_blocks &&
		   (offset % b || len != (l->nbytes[tensor] - offset < b
					     ? l->nbytes[tensor] - offset : b))) {
		lh_landed_problem(l, "call %lu: tensor %s: [%" PRIu64 ", +%" PRIu64
				     ") is not a whole block of %" PRIu64 " (%" PRIu64 " bytes)",
				  k, l->names[tensor], offset, len, b, l->nbytes[tensor]);
	} else {
		const unsigned char *got = bytes, *want = l->want[tensor] + offset;
		unsigned char *cov = l->cov[tensor] + offset;
		for (uint64_t i = 0; i < len; i++) {
			if (cov[i]++) {
				lh_landed_problem(l, "call %lu: tensor %s: byte %" PRIu64
						     " reported twice",
						  k, l->names[tensor], offset + i);
				break;
			}
			if (got[i] != want[i]) {
				lh_landed_problem(l, "call %lu: tensor %s: byte %" PRIu64
						     " reported as 0x%02x, the file has 0x%02x",
						  k, l->names[tensor], offset + i, got[i], want[i]);
				break;
			}
		}
		l->reported[tensor] += len;
	}
	int rc = 0;
	if (l->fail_at && k == l->fail_at) {
		l->failed_tensor = tensor;
		rc = l->fail_rc;
	}
	pthread_mutex_unlock(&l->lock);
	return rc;
}

/* Every byte of tensor i reported (once: the callback checks that). */
static inline bool lh_landed_complete(lh_landed *l, size_t i)
{
	pthread_mutex_lock(&l->lock);
	bool done = l->reported[i] == l->nbytes[i];
	pthread_mutex_unlock(&l->lock);
	return done;
}

/* After a load that succeeded: no rule broken, and every byte of every
 * selected tensor reported exactly once (none of the others). */
static inline void lh_landed_check(lh_landed *l, const char *ctx)
{
	if (l->problem[0])
		fail_msg("%s: on_landed: %s", ctx, l->problem);
	for (size_t i = 0; i < l->n; i++) {
		uint64_t want = l->selected[i] ? l->nbytes[i] : 0;
		if (l->reported[i] != want)
			fail_msg("%s: on_landed: tensor %s: %" PRIu64 " bytes reported, %" PRIu64
				 " expected",
				 ctx, l->names[i], l->reported[i], want);
		for (uint64_t k = 0; l->selected[i] && k < l->nbytes[i]; k++)
			if (l->cov[i][k] != 1)
				fail_msg("%s: on_landed: tensor %s: byte %" PRIu64
					 " reported %u times",
					 ctx, l->names[i], k, l->cov[i][k]);
	}
}

/* ---- resources */

static inline int lh_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static inline void lh_assert_has(const char *msg, const char *sub)
{
	if (!strstr(msg, sub))
		fail_msg("message \"%s\" lacks \"%s\"", msg, sub);
}

/* After a load whose on_landed l failed (fail_at, fail_rc), with o's
 * callback set to it: the load returned want with no buffer, its message
 * names the failing call's tensor and on_landed, and what was reported
 * before broke no rule. Frees l and clears o's callback. */
static inline void lh_landed_check_failed(lh_landed *l, fst_load_opts *o, int rc, int want,
					  const fst_error *err, const fst_buffer *buf,
					  const char *ctx)
{
	if (rc != want)
		fail_msg("%s: %d (%s), expected %d", ctx, rc, err->message, want);
	assert_int_equal(err->code, want);
	assert_null(buf);
	if (l->failed_tensor >= l->n)
		fail_msg("%s: the failing call was never made", ctx);
	char needle[96];
	snprintf(needle, sizeof needle, "tensor \"%s\"", l->names[l->failed_tensor]);
	lh_assert_has(err->message, needle);
	lh_assert_has(err->message, "on_landed");
	if (l->problem[0])
		fail_msg("%s: %s", ctx, l->problem);
	lh_landed_free(l);
	o->on_landed = NULL;
	o->on_landed_ctx = NULL;
}

/*
 * A regression of a bug these tests found and that has been fixed: always
 * a failure, named so the history (docs/testing.md) can be found.
 */
static inline void lh_known_bug(const char *id, const char *detail)
{
	fail_msg("regression %s: %s", id, detail);
}

/* Seed of a test run: FST_TEST_SEED when set (to replay a failure), else
 * a fixed one so runs are reproducible. */
static inline uint64_t lh_base_seed(void)
{
	const char *s = getenv("FST_TEST_SEED");
	return s && *s ? strtoull(s, NULL, 0) : 20240611u;
}

#endif
