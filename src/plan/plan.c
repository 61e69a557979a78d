/*
 * plan.c - where every tensor lands and which reads bring it there.
 *
 * Pure: the same checkpoint and options give the same plan. Tensors keep the
 * checkpoint's order (file by file, by offset); each starts at the next
 * multiple of align in the destination. Consecutive tensors whose bytes are
 * contiguous in the file (and, for direct reads, in the destination) form
 * one extent; extents are cut into chunks of at most chunk_bytes for
 * parallel reading, at multiples of chunk_bytes in the file when the chunk
 * goes through a landing slot, so O_DIRECT reads stay block-aligned.
 * Misaligned file offsets are absorbed here, by where bytes land: nothing is
 * ever moved after it has been read.
 */
#include "plan.h"

#include <string.h>

/* How the extents of a plan are read: the mode, and the files of a
 * per-file choice. */
struct read_mode {
	enum fsti_plan_mode mode;
	const bool *direct_files;
};

static bool is_direct(const struct read_mode *m, uint32_t file)
{
	if (m->mode == FSTI_PLAN_DIRECT)
		return true;
	return m->mode == FSTI_PLAN_PER_FILE && m->direct_files[file];
}

void fsti_plan_free(struct fsti_plan *p)
{
	fsti_free(p->t);
	fsti_free(p->c);
	memset(p, 0, sizeof *p);
}

static int push_chunk(struct fsti_plan *p, size_t *cap, const struct fsti_chunk *c)
{
	if (p->nc == *cap) {
		size_t n = *cap ? *cap * 2 : 256;
		struct fsti_chunk *g = fsti_realloc(p->c, n * sizeof *g);
		if (!g)
			return FST_ENOMEM;
		p->c = g;
		*cap = n;
	}
	p->c[p->nc++] = *c;
	return 0;
}

uint64_t fsti_plan_block_cut(const struct fsti_plan *p, size_t *k, size_t last, uint64_t off,
			     uint64_t stop, uint64_t grain)
{
	while (*k < last && p->t[*k].file_off + p->t[*k].nbytes < stop)
		(*k)++;
	const struct fsti_plan_tensor *t = &p->t[*k];
	if (stop <= t->file_off || stop >= t->file_off + t->nbytes)
		return stop;
	uint64_t cut = t->file_off + (stop - t->file_off) / grain * grain;
	return cut > off ? cut : stop;
}

/* Cut the extent of plan tensors [first, last] into chunks. */
static int emit_extent(struct fsti_plan *p, size_t *cap, size_t first, size_t last,
		       uint64_t chunk_bytes, bool direct, uint64_t grain)
{
	const struct fsti_plan_tensor *a = &p->t[first], *z = &p->t[last];
	uint64_t start = a->file_off, end = z->file_off + z->nbytes;
	size_t k = first;
	for (uint64_t off = start; off < end;) {
		uint64_t stop = direct ? off + chunk_bytes : (off / chunk_bytes + 1) * chunk_bytes;
		if (direct && grain && grain <= chunk_bytes && stop < end) {
			size_t at = k; /* k stays the first tensor of this chunk */
			stop = fsti_plan_block_cut(p, &at, last, off, stop, grain);
		}
		uint64_t len = FSTI_MIN(stop, end) - off;
		struct fsti_chunk c = {
			.file = a->file,
			.file_off = off,
			.len = len,
			.dst_off = direct ? a->dst_off + (off - start) : 0,
		};
		/* tensors touched: skip those ending at or before off */
		while (k < last && p->t[k].file_off + p->t[k].nbytes <= off)
			k++;
		c.first = (uint32_t)k;
		size_t j = k;
		while (j < last && p->t[j + 1].file_off < off + len)
			j++;
		c.last = (uint32_t)j;
		if (push_chunk(p, cap, &c))
			return FST_ENOMEM;
		off += len;
	}
	return 0;
}

int fsti_chunk_pieces(const struct fsti_plan *p, const struct fsti_chunk *c, fsti_piece_fn fn,
		      void *ctx)
{
	uint64_t c0 = c->file_off, c1 = c->file_off + c->len;
	for (uint32_t i = c->first; i <= c->last; i++) {
		const struct fsti_plan_tensor *t = &p->t[i];
		uint64_t a = FSTI_MAX(c0, t->file_off), b = FSTI_MIN(c1, t->file_off + t->nbytes);
		if (b <= a)
			continue;
		int rc = fn(ctx, a - c0, t->dst_off + (a - t->file_off), b - a);
		if (rc)
			return rc;
	}
	return 0;
}

int fsti_plan_build(const fst_checkpoint *ck, fsti_filter_fn filter, void *filter_ctx,
		    uint32_t align, uint64_t chunk_bytes, bool direct, struct fsti_plan *out,
		    fst_error *err)
{
	struct fsti_plan_request r = {
		.ck = ck, .filter = filter, .filter_ctx = filter_ctx, .align = align,
		.chunk_bytes = chunk_bytes, .mode = direct ? FSTI_PLAN_DIRECT : FSTI_PLAN_SLOTS,
	};
	return fsti_plan_make(&r, out, err);
}

