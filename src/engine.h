/*
 * engine.h - the loading pipeline's internal pieces: plan, buffer, readers
 * and sinks, shared by engine.c and its ends. Never installed.
 */
#ifndef FST_ENGINE_H
#define FST_ENGINE_H

#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>

/* ---- plan (plan.c): pure and deterministic */

struct fsti_plan_tensor {
	uint32_t file;     /* index in the checkpoint */
	uint32_t entry;    /* index in the checkpoint's tensor table */
	uint64_t file_off; /* absolute offset in its file */
	uint64_t nbytes;
	uint64_t dst_off;  /* offset in the destination, a multiple of align */
};

/* One read of len file bytes. It touches plan tensors first..last
 * (inclusive); empty tensors belong to no chunk. In a plan built for direct
 * reads the bytes also land contiguously at dst_off; otherwise dst_off is
 * meaningless and the bytes are scattered tensor by tensor. */
struct fsti_chunk {
	uint32_t file;
	uint32_t first, last;
	uint64_t file_off, len, dst_off;
};

struct fsti_plan {
	struct fsti_plan_tensor *t;
	size_t nt;
	struct fsti_chunk *c;
	size_t nc;
	uint64_t dst_size;    /* destination bytes, padding included */
	uint64_t total_bytes; /* tensor bytes */
	uint32_t align;
};

typedef int (*fsti_filter_fn)(void *ctx, const char *name);

/*
 * direct: extents must be contiguous in the destination too (for readers
 * that write straight into it); otherwise only in the file, and chunks are
 * cut at multiples of chunk_bytes in file offsets (friendly to O_DIRECT).
 */
int fsti_plan_build(const fst_checkpoint *ck, fsti_filter_fn filter, void *filter_ctx,
		    uint32_t align, uint64_t chunk_bytes, bool direct, struct fsti_plan *out,
		    fst_error *err);
/* The same with a choice per file: files whose direct_files entry is true
 * (every file for FSTI_PLAN_ALL_DIRECT) get direct extents cut into
 * direct_chunk_bytes (GPUDirect reads land straight at their tensors); the
 * others are planned for landing slots. A nonzero grain moves each cut of a
 * direct extent that falls inside a tensor back to a multiple of grain
 * counted from that tensor's first byte (for on_landed blocks). */
extern const bool fsti_plan_all_direct;
#define FSTI_PLAN_ALL_DIRECT (&fsti_plan_all_direct)
int fsti_plan_build_mixed(const fst_checkpoint *ck, fsti_filter_fn filter, void *filter_ctx,
			  uint32_t align, uint64_t chunk_bytes, const bool *direct_files,
			  uint64_t direct_chunk_bytes, uint64_t grain, struct fsti_plan *out,
			  fst_error *err);

/* Move a cut at file offset stop (past off, inside the tensors *k..last of
 * one extent) back to the last multiple of grain counted from the first
 * byte of the tensor it falls in, when that is still past off, so no
 * grain-sized block of a tensor is split. A cut at a tensor boundary stays.
 * *k is a cursor: it moves forward to the tensor the cut falls in. */
uint64_t fsti_plan_block_cut(const struct fsti_plan *p, size_t *k, size_t last, uint64_t off,
			     uint64_t stop, uint64_t grain);

/* A plan of arbitrary pieces (file ranges to destination offsets), in file
 * order and not overlapping: the read phase of a tensor-parallel load. */
int fsti_plan_from_pieces(const struct fsti_plan_tensor *pieces, size_t n, uint32_t align,
			  uint64_t chunk_bytes, bool direct, struct fsti_plan *out, fst_error *err);

/* Read pieces into dst (memory owned by the caller, on opts->device) with
 * the usual readers and sinks, and wait for the end (engine.c). */
int fsti_load_pieces(const fst_checkpoint *ck, const fst_load_opts *opts,
		     const struct fsti_plan_tensor *pieces, size_t n, void *dst, uint64_t dst_size,
		     fst_error *err);

/* Call fn for each piece of chunk c that belongs to one tensor: the piece
 * starts at byte `at` of the chunk and at byte dst_off of the destination. */
typedef int (*fsti_piece_fn)(void *ctx, uint64_t at, uint64_t dst_off, uint64_t len);
int fsti_chunk_pieces(const struct fsti_plan *p, const struct fsti_chunk *c, fsti_piece_fn fn,
		      void *ctx);
void fsti_plan_free(struct fsti_plan *p);

/* ---- buffer (buffer.c) */

