/*
 * cuda_helpers.h - shared by the CUDA target's tests (test_cuda_*), which
 * run against the libcuda test double (FST_CUDA_LIBRARY,
 * tests/doubles/cuda_double.c). The double is opened here too, for its
 * counters and raw driver calls: dlopen of the same path gives the very
 * library libfst loaded. The bodies are in cuda_helpers.c, built into
 * fst_testlib. A test program runs its tests with ch_reset before each,
 * between ch_setup and ch_teardown, after ch_init:
 *
 *	int rc = ch_init();
 *	if (rc)
 *		return rc;
 *	...
 *	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
 */
#ifndef FST_TEST_CUDA_HELPERS_H
#define FST_TEST_CUDA_HELPERS_H

#include "format.h"
#include "load_helpers.h"

#define MiB (1ull << 20)
/* What the double's destinations hold until their queued copies run. */
#define POISON 0xDB

/* ---- the double, opened directly for its counters and raw driver calls */

typedef unsigned long long dptr;
/* Device allocations and pinned blocks live in the double. */
extern long (*ch_live_device)(void);
extern long (*ch_live_host)(void);
/* What was live when the test started: 0, unless a failed test before it
 * left something behind (then only that test reports it). */
extern long ch_device_base, ch_pinned_base;
/* Whether this kernel allows io_uring (asked by ch_setup). */
extern bool ch_uring_ok;

/* A symbol of the double (fails the test when it lacks it). */
void *ch_sym(const char *name);
/* The delay of each queued operation of the double, in microseconds. */
void ch_set_delay(const char *us);

/* Nothing of the double may be live, and libfst's own host allocations are
 * back to host_base. Pinned staging blocks are kept between loads until
 * fst_trim: a block that was not given back to that pool stays live past
 * it. Only between loads. */
void ch_assert_clean(const char *when, long host_base);

/* ---- random checkpoints */

typedef struct ch_gen {
	unsigned nfiles;
	unsigned extra;   /* random tensors per file besides one of every dtype */
	uint64_t max_big; /* largest tensor */
	unsigned big_percent;
} ch_gen;

/* The checkpoints most tests share. */
extern const ch_gen ch_big_gen, ch_small_gen;

typedef struct ch_ckpt {
	char dir[600];
	fst_checkpoint *ck;
	size_t nfiles;
	unsigned char **bytes; /* every file, read independently */
	uint64_t *sizes;
	long host_base;
} ch_ckpt;

/* A tensor of dtype dt with about `bytes` bytes (exactly, for byte-sized
 * dtypes); 0 bytes gives an empty shape, scalar a shape of no dimensions. */
void ch_add_tensor(fst_writer *w, lh_rng *r, const char *name, fst_dtype dt, uint64_t bytes,
		   bool scalar, struct lh_fill_ctx *k);
/* Layouts of the shards, in turn: the first one's data section starts at
 * 8 mod 16. */
void ch_writer_layout(unsigned f, fst_writer_opts *wo);
/* g->nfiles shards in test_tmpdir()/name, each with one small tensor of
 * every dtype and g->extra random ones (empty, scalars, big, odd-sized). */
void ch_write_random(const char *name, uint64_t seed, const ch_gen *g, ch_ckpt *c);
/* Open path into c, with an independent copy of its files and libfst's
 * allocation count; ch_close closes it and removes c->dir. */
void ch_open(ch_ckpt *c, const char *path);
void ch_close(ch_ckpt *c);
/* ch_write_random with ch_big_gen and ch_open, then its files evicted from
 * the page cache; whether they can be (residency told, and under half left):
 * the cold-load tests skip where not. */
bool ch_write_cold(const char *name, uint64_t seed, ch_ckpt *c);

/* ---- checking loaded tensors (no cmocka asserts in the *_check forms:
 * they are also used off the main thread) */

/* Compare one view with the file (device, alignment, dtype, shape, every
 * byte, and a piece from an offset); 0, or -1 with why filled. */
int ch_view_check(const ch_ckpt *c, const fst_tensor_view *v, int device_id, char *why,
		  size_t wn);
void ch_assert_view(const ch_ckpt *c, const fst_tensor_view *v, int device_id);
/* Every tensor of the buffer equals the file, and no two overlap. */
int ch_buffer_check(const ch_ckpt *c, fst_buffer *buf, int device_id, char *why, size_t wn);
void ch_assert_buffer(const ch_ckpt *c, fst_buffer *buf, int device_id);

/* Options for a load to device. */
void ch_opts(fst_load_opts *o, const char *device, int io, unsigned threads, uint64_t staging);

/* ---- loads of cold files (test_cuda_cold_auto) */

/* c loaded with o, whole (fst_load) or streamed (every view checked on
 * cuda:0 as it comes, then fst_loader_finish); the status, and the buffer
 * in *out, checked against the files when loaded. */
int ch_load_whole_or_streamed(const ch_ckpt *c, const fst_load_opts *o, bool stream,
			      fst_buffer **out, fst_error *err);
/* Fail the N-th call at site, N = 1, 2, ... until no call fails, in loads
 * of c onto cuda:0 (io=auto, 4 threads, chunk bytes), cold (evicted before
 * each) or warm (read into the page cache before each), with the
 * environment variable var set to value: each load fails with code, a
 * message and nothing left, or gives the files' bytes and a description
 * that contains says. Fails the test when no load failed. */
void ch_fault_loop(const ch_ckpt *c, bool cold, const char *var, const char *value,
		   uint64_t chunk, const char *site, int code, const char *says);
/* Each of the n values of var, a load of cold c onto cuda:0 (io=auto)
 * and its fst_load_explain: FST_EUSAGE with the variable and the value
 * quoted, no buffer. */
void ch_cold_bad_env(const ch_ckpt *c, const char *var, const char *const *bad, size_t n);
/* Loads of c onto cuda:0 (io=auto, chunk bytes, each of the n thread
 * counts), cold or warm as in ch_fault_loop, with var set to value and
 * copies slowed to 2 ms, each freed as soon as it started: each stops and
 * leaves nothing. */
void ch_freed_at_once(const ch_ckpt *c, bool cold, const char *var, const char *value,
		      uint64_t chunk, const unsigned *threads, size_t n);
/* c evicted from the page cache (cold), or read into it (warm: fails the
 * test when under half of it is then resident). */
void ch_temperature(const ch_ckpt *c, bool cold);

/* ---- set-up */

/* 77 (skip) when FST_CUDA_LIBRARY is not set (not run by ctest), else 0. */
int ch_init(void);
/* Group set-up: opens the double, asks whether io_uring is usable. */
int ch_setup(void **state);
/* Before each test: the double's defaults and no fault armed, whatever a
 * failed test before it left behind. */
int ch_reset(void **state);
/* Group teardown: nothing of the double may be left live. */
int ch_teardown(void **state);

#endif
