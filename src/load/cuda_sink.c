/*
 * cuda_sink.c - chunks to GPU memory through pinned landing slots.
 *
 * Each worker owns a non-blocking stream, FSTI_SLOTS landing slots (its
 * share of the load's one pinned block) and one event per slot. A chunk
 * read into a slot is copied to its tensors with cuMemcpyHtoDAsync, piece
 * by piece, and the slot's event is recorded after the last piece. Two rules keep bytes sacred:
 *  - a slot is overwritten only after its event has completed (its copies
 *    have finished reading it);
 *  - a chunk is reported done (and so may complete a tensor) only after its
 *    event has completed: readiness never runs ahead of the copy engine.
 * There is no device-wide synchronisation and no kernel: bytes are never
 * moved once they are on the device.
 */
#include "cuda.h"
#include "engine.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/*
 * Pinned blocks are kept for the next load in this process: page-locking
 * costs about as much as reading the bytes from the page cache (it is
 * serialised in the driver), so a server that loads several checkpoints
 * pays it once. PORTABLE blocks serve every device. fst_trim frees them.
 *
 * A new block is anonymous memory advised for 2 MiB pages and registered
 * with the driver (cuMemHostRegister), which pins a huge page at a time
 * instead of 512 small ones: the first load of a process pays less for its
 * staging (docs/design.md, "Defaults"). The block is faulted in on as many
 * threads as the load has workers before it is registered, since the
 * driver would fault it in on one. Where that fails (no huge pages
 * matter: the registration works on small pages too; a driver that refuses
 * registration) the block comes from cuMemHostAlloc. FST_STAGING_PAGES=driver
 * asks for cuMemHostAlloc always, =lazy leaves the faulting to the driver.
 */
#define POOL_MAX 128
#define POOL_LIMIT (1ull << 30)
struct pinned_block {
	char *p;
	uint64_t len;      /* what the caller asked for */
	uint64_t map_len;  /* registered mapping's length; 0: cuMemHostAlloc */
};
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pinned_block pool[POOL_MAX];
static int pool_n;
static uint64_t pool_bytes;
static const struct fsti_cuda *pool_cu;

static void pinned_free(const struct fsti_cuda *cu, struct pinned_block b)
{
	if (b.map_len) {
		cu->cuMemHostUnregister(b.p);
		fsti_host_free(b.p, b.map_len);
	} else {
		cu->cuMemFreeHost(b.p);
	}
}

/* FST_STAGING_PAGES: "driver" (cuMemHostAlloc), "lazy" (huge pages the
 * registration faults in itself: a measuring aid), else huge pages faulted
 * in first */
enum staging_pages { STAGING_HUGE, STAGING_LAZY, STAGING_DRIVER };

static enum staging_pages staging_pages(void)
{
	const char *v = fsti_env(FSTI_ENV_STAGING_PAGES);
	if (v && !strcmp(v, "driver"))
		return STAGING_DRIVER;
	return v && !strcmp(v, "lazy") ? STAGING_LAZY : STAGING_HUGE;
}

/* A block of len bytes kept by an earlier load, into *out. */
static bool pinned_take(uint64_t len, struct pinned_block *out)
{
	bool found = false;
	pthread_mutex_lock(&pool_lock);
	for (int i = 0; i < pool_n && !found; i++)
		if (pool[i].len == len) {
			*out = pool[i];
			pool[i] = pool[--pool_n];
			pool_bytes -= len;
			found = true;
		}
	pthread_mutex_unlock(&pool_lock);
	return found;
}

/* A new pinned block of len bytes, faulted in on `threads` threads. */
static int pinned_new(const struct fsti_cuda *cu, uint64_t len, unsigned threads,
		      struct pinned_block *out, CUresult *r)
{
	*out = (struct pinned_block){NULL, len, 0};
	if (fsti_fault("pin")) {
		*r = FSTI_CUDA_ERROR_OUT_OF_MEMORY;
		return -1;
	}
	void *p;
	uint64_t map_len;
	enum staging_pages pages = staging_pages();
	if (pages != STAGING_DRIVER && fsti_host_alloc(len, 0, false, &p, &map_len, NULL) == 0) {
		if (pages == STAGING_HUGE)
			fsti_host_populate(p, map_len, threads);
		*r = cu->cuMemHostRegister_v2(p, (size_t)map_len, FSTI_CU_MEMHOSTREGISTER_PORTABLE);
		if (*r == 0) {
			*out = (struct pinned_block){p, len, map_len};
			return 0;
		}
		fsti_host_free(p, map_len);
	}
	*r = cu->cuMemHostAlloc((void **)&out->p, (size_t)len, FSTI_CU_MEMHOSTALLOC_PORTABLE);
	return *r ? -1 : 0;
}

