/*
 * base.h - what every module of libfst uses: errors, the clock, logging,
 * memory, fault injection, name tables, host memory, the environment,
 * the CPU's caches.
 * Depends on libc only; never installed (src/README.md).
 *
 * Cross-file internals are prefixed fsti_ and hidden by -fvisibility=hidden
 * and the version script, so they never clash with a caller's symbols.
 */
#ifndef FST_BASE_H
#define FST_BASE_H

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
/* secret (len bytes) where it stands right after the character lead, and
 * where trail is not 0 right before trail, written "***" in text (size
 * bytes, NUL-ended; cut short to fit). A short secret could be a piece of
 * another word: its neighbours say it is the secret. */
void fsti_text_hide(char *text, size_t size, char lead, const char *secret, size_t len,
		    char trail);
/* Hides secret so from every later log line of the process (as
 * fsti_text_hide does), whatever builds the line: a message naming a URL
 * with a password is logged as it is made, before anything hides it. False
 * when out of memory (the secret is then not kept). */
bool fsti_log_hide(char lead, const char *secret, size_t len, char trail);
/* bytes for a message: "N MiB" when a whole number of MiB, else "N KiB". */
void fsti_size_text(char *buf, size_t size, uint64_t bytes);

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

/* ---- the environment (env.c): every variable libfst reads, named and
 * explained there, and the library's one getenv. */

enum fsti_env {
	FSTI_ENV_LOG,             /* FST_LOG */
	FSTI_ENV_FAULT,           /* FST_FAULT */
	FSTI_ENV_CUDA_LIBRARY,    /* FST_CUDA_LIBRARY */
	FSTI_ENV_CUFILE_LIBRARY,  /* FST_CUFILE_LIBRARY */
	FSTI_ENV_NCCL_LIBRARY,    /* FST_NCCL_LIBRARY */
	FSTI_ENV_NVFS_DEVICES,    /* FST_NVFS_DEVICES */
	FSTI_ENV_CUFILE_JSON,     /* CUFILE_ENV_PATH_JSON */
	FSTI_ENV_GDS_TRY,         /* FST_GDS_TRY */
	FSTI_ENV_GDS,             /* FST_GDS */
	FSTI_ENV_DIST_TIMEOUT_MS, /* FST_DIST_TIMEOUT_MS */
	FSTI_ENV_DIST_GROUP_BYTES, /* FST_DIST_GROUP_BYTES */
	FSTI_ENV_UNIFIED,         /* FST_UNIFIED */
	FSTI_ENV_STAGING_PAGES,   /* FST_STAGING_PAGES */
	FSTI_ENV_URING_PAGE_CACHE, /* FST_URING_PAGE_CACHE */
	FSTI_ENV_READS_IN_FLIGHT, /* FST_READS_IN_FLIGHT */
	FSTI_ENV_WARM_DISK,       /* FST_WARM_DISK */
	FSTI_ENV_ALIGN_COPIES,    /* FST_ALIGN_COPIES */
	FSTI_ENV_CURL_LIBRARY,    /* FST_CURL_LIBRARY */
	/* remote sources (net/): the AWS SDKs' own variables, and HOME */
	FSTI_ENV_AWS_ACCESS_KEY_ID,
	FSTI_ENV_AWS_SECRET_ACCESS_KEY,
	FSTI_ENV_AWS_SESSION_TOKEN,
	FSTI_ENV_AWS_REGION,
	FSTI_ENV_AWS_DEFAULT_REGION,
	FSTI_ENV_AWS_PROFILE,
	FSTI_ENV_AWS_SHARED_CREDENTIALS_FILE,
	FSTI_ENV_AWS_CONFIG_FILE,
	FSTI_ENV_AWS_ENDPOINT_URL,
	FSTI_ENV_AWS_ENDPOINT_URL_S3,
	FSTI_ENV_AWS_NO_SIGN_REQUEST,
	FSTI_ENV_AWS_CA_BUNDLE,
	FSTI_ENV_CURL_CA_BUNDLE,
	FSTI_ENV_SSL_CERT_FILE,
	FSTI_ENV_HOME,
	FSTI_ENV_COUNT
};

