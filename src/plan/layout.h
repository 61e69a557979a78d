/* layout.h - the layout of a tensor-parallel load (pure; layout.c). */
#ifndef FST_LAYOUT_H
#define FST_LAYOUT_H

#include "plan.h"

struct fsti_dist_tensor {
	uint32_t entry;       /* index in the checkpoint's table */
	uint32_t file;
	uint64_t file_off;
	int dim;              /* FST_REPLICATE or the sharded dimension */
	uint64_t full_bytes;
	/* the tensor seen as [outer, mid, inner_bytes] around dim */
	uint64_t outer, mid, inner_bytes;
	uint64_t start, len;  /* this rank's block of mid */
	uint64_t shard_bytes; /* bytes on this rank */
	bool contiguous;      /* the shard is one run of file bytes: no broadcast */
	/* when broadcast, the rank of this rank's node that reads it: its rank
	 * in the group, and its index in the node (the broadcast's root on the
	 * node's communicator; the same as owner with one node); else both -1 */
	int owner, root;
	uint64_t dst_off;     /* in this rank's buffer */
	uint64_t scratch_off; /* in the owner's scratch (inner-dim shards) */
};

struct fsti_dist {
	struct fsti_dist_tensor *t;
	size_t n;
	uint64_t dst_bytes;     /* this rank's buffer */
	uint64_t scratch_bytes; /* owned inner-dim shards, read whole */
	uint64_t temp_bytes;    /* the largest inner-dim tensor, received whole */
	uint64_t read_bytes;    /* bytes this rank reads from storage */
	uint64_t bcast_bytes;   /* the broadcast tensors' bytes, read once in each node */
	int node_size;          /* ranks per node */
};

/*
 * The layout of rank `rank` of `world`, whose nodes are node_size
 * consecutive ranks each (0: one node of world ranks). Each broadcast tensor
 * is read once in each node; node_size must divide world (FST_EUSAGE).
 */
int fsti_dist_layout(const fst_checkpoint *ck, fsti_filter_fn filter, void *filter_ctx,
		     const int *dims, int world, int rank, int node_size, uint32_t align,
		     struct fsti_dist *out, fst_error *err);
void fsti_dist_free(struct fsti_dist *d);

/* A load moves its tensors in steps (groups): from tensor i0 on, tensors
 * until limit bytes of broadcast are reached, at least one. Returns the end
 * of the group that starts at i0. */
size_t fsti_dist_group_end(const struct fsti_dist *d, size_t i0, uint64_t limit);

/* Groups whose scratch is in use at once: a group is read into its slot
 * only once the broadcasts of the group FSTI_DIST_RING before it are done. */
#define FSTI_DIST_RING 3

/*
 * The owner's scratch as a ring of FSTI_DIST_RING groups' worth instead of
 * the whole load's (whose inner-dim tensors can be a third of a model): the
 * inner-dim tensors rank owns in group k go to slot k % FSTI_DIST_RING, as
 * far apart as the layout placed them, each slot as large as the largest
 * group's (align-rounded); scratch_bytes becomes the ring's. Where the
 * ring would be no smaller (three groups or fewer), nothing changes.
 */
void fsti_dist_scratch_ring(struct fsti_dist *d, int rank, uint64_t limit, uint32_t align);

#endif
