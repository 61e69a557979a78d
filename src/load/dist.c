/*
 * dist.c - tensor-parallel loading over NCCL: each byte read from storage
 * once in the whole group, or once in each node.
 *
 * Every rank computes the same layout (fsti_dist_layout, pure): each
 * tensor's shape on this rank, its place in the final buffer, and how it
 * arrives. A shard that is contiguous in the file (dim 0, or leading
 * dimensions of size 1) is read by its own rank, straight into place, with
 * no communication. Every other tensor is read by one owner, chosen so the
 * owners' bytes balance, and broadcast; a shard along an inner dimension is
 * then cut out of the broadcast copy by a strided device copy. Reading uses
 * the ordinary engine (fsti_load_pieces), group by group, while the
 * previous group's collectives run on one stream; they are waited for with
 * a deadline, so a rank that fails or vanishes makes the others fail
 * instead of hang, and at the end the ranks agree on whether every read
 * succeeded.
 *
 * With a node communicator (fst_load_sharded_nodes), each node of
 * consecutive ranks reads every broadcast tensor once and broadcasts it
 * over its own communicator, so that traffic stays inside the node; only
 * the agreement runs over the whole group, which therefore still fails
 * together.
 */
#include "cuda.h"
#include "layout.h"
#include "engine.h"
#include "nccl.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Broadcast bytes per pipeline step: reads of the next step overlap the
 * collectives of this one (FST_DIST_GROUP_BYTES sets another size; the
 * tests make steps small to cross many). */
#define GROUP_BYTES (256ull << 20)

static uint64_t group_bytes(void)
{
	const char *e = fsti_env(FSTI_ENV_DIST_GROUP_BYTES);
	unsigned long long v = e ? strtoull(e, NULL, 10) : 0;
	return v ? (uint64_t)v : GROUP_BYTES;
}

struct fst_comm {
	const struct fsti_nccl *nc;
	const struct fsti_cuda *cu;
	fsti_nccl_comm comm;
	int world, rank, device;
	CUstream stream;
	int timeout_ms;
	bool broken; /* aborted after a failure: every later call fails */
	/* a load runs on it: two at once would interleave their collectives,
	 * which the other ranks issue in one order (wrong bytes, or a hang) */
	atomic_bool busy;
	/* 256 bytes on the device: the warm-up's, then each load's agreement
	 * flag, so that agreeing needs no allocation that could fail */
	CUdeviceptr probe;
	/* the flag's host side: the copy onto the device reads it from the
	 * stream, perhaps after agree has returned, so it lives here */
	int32_t flag;
};

static void comm_abort(fst_comm *c)
{
	c->broken = true;
	if (c->comm)
		c->nc->ncclCommAbort(c->comm);
	c->comm = NULL;
}

/* A failed or timed-out collective: this rank leaves the collectives that
 * the others still expect, on both communicators (node may be NULL), so
 * neither can be used again; aborting both also ends what NCCL still has
 * queued on them. */
static int pair_fail(fst_comm *c, fst_comm *node, int code, fst_error *err, const char *what,
		     int r)
{
	comm_abort(c);
	if (node)
		comm_abort(node);
	return fsti_err_backend(err, code, r, "rank %d of %d: %s", c->rank, c->world, what);
}

/* NCCL's asynchronous error of c: 0 while none (or still in progress). */
static int async_error(const fst_comm *c)
{
	int async = 0;
	c->nc->ncclCommGetAsyncError(c->comm, &async);
	return async == FSTI_NCCL_IN_PROGRESS ? 0 : async;
}

/* Wait for the stream of on (c, or the node's communicator node, which may
 * be NULL), or for ev recorded there, watching NCCL's errors on both
 * communicators and on's deadline: a peer that failed on either is reason
 * to stop. */
