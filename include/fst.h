/*
 * fst.h - load safetensors checkpoints into CPU or GPU memory, byte-exact.
 *
 * The only public header of libfst. Conventions:
 *  - Every exported symbol is fst_*, every macro and enum constant FST_*.
 *  - Fallible calls return 0 (FST_OK) or a negative FST_E* code and, when the
 *    caller passes an fst_error, fill it with a message that names the file,
 *    the tensor and the rule. errno is never the error channel.
 *  - Handles are opaque; every *_close / *_release / *_free accepts NULL.
 *  - Strings and arrays returned by accessors belong to the handle and live
 *    until it is closed.
 *  - Thread safety: a handle may be read from several threads at once; calls
 *    that modify a handle need external locking. Library-wide state is
 *    limited to the lazily loaded GPU library tables and the log settings.
 */
#ifndef FST_H
#define FST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FST_API __declspec(dllexport)
#else
#define FST_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------- version */

#define FST_VERSION_MAJOR 0
#define FST_VERSION_MINOR 1
#define FST_VERSION_PATCH 0
#define FST_VERSION_NUMBER \
	(FST_VERSION_MAJOR * 10000 + FST_VERSION_MINOR * 100 + FST_VERSION_PATCH)

/* The library's version as "MAJOR.MINOR.PATCH" (since 0.1). */
FST_API const char *fst_version(void);
/* FST_VERSION_NUMBER of the library actually linked (since 0.1). */
FST_API unsigned fst_version_number(void);

/* ----------------------------------------------------------------- errors */

/* Error codes. Values are pinned and never renumbered. */
enum fst_status {
	FST_OK = 0,
	FST_EUSAGE = -1,       /* a bad argument from the caller */
	FST_EFORMAT = -2,      /* the input breaks a safetensors or index rule */
	FST_EIO = -3,          /* a system call on a file failed */
	FST_ENOMEM = -4,       /* host memory could not be allocated or pinned */
	FST_EDEVICE = -5,      /* the GPU driver or a GPU library failed */
	FST_EUNSUPPORTED = -6, /* the platform cannot do what was asked */
	FST_ECANCELED = -7,    /* the operation was cancelled by the caller */
	FST_EMISMATCH = -8,    /* loaded bytes differ from the file's (verify) */
	FST_ECHANGED = -9,     /* a file changed while it was being read */
};

#define FST_ERROR_MSG_MAX 1024

/*
 * Details of a failure. Pass one to any fallible call (or NULL when only the
 * code matters). On failure, code is the returned status, message a complete
 * sentence such as
 *   model.safetensors: tensor "lm_head.weight": data_offsets [0, 96] but
 *   shape [3, 4] of F32 needs 48 bytes
 * sys_errno the errno of the failing system call (or 0) and backend_code the
 * CUresult / cuFile / NCCL code (or 0).
 */
typedef struct fst_error {
	int code;
	int sys_errno;
	int backend_code;
	char message[FST_ERROR_MSG_MAX];
} fst_error;

/* A short static description of a status code; never NULL (since 0.1). */
FST_API const char *fst_strerror(int code);

/* -------------------------------------------------------- fault injection */

/*
 * Arm deterministic failures for tests: "SITE:N[+][:ERRNO][,...]" fails the
 * N-th call at SITE (with "+", that call and every later one) with ERRNO
 * (default EIO). NULL or "" disarms. Counters restart at every call. The
 * environment variable FST_FAULT is read once, at the first fault check.
 * Sites: open, read, short_read, uring_submit, uring_complete, mmap, alloc,
 * host_alloc, pin, device_alloc, h2d, event, cufile_register, cufile_read,
 * nccl, prefetch (readahead advice refused: the load is only slower),
 * presence (the lock by which loads of the same files see each other
 * refused), thread (a load's worker thread does not start). Returns
 * FST_EUSAGE naming the problem for an unknown site or a bad spec (since 0.1).
 */
FST_API int fst_fault_set(const char *spec, fst_error *err);
/*
 * How many failures were injected since the rules were last set (by
 * fst_fault_set, or FST_FAULT at the first check); 0 when none. When buf is
 * not NULL it gets the most recent one as "site SITE, call N" ("" when
 * none), so that an error message can say its failure was injected, and
 * where. Thread safe (since 0.1).
 */
FST_API long fst_fault_last(char *buf, size_t size);

/* ---------------------------------------------------------------- logging */

enum fst_log_level {
	FST_LOG_ERROR = 0,
	FST_LOG_WARN = 1,
	FST_LOG_INFO = 2,
	FST_LOG_DEBUG = 3,
};

typedef void (*fst_log_fn)(void *ctx, int level, const char *message);

/*
 * Route log lines to fn (NULL restores the default: stderr, "fst: LEVEL:
 * message"). The level threshold defaults to FST_LOG=error|warn|info|debug
 * from the environment, else warn. Not thread safe against concurrent
 * loads; set it once at start-up (since 0.1).
 */
FST_API void fst_log_set_callback(fst_log_fn fn, void *ctx);
FST_API void fst_log_set_level(int level);
FST_API int fst_log_get_level(void);

/* ----------------------------------------------------------------- dtypes */

