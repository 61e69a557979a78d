/*
 * internal.h - helpers shared by libfst's modules; never installed.
 *
 * Cross-file internals are prefixed fsti_ and hidden by -fvisibility=hidden
 * and the version script, so they never clash with a caller's symbols.
 */
#ifndef FST_INTERNAL_H
#define FST_INTERNAL_H

#include "fst.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
/* Lets the compiler check format strings of our printf-like helpers. */
#define FSTI_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define FSTI_PRINTF(fmt, args)
#endif

#define FSTI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FSTI_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- errors (error.c) */

/* Fill err (when not NULL) and return code. */
int fsti_err(fst_error *err, int code, const char *fmt, ...) FSTI_PRINTF(3, 4);
/* Same, with the errno of a failed system call appended as ": strerror". */
int fsti_err_sys(fst_error *err, int code, int errnum, const char *fmt, ...) FSTI_PRINTF(4, 5);
/* Same, with a GPU library's code recorded in err->backend_code. */
int fsti_err_backend(fst_error *err, int code, int backend_code, const char *fmt, ...)
	FSTI_PRINTF(4, 5);
/* Reset err to "no error". */
void fsti_err_clear(fst_error *err);

/* Seconds on a monotonic clock (log.c). */
double fsti_now(void);

/* ---- logging (log.c) */

void fsti_log(int level, const char *fmt, ...) FSTI_PRINTF(2, 3);
bool fsti_log_enabled(int level);

/* ---- memory (mem.c): the one path for host allocations, so faults can be
 * injected and allocations counted in tests. */

void *fsti_malloc(size_t size);
void *fsti_calloc(size_t n, size_t size);
void *fsti_realloc(void *p, size_t size);
char *fsti_strdup(const char *s);
void fsti_free(void *p);
/* size bytes aligned to align (a power of two >= sizeof(void *)); release
 * with fsti_free. */
void *fsti_aligned_alloc(size_t align, size_t size);
/* Number of live fsti_* allocations (for leak tests). */
long fsti_live_allocations(void);

/* ---- fault injection (fault.c) */

/*
 * Returns 0 normally. When FST_FAULT (or fst_fault_set) asks for a failure at
 * this site on this call, returns the errno to fail with (EIO unless given).
 */
int fsti_fault(const char *site);

/* ---- a name -> index table (names.c) */

typedef struct fsti_names {
	uint32_t *slots; /* index + 1, or 0 for empty */
	size_t mask; /* slot count - 1; slot count is a power of two */
} fsti_names;

typedef const char *(*fsti_name_of)(const void *ctx, size_t index);

/* Build a table for count names; returns FST_ENOMEM or 0. On a duplicate,
 * returns 1 and stores the two indices in *dup_a < *dup_b. */
int fsti_names_build(fsti_names *t, size_t count, fsti_name_of name_of, const void *ctx,
		     size_t *dup_a, size_t *dup_b);
long fsti_names_find(const fsti_names *t, const char *name, fsti_name_of name_of,
		     const void *ctx);
void fsti_names_free(fsti_names *t);

/* ---- format (format.c) */

struct fsti_tensor {
	const char *name;
	fst_dtype dtype;
	uint32_t ndim;
	uint64_t *shape;
	uint64_t numel;
	uint64_t begin, end;
};

struct fst_file {
	char *path;
	int fd;               /* -1 for memory files */
	const uint8_t *mem;   /* memory files only */
	uint64_t size;        /* whole file */
	uint64_t data_offset; /* 8 + header length */
	/* identity, to detect a file replaced or changed during a load: the
	 * status change time moves on every write, even one that puts the
	 * modification time back (rsync --inplace -t, touch -d) */
	uint64_t dev, ino, mtime_ns, ctime_ns, nlink;
	size_t ntensors;
	struct fsti_tensor *tensors; /* sorted by (begin, end) */
	size_t nmeta;
	char **meta_keys, **meta_values;
	fsti_names by_name;
	char *arena; /* names, shapes: one allocation */
};

/*
 * Parse and validate a header. header/len is the JSON text (without the
 * 8-byte length), data_len the size of the data section. Fills f's tensor
 * table and metadata. name is used in messages.
 */
int fsti_parse_header(fst_file *f, const char *name, const char *header, size_t len,
		      uint64_t data_len, fst_error *err);

void fsti_tensor_info(const fst_file *f, size_t i, fst_tensor_info *out);

/* FST_ECHANGED (naming the file, when, and what moved) unless f's descriptor
 * still shows the size, modification and status change times it had when
 * it was opened; memory images always pass (file.c). */
int fsti_file_check_unchanged(const fst_file *f, const char *when, fst_error *err);
/* fsti_name_of over an fst_file's tensors (ctx is the file). */
const char *fsti_tensor_name_of(const void *ctx, size_t i);

/* Format "[3, 4]" into buf (truncated with "..." if long). */
void fsti_format_shape(char *buf, size_t size, uint32_t ndim, const uint64_t *shape);

#endif