static void pinned_put(const struct fsti_cuda *cu, struct pinned_block b)
{
	pthread_mutex_lock(&pool_lock);
	if (pool_n < POOL_MAX && pool_bytes + b.len <= POOL_LIMIT) {
		pool[pool_n++] = b;
		pool_bytes += b.len;
		pool_cu = cu;
		b.p = NULL;
	}
	pthread_mutex_unlock(&pool_lock);
	if (b.p)
		pinned_free(cu, b);
}

void fst_trim(void)
{
	pthread_mutex_lock(&pool_lock);
	for (int i = 0; i < pool_n; i++)
		pinned_free(pool_cu, pool[i]);
	pool_n = 0;
	pool_bytes = 0;
	pthread_mutex_unlock(&pool_lock);
}

/*
 * A load whose staging no earlier load left behind pins it on the loading
 * thread after the workers have started: they make their streams and
 * events meanwhile, then wait at the gate (cuda_worker_init). On a
 * process's first load the two cost 7-12 ms and 2-3.5 ms on the H200, one
 * after the other before (bench/results/h200-2026-12-02-first-load,
 * h200-2026-12-04b/pin).
 */
enum pin_gate { PIN_PENDING, PIN_READY, PIN_FAILED };

struct cuda_load {
	const struct fsti_cuda *cu;
	int device;
	struct pinned_block pinned; /* every worker's slots */
	uint64_t pinned_len;        /* their bytes (0: no worker) */
	/* FST_ALIGN_COPIES=2: device memory of pinned_len, a slot for each
	 * pinned one, where each chunk lands whole in its slot's phase before
	 * its pieces are copied to their tensors on the device */
	CUdeviceptr scratch;
	atomic_uint workers;        /* slot sets handed out */
	pthread_mutex_t gate_lock;
	pthread_cond_t gate_cond;
	enum pin_gate gate;         /* written by the loading thread only */
};

struct cuda_worker {
	struct cuda_load *load;
	CUstream stream;
	CUevent ev[FSTI_SLOTS];
	bool ev_made[FSTI_SLOTS];
	CUdeviceptr scratch[FSTI_SLOTS]; /* 0: copies go straight to the tensors */
	const struct fsti_chunk *pending[FSTI_SLOTS];
	bool failed[FSTI_SLOTS]; /* a copy of the slot's chunk could not be queued */
	char *slot[FSTI_SLOTS];
};

/* Free mem, b's device memory or its mapped host memory, with the device's
 * context current: the last reference may be dropped on any thread. */
static void free_in_context(struct fst_buffer *b, void *mem, bool mapped_host)
{
	const struct fsti_cuda *cu = b->device_ctx;
	fst_error err;
	void *saved = fsti_cuda_save();
	if (fsti_cuda_use_device(cu, b->device_id, &err) == 0) {
		if (mapped_host)
			cu->cuMemFreeHost(mem);
		else
			cu->cuMemFree_v2((CUdeviceptr)(uintptr_t)mem);
	} else {
		fsti_log(FST_LOG_ERROR, "leaking %" PRIu64 " bytes of %s memory on cuda:%d: %s",
			 b->size, mapped_host ? "mapped host" : "device", b->device_id,
			 err.message);
	}
	fsti_cuda_restore(saved);
}

void fsti_cuda_release_device_buffer(struct fst_buffer *b)
{
	if (b->allocator.free) {
		b->allocator.free(b->allocator.ctx, b->base, b->size, b->device_type,
				  b->device_id);
		return;
	}
	if (b->device_ctx && b->base)
		free_in_context(b, b->base, false);
}

/* The driver, with the load's device current on this thread. */
static int use_buffer_device(struct fsti_engine *e, const struct fsti_cuda **cu, fst_error *err)
{
	int rc = fsti_cuda_get(cu, err);
	return rc ? rc : fsti_cuda_use_device(*cu, e->buf->device_id, err);
}

