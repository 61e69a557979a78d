/*
 * gds_helpers.h - shared by the GPUDirect Storage tests (test_gds_*,
 * test_gds_probe), which run against two doubles: libcuda
 * (FST_CUDA_LIBRARY, tests/doubles/cuda_double.c) and libcufile
 * (FST_CUFILE_LIBRARY, tests/doubles/cufile_double.c). The doubles are
 * opened here too, for their counters: dlopen of the same path gives the
 * very library libfst loaded. The bodies are in gds_helpers.c, built into
 * fst_testlib.
 */
#ifndef FST_TEST_GDS_HELPERS_H
#define FST_TEST_GDS_HELPERS_H

#include "format.h"
#include "load_helpers.h"

#define KiB 1024ull

/* ---- the doubles' counters */

typedef struct gh_doubles {
	void *cufile, *cuda;
	long (*live_handles)(void);
	long (*live_bufs)(void);
	long (*reads)(void);
	long (*failed_reads)(void);
	long (*misuse)(void);
	long (*driver_opens)(void);
	long (*handle_registers)(void);
	long (*buf_registers)(void);
	long (*bytes)(void);
	long (*path_reads)(const char *substr);
	long (*forget_bufs)(void);
	long (*live_device)(void);
	long (*live_host)(void);
} gh_doubles;

/* Filled by gh_open_doubles. */
extern gh_doubles gh;
/* Whether this kernel allows io_uring (asked by gh_group_setup). */
extern bool gh_uring_ok;

/* A symbol of a double (exits when it lacks it). */
void *gh_sym(void *lib, const char *name);

/*
 * Open both doubles (FST_TEST_CUFILE_DOUBLE names the cuFile double even
 * where a test points FST_CUFILE_LIBRARY elsewhere). Returns 77 (skip) when
 * the environment ctest sets is missing, else 0.
 */
int gh_open_doubles(void);

/* Every switch of the cuFile double off; faults disarmed. */
void gh_switches_off(void);

/* ---- log capture */

/* Forget the lines captured so far. */
void gh_log_clear(void);

/* Capture every line from now on, down to level. */
void gh_log_capture(int level);

/* Lines at level (-1: any) containing a and b (NULL: anything). */
int gh_log_count(int level, const char *a, const char *b);
/* Print the captured lines to stderr. */
void gh_log_dump(const char *why);

/* Exactly `want` lines at level containing a and b. */
void gh_log_expect(int want, int level, const char *a, const char *b);

/* ---- resources: what is live between loads */

typedef struct gh_base {
	long handles, bufs, device, host, allocs, misuse;
	int fds;
} gh_base;

gh_base gh_snapshot(void);

/*
 * Everything is back to what it was: cuFile handles and buffer
 * registrations, device allocations, pinned blocks (after fst_trim),
 * libfst's host allocations and descriptors; and the double saw no misuse.
 */
void gh_assert_back(const gh_base *b, const char *when);

/* ---- options and checks */

fst_load_opts gh_opts(const char *device, int gds, int io, unsigned threads);

/* One view against the file's bytes: device, alignment, size, every byte.
 * No cmocka assertion inside when it passes; fails the test otherwise. */
void gh_check_view(const fst_checkpoint *ck, const lh_files *fs, const fst_tensor_view *v,
		   int device_id, uint32_t align);

/* Every tensor of ckpt is in buf with the file's bytes. */
void gh_check_buffer(const fst_checkpoint *ck, const lh_files *fs, fst_buffer *buf, int device_id,
		     uint32_t align);
/* N of "cuda:N" (0 for "cuda"). */
int gh_device_id(const char *device);

/* fst_load must succeed with every byte right; returns the buffer's
 * description in desc (desc_size bytes). */
void gh_load_ok(const fst_checkpoint *ck, const lh_files *fs, const fst_load_opts *o, char *desc,
		size_t desc_size);

/* The streaming form: every tensor is checked the moment it is handed out. */
void gh_stream_ok(const fst_checkpoint *ck, const lh_files *fs, const fst_load_opts *o);

/* fst_load must fail with code (and backend_code, unless -1) and a message
 * containing a and b, handing out nothing. */
void gh_load_fails(const fst_checkpoint *ck, const fst_load_opts *o, int code, int backend,
		   const char *a, const char *b);

/* The same through the streaming form: start fails, or next does (after
 * handing out only correct tensors), and finish hands out nothing. */
void gh_stream_fails(const fst_checkpoint *ck, const lh_files *fs, const fst_load_opts *o, int code,
		     const char *a);

/* ---- checkpoints */

/* Sum of the tensor bytes of file `file`. */
uint64_t gh_file_bytes(const fst_checkpoint *ck, size_t file);
/* "/<dir name>/NN.safetensors": how the double's per-path counters find a
 * shard whatever the real path of the test directory is (4 static buffers,
 * used in turn). */
const char *gh_shard_key(const char *name, size_t file);
/*
 * The shape that broke the first GDS loader: every shard's data section
 * starts 8 bytes past a 16-byte boundary (data_align 16, header_extra 8),
 * and odd-sized U8 tensors come before BF16 ones, so the BF16 tensors sit at
 * odd file offsets while their destinations are 256-aligned. salt changes
 * the bytes, not the layout.
 */
void gh_write_founding_salted(const char *name, unsigned nfiles, uint64_t seed, uint64_t salt,
			      lh_ckpt *c);
void gh_write_founding(const char *name, unsigned nfiles, uint64_t seed, lh_ckpt *c);

/* An open checkpoint and an independent copy of its files. */
typedef struct gh_fixture {
	lh_ckpt c;
	fst_checkpoint *ck;
	lh_files fs;
	const char *name;
} gh_fixture;

/* Open x->c (written already) as name. */
void gh_fixture_open(gh_fixture *x, const char *name);
/* Write a founding-shape checkpoint and open it, checking the shape. */
void gh_founding(gh_fixture *x, const char *name, unsigned nfiles, uint64_t seed);
/* Close x and remove its directory. */
void gh_fixture_close(gh_fixture *x);
void gh_setenv_long(const char *name, long v);

/* ---- the group */

/* Before each test: every switch off, the doubles' delays, log capture. */
int gh_reset(void **state);
/* Asks whether io_uring is usable. */
int gh_group_setup(void **state);
/* Stop capturing the log; nothing may be left live in either double and the
 * cuFile double saw no misuse (-1, said on stderr, otherwise). */
int gh_leftovers(void);
/* gh_leftovers, as a group teardown. */
int gh_group_teardown(void **state);

#endif