struct fsti_btensor {
	const char *name;
	fst_dtype dtype;
	uint32_t ndim;
	const uint64_t *shape;
	uint64_t nbytes;
	void *data;
};

struct fst_buffer {
	atomic_long refs;
	int device_type, device_id;
	void *base;     /* the one allocation: host or device address (NULL for mmap) */
	uint64_t size;  /* its bytes */
	/* how to give base back */
	void (*release_memory)(struct fst_buffer *b);
	fst_allocator allocator; /* when the caller's allocator made base */
	uint64_t map_len;        /* host_mem mapping length */
	void *device_ctx;        /* the CUDA end's state for device buffers */
	void **maps;             /* mmap buffers: one mapping per file */
	uint64_t *map_lens;
	size_t nmaps;
	int read_only;           /* shared read-only mappings: writes would fault */
	struct fsti_btensor *t;
	size_t nt;
	uint64_t tensor_bytes;
	fsti_names by_name;
	char *arena;
	char describe[1200];
};

/* A buffer whose table mirrors the plan's tensors (data pointers unset). */
int fsti_buffer_new(const fst_checkpoint *ck, const struct fsti_plan *plan,
		    struct fst_buffer **out, fst_error *err);
/* Frees the table; calls release_memory. */
void fsti_buffer_destroy(struct fst_buffer *b);

/* ---- host memory (host_mem.c) */

/* Anonymous memory advised for huge pages, aligned to 2 MiB; optionally
 * page-locked. *map_len receives the length to pass to fsti_host_free. */
int fsti_host_alloc(uint64_t size, bool pinned, void **out, uint64_t *map_len, fst_error *err);
void fsti_host_free(void *p, uint64_t map_len);

/* ---- readers (io_pread.c, io_uring.c) */

struct fsti_engine;

/*
 * Readers. A worker reads a chunk either straight into the destination
 * (read_exact) or into one of its landing slots (start, then wait): slot
 * buffers are FSTI_DIRECT_ALIGN-aligned with room for len + 2 * FSTI_DIRECT_ALIGN
 * bytes, and the reader says where in the slot the chunk's first byte is
 * (O_DIRECT reads land at the block-aligned offset below it). start may
 * return before the bytes arrive; wait returns once they are all there.
 */
#define FSTI_DIRECT_ALIGN 4096u
/* Landing slots per worker: up to two reads in flight while the third
 * slot's bytes are still being copied out (to a GPU, asynchronously). */
#define FSTI_SLOTS 3

struct fsti_reader {
	const char *name;
	int (*worker_init)(struct fsti_engine *e, void **state, fst_error *err);
	int (*read_exact)(struct fsti_engine *e, void *state, uint32_t file, uint64_t off,
			  uint64_t len, void *dst, fst_error *err);
	int (*start)(struct fsti_engine *e, void *state, int slot, uint32_t file, uint64_t off,
		     uint64_t len, char *buf, fst_error *err);
	int (*wait)(struct fsti_engine *e, void *state, int slot, const char **where,
		    fst_error *err);
	void (*worker_fini)(void *state);
};

extern const struct fsti_reader fsti_reader_pread;
extern const struct fsti_sink fsti_sink_cuda;
/* release_memory of device buffers (cuMemFree or the caller's allocator). */
void fsti_cuda_release_device_buffer(struct fst_buffer *b);
extern const struct fsti_reader fsti_reader_uring;
/* Whether io_uring can be set up here (some sandboxes forbid it); cached. */
bool fsti_uring_available(void);

/* The bytes of a memory image (fst_file_open_memory), which has no
 * descriptor: they are already in memory and were validated at open. */
int fsti_copy_from_image(const fst_file *f, uint64_t off, uint64_t len, void *dst,
			 fst_error *err);

/* pread until len bytes; a short file is FST_ECHANGED. */
int fsti_pread_exact(int fd, const char *path, void *dst, uint64_t len, uint64_t off,
		     fst_error *err);

/* Fraction (0..1) of the checkpoint's data pages resident in the page cache,
 * sampled; -1 when it cannot be told. */
double fsti_cached_fraction(const fst_checkpoint *ck);

/* ---- sinks: where chunks go (engine.c has the host sink) */