static int wait_pair(fst_comm *c, fst_comm *node, fst_comm *on, CUevent ev, const char *what,
		     fst_error *err)
{
	double deadline = fsti_now() + on->timeout_ms / 1000.0;
	for (;;) {
		CUresult q = ev ? on->cu->cuEventQuery(ev) : on->cu->cuStreamQuery(on->stream);
		if (q == FSTI_CUDA_SUCCESS)
			return 0;
		if (q != FSTI_CUDA_ERROR_NOT_READY) {
			char m[300], e2[200];
			snprintf(m, sizeof m, "%s failed: %s", what,
				 fsti_cuda_error(on->cu, q, e2, sizeof e2));
			return pair_fail(c, node, FST_EDEVICE, err, m, q);
		}
		int async = async_error(c);
		const char *which = "";
		/* The group's error read again after the node's: a rank of this
		 * node that saw the group fail aborts the node too, between the
		 * two reads, and the group's failure is the one to name. */
		if (!async && node && (async = async_error(node))) {
			int group = async_error(c);
			if (group)
				async = group;
			else
				which = " on the node's communicator";
		}
		if (async) {
			char m[300];
			snprintf(m, sizeof m, "%s failed%s: %s (another rank failed?)", what, which,
				 on->nc->ncclGetErrorString(async));
			return pair_fail(c, node, FST_EDEVICE, err, m, async);
		}
		if (fsti_now() > deadline) {
			char m[300];
			snprintf(m, sizeof m,
				 "%s did not finish within %d ms (FST_DIST_TIMEOUT_MS): another rank "
				 "failed or is not taking part",
				 what, on->timeout_ms);
			return pair_fail(c, node, FST_EDEVICE, err, m, 0);
		}
		struct timespec ts = {0, 200000};
		nanosleep(&ts, NULL);
	}
}

int fst_comm_rank(const fst_comm *c) { return c->rank; }
int fst_comm_world(const fst_comm *c) { return c->world; }

int fst_comm_unique_id(unsigned char id[FST_COMM_ID_BYTES], fst_error *err)
{
	fsti_err_clear(err);
	const struct fsti_nccl *nc;
	int rc = fsti_nccl_get(&nc, err);
	if (rc)
		return rc;
	fsti_nccl_id nid;
	int r = nc->ncclGetUniqueId(&nid);
	if (r)
		return fsti_err_backend(err, FST_EDEVICE, r, "ncclGetUniqueId failed: %s",
					nc->ncclGetErrorString(r));
	memcpy(id, nid.internal, FST_COMM_ID_BYTES);
	return 0;
}