/* The variable's value now; NULL when it is unset or empty. */
const char *fsti_env(enum fsti_env var);
/* "FST_LOG", for messages. */
const char *fsti_env_name(enum fsti_env var);
/* FST_GDS_TRY=1: open the cuFile driver even where the probe rules GDS out. */
bool fsti_env_gds_try(void);

/* ---- a name -> index table (names.c) */

typedef struct fsti_names {
	uint32_t *slots; /* index + 1, or 0 for empty */
	size_t mask; /* slot count - 1; slot count is a power of two */
	size_t count; /* names in it */
} fsti_names;

typedef const char *(*fsti_name_of)(const void *ctx, size_t index);

/* Build a table for count names (any table t held is not freed); returns
 * FST_ENOMEM or 0. On a duplicate, returns 1 and stores the two indices in
 * *dup_a < *dup_b. */
int fsti_names_build(fsti_names *t, size_t count, fsti_name_of name_of, const void *ctx,
		     size_t *dup_a, size_t *dup_b);
/* Add index to a table (zeroed, or built), growing it: 0, FST_ENOMEM, or 1
 * with *dup the index of an equal name already there. */
int fsti_names_insert(fsti_names *t, size_t index, fsti_name_of name_of, const void *ctx,
		      size_t *dup);
long fsti_names_find(const fsti_names *t, const char *name, fsti_name_of name_of,
		     const void *ctx);
/* The farthest any name sits from its hash's slot: the table's worst probe
 * (for tests). */
size_t fsti_names_longest_probe(const fsti_names *t, fsti_name_of name_of, const void *ctx);
void fsti_names_free(fsti_names *t);
/* SipHash-c-d of len bytes under the key (k0, k1). */
uint64_t fsti_siphash(int c, int d, uint64_t k0, uint64_t k1, const void *data, size_t len);

/* ---- options structs */

/* Whether an options struct's struct_size is one a released fst.h gave it:
 * a size between two fields' ends would mix the caller's bytes with the
 * defaults inside one field (half a pointer). released holds every size the
 * struct has had, oldest first. */
static inline bool fsti_struct_size_known(size_t struct_size, const size_t *released, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (struct_size == released[i])
			return true;
	return false;
}

/* ---- host memory (host_mem.c) */

/* The huge page transparent huge pages come in on x86-64 and most arm64
 * kernels. */
#define FSTI_HUGE_PAGE (2ull << 20)
/* Anonymous memory advised for huge pages, aligned to 2 MiB or align if
 * larger, a whole number of huge pages long; optionally page-locked.
 * *map_len receives the length to pass to fsti_host_free. */
int fsti_host_alloc(uint64_t size, uint64_t align, bool pinned, void **out, uint64_t *map_len,
		    fst_error *err);
void fsti_host_free(void *p, uint64_t map_len);
/* Faults len bytes at p (from fsti_host_alloc, not yet touched) in, on up
 * to threads threads at once; the bytes stay zero. */
void fsti_host_populate(void *p, uint64_t len, unsigned threads);

/* ---- sysfs: small files, the CPU's caches (cpu.c) */

/* The first line of a small file (sysfs, procfs), without its newline;
 * false when it cannot be read. */
bool fsti_read_first_line(const char *path, char *buf, size_t size);

/* The largest data or unified cache of the given level that the sysfs
 * folder dir lists (a CPU's .../cache: index0, index1, ... each with its
 * level, type and size), in bytes; 0 where none can be read. */
uint64_t fsti_cache_bytes_in(const char *dir, int level);
/* CPU 0's level-3 cache (one instance: on a machine of several, each
 * socket's own), in bytes; 0 where sysfs does not say. */
uint64_t fsti_l3_cache_bytes(void);

#endif
