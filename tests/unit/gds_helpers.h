/*
 * gds_helpers.h - shared by the GPUDirect Storage tests (test_gds,
 * test_gds_probe), which run against two doubles: libcuda
 * (FST_CUDA_LIBRARY, tests/doubles/cuda_double.c) and libcufile
 * (FST_CUFILE_LIBRARY, tests/doubles/cufile_double.c). The doubles are
 * opened here too, for their counters: dlopen of the same path gives the
 * very library libfst loaded. The bodies are in gds_helpers.c, built into
 * fst_testlib.
 */
#ifndef FST_TEST_GDS_HELPERS_H
#define FST_TEST_GDS_HELPERS_H

#include "internal.h"
#include "load_helpers.h"

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

#endif
