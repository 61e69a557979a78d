/*
 * readiness.c - when a tensor is ready: sinks report each chunk once its
 * bytes are in their final place, and a tensor is ready exactly when its
 * last byte has been counted; the first error stops the load. Also the
 * on_landed reports of bytes passing through host memory.
 */
#include "engine.h"

#include <inttypes.h>
#include <string.h>

void fsti_ready_push_locked(struct fsti_engine *e, size_t t)
{
	e->ready[e->nready++] = t;
}

void fsti_chunk_done(struct fsti_engine *e, const struct fsti_chunk *c)
{
	uint64_t c0 = c->file_off, c1 = c->file_off + c->len;
	bool any = false;
	for (uint32_t i = c->first; i <= c->last; i++) {
		const struct fsti_plan_tensor *t = &e->plan.t[i];
		uint64_t a = FSTI_MAX(c0, t->file_off), b = FSTI_MIN(c1, t->file_off + t->nbytes);
		if (b <= a)
			continue;
		if (atomic_fetch_sub(&e->remaining[i], b - a) == b - a) {
			pthread_mutex_lock(&e->lock);
			fsti_ready_push_locked(e, i);
			pthread_mutex_unlock(&e->lock);
			any = true;
		}
	}
	atomic_fetch_add(&e->bytes_done, c->len);
	if (any)
		pthread_cond_broadcast(&e->cond);
}

void fsti_engine_fail(struct fsti_engine *e, const fst_error *err)
{
	pthread_mutex_lock(&e->lock);
	if (!e->error) {
		e->error = err->code ? err->code : FST_EIO;
		e->first_error = *err;
	}
	pthread_mutex_unlock(&e->lock);
	atomic_store(&e->stop, 1);
	pthread_cond_broadcast(&e->cond);
}

/* ---- on_landed: bytes shown to the caller as they pass through host memory */

/*
 * Report file bytes [a, b) of chunk c, readable at p (the byte at a), cut at
 * multiples of landed_block counted from each tensor's first byte. With
 * copy_to (the destination's base) each block is first copied to its place
 * and reported from there, while it is still in the caches.
 */
int fsti_report_landed(struct fsti_engine *e, const struct fsti_chunk *c, uint64_t a,
		       uint64_t b, const char *p, char *copy_to, fst_error *err)
{
	const uint64_t block = e->opts.landed_block;
	for (uint32_t i = c->first; i <= c->last; i++) {
		const struct fsti_plan_tensor *t = &e->plan.t[i];
		uint64_t x = FSTI_MAX(a, t->file_off), y = FSTI_MIN(b, t->file_off + t->nbytes);
		while (x < y) {
			uint64_t rel = x - t->file_off;
			uint64_t n = FSTI_MIN(y - x, block - rel % block);
			const char *at = p + (x - a);
			if (copy_to) {
				memcpy(copy_to + t->dst_off + rel, at, n);
				at = copy_to + t->dst_off + rel;
			}
			int rc = e->opts.on_landed(e->opts.on_landed_ctx, t->entry, rel, at, n);
			if (rc) {
				fst_tensor_info info;
				fst_checkpoint_tensor(e->ck, t->entry, &info, NULL);
				return fsti_err(err, rc < 0 && rc >= FST_ECHANGED ? rc : FST_ECANCELED,
						"tensor \"%s\": on_landed returned %d at byte %" PRIu64,
						info.name, rc, rel);
			}
			x += n;
		}
	}
	return 0;
}