/* Element types. Values are pinned. */
typedef enum fst_dtype {
	FST_DTYPE_INVALID = 0,
	FST_DTYPE_BOOL,
	FST_DTYPE_U8,
	FST_DTYPE_I8,
	FST_DTYPE_F8_E4M3,
	FST_DTYPE_F8_E5M2,
	FST_DTYPE_F8_E8M0,
	FST_DTYPE_F8_E4M3FNUZ,
	FST_DTYPE_F8_E5M2FNUZ,
	FST_DTYPE_I16,
	FST_DTYPE_U16,
	FST_DTYPE_F16,
	FST_DTYPE_BF16,
	FST_DTYPE_I32,
	FST_DTYPE_U32,
	FST_DTYPE_F32,
	FST_DTYPE_I64,
	FST_DTYPE_U64,
	FST_DTYPE_F64,
	FST_DTYPE_C64,
	FST_DTYPE_F4,
	FST_DTYPE_F6_E2M3,
	FST_DTYPE_F6_E3M2,
	FST_DTYPE_COUNT /* one past the last valid dtype */
} fst_dtype;

/* The file's spelling ("BF16"); "INVALID" for unknown values (since 0.1). */
FST_API const char *fst_dtype_name(fst_dtype dtype);
/* Bits per element (4 for F4, 6 for F6_*); 0 for unknown values (since 0.1). */
FST_API unsigned fst_dtype_bits(fst_dtype dtype);
/* Parse a dtype spelling, case-sensitive; FST_DTYPE_INVALID if unknown (since 0.1). */
FST_API fst_dtype fst_dtype_from_name(const char *name);

/* ------------------------------------------------------------------ files */

/* Header size limit enforced by the format, as the reference reader does. */
#define FST_HEADER_MAX 100000000u

/* One tensor of a file, as its header describes it. */
typedef struct fst_tensor_info {
	const char *name;
	fst_dtype dtype;
	uint32_t ndim;
	const uint64_t *shape; /* ndim entries; NULL when ndim == 0 (a scalar) */
	uint64_t numel;        /* product of shape (1 for a scalar) */
	uint64_t nbytes;       /* end - begin */
	uint64_t begin, end;   /* data_offsets, relative to the data section */
	uint64_t file_offset;  /* absolute offset of the first byte in the file */
} fst_tensor_info;

typedef struct fst_file fst_file;

/*
 * Open and validate a safetensors file. Every rule of the format is checked
 * before this returns (see docs/design.md, "Format rules"); the data section
 * is not read. The file stays open (read-only) until fst_file_close. path
 * may be a URL (see "remote sources" below) (since 0.1).
 */
FST_API int fst_file_open(const char *path, fst_file **out, fst_error *err);

/*
 * Like fst_file_open, from an open descriptor. The descriptor is duplicated:
 * the caller keeps ownership of fd. name is used in messages (NULL: "<fd N>")
 * (since 0.1).
 */
FST_API int fst_file_open_fd(int fd, const char *name, fst_file **out, fst_error *err);

/*
 * Validate a whole safetensors file held in memory (header and data). The
 * bytes are not copied: they must outlive the handle. name is used in
 * messages (NULL: "<memory>") (since 0.1).
 */
FST_API int fst_file_open_memory(const void *data, size_t size, const char *name,
				 fst_file **out, fst_error *err);

FST_API void fst_file_close(fst_file *file);

/* The path or name given at open; a URL with its password and query shown
 * as "***" (since 0.1). */
FST_API const char *fst_file_path(const fst_file *file);
/* Size of the whole file in bytes (since 0.1). */
FST_API uint64_t fst_file_size(const fst_file *file);
/* Offset of the data section: 8 + header length (since 0.1). */
FST_API uint64_t fst_file_data_offset(const fst_file *file);
/* The file's descriptor, or -1 for memory files; owned by the handle (since 0.1). */
FST_API int fst_file_fd(const fst_file *file);
/* The bytes of a memory file, or NULL (since 0.1). */
FST_API const void *fst_file_memory(const fst_file *file);

/* Number of tensors (since 0.1). */
FST_API size_t fst_file_tensor_count(const fst_file *file);
/*
 * Tensor i, in order of data offset (0 <= i < count). Returns FST_EUSAGE when
 * i is out of range (since 0.1).
 */
FST_API int fst_file_tensor(const fst_file *file, size_t i, fst_tensor_info *out);
/* Index of the tensor called name, or -1 (since 0.1). */
FST_API long fst_file_find(const fst_file *file, const char *name);

/* Number of __metadata__ entries (since 0.1). */
FST_API size_t fst_file_metadata_count(const fst_file *file);
/* 1 where the header has a __metadata__ object, even an empty one; 0 where
 * it has none (or null) (since 0.1). */
FST_API int fst_file_has_metadata(const fst_file *file);
/* Entry i of __metadata__, in the order of the header (since 0.1). */
FST_API int fst_file_metadata(const fst_file *file, size_t i, const char **key,
			      const char **value);
/* The value of __metadata__[key], or NULL (since 0.1). */
FST_API const char *fst_file_metadata_get(const fst_file *file, const char *key);

/* ------------------------------------------------------------ checkpoints */

