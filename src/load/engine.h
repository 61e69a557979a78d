/*
 * engine.h - the loading pipeline's internal pieces: buffer, sinks, the
 * engine and GDS, shared by load/'s files. Never installed.
 */
#ifndef FST_ENGINE_H
#define FST_ENGINE_H

#include "io.h"
#include "layout.h"
#include "plan.h"

#include <pthread.h>
#include <stdatomic.h>

struct fsti_engine;
struct fsti_gds;

/* Read pieces into dst (memory owned by the caller, on opts->device) with
 * the usual readers and sinks, and wait for the end (engine.c). */
int fsti_load_pieces(const fst_checkpoint *ck, const fst_load_opts *opts,
		     const struct fsti_plan_tensor *pieces, size_t n, void *dst, uint64_t dst_size,
		     fst_error *err);

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
	void *mapped_host;       /* unified memory: the host address of base (cuMemHostAlloc) */
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
/* The destination from the caller's allocator a (a->alloc set): size
 * bytes (at least 1) aligned to align on the buffer's device (b->device_type
 * and device_id set), given back by release, which calls a->free. The one
 * path for caller memory on every device. */
int fsti_buffer_from_allocator(struct fst_buffer *b, const fst_allocator *a, uint64_t size,
			       uint32_t align, void (*release)(struct fst_buffer *b),
			       fst_error *err);
/* A buffer whose table mirrors a tensor-parallel layout: each tensor with
 * this rank's shard shape and bytes (data pointers unset). */
int fsti_buffer_new_sharded(const fst_checkpoint *ck, const struct fsti_dist *d,
			    struct fst_buffer **out, fst_error *err);
/* Frees the table; calls release_memory. */
void fsti_buffer_destroy(struct fst_buffer *b);

extern const struct fsti_sink fsti_sink_cuda;
/* release_memory of device buffers (cuMemFree or the caller's allocator). */
void fsti_cuda_release_device_buffer(struct fst_buffer *b);

/* ---- sinks: where chunks go (host_sink.c, cuda_sink.c) */

/* The span within which a chunk's copy to a GPU should have its source and
 * destination at the same offset: a tensor at 8 mod 16 in its file lands on
 * an aligned device address, so a chunk read to the start of its slot would
 * be copied from page-aligned bytes to an address 8 bytes past a boundary
 * (docs/design.md, "Past the copy limit"). Within a slot's spare room. */
#define FSTI_COPY_PHASE 256u
_Static_assert(FSTI_COPY_PHASE <= FSTI_DIRECT_ALIGN, "a skewed chunk fits its slot");

/* FST_ALIGN_COPIES: 0, copies go as the bytes lie; 1, a chunk read with
 * pread lands in its slot at the sink's landing_skew (the CPU's copy out
 * of the page cache goes out of phase instead); 2, each chunk is copied
 * whole to device scratch in its slot's phase, then to its tensors on the
 * device (cuda_sink.c). */
enum fsti_copy_phase { FSTI_PHASE_AS_READ, FSTI_PHASE_IN_SLOT, FSTI_PHASE_ON_DEVICE };