static int cuda_load_init(struct fsti_engine *e, fst_error *err)
{
	const struct fsti_cuda *cu;
	int rc = use_buffer_device(e, &cu, err);
	if (rc)
		return rc;
	struct fst_buffer *b = e->buf;
	struct cuda_load *l = fsti_calloc(1, sizeof *l);
	if (!l)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	pthread_mutex_init(&l->gate_lock, NULL);
	pthread_cond_init(&l->gate_cond, NULL);
	e->sink_ctx = l;
	l->cu = cu;
	l->device = b->device_id;

	/* Destination: one device allocation, or the caller's allocator, or
	 * memory the caller gave (tensor-parallel loads). */
	uint64_t size = e->plan.dst_size ? e->plan.dst_size : 1;
	const fst_allocator *a = e->opts.allocator;
	b->device_ctx = (void *)cu;
	if (b->base) {
		/* given */
	} else if (a && a->alloc) {
		rc = fsti_buffer_from_allocator(b, a, size, e->opts.align,
						fsti_cuda_release_device_buffer, err);
		if (rc)
			return rc;
	} else {
		CUdeviceptr p = 0;
		double t0 = fsti_now();
		CUresult r = fsti_fault("device_alloc") ? FSTI_CUDA_ERROR_OUT_OF_MEMORY
							: cu->cuMemAlloc_v2(&p, size);
		fsti_log(FST_LOG_DEBUG, "cuda:%d: allocating %" PRIu64 " bytes took %.1f ms",
			 b->device_id, size, (fsti_now() - t0) * 1e3);
		if (r)
			return fsti_cuda_fail(cu, r, err,
					      "cuda:%d: cannot allocate %" PRIu64 " bytes for %zu "
					      "tensors",
					      b->device_id, size, e->plan.nt);
		b->base = (void *)(uintptr_t)p;
		b->size = size;
		b->release_memory = fsti_cuda_release_device_buffer;
		/* cuMemAlloc aligns to at least 256 bytes; a larger align needs
		 * the caller's allocator. */
		if (p % e->opts.align)
			return fsti_err(err, FST_EUNSUPPORTED,
					"cuda:%d: cuMemAlloc returned memory aligned to less than "
					"%u bytes; pass an allocator for larger alignments",
					b->device_id, e->opts.align);
	}
	/* Every worker's slots in one block: the driver pins one call at a
	 * time, and one call for the load costs about what one of the
	 * workers' own calls did (they waited for each other, the last one up
	 * to 11 ms on the H200: bench/results/h200-2026-12-02-first-load).
	 * No worker (no byte to read) needs none; a kept block is ready. */
	l->pinned_len = (uint64_t)e->nthreads * FSTI_SLOTS * e->slot_bytes;
	if (e->copy_phase == FSTI_PHASE_ON_DEVICE && l->pinned_len) {
		CUresult r = fsti_fault("device_alloc") ? FSTI_CUDA_ERROR_OUT_OF_MEMORY
							: cu->cuMemAlloc_v2(&l->scratch, l->pinned_len);
		if (r) {
			l->scratch = 0;
			return fsti_cuda_fail(cu, r, err,
					      "cuda:%d: cannot allocate %" PRIu64 " bytes of device "
					      "scratch (FST_ALIGN_COPIES=2)",
					      b->device_id, l->pinned_len);
		}
	}
	l->gate = !l->pinned_len || pinned_take(l->pinned_len, &l->pinned) ? PIN_READY
									    : PIN_PENDING;
	return 0;
}

/* The staging pinned, on the loading thread while the workers set
 * themselves up; the gate opens either way, so no worker waits past it. */