static int cut_chunks(struct fsti_plan *out, uint64_t chunk_bytes, const struct read_mode *m,
		      uint64_t direct_chunk_bytes, uint64_t grain, fst_error *err);

int fsti_plan_make(const struct fsti_plan_request *r, struct fsti_plan *out, fst_error *err)
{
	const fst_checkpoint *ck = r->ck;
	uint32_t align = r->align;
	uint64_t direct_chunk_bytes = r->direct_chunk_bytes ? r->direct_chunk_bytes
							    : r->chunk_bytes;
	memset(out, 0, sizeof *out);
	if (!align || (align & (align - 1)))
		return fsti_err(err, FST_EUSAGE, "align %u must be a power of two", align);
	if (!r->chunk_bytes)
		return fsti_err(err, FST_EUSAGE, "chunk size must be positive");
	if (r->mode == FSTI_PLAN_PER_FILE && !r->direct_files)
		return fsti_err(err, FST_EUSAGE, "internal: a per-file plan without its files");
	size_t n = fst_checkpoint_tensor_count(ck);
	out->align = align;
	out->t = fsti_calloc(n, sizeof *out->t);
	if (!out->t)
		return fsti_err(err, FST_ENOMEM, "out of memory for the plan");
	uint64_t cursor = 0;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info info;
		size_t file;
		fst_checkpoint_tensor(ck, i, &info, &file);
		if (r->filter && !r->filter(r->filter_ctx, info.name))
			continue;
		struct fsti_plan_tensor *t = &out->t[out->nt++];
		t->file = (uint32_t)file;
		t->entry = (uint32_t)i;
		t->file_off = info.file_offset;
		t->nbytes = info.nbytes;
		cursor = (cursor + align - 1) & ~(uint64_t)(align - 1);
		t->dst_off = cursor;
		cursor += info.nbytes;
		out->total_bytes += info.nbytes;
	}
	out->dst_size = cursor;
	struct read_mode m = {r->mode, r->direct_files};
	return cut_chunks(out, r->chunk_bytes, &m, direct_chunk_bytes, r->grain, err);
}

/* Extents and chunks of the pieces in out->t (in file order). */
static int cut_chunks(struct fsti_plan *out, uint64_t chunk_bytes, const struct read_mode *m,
		      uint64_t direct_chunk_bytes, uint64_t grain, fst_error *err)
{
	size_t cap = 0;
	size_t first = SIZE_MAX;
	for (size_t i = 0; i < out->nt; i++) {
		const struct fsti_plan_tensor *t = &out->t[i];
		if (!t->nbytes)
			continue; /* empty tensors need no read */
		if (first != SIZE_MAX) {
			/* the previous non-empty tensor: empty ones never break
			 * a run */
			size_t pi = i - 1;
			while (!out->t[pi].nbytes)
				pi--;
			const struct fsti_plan_tensor *prev = &out->t[pi];
			bool direct = is_direct(m, prev->file);
			bool contiguous = prev->file == t->file &&
					  prev->file_off + prev->nbytes == t->file_off &&
					  (!direct || prev->dst_off + prev->nbytes == t->dst_off);
			if (contiguous)
				continue;
			if (emit_extent(out, &cap, first, pi, direct ? direct_chunk_bytes : chunk_bytes,
					direct, grain))
				goto nomem;
		}
		first = i;
	}
	if (first != SIZE_MAX) {
		size_t last = out->nt - 1;
		while (!out->t[last].nbytes)
			last--;
		bool direct = is_direct(m, out->t[last].file);
		if (emit_extent(out, &cap, first, last, direct ? direct_chunk_bytes : chunk_bytes,
				direct, grain))
			goto nomem;
	}
	return 0;
nomem:
	fsti_plan_free(out);
	return fsti_err(err, FST_ENOMEM, "out of memory for the plan");
}

int fsti_plan_from_pieces(const struct fsti_plan_tensor *pieces, size_t n, uint32_t align,
			  uint64_t chunk_bytes, bool direct, struct fsti_plan *out, fst_error *err)
{
	memset(out, 0, sizeof *out);
	if (!chunk_bytes)
		return fsti_err(err, FST_EUSAGE, "chunk size must be positive");
	out->align = align;
	out->t = fsti_calloc(n + 1, sizeof *out->t);
	if (!out->t)
		return fsti_err(err, FST_ENOMEM, "out of memory for the plan");
	for (size_t i = 0; i < n; i++) {
		if (i && (pieces[i].file < pieces[i - 1].file ||
			  (pieces[i].file == pieces[i - 1].file &&
			   pieces[i].file_off < pieces[i - 1].file_off + pieces[i - 1].nbytes))) {
			fsti_plan_free(out);
			return fsti_err(err, FST_EUSAGE, "internal: pieces out of file order");
		}
		out->t[out->nt++] = pieces[i];
		out->total_bytes += pieces[i].nbytes;
		out->dst_size = FSTI_MAX(out->dst_size, pieces[i].dst_off + pieces[i].nbytes);
	}
	struct read_mode m = {direct ? FSTI_PLAN_DIRECT : FSTI_PLAN_SLOTS, NULL};
	return cut_chunks(out, chunk_bytes, &m, chunk_bytes, 0, err);
}