struct fsti_sink {
	const char *name;
	/* How it moves the bytes, for the load's description ("" or ", ..."). */
	const char *how;
	/* Load-wide set-up, on the calling thread (optional): allocates the
	 * destination (e->buf->base, size, release_memory) and shared state. */
	int (*load_init)(struct fsti_engine *e, fst_error *err);
	void (*load_fini)(struct fsti_engine *e);
	/* Load-wide set-up that can run while the workers set themselves up,
	 * on the calling thread once they have started (optional): worker_init
	 * waits for what it makes. On failure it leaves no worker waiting. */
	int (*load_started)(struct fsti_engine *e, fst_error *err);
	/* The load stopped before load_started ran (a worker could not be
	 * started): lets every worker waiting for what load_started makes go
	 * on, failing, so that it can be joined. Required with load_started. */
	void (*load_abandoned)(struct fsti_engine *e);
	/* Where in its slot chunk c should land, 0 to FSTI_COPY_PHASE - 1 bytes
	 * past the slot's start, for a reader that reads into any address
	 * (optional; the slot has room for it). */
	uint32_t (*landing_skew)(const struct fsti_engine *e, const struct fsti_chunk *c);
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

/* ---- a plan claimed from both ends (ends.c) */

/* Chunks 0 to n - 1 (n below 2^32), each handed out once: from the front in
 * order, from the back in reverse, until the two ends meet. */
typedef _Atomic uint64_t fsti_ends;
void fsti_ends_init(fsti_ends *e, size_t n);
/* The next chunk from the front, or from the back; SIZE_MAX once the ends
 * have met. Safe from any number of threads at once. */
size_t fsti_ends_front(fsti_ends *e);
size_t fsti_ends_back(fsti_ends *e);
/* Chunks neither end has claimed yet, and chunks the front has (a
 * moment's view). */
size_t fsti_ends_left(fsti_ends *e);
size_t fsti_ends_front_taken(fsti_ends *e);

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
	/* Streams (opts.stream_bytes): the plan cut into runs of run_chunks
	 * consecutive chunks, run r's next chunk in run_next[r]; a worker
	 * takes runs in order from next_run (run_chunks 0: no streams, every
	 * worker takes from next_chunk). */
	size_t run_chunks, nruns;
	atomic_size_t next_run;
	atomic_size_t *run_next;
	/* readahead of cold files read through the page cache: the chunk that
	 * is taken asks the kernel for the one this many chunks later (0: off) */
	size_t ahead;
	double cached; /* fraction of the data in the page cache; -1 unknown */
	atomic_uint_fast64_t bytes_done;
	atomic_uint_fast64_t *remaining; /* per plan tensor */
	atomic_int stop;                 /* error or cancel */
	/* fst_loader_cancel and fst_loader_progress calls from other threads
	 * in progress: the engine is not freed under them */
	atomic_int visitors;
	/* ready queue and the first error */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t *ready;
	size_t nready, nhanded;
	unsigned running;
	int error;
	fst_error first_error;
	bool canceled;
	/* what the readers read: the files and their O_DIRECT descriptors */
	struct fsti_source src;
	char why[320];
	char describe[1200];
	int device_type, device_id;
	void *saved_ctx; /* the caller's CUDA context, given back on return */
	bool restore_ctx;
	/* GPUDirect Storage: the load's state, opaque (gds.c); NULL until set up */
	struct fsti_gds *gds;
	/* unified memory (cuda_sink.c): readers write host memory mapped for the
	 * GPU, the tensors are its device addresses; write_base is where the
	 * readers and the host sink write (buf->base everywhere else) */
	bool unified;
	bool cold_direct; /* io=auto chose io_uring (O_DIRECT) for cold files */
	/* cold loads' read locks, seen by other loads of the same files; with
	 * share_watch, O_DIRECT turns to the page cache once another load
	 * appears (io/presence.c, fsti_direct_fds_watch) */
	struct fsti_presence *presence;
	bool share_watch;
	/* a load of given pieces (tensor-parallel ranks, each reading a part
	 * of the files another rank does not): no replicas to meet */
	bool pieces_only;
	/* fst_load_explain: nothing is read, so no presence lock is taken (a
	 * load of the same files would take it for another load) */
	bool explain_only;
	/* FST_URING_PAGE_CACHE: io_uring's reads through the page cache */
	enum fsti_page_cache page_cache;
	/* FST_READS_IN_FLIGHT: reads a worker keeps in flight in slot mode,
	 * 1 to FSTI_SLOTS */
	unsigned reads_in_flight;
	/* FST_ALIGN_COPIES: how copies to a GPU meet tensors that sit out of
	 * their file's phase (off by default: docs/design.md, "Past the copy
	 * limit") */
	enum fsti_copy_phase copy_phase;
	/* Disk helpers (FST_WARM_DISK): the last disk_helpers of the nthreads
	 * workers read, from a load's page-cached files, chunks from the end of
	 * the plan with O_DIRECT (disk_src), while the others read from its
	 * front through the page cache. The plan is then claimed from both
	 * ends (ends.c). */
	unsigned disk_helpers;
	atomic_uint worker_seq;
	/* io=auto: a worker's io_uring ring could not be set up, so it reads
	 * with pread (said once) */
	atomic_bool ring_fallback;
	fsti_ends ends;
	struct fsti_source disk_src;
	atomic_uint_fast64_t disk_bytes;
	double t_workers; /* when the workers were started */
	char *write_base;
	char platform_why[400];
};

/* ---- GPUDirect Storage (gds.c) */

/* Decide whether cuFile is used (per opts.gds and the probe) and register
 * each file; under auto a file that cannot be registered is left to the
 * staging path with one warning. Makes e->gds. */
int fsti_gds_setup(struct fsti_engine *e, fst_error *err);
/* Files planned for cuFile reads (0 without GDS), which ones (NULL
 * without), and why, for the load's description ("" without). */
size_t fsti_gds_direct_count(const struct fsti_gds *g);
const bool *fsti_gds_direct_files(const struct fsti_gds *g);
const char *fsti_gds_why(const struct fsti_gds *g);
/* Register the destination buffer with cuFile (optional for cuFile). */
int fsti_gds_register_buffer(struct fsti_engine *e, fst_error *err);
/* Read chunk c with cuFile straight into its tensors. Returns 0 when done,
 * 1 when the file fell back to staging (auto: do it there), or an error. */
int fsti_gds_read(struct fsti_engine *e, const struct fsti_chunk *c, fst_error *err);
bool fsti_gds_wanted(const struct fsti_engine *e, const struct fsti_chunk *c);
void fsti_gds_teardown(struct fsti_engine *e);


/* ---- unified memory (cuda_sink.c) */

/* For a CUDA load (the device current): the platform's class and
 * opts.unified decide whether the load reads straight into mapped host
 * memory (e->unified) or takes the discrete path; e->platform_why says
 * which and why. */
int fsti_unified_decide(struct fsti_engine *e, fst_error *err);
/* The destination of a unified load: cuMemHostAlloc(DEVICEMAP | PORTABLE),
 * base its device address, freed with cuMemFreeHost. */
int fsti_unified_alloc(struct fsti_engine *e, fst_error *err);

/* ---- the engine's parts (options.c, readiness.c, host_sink.c, views.c) */

/* Check opts (NULL: defaults) into o, with the defaults filled in: the one
 * check of every entry point. */
int fsti_load_opts_check(const fst_load_opts *in, fst_load_opts *o, fst_error *err);
int fsti_parse_device(const char *s, int *type, int *id, fst_error *err);
/* Tensor t (a plan index) is ready; e->lock held. */
void fsti_ready_push_locked(struct fsti_engine *e, size_t t);
/* The destination in host memory: the caller's allocator or libfst's. */
int fsti_alloc_host(struct fsti_engine *e, fst_error *err);
extern const struct fsti_sink fsti_sink_host;
/* io=mmap: the buffer's tensors are views of the mapped files. */
int fsti_map_files(struct fsti_engine *e, fst_error *err);

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