static int cuda_load_started(struct fsti_engine *e, fst_error *err)
{
	struct cuda_load *l = e->sink_ctx;
	if (l->gate != PIN_PENDING)
		return 0;
	double t0 = fsti_now();
	struct pinned_block b;
	CUresult r;
	int rc = 0;
	if (pinned_new(l->cu, l->pinned_len, e->nthreads, &b, &r))
		rc = fsti_cuda_fail(l->cu, r, err,
				    "cannot allocate %" PRIu64 " bytes of pinned staging "
				    "memory (--staging sets the budget)",
				    l->pinned_len);
	else
		fsti_log(FST_LOG_DEBUG,
			 "cuda:%d: pinning %" PRIu64 " bytes of staging took %.1f ms",
			 l->device, l->pinned_len, (fsti_now() - t0) * 1e3);
	pthread_mutex_lock(&l->gate_lock);
	if (!rc)
		l->pinned = b;
	l->gate = rc ? PIN_FAILED : PIN_READY;
	pthread_cond_broadcast(&l->gate_cond);
	pthread_mutex_unlock(&l->gate_lock);
	return rc;
}

/* No worker was to wait for staging that load_started will not pin. */
static void cuda_load_abandoned(struct fsti_engine *e)
{
	struct cuda_load *l = e->sink_ctx;
	pthread_mutex_lock(&l->gate_lock);
	if (l->gate == PIN_PENDING)
		l->gate = PIN_FAILED;
	pthread_cond_broadcast(&l->gate_cond);
	pthread_mutex_unlock(&l->gate_lock);
}

static void cuda_load_fini(struct fsti_engine *e)
{
	struct cuda_load *l = e->sink_ctx;
	if (!l)
		return;
	/* the workers are gone and their streams idle: no copy reads the slots */
	if (l->pinned.p)
		pinned_put(l->cu, l->pinned);
	if (l->scratch) {
		fst_error err;
		void *saved = fsti_cuda_save();
		if (fsti_cuda_use_device(l->cu, l->device, &err) == 0)
			l->cu->cuMemFree_v2(l->scratch);
		else
			fsti_log(FST_LOG_ERROR, "leaking %" PRIu64 " bytes of device scratch on "
						"cuda:%d: %s",
				 l->pinned_len, l->device, err.message);
		fsti_cuda_restore(saved);
	}
	pthread_mutex_destroy(&l->gate_lock);
	pthread_cond_destroy(&l->gate_cond);
	fsti_free(l);
	e->sink_ctx = NULL;
}

static int cuda_worker_init(struct fsti_engine *e, void **state, fst_error *err)
{
	struct cuda_load *l = e->sink_ctx;
	const struct fsti_cuda *cu = l->cu;
	struct cuda_worker *w = fsti_calloc(1, sizeof *w);
	if (!w)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	*state = w;
	w->load = l;
	int rc = fsti_cuda_use_device(cu, l->device, err);
	if (rc)
		return rc;
	CUresult r = cu->cuStreamCreate(&w->stream, FSTI_CU_STREAM_NON_BLOCKING);
	if (r) {
		w->stream = NULL;
		return fsti_cuda_fail(cu, r, err, "cuda:%d: cannot create a stream", l->device);
	}
	for (int s = 0; s < FSTI_SLOTS; s++) {
		r = cu->cuEventCreate(&w->ev[s], FSTI_CU_EVENT_DISABLE_TIMING);
		if (r)
			return fsti_cuda_fail(cu, r, err, "cuda:%d: cannot create an event",
					      l->device);
		w->ev_made[s] = true;
	}
	pthread_mutex_lock(&l->gate_lock);
	while (l->gate == PIN_PENDING)
		pthread_cond_wait(&l->gate_cond, &l->gate_lock);
	bool pinned = l->gate == PIN_READY;
	pthread_mutex_unlock(&l->gate_lock);
	if (!pinned) /* the loading thread reports why */
		return fsti_err(err, FST_EDEVICE, "cuda:%d: no pinned staging", l->device);
	unsigned k = atomic_fetch_add(&l->workers, 1);
	if (k >= e->nthreads)
		return fsti_err(err, FST_EDEVICE, "cuda:%d: more workers than slot sets (%u)",
				l->device, e->nthreads);
	char *mine = l->pinned.p + (uint64_t)k * FSTI_SLOTS * e->slot_bytes;
	for (int s = 0; s < FSTI_SLOTS; s++)
		w->slot[s] = mine + (unsigned)s * e->slot_bytes;
	for (int s = 0; l->scratch && s < FSTI_SLOTS; s++)
		w->scratch[s] = l->scratch + ((uint64_t)k * FSTI_SLOTS + (unsigned)s) * e->slot_bytes;
	return 0;
}