/*
 * A checkpoint is one or more safetensors files seen as one tensor table:
 * a single file, a directory, or a model.safetensors.index.json.
 *
 * A directory with exactly one *.safetensors.index.json uses it; otherwise
 * every *.safetensors file in it, in name order. An index is advisory but
 * checked: every shard it names must exist and be valid, every mapped tensor
 * must be in its shard, and no tensor name may appear in two shards. Tensors
 * present in a shard but missing from the map are kept, with a warning.
 * path may be a URL of any of these, an S3 folder listed as a directory
 * (see "remote sources" below).
 */
typedef struct fst_checkpoint fst_checkpoint;

FST_API int fst_checkpoint_open(const char *path, fst_checkpoint **out, fst_error *err);
/* Make a checkpoint of files already open; takes ownership of every file,
 * also on failure (since 0.1). */
FST_API int fst_checkpoint_from_files(fst_file **files, size_t count, fst_checkpoint **out,
				      fst_error *err);
FST_API void fst_checkpoint_close(fst_checkpoint *ckpt);

/* The path given at open; a URL with its password and query shown as "***"
 * (since 0.1). */
FST_API const char *fst_checkpoint_path(const fst_checkpoint *ckpt);
/* The index file used, or NULL; a URL shown as by fst_checkpoint_path
 * (since 0.1). */
FST_API const char *fst_checkpoint_index_path(const fst_checkpoint *ckpt);
/* path as fst shows it, into out (size bytes, NUL-ended, cut to fit; out
 * may be NULL when size is 0): an http(s) URL's password (its user info
 * whole where that has no ':', a token given as the user) and query as
 * "***", anything else as given; for naming an input that could not be
 * opened. Returns the length of the whole text, as snprintf does (since
 * 0.1). */
FST_API size_t fst_display_path(const char *path, char *out, size_t size);
FST_API size_t fst_checkpoint_file_count(const fst_checkpoint *ckpt);
/* File i; owned by the checkpoint (since 0.1). */
FST_API const fst_file *fst_checkpoint_file(const fst_checkpoint *ckpt, size_t i);
/* Tensors of all files: file by file, each in data-offset order (since 0.1). */
FST_API size_t fst_checkpoint_tensor_count(const fst_checkpoint *ckpt);
/* Tensor i of the whole table and the index of its file (file_index may be NULL)
 * (since 0.1). */
FST_API int fst_checkpoint_tensor(const fst_checkpoint *ckpt, size_t i, fst_tensor_info *out,
				  size_t *file_index);
/* Index in the whole table of the tensor called name, or -1 (since 0.1). */
FST_API long fst_checkpoint_find(const fst_checkpoint *ckpt, const char *name);
/* Sum of all tensors' bytes (since 0.1). */
FST_API uint64_t fst_checkpoint_total_bytes(const fst_checkpoint *ckpt);

/* ------------------------------------------------------- remote sources */

/*
 * Everywhere a path is taken, a URL may be given too (docs/remote.md):
 *   s3://BUCKET/KEY.safetensors, s3://BUCKET/PREFIX/ (the objects listed
 *   there, as a directory's files), s3://BUCKET/PREFIX/model.safetensors.index.json,
 *   http(s)://HOST/PATH/model.safetensors or .../model.safetensors.index.json.
 * They are read with libcurl, opened at run time (libcurl.so.4, or
 * FST_CURL_LIBRARY): without it a URL fails with FST_EUNSUPPORTED naming the
 * library. S3 requests are signed (AWS SigV4) with the credentials that the
 * AWS SDKs would find; a load reads each file with parallel ranged GETs,
 * each checked against the object's ETag, size and Last-Modified, so an
 * object that changes during a load is FST_ECHANGED, never wrong bytes.
 * HTTP 404 is FST_EIO with sys_errno ENOENT, 401 and 403 FST_EIO with
 * EACCES, other failures FST_EIO once the retries are spent.
 */

/* S3 addressing. */
enum fst_s3_addressing {
	FST_S3_AUTO = 0,    /* path-style with an endpoint, virtual-hosted on AWS */
	FST_S3_PATH = 1,    /* ENDPOINT/BUCKET/KEY */
	FST_S3_VIRTUAL = 2, /* BUCKET.ENDPOINT-HOST/KEY */
};

/* How remote files are reached; every field left 0 or NULL takes the
 * environment's setting, else the default. Local paths ignore them all. */
typedef struct fst_open_opts {
	size_t struct_size;     /* set by fst_open_opts_init */
	/* S3 endpoint URL, e.g. "http://127.0.0.1:9000"; NULL:
	 * AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else AWS's for the region */
	const char *endpoint;
	/* NULL: AWS_REGION, AWS_DEFAULT_REGION, the profile's, else us-east-1 */
	const char *region;
	/* NULL: AWS_PROFILE, else "default" */
	const char *profile;
	/* nonzero: never sign (public buckets). 0: unsigned where
	 * AWS_NO_SIGN_REQUEST is true or 1, or where no credentials are found */
	int unsigned_requests;
	int addressing;         /* enum fst_s3_addressing */
	/* CA bundle for https; NULL: AWS_CA_BUNDLE, CURL_CA_BUNDLE,
	 * SSL_CERT_FILE, else libcurl's own */
	const char *ca_bundle;
	/* Retries of a failed request (HTTP 429 or 5xx, a dropped or reset
	 * connection, a stall) in a row; an attempt that brings bytes starts
	 * the count again: 0 = 5; -1 = none. */
	int retries;
	/* Bound on one request's retries together, backoff included, from its
	 * first failed attempt, whatever bytes later attempts bring: no retry
	 * starts past it. 0 = 60 s */
	unsigned retry_time_ms;
	unsigned connect_timeout_ms; /* 0 = 10 s */
	/* A transfer below 1 KiB/s for this long fails (and is retried): 0 = 30 s */
	unsigned stall_timeout_ms;
	/* One attempt of one request that runs longer than this fails (and is
	 * retried, resuming after the bytes it brought), however steadily its
	 * bytes come: 0 = the connect and stall timeouts plus 1 s for every
	 * 64 KiB asked (2 min 48 s for an 8 MiB request with their defaults).
	 * A server trickling just above the stall rate would otherwise hold a
	 * request for hours (since 0.1). */
	unsigned request_timeout_ms;
} fst_open_opts;

