/*
 * plan.h - where every byte goes: placement of tensors in a destination and
 * the reads that bring them (plan.c), and the tensor-parallel layout
 * (layout.h). Pure and deterministic; depends on base/ and format/.
 */
#ifndef FST_PLAN_H
#define FST_PLAN_H

#include "format.h"

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

/* How a plan's extents are read: into landing slots (chunks cut at
 * multiples of chunk_bytes in file offsets, friendly to O_DIRECT; bytes
 * scattered tensor by tensor), straight into the destination (extents
 * contiguous in the destination too), or chosen per file. */
enum fsti_plan_mode {
	FSTI_PLAN_SLOTS,
	FSTI_PLAN_DIRECT,
	FSTI_PLAN_PER_FILE,
};

struct fsti_plan_request {
	const fst_checkpoint *ck;
	fsti_filter_fn filter; /* NULL: every tensor */
	void *filter_ctx;
	uint32_t align;        /* of each tensor in the destination, a power of two */
	uint64_t chunk_bytes;  /* the largest read */
	enum fsti_plan_mode mode;
	/* FSTI_PLAN_PER_FILE: files whose entry is true get direct extents
	 * (GPUDirect reads land straight at their tensors), the others slots */
	const bool *direct_files;
	/* the largest direct read (0: chunk_bytes) */
	uint64_t direct_chunk_bytes;
	/* nonzero: each cut of a direct extent that falls inside a tensor moves
	 * back to a multiple of grain counted from that tensor's first byte (for
	 * on_landed blocks) */
	uint64_t grain;
};

int fsti_plan_make(const struct fsti_plan_request *r, struct fsti_plan *out, fst_error *err);
/* The common case: every tensor that filter keeps, all slots or all direct. */
int fsti_plan_build(const fst_checkpoint *ck, fsti_filter_fn filter, void *filter_ctx,
		    uint32_t align, uint64_t chunk_bytes, bool direct, struct fsti_plan *out,
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

/* Call fn for each piece of chunk c that belongs to one tensor: the piece
 * starts at byte `at` of the chunk and at byte dst_off of the destination. */
typedef int (*fsti_piece_fn)(void *ctx, uint64_t at, uint64_t dst_off, uint64_t len);
int fsti_chunk_pieces(const struct fsti_plan *p, const struct fsti_chunk *c, fsti_piece_fn fn,
		      void *ctx);
void fsti_plan_free(struct fsti_plan *p);

#endif