/* Wait for slot s's copies; then its chunk is on the device. */
static int finish_slot(struct fsti_engine *e, struct cuda_worker *w, int s, fst_error *err)
{
	const struct fsti_cuda *cu = w->load->cu;
	if (!w->pending[s])
		return 0;
	CUresult r = fsti_fault("event") ? 999 : cu->cuEventSynchronize(w->ev[s]);
	const struct fsti_chunk *c = w->pending[s];
	bool failed = w->failed[s];
	w->pending[s] = NULL;
	w->failed[s] = false;
	if (failed)
		return 0; /* waited for; never counted: its error is already reported */
	if (r)
		return fsti_cuda_fail(cu, r, err,
				      "%s: copy of %" PRIu64 " bytes at offset %" PRIu64
				      " to cuda:%d failed",
				      fsti_engine_path(e, c->file), c->len, c->file_off,
				      w->load->device);
	fsti_chunk_done(e, c);
	return 0;
}

static int cuda_slot_buffer(struct fsti_engine *e, void *state, int s, char **buf,
			    fst_error *err)
{
	struct cuda_worker *w = state;
	int rc = finish_slot(e, w, s, err);
	/* Report other slots whose copies are already over, so their tensors
	 * become ready without waiting for this worker's next turn. */
	for (int k = 0; !rc && k < FSTI_SLOTS; k++)
		if (k != s && w->pending[k] &&
		    w->load->cu->cuEventQuery(w->ev[k]) == FSTI_CUDA_SUCCESS)
			rc = finish_slot(e, w, k, err);
	*buf = w->slot[s];
	return rc;
}

/* The copies of a chunk's pieces to their tensors: from the staged bytes
 * at src, or (FST_ALIGN_COPIES=2) from their copy in device scratch at
 * dev_src. */
struct to_tensors {
	const struct fsti_cuda *cu;
	CUdeviceptr base;
	const char *src;
	CUdeviceptr dev_src; /* 0: from src */
	CUstream stream;
	CUresult r;
};

static int copy_piece(void *ctx, uint64_t at, uint64_t dst_off, uint64_t len)
{
	struct to_tensors *t = ctx;
	if (fsti_fault("h2d"))
		t->r = 1;
	else if (t->dev_src)
		t->r = t->cu->cuMemcpyDtoDAsync_v2(t->base + dst_off, t->dev_src + at, (size_t)len,
						   t->stream);
	else
		t->r = t->cu->cuMemcpyHtoDAsync_v2(t->base + dst_off, t->src + at, (size_t)len,
						   t->stream);
	return t->r ? -1 : 0;
}

/* Chunk c's bytes at where copied whole to scratch, at where's offset
 * within FSTI_COPY_PHASE (so the copy from the host is in phase however
 * the tensors lie), then piece by piece to the tensors on the device,
 * all on the worker's stream. */
static CUresult via_scratch(struct fsti_engine *e, struct cuda_worker *w, int s,
			    const struct fsti_chunk *c, const char *where)
{
	const struct fsti_cuda *cu = w->load->cu;
	CUdeviceptr at = w->scratch[s] + ((uintptr_t)where & (FSTI_COPY_PHASE - 1));
	CUresult r = fsti_fault("h2d") ? 1
				       : cu->cuMemcpyHtoDAsync_v2(at, where, (size_t)c->len,
								  w->stream);
	if (r)
		return r;
	struct to_tensors t = {cu, (CUdeviceptr)(uintptr_t)e->buf->base, NULL, at, w->stream, 0};
	fsti_chunk_pieces(&e->plan, c, copy_piece, &t);
	return t.r;
}

/* The piece of a chunk with the most bytes: where it starts in the chunk
 * and on the device. */
struct largest {
	uint64_t at, dst_off, len;
};

static int note_largest(void *ctx, uint64_t at, uint64_t dst_off, uint64_t len)
{
	struct largest *l = ctx;
	if (len > l->len)
		*l = (struct largest){at, dst_off, len};
	return 0;
}

/* Where chunk c lands in its slot (a page-aligned buffer): so that its
 * largest piece is copied between addresses with the same offset within
 * FSTI_COPY_PHASE. A tensor at 8 mod 16 in its file otherwise goes from a
 * page boundary to 8 bytes past an aligned device address, and every other
 * tensor of such a checkpoint with it. */