/* Fill opts with the defaults (since 0.1). */
FST_API void fst_open_opts_init(fst_open_opts *opts);
/* fst_checkpoint_open with options for remote files (opts NULL: defaults)
 * (since 0.1). */
FST_API int fst_checkpoint_open_ex(const char *path, const fst_open_opts *opts,
				   fst_checkpoint **out, fst_error *err);
/* fst_file_open with options for remote files (opts NULL: defaults) (since 0.1). */
FST_API int fst_file_open_ex(const char *path, const fst_open_opts *opts, fst_file **out,
			     fst_error *err);
/* Nonzero for a file opened from a URL (since 0.1). */
FST_API int fst_file_is_remote(const fst_file *file);
/*
 * Read len bytes of the file from byte offset into dst: pread for files,
 * a copy for memory images, ranged GETs for remote files (checked as a
 * load's are). Past the end, or a file that changed, is FST_ECHANGED
 * (since 0.1).
 */
FST_API int fst_file_read(const fst_file *file, uint64_t offset, void *dst, uint64_t len,
			  fst_error *err);

/* ----------------------------------------------------------------- writer */

enum fst_writer_order {
	FST_ORDER_GIVEN = 0,     /* tensors in the order they were added */
	FST_ORDER_ALIGNMENT = 1, /* largest power-of-two size divisor first, then
	                          * by name: keeps as many tensors aligned as the
	                          * sizes allow */
};

typedef struct fst_writer_opts {
	size_t struct_size; /* set by fst_writer_opts_init */
	/* The data section starts at a multiple of this (a power of two, 8 to
	 * 1 MiB); the header is padded with spaces. Default 8. */
	uint32_t data_align;
	/* Extra bytes added to the data offset (beyond data_align), still as
	 * header spaces; must be a multiple of 8. Lets tests make headers whose
	 * length is 8 mod 16, for example. Default 0. */
	uint32_t header_extra;
	int order; /* enum fst_writer_order, default FST_ORDER_GIVEN */
} fst_writer_opts;

FST_API void fst_writer_opts_init(fst_writer_opts *opts);

/*
 * Fills buf with len bytes of a tensor's data starting at byte offset off of
 * that tensor; returns 0 or a negative FST_E* code.
 */
typedef int (*fst_fill_fn)(void *ctx, void *buf, uint64_t off, size_t len);

typedef struct fst_writer fst_writer;

/* Start a writer. Nothing is written until fst_writer_finish (since 0.1). */
FST_API int fst_writer_new(const fst_writer_opts *opts, fst_writer **out, fst_error *err);
FST_API void fst_writer_free(fst_writer *w);

/*
 * Add a tensor whose bytes are at data (nbytes must equal the size its dtype
 * and shape need). data is referenced, not copied: keep it until finish.
 * FST_EUSAGE for a name added before, not valid UTF-8 or "__metadata__", or
 * a tensor that would take the total past 2^63 - 1 bytes (since 0.1).
 */
FST_API int fst_writer_add(fst_writer *w, const char *name, fst_dtype dtype, uint32_t ndim,
			   const uint64_t *shape, const void *data, uint64_t nbytes,
			   fst_error *err);
/* Add a tensor whose bytes are produced by fill at finish (since 0.1). */
FST_API int fst_writer_add_fill(fst_writer *w, const char *name, fst_dtype dtype, uint32_t ndim,
				const uint64_t *shape, fst_fill_fn fill, void *ctx,
				fst_error *err);
/* Set __metadata__[key] = value; key and value both NULL: write
 * __metadata__ even with no entries, as {} (as the reference writer does
 * for metadata={}) (since 0.1). */
FST_API int fst_writer_metadata(fst_writer *w, const char *key, const char *value,
				fst_error *err);
/*
 * Write the file to path (created or replaced; written to a temporary of its
 * own beside it, path.tmp.XXXXXXXX, then renamed, so a failed write leaves no
 * partial file under path, and writers finishing one path at once each
 * succeed) (since 0.1).
 */
FST_API int fst_writer_finish(fst_writer *w, const char *path, fst_error *err);
/*
 * The size in bytes of the file the writer would write now: header and data
 * (since 0.1).
 */
FST_API int fst_writer_size(fst_writer *w, uint64_t *size, fst_error *err);
/*
 * Write the whole file, exactly as fst_writer_finish would, into dst, which
 * holds size bytes: fst_writer_size's answer, or FST_EUSAGE (since 0.1).
 */
