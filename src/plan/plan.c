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

/* The marker for "every file direct" (plain plans). */
const bool fsti_plan_all_direct = true;
#define PLAN_ALL_DIRECT FSTI_PLAN_ALL_DIRECT

static bool is_direct(const bool *direct_files, uint32_t file)
{
	if (direct_files == PLAN_ALL_DIRECT)
		return true;
	return direct_files && direct_files[file];
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
	return fsti_plan_build_mixed(ck, filter, filter_ctx, align, chunk_bytes,
				     direct ? PLAN_ALL_DIRECT : NULL, chunk_bytes, 0, out, err);
}

static int cut_chunks(struct fsti_plan *out, uint64_t chunk_bytes, const bool *direct_files,
		      uint64_t direct_chunk_bytes, uint64_t grain, fst_error *err);

int fsti_plan_build_mixed(const fst_checkpoint *ck, fsti_filter_fn filter, void *filter_ctx,
			  uint32_t align, uint64_t chunk_bytes, const bool *direct_files,
			  uint64_t direct_chunk_bytes, uint64_t grain, struct fsti_plan *out,
			  fst_error *err)
{
	memset(out, 0, sizeof *out);
	if (!align || (align & (align - 1)))
		return fsti_err(err, FST_EUSAGE, "align %u must be a power of two", align);
	if (!chunk_bytes || !direct_chunk_bytes)
		return fsti_err(err, FST_EUSAGE, "chunk size must be positive");
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
		if (filter && !filter(filter_ctx, info.name))
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
	return cut_chunks(out, chunk_bytes, direct_files, direct_chunk_bytes, grain, err);
}

/* Extents and chunks of the pieces in out->t (in file order). */
static int cut_chunks(struct fsti_plan *out, uint64_t chunk_bytes, const bool *direct_files,
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
			bool direct = is_direct(direct_files, prev->file);
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
		bool direct = is_direct(direct_files, out->t[last].file);
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
	return cut_chunks(out, chunk_bytes, direct ? PLAN_ALL_DIRECT : NULL, chunk_bytes, 0, err);
}