struct fsti_sink {
	const char *name;
	/* Load-wide set-up, on the calling thread (optional): allocates the
	 * destination (e->buf->base, size, release_memory) and shared state. */
	int (*load_init)(struct fsti_engine *e, fst_error *err);
	void (*load_fini)(struct fsti_engine *e);
	/* Per-worker state, with FSTI_SLOTS landing buffers of slot_bytes. */
	int (*worker_init)(struct fsti_engine *e, void **state, fst_error *err);
	/* Slot s's buffer, free to overwrite: waits for copies still reading
	 * it (reporting the chunks they finish). */
	int (*slot_buffer)(struct fsti_engine *e, void *state, int s, char **buf, fst_error *err);
	/* Chunk c's bytes are at where, in slot s: move them to their tensors.
	 * The sink calls fsti_chunk_done once they are in their final place. */
	int (*deliver)(struct fsti_engine *e, void *state, int s, const struct fsti_chunk *c,
		       const char *where, fst_error *err);
	/* Wait until every delivered chunk of this worker is done. */
	int (*drain)(struct fsti_engine *e, void *state, fst_error *err);
	void (*worker_fini)(struct fsti_engine *e, void *state);
};

/* ---- engine (engine.c) */

struct fsti_engine {
	const fst_checkpoint *ck;
	fst_load_opts opts;
	struct fsti_plan plan;
	struct fst_buffer *buf;
	const struct fsti_reader *reader;
	const struct fsti_sink *sink; /* NULL: direct reads into host memory */
	void *sink_ctx;               /* the sink's load-wide state */
	uint64_t slot_bytes;          /* landing slot size: chunk + 2 blocks */
	unsigned nthreads;
	pthread_t *threads;
	unsigned started;
	atomic_size_t next_chunk;
	atomic_uint_fast64_t bytes_done;
	atomic_uint_fast64_t *remaining; /* per plan tensor */
	atomic_int stop;                 /* error or cancel */
	/* ready queue and the first error */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t *ready;
	size_t nready, nhanded;
	unsigned running;
	int error;
	fst_error first_error;
	bool canceled;
	/* O_DIRECT descriptors per file for the uring reader (-1: not open). */
	int *direct_fds;
	bool direct_refused_logged;
	char why[160];
	char describe[1200];
	int device_type, device_id;
	void *saved_ctx; /* the caller's CUDA context, given back on return */
	bool restore_ctx;
	/* GPUDirect Storage: the cuFile table and per-file state when used */
	const void *cufile;
	struct fsti_gds_file *gds;
	bool *gds_direct;   /* per file: planned for cuFile reads */
	size_t gds_files;   /* how many files use cuFile */
	bool gds_buffer_registered;
	void *gds_registered_base;
	char gds_why[700];
};

/* ---- GPUDirect Storage (gds.c) */

struct fsti_gds_file {
	int fd;             /* O_DIRECT descriptor given to cuFile */
	void *handle;       /* cuFile handle, when registered */
	atomic_bool failed; /* a read failed: the file goes through staging */
};

/* Decide whether cuFile is used (per opts.gds and the probe) and register
 * each file; under auto a file that cannot be registered is left to the
 * staging path with one warning. Fills e->gds_direct (per file). */
int fsti_gds_setup(struct fsti_engine *e, fst_error *err);
/* Register the destination buffer with cuFile (optional for cuFile). */
int fsti_gds_register_buffer(struct fsti_engine *e, fst_error *err);
/* Read chunk c with cuFile straight into its tensors. Returns 0 when done,
 * 1 when the file fell back to staging (auto: do it there), or an error. */
int fsti_gds_read(struct fsti_engine *e, const struct fsti_chunk *c, fst_error *err);
bool fsti_gds_wanted(const struct fsti_engine *e, const struct fsti_chunk *c);
void fsti_gds_teardown(struct fsti_engine *e);

/* Called by sinks when chunk c's bytes are in their final place. */
void fsti_chunk_done(struct fsti_engine *e, const struct fsti_chunk *c);
/* Show the caller (opts.on_landed) file bytes [a, b) of chunk c, readable
 * at p, in pieces that never cross a landed_block multiple of a tensor;
 * with copy_to (the destination's base), copy each piece there first. */
int fsti_report_landed(struct fsti_engine *e, const struct fsti_chunk *c, uint64_t a,
		       uint64_t b, const char *p, char *copy_to, fst_error *err);
/* Record an error (the first one wins) and stop the readers. */
void fsti_engine_fail(struct fsti_engine *e, const fst_error *err);
/* Path of file i, for messages. */
const char *fsti_engine_path(const struct fsti_engine *e, uint32_t file);
int fsti_engine_fd(const struct fsti_engine *e, uint32_t file);

#endif