FST_API int fst_writer_finish_memory(fst_writer *w, void *dst, uint64_t size,
				     fst_error *err);

/* ---------------------------------------------------------------- loading */

enum fst_io {
	FST_IO_AUTO = 0,  /* pread when the files are in the page cache; cold files
			   * onto a GPU or into host memory: uring, 512 KiB chunks,
			   * 8 threads, except where another fst load reads the
			   * same files (replicas): then through the page cache,
			   * shared; into unified memory, or with readahead_bytes
			   * set: pread with readahead */
	FST_IO_PREAD = 1, /* a pool of threads calling pread */
	FST_IO_URING = 2, /* io_uring with O_DIRECT (buffered where refused) */
	FST_IO_MMAP = 3,  /* CPU only: views straight into read-only file mappings */
};

enum fst_gds {
	FST_GDS_AUTO = 0, /* cuFile only where real peer-to-peer DMA is available */
	FST_GDS_ON = 1,   /* cuFile or fail, with the probe's reasons */
	FST_GDS_OFF = 2,  /* never touch cuFile */
};

/* CUDA targets on unified-memory machines (docs/platforms.md). */
enum fst_unified {
	FST_UNIFIED_AUTO = 0, /* one copy into mapped host memory on integrated GPUs
	                       * (DGX Spark, Jetson); the discrete path elsewhere */
	FST_UNIFIED_ON = 1,   /* unified memory on integrated or coherent (GH200) GPUs,
	                       * or fail with the reason */
	FST_UNIFIED_OFF = 2,  /* always the discrete path: device memory, staged copies */
};

/* Device kinds; the values are DLPack's (kDLCPU, kDLCUDA). */
enum fst_device_type {
	FST_DEVICE_CPU = 1,
	FST_DEVICE_CUDA = 2,
};

/*
 * A caller's memory for the destination buffer. alloc returns size bytes
 * aligned to at least `align` on the given device (host memory for
 * FST_DEVICE_CPU, a device pointer for FST_DEVICE_CUDA), or NULL; free gives
 * it back when the buffer's last reference is released.
 */
typedef struct fst_allocator {
	void *(*alloc)(void *ctx, uint64_t size, uint32_t align, int device_type, int device_id);
	void (*free)(void *ctx, void *ptr, uint64_t size, int device_type, int device_id);
	void *ctx;
} fst_allocator;