static uint32_t cuda_landing_skew(const struct fsti_engine *e, const struct fsti_chunk *c)
{
	struct largest l = {0, 0, 0};
	fsti_chunk_pieces(&e->plan, c, note_largest, &l);
	uint64_t dst = (uint64_t)(uintptr_t)e->buf->base + l.dst_off;
	return (uint32_t)((dst - l.at) & (FSTI_COPY_PHASE - 1));
}

static int cuda_deliver(struct fsti_engine *e, void *state, int s, const struct fsti_chunk *c,
			const char *where, fst_error *err)
{
	struct cuda_worker *w = state;
	const struct fsti_cuda *cu = w->load->cu;
	struct to_tensors h = {cu, (CUdeviceptr)(uintptr_t)e->buf->base, where, 0, w->stream, 0};
	if (w->scratch[s])
		h.r = via_scratch(e, w, s, c, where);
	else
		fsti_chunk_pieces(&e->plan, c, copy_piece, &h);
	/* Record the event even after a failed copy, so waiting on the slot
	 * covers whatever was queued before the failure. */
	CUresult r = fsti_fault("event") ? 999 : cu->cuEventRecord(w->ev[s], w->stream);
	if (!r) {
		w->pending[s] = c;
		w->failed[s] = h.r != 0;
	}
	if (h.r)
		return fsti_cuda_fail(cu, h.r, err,
				      "%s: cannot queue the copy of %" PRIu64 " bytes at offset "
				      "%" PRIu64 " to cuda:%d",
				      fsti_engine_path(e, c->file), c->len, c->file_off,
				      w->load->device);
	if (r) {
		/* Without an event the slot's copies cannot be waited for one by
		 * one: wait for the whole stream instead. */
		cu->cuStreamSynchronize(w->stream);
		return fsti_cuda_fail(cu, r, err, "cuda:%d: cannot record an event",
				      w->load->device);
	}
	/* The copies are queued: show the caller the staged bytes meanwhile
	 * (the slot is not reused before its event). A chunk the callback
	 * refused, or whose later bytes it never saw, is still waited for but
	 * never counted: its tensors are not handed out. */
	if (e->opts.on_landed) {
		int rc = fsti_report_landed(e, c, c->file_off, c->file_off + c->len, where, NULL,
					    err);
		if (rc && w->pending[s] == c)
			w->failed[s] = true;
		return rc;
	}
	return 0;
}

static int cuda_drain(struct fsti_engine *e, void *state, fst_error *err)
{
	struct cuda_worker *w = state;
	int rc = 0;
	if (!w)
		return 0;
	for (int s = 0; s < FSTI_SLOTS; s++) {
		fst_error e2;
		int r = finish_slot(e, w, s, &e2);
		if (r && !rc) {
			rc = r;
			if (err)
				*err = e2;
		}
	}
	/* Belt and braces: nothing of this worker may still be in flight when
	 * the staging memory is freed. */
	if (w->stream)
		w->load->cu->cuStreamSynchronize(w->stream);
	return rc;
}

static void cuda_worker_fini(struct fsti_engine *e, void *state)
{
	(void)e;
	struct cuda_worker *w = state;
	if (!w)
		return;
	const struct fsti_cuda *cu = w->load->cu;
	if (w->stream)
		cu->cuStreamSynchronize(w->stream);
	for (int s = 0; s < FSTI_SLOTS; s++)
		if (w->ev_made[s])
			cu->cuEventDestroy_v2(w->ev[s]);
	if (w->stream)
		cu->cuStreamDestroy_v2(w->stream);
	fsti_free(w);
}

const struct fsti_sink fsti_sink_cuda = {
	.name = "cuda",
	.how = " to pinned staging, async copies to the GPU",
	.load_init = cuda_load_init,
	.load_fini = cuda_load_fini,
	.load_started = cuda_load_started,
	.load_abandoned = cuda_load_abandoned,
	.landing_skew = cuda_landing_skew,
	.worker_init = cuda_worker_init,
	.slot_buffer = cuda_slot_buffer,
	.deliver = cuda_deliver,
	.drain = cuda_drain,
	.worker_fini = cuda_worker_fini,
};

/* ---- unified memory: one copy into host memory mapped for the GPU */

