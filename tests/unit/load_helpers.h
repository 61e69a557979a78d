/*
 * load_helpers.h - shared by the loading tests (test_plan, test_engine_*,
 * test_stress, test_cuda_*, test_gds_*, ...): a seeded generator of random
 * checkpoints written with fst_writer, an independent reader of file bytes,
 * filters, a recorder of on_landed calls, resource counters and checked CPU
 * loads. The bodies are in load_helpers.c, load_landed.c and load_checks.c,
 * built into fst_testlib; only the generator's hot inner steps stay inline
 * here.
 */
#ifndef FST_TEST_LOAD_HELPERS_H
#define FST_TEST_LOAD_HELPERS_H

#include "helpers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
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

lh_shape lh_default_shape(void);

struct lh_fill_ctx {
	uint64_t key;
};

/* Tensor bytes: a function of the tensor's key and the position, so no two
 * tensors (and no two 8-byte words of one) look alike. */
int lh_fill(void *ctx, void *buf, uint64_t off, size_t len);

/* Pick a dtype and shape with about `bytes` bytes (exactly, for U8). */
void lh_pick_type(lh_rng *r, uint64_t bytes, fst_dtype *dt, uint32_t *ndim, uint64_t shape[4]);

typedef struct lh_ckpt {
	char dir[600];   /* the checkpoint's directory */
	char path[700];  /* what to open: the directory or its only shard */
	unsigned nfiles;
	size_t ntensors;
	uint64_t total_bytes;
} lh_ckpt;

/* Remove a directory and everything in it. */
void lh_rmdir(const char *dir);

/*
 * Write a random checkpoint into a fresh directory test_tmpdir()/name:
 * shards NN.safetensors with random tensors (0-byte, odd-sized, scalars,
 * sub-byte dtypes), random data alignment and header padding. Tensor names
 * are "fF.tT" (F the shard, T the tensor in that shard).
 */
void lh_write_random(const char *name, uint64_t seed, const lh_shape *sh, lh_ckpt *ck);
/* fst_checkpoint_open, failing the test on an error. */
fst_checkpoint *lh_open(const char *path);

/* ---- an independent copy of every file, read with plain read(2) */

typedef struct lh_files {
	size_t n;
	unsigned char **bytes;
	uint64_t *size;
} lh_files;

/* A whole file, read with read(2) (malloc'd; *size its length). */
unsigned char *lh_slurp(const char *path, uint64_t *size);
/* Every file of ck, in checkpoint order; lh_files_free frees them. */
void lh_files_read(const fst_checkpoint *ck, lh_files *fs);
void lh_files_free(lh_files *fs);
/* Drop ck's files' pages from the page cache (written back first: dirty
 * pages are not dropped). */
void lh_evict(const fst_checkpoint *ck);

/* The file bytes of checkpoint tensor i. */
const unsigned char *lh_expected(const fst_checkpoint *ck, const lh_files *fs, size_t i,
				 fst_tensor_info *info);

/* Compare n bytes; on a difference, fail naming the tensor and byte. */
void lh_assert_bytes(const char *what, const void *got, const void *want, uint64_t n);

/* ---- filters */

/* Keeps a tensor when a hash of its name and the seed falls under percent. */
typedef struct lh_filter {
	uint64_t seed;
	unsigned percent;
	unsigned calls;
} lh_filter;

uint64_t lh_hash_name(const char *s);
bool lh_keeps(const lh_filter *f, const char *name);
int lh_filter_fn(void *ctx, const char *name);

/* ---- on_landed: a recorder of every reported piece */

/* The block size a load uses for landed_block as given (0: the default). */
uint64_t lh_block_of(uint64_t landed_block);

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
void lh_landed_init(lh_landed *l, const fst_checkpoint *ck, unsigned char *const *bytes,
		    const lh_filter *flt, uint64_t block, bool whole_blocks);
void lh_landed_free(lh_landed *l);
/* The callback: fst_load_opts.on_landed with on_landed_ctx an lh_landed. */
int lh_on_landed(void *ctx, size_t tensor, uint64_t offset, const void *bytes, uint64_t len);

/* Every byte of tensor i reported (once: the callback checks that). */
bool lh_landed_complete(lh_landed *l, size_t i);

/* After a load that succeeded: no rule broken, and every byte of every
 * selected tensor reported exactly once (none of the others). */
void lh_landed_check(lh_landed *l, const char *ctx);

/* After a load whose on_landed l failed (fail_at, fail_rc), with o's
 * callback set to it: the load returned want with no buffer, its message
 * names the failing call's tensor and on_landed, and what was reported
 * before broke no rule. Frees l and clears o's callback. */
void lh_landed_check_failed(lh_landed *l, fst_load_opts *o, int rc, int want,
			    const fst_error *err, const fst_buffer *buf, const char *ctx);

/* ---- resources */

/* Open descriptors of this process (-1 without /proc). */
int lh_count_fds(void);

/*
 * A regression of a bug these tests found and that has been fixed: always
 * a failure, named so the history (docs/testing.md) can be found.
 */
void lh_known_bug(const char *id, const char *detail);

/* ---- CPU loads checked (load_checks.c) */

/* One view against checkpoint tensor `entry`: name, dtype, shape, size, the
 * CPU, alignment (unless mapped) and every byte. */
void lh_check_view(const fst_checkpoint *ck, const lh_files *fs, size_t entry,
		   const fst_tensor_view *v, uint32_t align, bool mapped, const char *ctx);
/* A whole buffer loaded with o: the tensors flt selects (NULL: all), in
 * checkpoint order, inside the one allocation and disjoint; counts, sizes,
 * fst_buffer_find and describe. */
void lh_check_buffer(const fst_checkpoint *ck, const lh_files *fs, fst_buffer *buf,
		     const fst_load_opts *o, const lh_filter *flt, const char *ctx);
/* The streaming form: each view checked the moment it is handed out, each
 * selected tensor exactly once; some views released before finish, the
 * others checked again after it. Returns the buffer from finish. */
fst_buffer *lh_load_streaming(const fst_checkpoint *ck, const lh_files *fs,
			      const fst_load_opts *o, const lh_filter *flt, const char *ctx);
/* fst_load and fst_load_start both refuse o with code and a message
 * containing needle, handing out nothing and leaving nothing allocated. */
void lh_expect_usage(const fst_checkpoint *ck, const fst_load_opts *o, int code,
		     const char *needle);
/* One shard of 96 BF16 tensors of 96 KiB (9 MiB), written once a process;
 * for cancelling and progress. */
const char *lh_big_path(void);

/* ---- the rest */

/* "pread", "uring", "mmap" or "auto". */
const char *lh_io_name(int io);

/* Does this kernel allow io_uring? A small CPU load says, once a process:
 * 1 yes, 0 no (FST_EUNSUPPORTED; a line on stderr says the uring cases are
 * skipped), -1 the load failed otherwise (said on stderr). For group set-ups;
 * lh_uring_usable fails the test on -1. */
int lh_uring_probe(void);
bool lh_uring_usable(void);
/* True for io=uring where there is no io_uring (a kernel that forbids it, or
 * qemu-user, which lacks the syscalls): the caller skips that case, as
 * lh_uring_probe said on stderr. */
bool lh_io_skipped(int io);

/* Seed of a test run: FST_TEST_SEED when set (to replay a failure), else
 * a fixed one so runs are reproducible. */
uint64_t lh_base_seed(void);

#endif