typedef struct fst_load_opts {
	size_t struct_size;        /* set by fst_load_opts_init */
	const char *device;        /* "cpu" (default), "cuda" or "cuda:N" */
	int io;                    /* enum fst_io, default FST_IO_AUTO */
	int gds;                   /* enum fst_gds, default FST_GDS_AUTO; left at auto,
	                            * FST_GDS=auto|on|off from the environment decides */
	unsigned threads;          /* reader threads; 0 = one per CPU, at most 16
					(page cache onto a GPU: at most 12; cold
					files read ahead: 16 at least; cold files
					onto a GPU under FST_IO_AUTO: 8) */
	uint64_t chunk_bytes;      /* bytes per read; 0 = default (docs/design.md;
					cold files onto a GPU under FST_IO_AUTO:
					512 KiB) */
	uint64_t staging_bytes;    /* host staging budget; 0 = 128 MiB for page-cache
	                            * reads (64 MiB onto a GPU where the CPU's L3
	                            * holds less than 256 MiB), 256 MiB for O_DIRECT */
	uint32_t align;            /* alignment of every tensor; 0 = 256; power of two */
	int pinned;                /* CPU target: page-lock the destination */
	/* Keep only the tensors for which filter returns nonzero (NULL: all). */
	int (*filter)(void *ctx, const char *name);
	void *filter_ctx;
	/* Called from the thread that waits for the load (in fst_loader_finish,
	 * and in fst_loader_next while it waits for a tensor), at most every
	 * 100 ms in each wait, and once at the end with done == total. */
	void (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
	const fst_allocator *allocator; /* NULL: libfst allocates */
	/*
	 * Called from the reader threads, concurrently and in no particular
	 * order, as bytes pass through host memory: len bytes of checkpoint
	 * tensor `tensor` (its index for fst_checkpoint_tensor), from byte
	 * `offset` of that tensor, readable at `bytes` during the call only.
	 * On the CPU that is their final place; for a GPU, the host staging
	 * they are copied from. A piece never crosses a multiple of
	 * landed_block counted from the tensor's first byte, and reads are cut
	 * there too, so its bytes are still in the CPU's caches: the place to
	 * hash them on the way (`fst load --check` does). Each byte is
	 * reported at most once and before its tensor is ready; bytes that
	 * never pass through host memory (io=mmap, GPUDirect) are not
	 * reported. A nonzero return (an FST_E* code) fails the load. Not
	 * supported by fst_load_sharded.
	 */
	int (*on_landed)(void *ctx, size_t tensor, uint64_t offset, const void *bytes,
			 uint64_t len);
	void *on_landed_ctx;
	uint64_t landed_block; /* 0 = 256 KiB; a power of two, 4 KiB to 1 GiB */
	/*
	 * FST_IO_MMAP only: map the files private and writable, copy-on-write.
	 * The tensors can then be written like any memory; a page written
	 * becomes this process's own copy and the file never changes. Pages
	 * not written are the page cache's, as with shared mappings (since 0.1).
	 */
	int mmap_private;
	/*
	 * CUDA targets: enum fst_unified, default FST_UNIFIED_AUTO; left at
	 * auto, FST_UNIFIED=auto|on|off from the environment decides. A unified
	 * load reads each byte once, straight into host memory mapped for the
	 * GPU (cuMemHostAlloc with DEVICEMAP), and its views are that memory's
	 * device addresses; there is no device allocation, staging or copy, and
	 * no cuFile. It cannot use a caller's allocator: auto then takes the
	 * discrete path, on fails (since 0.1).
	 */
	int unified;
	/*
	 * Cold files read through the page cache (io=pread, or io=auto where it
	 * reads that way: when readahead_bytes is set, and into unified memory;
	 * on files mostly not in the page cache): how many
	 * bytes ahead of the readers the kernel is asked to fetch
	 * (posix_fadvise WILLNEED), so storage sees deep queues without pinned
	 * staging to match. 0 = default (1 GiB), FST_READAHEAD_OFF = never.
	 * Ignored for files in the page cache and for O_DIRECT (since 0.1).
	 */
	uint64_t readahead_bytes;
	/*
	 * How the reader threads share the work. 0 or FST_STREAM_OFF: every
	 * thread takes the next chunk in file order from one queue, so the
	 * storage sees one stream. Otherwise each thread reads a stretch of
	 * this many bytes in order before taking the next stretch, so the
	 * storage sees one sequential stream per thread; a thread with no
	 * stretch left helps finish the one with the most left. Cold files
	 * read with readahead: each stream asks ahead its share of
	 * readahead_bytes (docs/design.md, "Cold reads"). At least one
	 * chunk (since 0.1).
	 */
	uint64_t stream_bytes;
} fst_load_opts;

#define FST_READAHEAD_OFF UINT64_MAX
#define FST_STREAM_OFF UINT64_MAX

/* Fill opts with the defaults (since 0.1). */
FST_API void fst_load_opts_init(fst_load_opts *opts);

/*
 * The loaded tensors: one allocation (on the CPU or one GPU) holding every
 * tensor at an address aligned to opts.align, or, for FST_IO_MMAP, read-only
 * file mappings. Reference-counted; freed when the last reference goes.
 */
typedef struct fst_buffer fst_buffer;

/*
 * One loaded tensor. A view returned by fst_buffer_tensor or fst_loader_next
 * holds a reference on its buffer: release it with fst_view_release. Its
 * strings and shape live as long as the buffer.
 */
typedef struct fst_tensor_view {
	const char *name;
	fst_dtype dtype;
	uint32_t ndim;
	const uint64_t *shape; /* NULL for scalars */
	uint64_t nbytes;
	void *data;      /* host or device address of the first byte */
	int device_type; /* enum fst_device_type */
	int device_id;
	size_t index;    /* position in the buffer's table */
	fst_buffer *buffer;
} fst_tensor_view;

/* Load every (selected) tensor of ckpt; on success *out holds one reference.
 * On failure nothing is returned and everything is released (since 0.1). */
FST_API int fst_load(const fst_checkpoint *ckpt, const fst_load_opts *opts, fst_buffer **out,
		     fst_error *err);

/*
 * The streaming form. fst_load_start allocates the destination and starts the
 * reader threads; fst_loader_next blocks until another tensor is complete and
 * returns 1 with a view of it, 0 when every tensor has been handed out, or a
 * negative code on failure (the load's first error); a tensor is handed out
 * only while its file is unchanged since it was opened (else FST_ECHANGED,
 * from then on). fst_loader_finish waits
 * for the end, hands over the buffer (*out may be NULL to drop it) and
 * frees the loader, whatever it returns: do not call fst_loader_free after.
 * ckpt must stay open until fst_loader_finish or fst_loader_free returns
 * (since 0.1).
 */
typedef struct fst_loader fst_loader;
FST_API int fst_load_start(const fst_checkpoint *ckpt, const fst_load_opts *opts,
			   fst_loader **out, fst_error *err);
FST_API int fst_loader_next(fst_loader *ld, fst_tensor_view *view, fst_error *err);
/* Bytes landed so far and in total (since 0.1). */
FST_API void fst_loader_progress(const fst_loader *ld, uint64_t *done, uint64_t *total);
/* Ask the readers to stop; a later finish returns FST_ECANCELED. Safe from
 * any thread (since 0.1). */
FST_API void fst_loader_cancel(fst_loader *ld);
FST_API int fst_loader_finish(fst_loader *ld, fst_buffer **out, fst_error *err);
/* Cancel if running, wait for the threads, release everything (since 0.1). */
FST_API void fst_loader_free(fst_loader *ld);

FST_API void fst_buffer_retain(fst_buffer *buf);
FST_API void fst_buffer_release(fst_buffer *buf);
FST_API size_t fst_buffer_tensor_count(const fst_buffer *buf);
/* View of tensor i; takes a reference on buf (since 0.1). */
FST_API int fst_buffer_tensor(fst_buffer *buf, size_t i, fst_tensor_view *out);
/* Index of the tensor called name, or -1 (since 0.1). */
FST_API long fst_buffer_find(const fst_buffer *buf, const char *name);
/* Bytes allocated for the tensors (0 for mmap buffers) (since 0.1). */
FST_API uint64_t fst_buffer_size(const fst_buffer *buf);
/* Nonzero when the tensors must not be written: FST_IO_MMAP without
 * mmap_private, whose shared mappings are read-only (since 0.1). */
FST_API int fst_buffer_read_only(const fst_buffer *buf);
/* Sum of the tensors' bytes (since 0.1). */
FST_API uint64_t fst_buffer_tensor_bytes(const fst_buffer *buf);
/* How the load ran and why, e.g. "pread, 2 threads, 16 MiB chunks: files in
 * the page cache (100%)" (since 0.1). */
FST_API const char *fst_buffer_describe(const fst_buffer *buf);
/* Drop the view's reference (the view is cleared); NULL is fine (since 0.1). */
FST_API void fst_view_release(fst_tensor_view *view);
/*
 * The host address of the view's first byte where the CPU can use it: the
 * view's own address on the CPU, and for a unified-memory load (the
 * FST_UNIFIED path) the host address of the same bytes; NULL for device
 * memory the CPU cannot reach, and for NULL (since 0.1).
 */
FST_API void *fst_view_host_data(const fst_tensor_view *view);

/*
 * Describe what fst_load would do with these options, without loading: the
 * reader, the target, threads, chunk size and the reasons, e.g. "pread, 16
 * threads, 16 MiB chunks: auto: 100% of the data in the page cache". Fails
 * as fst_load would for bad options or a missing device (since 0.1). Other
 * loads of the same files are seen, and do not see this one.
 */
FST_API int fst_load_explain(const fst_checkpoint *ckpt, const fst_load_opts *opts, char *buf,
			     size_t size, fst_error *err);

/*
 * Copy len bytes of a loaded tensor, from byte offset, into host memory at
 * dst: a memcpy for CPU buffers, a synchronous device-to-host copy for GPU
 * buffers (since 0.1).
 */
FST_API int fst_copy_to_host(const fst_tensor_view *view, uint64_t offset, void *dst,
			     uint64_t len, fst_error *err);

/* ---------------------------------------------------------------- devices */

/*
 * Free memory libfst keeps between loads: pinned staging blocks (at most
 * 1 GiB), kept because page-locking costs about as much as reading the same
 * bytes from the page cache. Call it when no load is running (since 0.1).
 */
FST_API void fst_trim(void);

typedef struct fst_cuda_device {
	int index;
	char name[256];
	uint64_t total_memory;
	uint64_t free_memory;
	int integrated;      /* shares memory with the host (never GPUDirect) */
	int gpu_direct_rdma; /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED */
	int compute_major, compute_minor;
	char pci_bus_id[32]; /* "0000:3b:00.0" */
	int pcie_gen, pcie_width; /* current link from sysfs; 0 when unknown */
} fst_cuda_device;

/*
 * Load the CUDA driver (libcuda.so.1, or FST_CUDA_LIBRARY) and report its
 * version (e.g. 13000), the number of devices and the library's path. On a
 * machine without a driver this fails with FST_EDEVICE and "no CUDA driver"
 * (since 0.1).
 */
FST_API int fst_cuda_driver(int *driver_version, int *device_count, char *library,
			    size_t library_size, fst_error *err);
FST_API int fst_cuda_device_info(int index, fst_cuda_device *out, fst_error *err);
/*
 * Measure host-to-device copy bandwidth from pinned memory: bytes copied in
 * 16 MiB pieces on one stream, best of three (since 0.1).
 */
FST_API int fst_cuda_h2d_bandwidth(int index, uint64_t bytes, double *gbps, fst_error *err);

/* What the GPUDirect Storage probe found for a device (docs/gds.md). */
typedef struct fst_gds_report {
	int library;         /* libcufile.so.0 (or FST_CUFILE_LIBRARY) loaded */
	int integrated;      /* the GPU shares memory with the host */
	int gpu_direct_rdma; /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED */
	int nvfs_devices;    /* /dev/nvidia-fs* present */
	int driver_opened;   /* cuFileDriverOpen was called and succeeded */
	int driver_error;    /* its error code when it failed */
	unsigned nvfs_major, nvfs_minor; /* from cuFileDriverGetProperties */
	int compat_allowed;  /* cufile.json allow_compat_mode: 1, 0, -1 unknown */
	int usable;          /* real peer-to-peer DMA: what gds=auto uses */
	char reason[512];    /* the first reason it is not usable, or what was found */
} fst_gds_report;

/* Probe GPUDirect Storage for a device (cached per process). The cuFile
 * driver is opened only where /dev/nvidia-fs* exists (since 0.1). */
FST_API int fst_gds_probe(int device, fst_gds_report *out, fst_error *err);

/* The kind of machine a CUDA device is on, from its attributes
 * (docs/platforms.md has the rule). */
enum fst_platform {
	FST_PLATFORM_DISCRETE = 0,   /* its own memory behind PCIe */
	FST_PLATFORM_INTEGRATED = 1, /* one memory with the CPU: GB10, Jetson */
	FST_PLATFORM_COHERENT = 2,   /* own memory plus coherent host access: GH200, GB200 */
};
typedef struct fst_platform_report {
	int platform;                /* enum fst_platform */
	int integrated;              /* CU_DEVICE_ATTRIBUTE_INTEGRATED */
	int can_map_host_memory;     /* CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY */
	int pageable_memory_access;  /* CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS */
	int uses_host_page_tables;   /* ..._PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES */
	int host_pointer_registered; /* ..._CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM */
	int unified_by_default;      /* unified=auto loads in one copy there */
	char name[16];               /* "discrete", "integrated", "coherent" */
	char reason[256];            /* the attributes that decided */
} fst_platform_report;

/* Classify a CUDA device (since 0.1). */
FST_API int fst_platform_probe(int device, fst_platform_report *out, fst_error *err);

/* ------------------------------------------------------------ multi-GPU */

/*
 * Tensor-parallel loading over NCCL (libnccl.so.2, opened with dlopen;
 * FST_NCCL_LIBRARY names another file). One process per GPU: rank 0 makes a
 * unique id, the caller sends it to every rank (MPI, a file, or, in Python,
 * the torch.distributed group), and each rank joins with fst_comm_init.
 */
#define FST_COMM_ID_BYTES 128

typedef struct fst_comm fst_comm;

/* A new unique id for fst_comm_init (since 0.1). */
FST_API int fst_comm_unique_id(unsigned char id[FST_COMM_ID_BYTES], fst_error *err);
/*
 * Join a communicator of `world` ranks as `rank`, on CUDA device `device`.
 * Blocks until every rank has joined. timeout_ms bounds every later
 * collective wait (0: FST_DIST_TIMEOUT_MS from the environment, else
 * 300000): a rank that fails or vanishes makes the others fail within it
 * rather than hang (since 0.1).
 */
FST_API int fst_comm_init(int world, int rank, const unsigned char id[FST_COMM_ID_BYTES],
			  int device, int timeout_ms, fst_comm **out, fst_error *err);
FST_API void fst_comm_destroy(fst_comm *comm);
FST_API int fst_comm_rank(const fst_comm *comm);
FST_API int fst_comm_world(const fst_comm *comm);

/* Dim value for fst_load_sharded: the whole tensor on every rank. */
#define FST_REPLICATE (-1)

/*
 * Load a checkpoint across the ranks of comm, every rank calling it with the
 * same arguments. dims[i] is for tensor i of the checkpoint's table
 * (fst_checkpoint_tensor): FST_REPLICATE for the whole tensor on every rank,
 * or a dimension to shard: rank r gets the block [r * b, (r + 1) * b) along
 * it, b = ceil(size / world), as fastsafetensors cuts it (the last ranks may
 * get less, or nothing). dims NULL replicates everything.
 *
 * Each byte is read from storage once in the whole group: a shard that is
 * contiguous in the file (dim 0, or leading dimensions of size 1) is read by
 * its rank alone, with no communication; every other tensor is read by one
 * rank (balanced by bytes) and broadcast, and a shard along an inner
 * dimension is then cut out by a strided device copy. The buffer's views
 * have the shard shapes. opts->device is taken from comm; opts->allocator is
 * not used and GPUDirect Storage is off (reads go through pinned staging).
 * Every rank returns the same status: a rank that fails makes all fail
 * (since 0.1). It is fst_load_sharded_nodes with node NULL. One load at a
 * time on a communicator: a second, from another thread, is FST_EUSAGE at
 * once on its rank alone, and the first goes on.
 */
FST_API int fst_load_sharded(const fst_checkpoint *ckpt, const fst_load_opts *opts,
			     fst_comm *comm, const int *dims, fst_buffer **out, fst_error *err);

/*
 * fst_load_sharded for a group whose ranks span several nodes (hosts):
 * each byte read from storage once in each node instead of once in the
 * group, so that broadcasts stay inside a node (NVLink) and never cross
 * the network. node is a communicator of this rank's node's ranks, made by
 * the caller with fst_comm_unique_id and fst_comm_init among them. Nodes
 * are consecutive ranks of comm: with size = fst_comm_world(node), node n
 * holds ranks [n * size, (n + 1) * size), and this rank is rank
 * fst_comm_rank(comm) % size of node, on comm's device. node NULL (or comm
 * itself) is one node: fst_load_sharded.
 *
 * Shards contiguous in the file are read by their own rank, as in
 * fst_load_sharded. Every other tensor has an owner in each node, by the
 * same byte-balancing rule over the node's ranks, which reads it and
 * broadcasts it over node. The ranks' agreement on their reads runs over
 * comm, so every rank of the group returns the same status; each wait is
 * bounded by the timeout of the communicator it waits on, and an NCCL
 * error or a timeout on either aborts both (FST_EDEVICE; make new ones).
 * What one rank can check is checked before any collective (FST_EUSAGE):
 * node's size divides comm's, this rank's rank in node, the device. A rank
 * that refuses leaves the others to time out. fst_buffer_describe says
 * "tensor-parallel rank R of W, in nodes of N: read X bytes from storage,
 * ..." (since 0.1).
 */
FST_API int fst_load_sharded_nodes(const fst_checkpoint *ckpt, const fst_load_opts *opts,
				   fst_comm *comm, fst_comm *node, const int *dims,
				   fst_buffer **out, fst_error *err);

#ifdef __cplusplus
}
#endif

#endif /* FST_H */