int fsti_unified_decide(struct fsti_engine *e, fst_error *err)
{
	const struct fsti_cuda *cu;
	int rc = fsti_cuda_get(&cu, err);
	if (rc)
		return rc;
	struct fsti_platform p;
	rc = fsti_cuda_platform(cu, e->device_id, &p, err);
	if (rc)
		return rc;
	const int policy = e->opts.unified;
	const bool caller_memory = e->opts.allocator && e->opts.allocator->alloc;
	const char *cls = fsti_platform_name(p.cls);
	e->unified = false;
	if (policy == FST_UNIFIED_OFF) {
		snprintf(e->platform_why, sizeof e->platform_why,
			 "discrete path asked for (unified=off) on a %s GPU", cls);
	} else if (caller_memory) {
		if (policy == FST_UNIFIED_ON)
			return fsti_err(err, FST_EUSAGE,
					"unified=on maps host memory for cuda:%d itself and cannot use "
					"the caller's allocator (which gives device memory)",
					e->device_id);
		snprintf(e->platform_why, sizeof e->platform_why,
			 "discrete path: the caller's allocator gives the memory (%s GPU)", cls);
	} else if (p.cls == FSTI_PLATFORM_INTEGRATED ||
		   (p.cls == FSTI_PLATFORM_COHERENT && policy == FST_UNIFIED_ON)) {
		e->unified = true;
		snprintf(e->platform_why, sizeof e->platform_why, "unified memory%s: %s",
			 policy == FST_UNIFIED_ON ? " (unified=on)" : "", p.reason);
	} else if (p.cls == FSTI_PLATFORM_COHERENT) {
		snprintf(e->platform_why, sizeof e->platform_why,
			 "discrete path on a coherent GPU: tensors stay in the GPU's own memory, "
			 "unified=on would leave them in host memory (%.200s)",
			 p.reason);
	} else if (policy == FST_UNIFIED_ON) {
		return fsti_err(err, FST_EUNSUPPORTED,
				"unified=on but %s; unified memory needs an integrated or coherent GPU",
				p.reason);
	} else {
		snprintf(e->platform_why, sizeof e->platform_why, "discrete: %s", p.reason);
	}
	fsti_log(FST_LOG_INFO, "cuda:%d: %s", e->device_id, e->platform_why);
	return 0;
}

static void release_unified(struct fst_buffer *b)
{
	if (b->device_ctx && b->mapped_host)
		free_in_context(b, b->mapped_host, true);
	b->mapped_host = NULL;
}

int fsti_unified_alloc(struct fsti_engine *e, fst_error *err)
{
	const struct fsti_cuda *cu;
	int rc = use_buffer_device(e, &cu, err);
	if (rc)
		return rc;
	struct fst_buffer *b = e->buf;
	uint64_t size = e->plan.dst_size ? e->plan.dst_size : 1;
	void *host = NULL;
	CUresult r = fsti_fault("device_alloc")
			     ? FSTI_CUDA_ERROR_OUT_OF_MEMORY
			     : cu->cuMemHostAlloc(&host, (size_t)size,
						  FSTI_CU_MEMHOSTALLOC_DEVICEMAP |
							  FSTI_CU_MEMHOSTALLOC_PORTABLE);
	if (r)
		return fsti_cuda_fail(cu, r, err,
				      "cuda:%d: cannot map %" PRIu64 " bytes of host memory for %zu "
				      "tensors",
				      b->device_id, size, e->plan.nt);
	b->device_ctx = (void *)cu;
	b->mapped_host = host;
	b->size = size;
	b->release_memory = release_unified;
	CUdeviceptr d = 0;
	r = cu->cuMemHostGetDevicePointer_v2(&d, host, 0);
	if (r)
		return fsti_cuda_fail(cu, r, err, "cuda:%d: no device address for mapped host memory",
				      b->device_id);
	b->base = (void *)(uintptr_t)d;
	e->write_base = host;
	if (d % e->opts.align || (uintptr_t)host % e->opts.align)
		return fsti_err(err, FST_EUNSUPPORTED,
				"cuda:%d: mapped host memory is aligned to less than %u bytes; pass "
				"unified=off for larger alignments",
				b->device_id, e->opts.align);
	return 0;
}
