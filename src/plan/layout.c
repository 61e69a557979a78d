/*
 * layout.c - the layout of a tensor-parallel load: which bytes of each
 * tensor a rank holds, where they go, and who reads them. Pure.
 */
#include "layout.h"

#include <string.h>

/* Tensor info seen along dim (FST_REPLICATE: whole) from this rank. */
static int layout_tensor(const fst_tensor_info *info, int dim, int world, int rank,
			 struct fsti_dist_tensor *t, fst_error *err)
{
	t->dim = dim;
	if (dim < FST_REPLICATE || (dim >= 0 && (uint32_t)dim >= info->ndim))
		return fsti_err(err, FST_EUSAGE,
				"tensor \"%s\": cannot shard along dim %d of a %u-dimensional tensor",
				info->name, dim, info->ndim);
	unsigned bits = fst_dtype_bits(info->dtype);
	if (dim >= 0 && bits % 8)
		return fsti_err(err, FST_EUNSUPPORTED,
				"tensor \"%s\": %s packs several elements in a byte and cannot be "
				"sharded",
				info->name, fst_dtype_name(info->dtype));
	if (dim < 0) {
		t->outer = 1;
		t->mid = 1;
		t->inner_bytes = info->nbytes;
		t->start = 0;
		t->len = 1;
		t->contiguous = false;
	} else {
		uint64_t outer = 1, inner = bits / 8;
		for (int d = 0; d < dim; d++)
			outer *= info->shape[d];
		for (uint32_t d = (uint32_t)dim + 1; d < info->ndim; d++)
			inner *= info->shape[d];
		t->outer = outer;
		t->mid = info->shape[dim];
		t->inner_bytes = inner;
		uint64_t block = (t->mid + (uint64_t)world - 1) / (uint64_t)world;
		t->start = FSTI_MIN((uint64_t)rank * block, t->mid);
		t->len = FSTI_MIN(block, t->mid - t->start);
		t->contiguous = outer == 1 || t->full_bytes == 0;
	}
	t->shard_bytes = t->outer * t->len * t->inner_bytes;
	return 0;
}

/* Owners: consecutive runs balanced by bytes over the ranks of a node, the
 * same on every rank and in every node (so each node reads every broadcast
 * tensor once, and its ranks split those bytes evenly); and each tensor's
 * place in this rank's buffer and scratch. */
static void place(struct fsti_dist *out, int rank, uint32_t align)
{
	uint64_t ns = (uint64_t)out->node_size, total = out->bcast_bytes;
	int first = rank / out->node_size * out->node_size; /* this rank's node's first rank */
	uint64_t before = 0, dst = 0, scratch = 0;
	for (size_t i = 0; i < out->n; i++) {
		struct fsti_dist_tensor *t = &out->t[i];
		t->owner = t->root = -1;
		if (!t->contiguous) {
			uint64_t mid = before + t->full_bytes / 2;
			t->root = total ? (int)FSTI_MIN(ns - 1, mid * ns / total) : 0;
			t->owner = first + t->root;
			before += t->full_bytes;
			if (t->dim >= 0) {
				out->temp_bytes = FSTI_MAX(out->temp_bytes, t->full_bytes);
				if (t->owner == rank) {
					scratch = (scratch + align - 1) & ~(uint64_t)(align - 1);
					t->scratch_off = scratch;
					scratch += t->full_bytes;
				}
			}
		}
		dst = (dst + align - 1) & ~(uint64_t)(align - 1);
		t->dst_off = dst;
		dst += t->shard_bytes;
		out->read_bytes += t->contiguous ? t->shard_bytes
						 : (t->owner == rank ? t->full_bytes : 0);
	}
	out->dst_bytes = dst;
	out->scratch_bytes = scratch;
}

