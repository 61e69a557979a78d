/*
 * host_sink.c - destination memory on the host, and the host sink: chunks
 * read into landing slots (O_DIRECT) scattered to their tensors.
 */
#include "engine.h"

#include <inttypes.h>
#include <string.h>

static void release_host(struct fst_buffer *b)
{
	if (b->allocator.free)
		b->allocator.free(b->allocator.ctx, b->base, b->size, b->device_type, b->device_id);
	else
		fsti_host_free(b->base, b->map_len);
}

int fsti_alloc_host(struct fsti_engine *e, fst_error *err)
{
	struct fst_buffer *b = e->buf;
	uint64_t size = e->plan.dst_size;
	const fst_allocator *a = e->opts.allocator;
	if (a && a->alloc) {
		return fsti_buffer_from_allocator(b, a, size, e->opts.align, release_host, err);
	}
	int rc = fsti_host_alloc(size, e->opts.align, e->opts.pinned, &b->base, &b->map_len, err);
	if (rc)
		return rc;
	b->size = size;
	b->release_memory = release_host;
	return 0;
}

/*
 * A worker's landing slots: one mapping of huge pages (host_mem.c), faulted
 * in here. An O_DIRECT read into 4 KiB pages hands the disk one segment per
 * page (128 for a 512 KiB request), into a huge page one; the pinned
 * staging of loads onto a GPU is huge pages too, and read the same requests
 * faster (docs/design.md, "Cold reads"). Where whole huge pages for every
 * worker would not fit the staging budget, an exact block of small pages.
 */
struct host_worker {
	char *slots;
	uint64_t map_len; /* 0: from fsti_aligned_alloc */
};

static int host_worker_init(struct fsti_engine *e, void **state, fst_error *err)
{
	struct host_worker *w = fsti_calloc(1, sizeof *w);
	if (!w)
		return fsti_err(err, FST_ENOMEM, "out of memory for landing slots");
	*state = w;
	uint64_t len = FSTI_SLOTS * e->slot_bytes;
	uint64_t whole = (len + FSTI_HUGE_PAGE - 1) & ~(FSTI_HUGE_PAGE - 1);
	if (whole * e->nthreads <= e->opts.staging_bytes) {
		void *p;
		int rc = fsti_host_alloc(len, 0, false, &p, &w->map_len, err);
		if (rc)
			return rc;
		w->slots = p;
		fsti_host_populate(p, w->map_len, 1);
		return 0;
	}
	if (!(w->slots = fsti_aligned_alloc(FSTI_DIRECT_ALIGN, (size_t)len)))
		return fsti_err(err, FST_ENOMEM, "out of memory for landing slots");
	return 0;
}

static int host_slot_buffer(struct fsti_engine *e, void *state, int s, char **buf,
			    fst_error *err)
{
	(void)err;
	*buf = ((struct host_worker *)state)->slots + (uint64_t)s * e->slot_bytes;
	return 0;
}

struct scatter {
	char *dst;
	const char *src;
};

static int scatter_piece(void *ctx, uint64_t at, uint64_t dst_off, uint64_t len)
{
	struct scatter *sc = ctx;
	memcpy(sc->dst + dst_off, sc->src + at, len);
	return 0;
}

static int host_deliver(struct fsti_engine *e, void *state, int s, const struct fsti_chunk *c,
			const char *where, fst_error *err)
{
	(void)state;
	(void)s;
	if (e->opts.on_landed) {
		int rc = fsti_report_landed(e, c, c->file_off, c->file_off + c->len, where,
					    e->write_base, err);
		if (rc)
			return rc;
	} else {
		struct scatter sc = {e->write_base, where};
		fsti_chunk_pieces(&e->plan, c, scatter_piece, &sc);
	}
	fsti_chunk_done(e, c);
	return 0;
}

static int host_drain(struct fsti_engine *e, void *state, fst_error *err)
{
	(void)e;
	(void)state;
	(void)err;
	return 0;
}

static void host_worker_fini(struct fsti_engine *e, void *state)
{
	(void)e;
	struct host_worker *w = state;
	if (!w)
		return;
	if (w->map_len)
		fsti_host_free(w->slots, w->map_len);
	else
		fsti_free(w->slots);
	fsti_free(w);
}

const struct fsti_sink fsti_sink_host = {
	.name = "host",
	.how = "",
	.load_init = NULL, /* engine.c allocates host memory itself */
	.load_fini = NULL,
	.worker_init = host_worker_init,
	.slot_buffer = host_slot_buffer,
	.deliver = host_deliver,
	.drain = host_drain,
	.worker_fini = host_worker_fini,
};