/* Whether stream is idle, asked every millisecond for up to ms. */
static bool stream_idle_within(const struct fsti_cuda *cu, CUstream stream, int ms)
{
	for (int i = 0;; i++) {
		if (cu->cuStreamQuery(stream) == FSTI_CUDA_SUCCESS)
			return true;
		if (i >= ms)
			return false;
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
}

/* A rank that failed before it joined still joins, then leaves at once.
 * Every rank waits in ncclCommInitRank until all have joined, and no
 * deadline of ours reaches inside it: one rank missing there held the others
 * for as long as NCCL waits. Joined and aborted, the communicator fails the
 * others' first collectives, which are bounded (wait_pair). */
static void join_and_leave(const struct fsti_nccl *nc, int world, int rank,
			   const unsigned char id[FST_COMM_ID_BYTES])
{
	fsti_nccl_id nid;
	memcpy(nid.internal, id, FST_COMM_ID_BYTES);
	fsti_nccl_comm comm = NULL;
	if (!nc->ncclCommInitRank(&comm, world, nid, rank) && comm)
		nc->ncclCommAbort(comm);
}

int fst_comm_init(int world, int rank, const unsigned char id[FST_COMM_ID_BYTES], int device,
		  int timeout_ms, fst_comm **out, fst_error *err)
{
	fsti_err_clear(err);
	if (!out || !id || world < 1 || rank < 0 || rank >= world)
		return fsti_err(err, FST_EUSAGE, "fst_comm_init: rank %d of %d is not valid", rank,
				world);
	*out = NULL;
	const struct fsti_nccl *nc;
	const struct fsti_cuda *cu;
	int rc = fsti_nccl_get(&nc, err);
	if (rc)
		return rc; /* no NCCL here: nothing to join */
	rc = fsti_cuda_get(&cu, err);
	if (rc) {
		join_and_leave(nc, world, rank, id);
		return rc;
	}
	void *saved = fsti_cuda_save();
	rc = fsti_cuda_use_device(cu, device, err);
	fst_comm *c = rc ? NULL : fsti_calloc(1, sizeof *c);
	if (!rc && !c)
		rc = fsti_err(err, FST_ENOMEM, "out of memory");
	if (!rc) {
		c->nc = nc;
		c->cu = cu;
		c->world = world;
		c->rank = rank;
		c->device = device;
		const char *env = fsti_env(FSTI_ENV_DIST_TIMEOUT_MS);
		c->timeout_ms = timeout_ms > 0 ? timeout_ms : env && atoi(env) > 0 ? atoi(env) : 300000;
		CUresult cr = cu->cuStreamCreate(&c->stream, FSTI_CU_STREAM_NON_BLOCKING);
		if (cr)
			rc = fsti_cuda_fail(cu, cr, err, "cuda:%d: cannot create a stream", device);
	}
	if (rc)
		join_and_leave(nc, world, rank, id);
	else {
		fsti_nccl_id nid;
		memcpy(nid.internal, id, FST_COMM_ID_BYTES);
		int r = fsti_fault("nccl") ? 2 : nc->ncclCommInitRank(&c->comm, world, nid, rank);
		if (r)
			rc = fsti_err_backend(err, FST_EDEVICE, r,
					      "rank %d of %d: ncclCommInitRank failed: %s", rank,
					      world, nc->ncclGetErrorString(r));
	}
	/* Two collectives now, an all-reduce and a broadcast: NCCL connects a
	 * collective's peers lazily, inside its first call (NCCL_RUNTIME_CONNECT,
	 * on by default since 2.22), for its algorithm; a broadcast runs on
	 * rings, which a small all-reduce may not have used. A peer gone by
	 * then holds that call itself, beyond any deadline of ours (on the
	 * H200, over NCCL's socket transport, 60 s of connection retries).
	 * Connected here, while every rank is joining, every later wait is ours
	 * to bound; so is this one. */
	CUdeviceptr probe = 0;
	if (!rc) {
		CUresult ar = cu->cuMemAlloc_v2(&probe, 256);
		if (ar)
			rc = fsti_cuda_fail(cu, ar, err,
					    "rank %d of %d: cannot allocate 256 bytes on cuda:%d for "
					    "the first collectives",
					    rank, world, device);
	}
	if (!rc) {
		void *p = (void *)(uintptr_t)probe;
		int r = nc->ncclAllReduce(p, p, 1, FSTI_NCCL_INT32, FSTI_NCCL_MAX, c->comm,
					  c->stream);
		if (!r)
			r = nc->ncclBroadcast(p, p, 1, FSTI_NCCL_INT32, 0, c->comm, c->stream);
		if (r)
			rc = fsti_err_backend(err, FST_EDEVICE, r,
					      "rank %d of %d: the first collectives failed: %s", rank,
					      world, nc->ncclGetErrorString(r));
		else
			rc = wait_pair(c, NULL, c, NULL, "the first collectives", err);
	}
	if (!rc)
		c->probe = probe;
	/* the abort first: it ends the collectives still queued on the stream
	 * (one that failed may leave the other waiting there) */
	if (rc && c && c->comm)
		nc->ncclCommAbort(c->comm);
	/* after a failed wait the stream may still use the probe: left then
	 * (the aborted collectives end soon after the abort returns) */
	if (rc && probe && stream_idle_within(cu, c->stream, 200))
		cu->cuMemFree_v2(probe);
	fsti_cuda_restore(saved);
	if (rc) {
		if (c && c->stream)
			cu->cuStreamDestroy_v2(c->stream);
		fsti_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

void fst_comm_destroy(fst_comm *c)
{
	if (!c)
		return;
	void *saved = fsti_cuda_save();
	fsti_cuda_use_device(c->cu, c->device, NULL);
	if (c->comm) {
		if (c->broken)
			c->nc->ncclCommAbort(c->comm);
		else
			c->nc->ncclCommDestroy(c->comm);
	}
	/* Work queued behind an aborted collective may still read the probe
	 * and c->flag: both are left then (a few hundred bytes), rather than
	 * freed under it. */
	bool idle = !c->stream || c->cu->cuStreamQuery(c->stream) == FSTI_CUDA_SUCCESS;
	if (c->probe && idle)
		c->cu->cuMemFree_v2(c->probe);
	if (c->stream)
		c->cu->cuStreamDestroy_v2(c->stream);
	fsti_cuda_restore(saved);
	if (idle)
		fsti_free(c);
}

/* The reads of this rank among tensors [i0, i1): into the final buffer,
 * or into its scratch. */
static size_t rank_pieces(const struct fsti_dist *d, int rank, bool scratch, size_t i0,
			  size_t i1, struct fsti_plan_tensor *p)
{
	size_t n = 0;
	for (size_t i = i0; i < i1; i++) {
		const struct fsti_dist_tensor *t = &d->t[i];
		if (t->contiguous && !scratch && t->shard_bytes) {
			p[n++] = (struct fsti_plan_tensor){t->file, t->entry,
							   t->file_off + t->start * t->inner_bytes,
							   t->shard_bytes, t->dst_off};
		} else if (!t->contiguous && t->owner == rank && t->full_bytes) {
			if (t->dim < 0 && !scratch)
				p[n++] = (struct fsti_plan_tensor){t->file, t->entry, t->file_off,
								   t->full_bytes, t->dst_off};
			else if (t->dim >= 0 && scratch)
				p[n++] = (struct fsti_plan_tensor){t->file, t->entry, t->file_off,
								   t->full_bytes, t->scratch_off};
		}
	}
	return n;
}

static uint64_t pieces_bytes(const struct fsti_plan_tensor *p, size_t n)
{
	uint64_t bytes = 0;
	for (size_t i = 0; i < n; i++)
		bytes += p[i].nbytes;
	return bytes;
}

/* ---- collectives */

/* One sharded load. */
struct sharded {
	const char *fn; /* the caller's name, for messages */
	/* the caller's progress, over all of this rank's reads: each group's
	 * load reports its own, from progress_base on */
	void (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
	uint64_t progress_base, progress_total;
	const fst_checkpoint *ck;
	fst_comm *c;
	/* the node's communicator, or NULL: the broadcasts' (bc) is then c */
	fst_comm *node, *bc;
	fst_load_opts opts;
	char device[32];
	struct fsti_dist d;
	struct fst_buffer *b;
	struct fsti_plan_tensor *pieces; /* one group's reads */
	CUdeviceptr scratch, temp;
	uint64_t max_pitch; /* the widest row one strided copy may step over */
	uint64_t group_limit; /* broadcast bytes per pipeline step */
	CUevent queued[2]; /* the end of the last two groups' collectives */
	/* this rank's first read failure: it goes on with the collectives, and
	 * the ranks agree on it at the end */
	int read_rc;
	fst_error rerr;
};

static int comm_fail(struct sharded *s, int code, fst_error *err, const char *what, int r)
{
	return pair_fail(s->c, s->node, code, err, what, r);
}

static int wait_stream(struct sharded *s, fst_comm *on, const char *what, fst_error *err)
{
	return wait_pair(s->c, s->node, on, NULL, what, err);
}

static int check_nccl(struct sharded *s, int r, const char *what, fst_error *err)
{
	if (!r)
		return 0;
	char m[300];
	snprintf(m, sizeof m, "%s: %s", what, s->c->nc->ncclGetErrorString(r));
	return comm_fail(s, FST_EDEVICE, err, m, r);
}

/* Did every rank of the group succeed? An all-reduce of a flag (the
 * comm's probe) over the whole group, bounded in time: *any is whether
 * some rank failed. what names it in messages; only the agreement on the
 * reads has the "nccl" fault site. */
static int agree(struct sharded *s, bool failed, bool *any, const char *what, bool fault,
		 fst_error *err)
{
	fst_comm *c = s->c;
	c->flag = failed ? 1 : 0;
	CUresult cr = c->cu->cuMemcpyHtoDAsync_v2(c->probe, &c->flag, sizeof c->flag, c->stream);
	if (cr)
		return comm_fail(s, FST_EDEVICE, err, "cannot stage the status flag", cr);
	void *flag = (void *)(uintptr_t)c->probe;
	int r = fault && fsti_fault("nccl")
			? 3
			: c->nc->ncclAllReduce(flag, flag, 1, FSTI_NCCL_INT32, FSTI_NCCL_MAX,
					       c->comm, c->stream);
	char m[200];
	snprintf(m, sizeof m, "ncclAllReduce %s", what);
	int rc = check_nccl(s, r, m, err);
	snprintf(m, sizeof m, "agreeing %s", what);
	if (!rc)
		rc = wait_stream(s, c, m, err);
	if (rc)
		return rc;
	int32_t max = 0;
	cr = c->cu->cuMemcpyDtoH_v2(&max, c->probe, sizeof max);
	if (cr)
		return comm_fail(s, FST_EDEVICE, err, "cannot read the status flag", cr);
	*any = max != 0;
	return 0;
}

static void release_dist(struct fst_buffer *b)
{
	fsti_cuda_release_device_buffer(b);
}

/* The node's communicator against the group's, as far as one rank can
 * tell: its size divides the group's, this rank's place in it is the one
 * consecutive nodes give, and it is on the same device. That the node's
 * other ranks are this rank's neighbours in the group only they know. */
static int node_check(const struct sharded *s, fst_error *err)
{
	const fst_comm *c = s->c, *n = s->node;
	if (n->broken || !n->comm)
		return fsti_err(err, FST_EDEVICE, "rank %d: the node's communicator was aborted by "
						  "an earlier failure",
				c->rank);
	if (c->world % n->world)
		return fsti_err(err, FST_EUSAGE, "%s: a node communicator of %d ranks does not "
						 "divide the group of %d ranks",
				s->fn, n->world, c->world);
	if (n->rank != c->rank % n->world)
		return fsti_err(err, FST_EUSAGE, "%s: rank %d of the group is rank %d of its node's "
						 "communicator, not %d: a node's ranks must be "
						 "consecutive ranks of the group, in order",
				s->fn, c->rank, n->rank, c->rank % n->world);
	if (n->device != c->device)
		return fsti_err(err, FST_EUSAGE, "%s: the node's communicator is on cuda:%d, the "
						 "group's on cuda:%d: both must be this rank's device",
				s->fn, n->device, c->device);
	return 0;
}

/* A group's load's progress as the caller's, over all of the rank's reads:
 * it only grows, to the rank's total. */
static void group_progress(void *ctx, uint64_t done, uint64_t total)
{
	(void)total;
	struct sharded *s = ctx;
	s->progress(s->progress_ctx, s->progress_base + done, s->progress_total);
}

/* The options first (the one check fst_load makes, so a bad struct is
 * refused before comm is touched), then the arguments and the
 * communicators; the device is the communicator's, and reads are staged. */
static int sharded_check(struct sharded *s, const fst_load_opts *opts, fst_buffer **out,
			 fst_error *err)
{
	int rc = fsti_load_opts_check(opts, &s->opts, err);
	if (rc)
		return rc;
	if (!s->ck || !s->c || !out)
		return fsti_err(err, FST_EUSAGE, "%s: checkpoint, comm and out are required", s->fn);
	if (s->c->broken || !s->c->comm)
		return fsti_err(err, FST_EDEVICE, "rank %d: the communicator was aborted by an "
						  "earlier failure",
				s->c->rank);
	if (s->node == s->c)
		s->node = NULL; /* one node: the group's communicator does it all */
	if (s->node && (rc = node_check(s, err)))
		return rc;
	s->bc = s->node ? s->node : s->c;
	if (s->opts.on_landed)
		return fsti_err(err, FST_EUSAGE, "%s: on_landed is not supported (a rank sees only "
						 "its slices)",
				s->fn);
	snprintf(s->device, sizeof s->device, "cuda:%d", s->c->device);
	s->opts.device = s->device;
	s->opts.gds = FST_GDS_OFF; /* pieces go through staging */
	if (s->opts.progress) {
		s->progress = s->opts.progress;
		s->progress_ctx = s->opts.progress_ctx;
		s->opts.progress = group_progress;
		s->opts.progress_ctx = s;
	}
	return 0;
}

/* cuMemAlloc, or the fault site device_alloc's failure. */
static CUresult device_alloc(const struct fsti_cuda *cu, CUdeviceptr *p, uint64_t n)
{
	return fsti_fault("device_alloc") ? FSTI_CUDA_ERROR_OUT_OF_MEMORY : cu->cuMemAlloc_v2(p, n);
}

/* The buffer: its table mirrors the layout, shapes cut to the shards, in
 * one device allocation. */
static int sharded_buffer(struct sharded *s, fst_error *err)
{
	const struct fsti_cuda *cu = s->c->cu;
	s->pieces = fsti_calloc(s->d.n + 1, sizeof *s->pieces);
	if (!s->pieces)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	s->progress_total = 0;
	for (int into_scratch = 0; into_scratch < 2; into_scratch++) {
		size_t np = rank_pieces(&s->d, s->c->rank, into_scratch, 0, s->d.n, s->pieces);
		s->progress_total += pieces_bytes(s->pieces, np);
	}
	int rc = fsti_buffer_new_sharded(s->ck, &s->d, &s->b, err);
	if (rc)
		return rc;
	struct fst_buffer *b = s->b;
	b->device_type = FST_DEVICE_CUDA;
	b->device_id = s->c->device;
	b->device_ctx = (void *)cu;
	uint64_t size = s->d.dst_bytes ? s->d.dst_bytes : 1;
	CUdeviceptr base = 0;
	CUresult cr = device_alloc(cu, &base, size);
	if (cr)
		return fsti_cuda_fail(cu, cr, err, "cuda:%d: cannot allocate %" PRIu64 " bytes",
				      s->c->device, s->d.dst_bytes);
	b->base = (void *)(uintptr_t)base;
	b->size = size;
	b->release_memory = release_dist;
	for (size_t i = 0; i < s->d.n; i++)
		b->t[i].data = (char *)b->base + s->d.t[i].dst_off;
	if (s->node)
		snprintf(b->describe, sizeof b->describe,
			 "tensor-parallel rank %d of %d, in nodes of %d: read %" PRIu64
			 " bytes from storage, broadcast the rest over NCCL within the node",
			 s->c->rank, s->c->world, s->node->world, s->d.read_bytes);
	else
		snprintf(b->describe, sizeof b->describe,
			 "tensor-parallel rank %d of %d: read %" PRIu64 " bytes from storage, "
			 "broadcast the rest over NCCL",
			 s->c->rank, s->c->world, s->d.read_bytes);
	return 0;
}

/* Device memory for the transfer: the owned inner-dim shards' scratch, the
 * broadcast copy and the events; a failure in any is agreed on before any
 * broadcast, in load_sharded, so every rank fails at once. */
static int sharded_memory(struct sharded *s, fst_error *err)
{
	const struct fsti_cuda *cu = s->c->cu;
	CUresult cr;
	CUdevice dev;
	int pitch = 0;
	if (cu->cuDeviceGet(&dev, s->c->device) ||
	    cu->cuDeviceGetAttribute(&pitch, FSTI_CU_DEVICE_ATTRIBUTE_MAX_PITCH, dev) || pitch <= 0)
		pitch = INT32_MAX; /* what every device so far has reported */
	s->max_pitch = (uint64_t)pitch;
	if (s->d.scratch_bytes && (cr = device_alloc(cu, &s->scratch, s->d.scratch_bytes)))
		return fsti_cuda_fail(cu, cr, err, "cuda:%d: cannot allocate %" PRIu64
						   " bytes of scratch",
				      s->c->device, s->d.scratch_bytes);
	if (s->d.temp_bytes && (cr = device_alloc(cu, &s->temp, s->d.temp_bytes)))
		return fsti_cuda_fail(cu, cr, err, "cuda:%d: cannot allocate %" PRIu64 " bytes",
				      s->c->device, s->d.temp_bytes);
	for (int k = 0; k < 2; k++)
		if ((cr = cu->cuEventCreate(&s->queued[k], FSTI_CU_EVENT_DISABLE_TIMING)))
			return fsti_cuda_fail(cu, cr, err, "cuda:%d: cannot create an event",
					      s->c->device);
	return 0;
}

/* This rank's reads among tensors [i0, i1): into the buffer, then into the
 * scratch; after a failure nothing more is read. */
static void read_group(struct sharded *s, size_t i0, size_t i1)
{
	for (int into_scratch = 0; into_scratch < 2 && !s->read_rc; into_scratch++) {
		size_t np = rank_pieces(&s->d, s->c->rank, into_scratch, i0, i1, s->pieces);
		if (np)
			s->read_rc = fsti_load_pieces(s->ck, &s->opts, s->pieces, np,
						      into_scratch ? (void *)(uintptr_t)s->scratch
								   : s->b->base,
						      into_scratch ? s->d.scratch_bytes : s->b->size,
						      &s->rerr);
		s->progress_base += pieces_bytes(s->pieces, np);
	}
	fsti_cuda_use_device(s->c->cu, s->c->device, NULL); /* loads give the context back */
}

/* This rank's block of an inner-dim shard, cut out of the broadcast copy. */
static int copy_shard(struct sharded *s, const struct fsti_dist_tensor *t, fst_error *err)
{
	fsti_memcpy2d m;
	memset(&m, 0, sizeof m);
	m.srcMemoryType = m.dstMemoryType = FSTI_CU_MEMORYTYPE_DEVICE;
	m.srcDevice = s->temp + t->start * t->inner_bytes;
	m.srcPitch = t->mid * t->inner_bytes;
	m.dstDevice = (CUdeviceptr)(uintptr_t)s->b->base + t->dst_off;
	m.dstPitch = t->len * t->inner_bytes;
	m.WidthInBytes = t->len * t->inner_bytes;
	m.Height = t->outer;
	/* on the broadcasts' stream: the next broadcast reuses temp */
	const struct fsti_cuda *cu = s->bc->cu;
	CUresult cr = 0;
	if (m.srcPitch <= s->max_pitch)
		cr = cu->cuMemcpy2DAsync_v2(&m, s->bc->stream);
	else /* rows wider than a strided copy may step (2 GiB): one copy a row,
	      * of which there are few, each row being that wide */
		for (size_t y = 0; y < m.Height && !cr; y++)
			cr = cu->cuMemcpyDtoDAsync_v2(m.dstDevice + y * m.dstPitch,
						      m.srcDevice + y * m.srcPitch, m.WidthInBytes,
						      s->bc->stream);
	return cr ? comm_fail(s, FST_EDEVICE, err, "strided copy of a shard failed", cr) : 0;
}

/* Queue tensor t's broadcast from its owner (whole tensors straight into
 * place, inner-dim shards through the copy), when it is broadcast: over the
 * node's communicator, whose root is the owner's index in the node, or
 * else over the group's, where that index is the owner's rank. */
static int broadcast_tensor(struct sharded *s, const struct fsti_dist_tensor *t, fst_error *err)
{
	fst_comm *bc = s->bc;
	if (t->contiguous || !t->full_bytes)
		return 0;
	int r;
	if (t->dim < 0) {
		void *p = (char *)s->b->base + t->dst_off;
		r = bc->nc->ncclBroadcast(p, p, t->full_bytes, FSTI_NCCL_UINT8, t->root, bc->comm,
					  bc->stream);
		return check_nccl(s, r, "ncclBroadcast", err);
	}
	bool mine = t->owner == s->c->rank;
	const void *send = mine ? (void *)(uintptr_t)(s->scratch + t->scratch_off) : NULL;
	if (mine && !s->scratch)
		send = (void *)(uintptr_t)s->temp; /* no scratch: send anything */
	r = bc->nc->ncclBroadcast(send, (void *)(uintptr_t)s->temp, t->full_bytes,
				  FSTI_NCCL_UINT8, t->root, bc->comm, bc->stream);
	int rc = check_nccl(s, r, "ncclBroadcast", err);
	if (rc || !t->shard_bytes)
		return rc;
	return copy_shard(s, t, err);
}

/* Did every rank read everything it had to? */
static int sharded_agree(struct sharded *s, fst_error *err)
{
	bool any = false;
	int rc = agree(s, s->read_rc != 0, &any, "on the read status", true, err);
	if (rc)
		return rc;
	if (s->read_rc) {
		if (err)
			*err = s->rerr;
		return s->read_rc;
	}
	if (any)
		return fsti_err(err, FST_EIO,
				"rank %d of %d: another rank could not read its share of the "
				"checkpoint",
				s->c->rank, s->c->world);
	return 0;
}

/*
 * Pipelined, group by group (GROUP_BYTES of broadcast each, or
 * FST_DIST_GROUP_BYTES): while the collectives of one group run on the
 * broadcasts' stream, this thread reads the next group. At most two
 * groups' collectives are queued: before a
 * group's are, the end of the one two before it is waited for, with the
 * deadline, so a stalled peer is noticed within a group, the queues behind
 * NCCL's calls never fill (where a call could block beyond any deadline),
 * and no rank reads far ahead of the others. A rank whose reads fail goes
 * on issuing the same collectives (sending what it has), so no rank waits
 * for it; the agreement at the end, over the whole group once every
 * broadcast is done, makes every rank fail together. The two communicators
 * never have collectives in flight at once, so neither can hold up the
 * other.
 */
static int sharded_transfer(struct sharded *s, fst_error *err)
{
	int rc = 0;
	const uint64_t limit = s->group_limit;
	for (size_t i0 = 0, k = 0; i0 < s->d.n && !rc; k++) {
		size_t i1 = fsti_dist_group_end(&s->d, i0, limit);
		read_group(s, i0, i1);
		CUevent ev = s->queued[k % 2];
		/* group k - 2's broadcasts done: group k + 1 may then be read
		 * into the scratch they sent from (FSTI_DIST_RING is 3) */
		if (k >= 2)
			rc = wait_pair(s->c, s->node, s->bc, ev, "broadcasting the checkpoint", err);
		for (size_t i = i0; i < i1 && !rc; i++)
			rc = broadcast_tensor(s, &s->d.t[i], err);
		CUresult cr = rc ? 0 : s->bc->cu->cuEventRecord(ev, s->bc->stream);
		if (cr)
			rc = comm_fail(s, FST_EDEVICE, err, "cannot record an event", cr);
		i0 = i1;
	}
	if (!rc)
		rc = wait_stream(s, s->bc, "broadcasting the checkpoint", err);
	if (!rc)
		rc = sharded_agree(s, err);
	return rc;
}

/*
 * After a failure the streams may still hold work queued behind a
 * collective that was aborted (the strided copies out of temp, the status
 * flag's copy): once the abort ends the collective, that work runs on. The
 * memory it uses is freed only when both streams are idle, waited for as
 * long as the communicators' timeout; past that it stays allocated, and the
 * log says so, since freeing it under a copy would let the copy write into
 * whatever is allocated there next.
 */
static bool streams_idle(const struct sharded *s)
{
	const fst_comm *cs[2] = {s->bc, s->c};
	int ms = FSTI_MAX(s->c->timeout_ms, s->bc->timeout_ms);
	double deadline = fsti_now() + ms / 1000.0;
	for (int k = 0; k < 2; k++)
		while (cs[k]->cu->cuStreamQuery(cs[k]->stream) == FSTI_CUDA_ERROR_NOT_READY) {
			if (fsti_now() > deadline) {
				fsti_log(FST_LOG_ERROR,
					 "rank %d: copies of a failed load still run on cuda:%d after "
					 "%d ms: leaking its %" PRIu64 " bytes of device memory",
					 s->c->rank, s->c->device, ms,
					 s->d.dst_bytes + s->d.scratch_bytes + s->d.temp_bytes);
				return false;
			}
			struct timespec ts = {0, 200000};
			nanosleep(&ts, NULL);
		}
	return true;
}

/* Device memory only when nothing queued can still touch it (idle). */
static void sharded_free(struct sharded *s, bool idle)
{
	const struct fsti_cuda *cu = s->c->cu;
	if (s->temp && idle)
		cu->cuMemFree_v2(s->temp);
	if (s->scratch && idle)
		cu->cuMemFree_v2(s->scratch);
	for (int k = 0; k < 2; k++)
		if (s->queued[k])
			cu->cuEventDestroy_v2(s->queued[k]); /* the driver waits for its work */
	if (s->b && !idle)
		s->b->release_memory = NULL;
	fsti_free(s->pieces);
	fsti_dist_free(&s->d);
}

static int load_claimed(const char *fn, const fst_checkpoint *ck, const fst_load_opts *opts,
			fst_comm *c, fst_comm *node, const int *dims, fst_buffer **out,
			fst_error *err)
{
	struct sharded s = {.fn = fn, .ck = ck, .c = c, .node = node};
	int rc = sharded_check(&s, opts, out, err);
	if (rc)
		return rc;
	rc = fsti_dist_layout(ck, s.opts.filter, s.opts.filter_ctx, dims, c->world, c->rank,
			      s.bc->world, s.opts.align, &s.d, err);
	if (rc)
		return rc;
	/* the owner's scratch: three groups' worth, reused (sharded_transfer
	 * reads a group only once the broadcasts out of its slot are done) */
	s.group_limit = group_bytes();
	fsti_dist_scratch_ring(&s.d, c->rank, s.group_limit, s.opts.align);
	void *saved = fsti_cuda_save();
	fsti_err_clear(&s.rerr);
	fst_error merr;
	int mrc = fsti_cuda_use_device(c->cu, c->device, &merr);
	if (!mrc)
		mrc = sharded_buffer(&s, &merr);
	if (!mrc)
		mrc = sharded_memory(&s, &merr);
	/* A rank without its memory would leave the others waiting for its
	 * collectives until the deadline: the group agrees on it first. */
	bool any = false;
	rc = agree(&s, mrc != 0, &any, "that every rank has its memory", false, err);
	if (!rc && mrc) {
		if (err)
			*err = merr;
		rc = mrc;
	} else if (!rc && any) {
		rc = fsti_err(err, FST_EDEVICE,
			      "rank %d of %d: another rank could not allocate its memory for the load",
			      c->rank, c->world);
	}
	if (!rc)
		rc = sharded_transfer(&s, err);
	sharded_free(&s, !rc || streams_idle(&s)); /* a success waited for both */
	if (rc)
		fst_buffer_release(s.b);
	else
		*out = s.b;
	fsti_cuda_restore(saved);
	return rc;
}

/* The load, with c and node (NULL, or c itself, or another) claimed for
 * it; a communicator another load of this rank holds is refused at once,
 * and the load that holds it goes on. */
static int load_sharded(const char *fn, const fst_checkpoint *ck, const fst_load_opts *opts,
			fst_comm *c, fst_comm *node, const int *dims, fst_buffer **out,
			fst_error *err)
{
	fsti_err_clear(err);
	if (out)
		*out = NULL;
	/* nothing claimed where the checks refuse the call: a node beside no
	 * comm is never followed */
	bool claim = ck && c && out;
	fst_comm *held[2] = {claim ? c : NULL, claim && node != c ? node : NULL};
	for (int k = 0; k < 2; k++)
		if (held[k] && atomic_exchange(&held[k]->busy, true)) {
			if (k)
				atomic_store(&held[0]->busy, false);
			return fsti_err(err, FST_EUSAGE,
					"%s: rank %d: the %s communicator is in use by another "
					"load (one load at a time on a communicator)",
					fn, held[k]->rank, k ? "node's" : "group's");
		}
	int rc = load_claimed(fn, ck, opts, c, node, dims, out, err);
	for (int k = 0; k < 2; k++)
		if (held[k])
			atomic_store(&held[k]->busy, false);
	return rc;
}

int fst_load_sharded_nodes(const fst_checkpoint *ck, const fst_load_opts *opts, fst_comm *c,
			   fst_comm *node, const int *dims, fst_buffer **out, fst_error *err)
{
	return load_sharded("fst_load_sharded_nodes", ck, opts, c, node, dims, out, err);
}

int fst_load_sharded(const fst_checkpoint *ck, const fst_load_opts *opts, fst_comm *c,
		     const int *dims, fst_buffer **out, fst_error *err)
{
	return load_sharded("fst_load_sharded", ck, opts, c, NULL, dims, out, err);
}