int fsti_dist_layout(const fst_checkpoint *ck, fsti_filter_fn filter, void *filter_ctx,
		     const int *dims, int world, int rank, int node_size, uint32_t align,
		     struct fsti_dist *out, fst_error *err)
{
	memset(out, 0, sizeof *out);
	if (node_size == 0)
		node_size = world;
	if (node_size <= 0 || world % node_size)
		return fsti_err(err, FST_EUSAGE,
				"nodes of %d ranks do not divide the group of %d ranks", node_size,
				world);
	out->node_size = node_size;
	size_t n = fst_checkpoint_tensor_count(ck);
	out->t = fsti_calloc(n + 1, sizeof *out->t);
	if (!out->t)
		return fsti_err(err, FST_ENOMEM, "out of memory for the layout");
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info info;
		size_t file;
		fst_checkpoint_tensor(ck, i, &info, &file);
		if (filter && !filter(filter_ctx, info.name))
			continue;
		struct fsti_dist_tensor *t = &out->t[out->n++];
		t->entry = (uint32_t)i;
		t->file = (uint32_t)file;
		t->file_off = info.file_offset;
		t->full_bytes = info.nbytes;
		int rc = layout_tensor(&info, dims ? dims[i] : FST_REPLICATE, world, rank, t, err);
		if (rc) {
			fsti_dist_free(out);
			return rc;
		}
		if (!t->contiguous)
			out->bcast_bytes += t->full_bytes;
	}
	place(out, rank, align);
	return 0;
}

void fsti_dist_free(struct fsti_dist *d)
{
	fsti_free(d->t);
	memset(d, 0, sizeof *d);
}

size_t fsti_dist_group_end(const struct fsti_dist *d, size_t i0, uint64_t limit)
{
	size_t i1 = i0;
	uint64_t group = 0;
	while (i1 < d->n && (i1 == i0 || group < limit)) {
		group += d->t[i1].contiguous ? 0 : d->t[i1].full_bytes;
		i1++;
	}
	return i1;
}

/* Whether rank reads t into its scratch: an inner-dim shard it owns. */
static bool in_scratch(const struct fsti_dist_tensor *t, int rank)
{
	return !t->contiguous && t->dim >= 0 && t->owner == rank;
}

/* The span of the scratch tensors of rank in [i0, i1) (*first: the lowest
 * offset; 0 bytes where none). place() puts a rank's scratch tensors at
 * rising aligned offsets in table order, so the first is the lowest. */
static uint64_t group_span(const struct fsti_dist *d, int rank, size_t i0, size_t i1,
			   uint64_t *first)
{
	uint64_t end = 0;
	*first = UINT64_MAX;
	for (size_t i = i0; i < i1; i++) {
		const struct fsti_dist_tensor *t = &d->t[i];
		if (!in_scratch(t, rank))
			continue;
		if (*first == UINT64_MAX)
			*first = t->scratch_off;
		end = t->scratch_off + t->full_bytes;
	}
	return *first == UINT64_MAX ? 0 : end - *first;
}

void fsti_dist_scratch_ring(struct fsti_dist *d, int rank, uint64_t limit, uint32_t align)
{
	uint64_t slot = 0, first;
	size_t ngroups = 0;
	for (size_t i0 = 0, i1; i0 < d->n; i0 = i1, ngroups++) {
		i1 = fsti_dist_group_end(d, i0, limit);
		slot = FSTI_MAX(slot, group_span(d, rank, i0, i1, &first));
	}
	slot = (slot + align - 1) & ~(uint64_t)(align - 1);
	uint64_t ring = FSTI_MIN(ngroups, (size_t)FSTI_DIST_RING) * slot;
	if (ring >= d->scratch_bytes)
		return; /* few groups: the whole load's is no larger */
	size_t k = 0;
	for (size_t i0 = 0, i1; i0 < d->n; i0 = i1, k++) {
		i1 = fsti_dist_group_end(d, i0, limit);
		if (!group_span(d, rank, i0, i1, &first))
			continue;
		for (size_t i = i0; i < i1; i++)
			if (in_scratch(&d->t[i], rank))
				d->t[i].scratch_off = k % FSTI_DIST_RING * slot +
						      (d->t[i].scratch_off - first);
	}
	d->scratch_bytes = ring;
}
