/* Description: tensor-parallel loads end to end without a GPU: 4 ranks as
 * threads of this process, against the libcuda double and the NCCL double
 * (whose collectives run late on the ranks' streams and wait there for
 * every rank, and which fails the process when the ranks' collectives do
 * not match). fst_load_sharded, and fst_load_sharded_nodes in nodes of 1,
 * 2 and 4 ranks (and with the group's communicator as the node's): every
 * rank's shards equal the file's bytes cut as fastsafetensors cuts them,
 * and each node's ranks read (by their buffers' descriptions) every
 * broadcast tensor once plus their own shards. Every rank refuses a node
 * communicator whose ranks are out of order or on another device, before
 * any collective; with a node size that does not divide the group, the
 * ranks that can tell refuse it and the one that cannot times out. A rank
 * whose read fails, or whose device memory cannot be allocated, makes every
 * rank fail at once, and the communicators stay usable: the next load is
 * whole. A rank that takes no part makes every
 * other rank fail within the timeout, and both of their communicators are
 * aborted; where NCCL reports the peer's departure (the double's
 * FST_NCCL_DOUBLE_ASYNC=1), they fail at once, the node's failure
 * spreading to the other node through the group's communicator. The NCCL
 * double connects broadcasts lazily, inside each rank's first broadcast
 * call, as NCCL does (FST_NCCL_DOUBLE_LAZY=1, a connection to a missing
 * rank failing after 5 s): a rank that takes no part must still make the
 * others fail within the 300 ms timeout, so the communicators must be
 * connected when they are made. A rank that fails before it joins (a
 * device that does not exist) makes the others fail in their first
 * collectives, not wait for it in ncclCommInitRank. A second load on a
 * communicator that a load of its rank holds is refused at once, and the
 * first loads whole. Loads run in steps of 4 KiB of broadcast
 * (FST_DIST_GROUP_BYTES), so each crosses many and waits, with the
 * deadline, for the step two before each. Inner-dim shards whose rows pass
 * the device's pitch limit are copied whole. Nothing of the doubles or of
 * libfst is left allocated. */
#include "cuda_helpers.h"

#include <pthread.h>

#define WORLD 4

/* A node communicator as one rank joins it. */
struct node_spec {
	int id;     /* its id: node_ids[id] */
	int rank;   /* its rank in it */
	int world;  /* its size */
	int device; /* its device */
};

struct scenario {
	const char *name;
	int node_size;        /* consecutive nodes of that many; 0: no node */
	bool node_is_comm;    /* the group's communicator passed as the node's */
	struct node_spec *custom; /* or the node of each rank, as given */
	int vanish;           /* the rank that takes no part in the loads; -1: none */
	bool drop_node;       /* it destroys its node communicator at once */
	int timeout_ms;
	bool again;           /* every rank that took part loads a second time */
};

/* What a rank's progress callback saw. */
struct progress_seen {
	uint64_t done, total;
	int calls;
	bool backwards, total_moved;
};

struct rank_out {
	struct progress_seen progress;
	int rc, rc2;
	fst_error err, err2;
	double secs;
	fst_buffer *buf, *buf2;
};

struct run {
	const struct scenario *sc;
	const ch_ckpt *c;
	const int *dims;
	unsigned char group_id[FST_COMM_ID_BYTES], node_ids[WORLD][FST_COMM_ID_BYTES];
	struct node_spec nodes[WORLD];
	struct rank_out out[WORLD];
	char problem[WORLD][1100]; /* a set-up failure of a rank, off the main thread */
	pthread_mutex_t m;
	pthread_cond_t cv;
	int ready;    /* ranks past joining their communicators, or failed to */
	int finished; /* ranks done with their loads, or failed to join */
};

struct rank_arg {
	struct run *run;
	int rank;
};

static fst_load_opts opts(void)
{
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = FST_IO_PREAD;
	o.threads = 2;
	o.staging_bytes = 1 * MiB;
	return o;
}

static void seen_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct progress_seen *p = ctx;
	if (p->calls && done < p->done)
		p->backwards = true;
	if (p->calls && total != p->total)
		p->total_moved = true;
	p->done = done;
	p->total = total;
	p->calls++;
}

static int load(struct run *run, fst_comm *comm, fst_comm *node, fst_buffer **buf, fst_error *err,
		struct progress_seen *seen)
{
	fst_load_opts o = opts();
	o.progress = seen_progress;
	o.progress_ctx = seen;
	if (node)
		return fst_load_sharded_nodes(run->c->ck, &o, comm, node, run->dims, buf, err);
	return fst_load_sharded(run->c->ck, &o, comm, run->dims, buf, err);
}

/* Count this rank in *n, under the run's lock. */
static void count(struct run *run, int *n)
{
	pthread_mutex_lock(&run->m);
	(*n)++;
	pthread_cond_broadcast(&run->cv);
	pthread_mutex_unlock(&run->m);
}

/* Until n counts every rank but the one that takes no part. */
static void wait_others(struct run *run, const int *n)
{
	pthread_mutex_lock(&run->m);
	while (*n < WORLD - 1)
		pthread_cond_wait(&run->cv, &run->m);
	pthread_mutex_unlock(&run->m);
}

static void *rank_main(void *arg)
{
	struct rank_arg *a = arg;
	struct run *run = a->run;
	const struct scenario *sc = run->sc;
	int r = a->rank;
	int device = r % 2;
	struct rank_out *out = &run->out[r];
	fst_comm *comm = NULL, *node = NULL;
	fst_error err;
	if (fst_comm_init(WORLD, r, run->group_id, device, sc->timeout_ms, &comm, &err)) {
		snprintf(run->problem[r], sizeof run->problem[r], "comm: %s", err.message);
		goto gone;
	}
	const struct node_spec *ns = &run->nodes[r];
	if (sc->node_is_comm)
		node = comm;
	else if (ns->world &&
		 fst_comm_init(ns->world, ns->rank, run->node_ids[ns->id], ns->device, sc->timeout_ms,
			       &node, &err)) {
		snprintf(run->problem[r], sizeof run->problem[r], "node: %s", err.message);
		fst_comm_destroy(comm);
		goto gone;
	}
	if (r == sc->vanish) {
		/* A peer that left while a rank still joined would fail that
		 * rank's join, not its load: it leaves once every other rank
		 * has joined. */
		wait_others(run, &run->ready);
		if (sc->drop_node) {
			fst_comm_destroy(node);
			node = NULL;
		}
		/* here until the others are done, its communicators alive */
		wait_others(run, &run->finished);
	} else {
		count(run, &run->ready);
		double t0 = test_now_s();
		out->rc = load(run, comm, node, &out->buf, &out->err, &out->progress);
		out->secs = test_now_s() - t0;
		if (sc->again)
			out->rc2 = load(run, comm, node, &out->buf2, &out->err2, &out->progress);
		count(run, &run->finished);
	}
	if (node != comm)
		fst_comm_destroy(node);
	fst_comm_destroy(comm);
	return NULL;
gone: /* a rank that could not join: the one that takes no part waits for none */
	if (r != sc->vanish) {
		count(run, &run->ready);
		count(run, &run->finished);
	}
	return NULL;
}

/* Run a scenario: every rank in its own thread, each joining the group's
 * communicator and its node's. */
static void run_ranks(struct run *run, const struct scenario *sc, const ch_ckpt *c,
		      const int *dims)
{
	memset(run, 0, sizeof *run);
	run->sc = sc;
	run->c = c;
	run->dims = dims;
	pthread_mutex_init(&run->m, NULL);
	pthread_cond_init(&run->cv, NULL);
	fst_error err;
	assert_int_equal(fst_comm_unique_id(run->group_id, &err), 0);
	for (int i = 0; i < WORLD; i++)
		assert_int_equal(fst_comm_unique_id(run->node_ids[i], &err), 0);
	for (int r = 0; r < WORLD; r++) {
		if (sc->custom)
			run->nodes[r] = sc->custom[r];
		else if (sc->node_size)
			run->nodes[r] = (struct node_spec){r / sc->node_size, r % sc->node_size,
							   sc->node_size, r % 2};
	}
	pthread_t t[WORLD];
	struct rank_arg args[WORLD];
	for (int r = 0; r < WORLD; r++) {
		args[r] = (struct rank_arg){run, r};
		assert_int_equal(pthread_create(&t[r], NULL, rank_main, &args[r]), 0);
	}
	for (int r = 0; r < WORLD; r++)
		pthread_join(t[r], NULL);
	pthread_mutex_destroy(&run->m);
	pthread_cond_destroy(&run->cv);
	for (int r = 0; r < WORLD; r++)
		if (run->problem[r][0])
			fail_msg("%s: rank %d: %s", sc->name, r, run->problem[r]);
}

static void release_all(struct run *run)
{
	for (int r = 0; r < WORLD; r++) {
		fst_buffer_release(run->out[r].buf);
		fst_buffer_release(run->out[r].buf2);
	}
}

/* ---- what a rank should hold and read */

struct cut {
	uint64_t outer, mid, inner, start, len;
};

static struct cut cut_of(const fst_tensor_info *t, int dim, int rank)
{
	struct cut k = {1, 1, t->nbytes, 0, 1};
	if (dim < 0)
		return k;
	k.inner = fst_dtype_bits(t->dtype) / 8;
	for (int d = 0; d < dim; d++)
		k.outer *= t->shape[d];
	for (uint32_t d = (uint32_t)dim + 1; d < t->ndim; d++)
		k.inner *= t->shape[d];
	k.mid = t->shape[dim];
	uint64_t block = (k.mid + WORLD - 1) / WORLD;
	k.start = (uint64_t)rank * block < k.mid ? (uint64_t)rank * block : k.mid;
	k.len = block < k.mid - k.start ? block : k.mid - k.start;
	return k;
}

/* Read once by its own rank, never broadcast. */
static bool contiguous(const fst_tensor_info *t, int dim)
{
	return dim >= 0 && (cut_of(t, dim, 0).outer == 1 || t->nbytes == 0);
}

static lh_files files_of(const ch_ckpt *c)
{
	lh_files fs = {c->nfiles, c->bytes, c->sizes};
	return fs;
}

/* Every tensor of rank r's buffer is its cut of the file's bytes. */
static void assert_shards(const ch_ckpt *c, const int *dims, fst_buffer *buf, int r,
			  const char *what)
{
	lh_files fs = files_of(c);
	size_t n = fst_checkpoint_tensor_count(c->ck);
	assert_int_equal(fst_buffer_tensor_count(buf), n);
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info t;
		const unsigned char *full = lh_expected(c->ck, &fs, i, &t);
		struct cut k = cut_of(&t, dims[i], r);
		uint64_t bytes = k.outer * k.len * k.inner;
		unsigned char *want = malloc(bytes + 1), *got = malloc(bytes + 1);
		for (uint64_t o = 0; o < k.outer; o++)
			memcpy(want + o * k.len * k.inner, full + (o * k.mid + k.start) * k.inner,
			       k.len * k.inner);
		long j = fst_buffer_find(buf, t.name);
		assert_true(j >= 0);
		fst_tensor_view v;
		assert_int_equal(fst_buffer_tensor(buf, (size_t)j, &v), 0);
		assert_int_equal(v.nbytes, bytes);
		assert_int_equal(v.device_id, r % 2);
		fst_error err;
		if (bytes && fst_copy_to_host(&v, 0, got, bytes, &err))
			fail_msg("%s: rank %d: %s: %s", what, r, t.name, err.message);
		char name[300];
		snprintf(name, sizeof name, "%s: rank %d: %s (dim %d)", what, r, t.name, dims[i]);
		lh_assert_bytes(name, got, want, bytes);
		fst_view_release(&v);
		free(want);
		free(got);
	}
}

static uint64_t read_bytes(fst_buffer *buf)
{
	const char *d = strstr(fst_buffer_describe(buf), ": read ");
	assert_non_null(d);
	unsigned long long n = 0;
	assert_int_equal(sscanf(d, ": read %llu bytes from storage", &n), 1);
	return n;
}

/* The broadcast bytes, and each rank's own contiguous shards. */
static uint64_t expected_reads(const ch_ckpt *c, const int *dims, uint64_t own[WORLD])
{
	uint64_t bcast = 0;
	memset(own, 0, WORLD * sizeof *own);
	for (size_t i = 0; i < fst_checkpoint_tensor_count(c->ck); i++) {
		fst_tensor_info t;
		fst_checkpoint_tensor(c->ck, i, &t, NULL);
		if (!contiguous(&t, dims[i])) {
			bcast += t.nbytes;
			continue;
		}
		for (int r = 0; r < WORLD; r++) {
			struct cut k = cut_of(&t, dims[i], r);
			own[r] += k.outer * k.len * k.inner;
		}
	}
	return bcast;
}

/* A random dim for each tensor: sub-byte dtypes replicated, the others
 * sharded along any of their dims or replicated; the checkpoint has inner
 * and leading shards and replicated tensors. */
static int *random_dims(const ch_ckpt *c, uint64_t seed)
{
	lh_rng rng = {seed};
	size_t n = fst_checkpoint_tensor_count(c->ck);
	int *dims = calloc(n + 1, sizeof *dims);
	bool inner = false, lead = false, rep = false;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info t;
		fst_checkpoint_tensor(c->ck, i, &t, NULL);
		dims[i] = FST_REPLICATE;
		if (t.ndim && fst_dtype_bits(t.dtype) % 8 == 0 && lh_below(&rng, 4))
			dims[i] = (int)lh_below(&rng, t.ndim);
		inner |= dims[i] > 0 && !contiguous(&t, dims[i]) && t.nbytes;
		lead |= dims[i] >= 0 && contiguous(&t, dims[i]) && t.nbytes;
		rep |= dims[i] < 0 && t.nbytes;
	}
	assert_true(inner && lead && rep);
	return dims;
}

/* ---- the tests */

static void test_loads(void **state)
{
	(void)state;
	ch_ckpt c;
	ch_write_random("dist", 21, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	int *dims = random_dims(&c, 5);
	uint64_t own[WORLD], bcast = expected_reads(&c, dims, own);
	uint64_t total = fst_checkpoint_total_bytes(c.ck);
	static const struct scenario cases[] = {
		{"fst_load_sharded", 0, false, NULL, -1, false, 20000, false},
		{"the group's communicator as the node's", 0, true, NULL, -1, false, 20000, false},
		{"nodes of 1", 1, false, NULL, -1, false, 20000, false},
		{"nodes of 2", 2, false, NULL, -1, false, 20000, false},
		{"nodes of 4", 4, false, NULL, -1, false, 20000, false},
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		const struct scenario *sc = &cases[k];
		struct run run;
		run_ranks(&run, sc, &c, dims);
		int ns = sc->node_size ? sc->node_size : WORLD;
		uint64_t group = 0;
		for (int r = 0; r < WORLD; r++) {
			if (run.out[r].rc)
				fail_msg("%s: rank %d: %s", sc->name, r, run.out[r].err.message);
			assert_shards(&c, dims, run.out[r].buf, r, sc->name);
			const char *d = fst_buffer_describe(run.out[r].buf);
			char want[80];
			snprintf(want, sizeof want, "tensor-parallel rank %d of %d%s", r, WORLD,
				 sc->node_size ? ", in nodes of" : ":");
			assert_has(d, want);
			group += read_bytes(run.out[r].buf);
			/* progress over all of the rank's reads: it only grows, to
			 * what the rank read */
			const struct progress_seen *p = &run.out[r].progress;
			if (p->backwards || p->total_moved || p->done != p->total ||
			    p->total != read_bytes(run.out[r].buf))
				fail_msg("%s: rank %d: progress %s; last %" PRIu64 " of %" PRIu64
					 ", read %" PRIu64,
					 sc->name, r,
					 p->backwards	  ? "went back"
					 : p->total_moved ? "changed its total"
							  : "ended elsewhere",
					 p->done, p->total, read_bytes(run.out[r].buf));
		}
		for (int first = 0; first < WORLD; first += ns) {
			uint64_t sum = 0, shards = 0;
			for (int r = first; r < first + ns; r++) {
				sum += read_bytes(run.out[r].buf);
				shards += own[r];
			}
			assert_int_equal(sum, bcast + shards);
		}
		assert_int_equal(group, total + (uint64_t)(WORLD / ns - 1) * bcast);
		print_message("%s: %" PRIu64 " bytes read in all; %" PRIu64 " of the %" PRIu64
			      " broadcast\n",
			      sc->name, group, bcast, total);
		release_all(&run);
		ch_assert_clean(sc->name, c.host_base);
	}
	free(dims);
	ch_close(&c);
}

/* Inner-dim shards whose rows are wider than a strided copy may step over
 * (a device's pitch limit, 2 GiB on every GPU so far; here the double's
 * FST_DOUBLE_MAX_PITCH set between the narrowest and widest row) still
 * reach every rank whole: the copy goes a row at a time. */
static void test_rows_past_the_pitch_limit(void **state)
{
	(void)state;
	ch_ckpt c;
	ch_write_random("dist-pitch", 27, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	int *dims = random_dims(&c, 9);
	uint64_t lo = UINT64_MAX, hi = 0;
	for (size_t i = 0; i < fst_checkpoint_tensor_count(c.ck); i++) {
		fst_tensor_info t;
		fst_checkpoint_tensor(c.ck, i, &t, NULL);
		if (contiguous(&t, dims[i]) || dims[i] < 0 || !t.nbytes)
			continue;
		struct cut k = cut_of(&t, dims[i], 0);
		uint64_t row = k.mid * k.inner;
		lo = row < lo ? row : lo;
		hi = row > hi ? row : hi;
	}
	if (lo >= hi)
		fail_msg("the inner-dim shards' rows are all %" PRIu64 " bytes wide", lo);
	char pitch[32];
	snprintf(pitch, sizeof pitch, "%" PRIu64, lo);
	setenv("FST_DOUBLE_MAX_PITCH", pitch, 1);
	static const struct scenario sc = {"rows past the pitch limit", 2, false, NULL, -1, false,
					   20000, false};
	struct run run;
	run_ranks(&run, &sc, &c, dims);
	unsetenv("FST_DOUBLE_MAX_PITCH");
	for (int r = 0; r < WORLD; r++) {
		if (run.out[r].rc)
			fail_msg("%s: rank %d: %s", sc.name, r, run.out[r].err.message);
		assert_shards(&c, dims, run.out[r].buf, r, sc.name);
	}
	print_message("rows of %" PRIu64 " to %" PRIu64 " bytes, the limit %" PRIu64 "\n", lo, hi,
		      lo);
	release_all(&run);
	ch_assert_clean(sc.name, c.host_base);
	free(dims);
	ch_close(&c);
}

/* What rank r of bad-node case k says. */
static void refusal(size_t k, int r, char *want, size_t size)
{
	const char *fn = "fst_load_sharded_nodes";
	if (k == 0)
		snprintf(want, size, "%s: rank %d of the group is rank %d of its node's communicator, "
				     "not %d",
			 fn, r, (r % 2) ^ 1, r % 2);
	else if (k == 1)
		snprintf(want, size, "%s: the node's communicator is on cuda:%d, the group's on cuda:%d",
			 fn, (r + 1) % 2, r % 2);
	else if (r < 3)
		snprintf(want, size, "%s: a node communicator of 3 ranks does not divide the group of "
				     "4 ranks",
			 fn);
	else
		snprintf(want, size, "agreeing that every rank has its memory did not finish "
				     "within 300 ms");
}

static void test_bad_node_communicators(void **state)
{
	(void)state;
	ch_ckpt c;
	ch_write_random("dist-bad", 22, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	int *dims = random_dims(&c, 6);
	/* ranks of a node out of order, and nodes on the other device */
	struct node_spec swapped[WORLD], elsewhere[WORLD], three[WORLD];
	for (int r = 0; r < WORLD; r++) {
		swapped[r] = (struct node_spec){r / 2, (r % 2) ^ 1, 2, r % 2};
		elsewhere[r] = (struct node_spec){r / 2, r % 2, 2, (r + 1) % 2};
		/* {0, 1, 2} and {3}: only ranks 0 to 2 can tell */
		three[r] = (struct node_spec){0, r, 3, r % 2};
	}
	three[3] = (struct node_spec){1, 0, 1, 1};
	const struct scenario cases[] = {
		{"out of order", 0, false, swapped, -1, false, 20000, false},
		{"another device", 0, false, elsewhere, -1, false, 20000, false},
		{"3 does not divide 4", 0, false, three, -1, false, 300, false},
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		struct run run;
		run_ranks(&run, &cases[k], &c, dims);
		for (int r = 0; r < WORLD; r++) {
			const struct rank_out *o = &run.out[r];
			bool waits = k == 2 && r == 3; /* the rank that cannot tell */
			char want[200];
			refusal(k, r, want, sizeof want);
			assert_int_equal(o->rc, waits ? FST_EDEVICE : FST_EUSAGE);
			assert_has(o->err.message, want);
			assert_null(o->buf);
			/* refused before any collective: at once */
			assert_true(waits ? o->secs >= 0.3 && o->secs < 10 : o->secs < 1);
		}
		ch_assert_clean(cases[k].name, c.host_base);
	}
	free(dims);
	ch_close(&c);
}

/* One rank fails (fault armed for the first hit of any rank): it returns
 * its own error, holding own (and own_rc, unless 0); every other rank returns others_rc with
 * others, well within the 20 s timeout; the next load over the same
 * communicators is whole. */
/* Returns false, having checked every rank's load, where the fault never
 * fired (no rank failed); with must_fire, that fails the test. */
static bool one_rank_fails(const struct scenario *sc, const char *dir, uint64_t seed,
			   const char *fault, const char *own, int own_rc, int others_rc,
			   const char *others, bool must_fire)
{
	ch_ckpt c;
	ch_write_random(dir, seed, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	int *dims = random_dims(&c, seed);
	assert_int_equal(fst_fault_set(fault, NULL), 0);
	struct run run;
	run_ranks(&run, sc, &c, dims);
	fst_fault_set(NULL, NULL);
	bool fired = false;
	for (int r = 0; r < WORLD; r++)
		fired |= run.out[r].rc != 0;
	if (!fired && !must_fire) {
		for (int r = 0; r < WORLD; r++)
			assert_shards(&c, dims, run.out[r].buf, r, fault);
		release_all(&run);
		ch_assert_clean(fault, c.host_base);
		free(dims);
		ch_close(&c);
		return false;
	}
	int mine = 0;
	for (int r = 0; r < WORLD; r++) {
		const struct rank_out *o = &run.out[r];
		assert_int_not_equal(o->rc, 0);
		assert_null(o->buf);
		assert_true(o->secs < 5);
		if (strstr(o->err.message, others)) {
			assert_int_equal(o->rc, others_rc);
			continue;
		}
		mine++;
		assert_has(o->err.message, own);
		if (own_rc)
			assert_int_equal(o->rc, own_rc);
		print_message("rank %d failed (%.3f s): %s\n", r, o->secs, o->err.message);
	}
	assert_int_equal(mine, 1);
	/* nothing was aborted: the next load over the same communicators is whole */
	for (int r = 0; r < WORLD; r++) {
		if (run.out[r].rc2)
			fail_msg("rank %d, again: %s", r, run.out[r].err2.message);
		assert_shards(&c, dims, run.out[r].buf2, r, "again");
	}
	release_all(&run);
	ch_assert_clean(sc->name, c.host_base);
	free(dims);
	ch_close(&c);
	return true;
}

static void test_read_failure(void **state)
{
	(void)state;
	static const struct scenario sc = {"a read fails", 2, false, NULL, -1, false, 20000, true};
	one_rank_fails(&sc, "dist-fail", 23, "read:1", "read of", FST_EIO, FST_EIO,
		       "another rank could not read its share", true);
}

static void test_allocation_failure(void **state)
{
	(void)state;
	/* one rank cannot allocate its buffer: every rank knows it from the
	 * first agreement, at once */
	static const struct scenario sc = {"an allocation fails", 2, false, NULL, -1, false, 20000,
					   true};
	one_rank_fails(&sc, "dist-alloc", 26, "device_alloc:1", "cannot allocate", 0, FST_EDEVICE,
		       "another rank could not allocate its memory for the load", true);
	/* and each later allocation of a load: a rank's buffer, the scratch it
	 * reads owned inner-dim tensors into, its broadcast copy; a scratch
	 * that could not be had was once found out only at the end, the others
	 * having read everything first ("could not read its share") */
	int fired = 1;
	for (long n = 2;; n++) {
		if (n > 64)
			fail_msg("device_alloc:%ld still fails a load", n);
		char spec[64];
		snprintf(spec, sizeof spec, "device_alloc:%ld", n);
		if (!one_rank_fails(&sc, "dist-alloc", 26, spec, "cannot allocate", 0, FST_EDEVICE,
				    "another rank could not allocate its memory for the load",
				    false))
			break;
		fired++;
	}
	/* four buffers, four broadcast copies, and at least one scratch */
	if (fired < 9)
		fail_msg("only %d allocations of a load failed it", fired);
}

static void test_vanished_rank(void **state)
{
	(void)state;
	ch_ckpt c;
	ch_write_random("dist-vanish", 24, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	int *dims = random_dims(&c, 8);
	/* rank 1 takes no part: the others wait for it in the group's first
	 * agreement, that every rank has its memory, before any broadcast */
	static const struct scenario sc = {"rank 1 vanishes", 2, false, NULL, 1, false, 300, true};
	struct run run;
	run_ranks(&run, &sc, &c, dims);
	for (int r = 0; r < WORLD; r++) {
		if (r == 1)
			continue;
		const struct rank_out *o = &run.out[r];
		assert_int_equal(o->rc, FST_EDEVICE);
		assert_has(o->err.message, "agreeing that every rank has its memory did not finish "
					   "within 300 ms");
		/* within the timeout and well before a lazy connection gives up */
		assert_true(o->secs >= 0.3 && o->secs < 3);
		print_message("rank %d failed in %.2f s: %s\n", r, o->secs, o->err.message);
		/* both communicators aborted: the next load is refused at once */
		assert_int_equal(o->rc2, FST_EDEVICE);
		assert_has(o->err2.message, "the communicator was aborted by an earlier failure");
	}
	release_all(&run);
	ch_assert_clean(sc.name, c.host_base);
	free(dims);
	ch_close(&c);
}

static void test_departure_reported(void **state)
{
	(void)state;
	ch_ckpt c;
	ch_write_random("dist-async", 25, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	int *dims = random_dims(&c, 9);
	/* rank 1 destroys its node communicator and NCCL says so: rank 0 fails
	 * at once on the node's communicator, and its abort of the group's
	 * makes ranks 2 and 3 fail at once too (in the group's first
	 * agreement), long before the timeout */
	static const struct scenario sc = {"rank 1 leaves its node", 2, false, NULL, 1, true, 20000,
					   false};
	setenv("FST_NCCL_DOUBLE_ASYNC", "1", 1);
	struct run run;
	run_ranks(&run, &sc, &c, dims);
	unsetenv("FST_NCCL_DOUBLE_ASYNC");
	for (int r = 0; r < WORLD; r++) {
		if (r == 1)
			continue;
		const struct rank_out *o = &run.out[r];
		assert_int_equal(o->rc, FST_EDEVICE);
		if (r == 0)
			assert_has(o->err.message, "failed on the node's communicator: ");
		else
			assert_true(!strstr(o->err.message, "on the node's communicator"));
		assert_has(o->err.message, "(another rank failed?)");
		assert_true(o->secs < 5);
		print_message("rank %d failed in %.3f s: %s\n", r, o->secs, o->err.message);
	}
	release_all(&run);
	ch_assert_clean(sc.name, c.host_base);
	free(dims);
	ch_close(&c);
}

struct joiner {
	const unsigned char *id;
	int rank, device, rc;
	fst_error err;
	double secs;
	fst_comm *comm;
};

static void *join(void *arg)
{
	struct joiner *j = arg;
	double t0 = test_now_s();
	j->rc = fst_comm_init(WORLD, j->rank, j->id, j->device, 20000, &j->comm, &j->err);
	j->secs = test_now_s() - t0;
	return NULL;
}

/* Every rank joins a new communicator (id, made here) in a thread of its
 * own, on device r % 2; the rank bad (-1: none) names a device that does
 * not exist. */
static void join_ranks(unsigned char id[FST_COMM_ID_BYTES], int bad, struct joiner j[WORLD])
{
	fst_error err;
	assert_int_equal(fst_comm_unique_id(id, &err), 0);
	pthread_t t[WORLD];
	for (int r = 0; r < WORLD; r++) {
		j[r] = (struct joiner){.id = id, .rank = r, .device = r == bad ? 99 : r % 2};
		assert_int_equal(pthread_create(&t[r], NULL, join, &j[r]), 0);
	}
	for (int r = 0; r < WORLD; r++)
		pthread_join(t[r], NULL);
}

/* Rank 1 names a device that does not exist and fails before joining the
 * communicator. It joins and leaves at once, so the others fail in their
 * first collectives; they once waited in ncclCommInitRank for it (the
 * double gives up after 60 s, NCCL's bootstrap waits on). */
static void test_rank_that_cannot_join(void **state)
{
	(void)state;
	unsigned char id[FST_COMM_ID_BYTES];
	struct joiner j[WORLD];
	join_ranks(id, 1, j);
	for (int r = 0; r < WORLD; r++) {
		print_message("rank %d: %d in %.2f s: %s\n", r, j[r].rc, j[r].secs,
			      j[r].rc ? j[r].err.message : "joined");
		assert_int_equal(j[r].rc, FST_EDEVICE);
		assert_null(j[r].comm);
		if (r == 1)
			assert_has(j[r].err.message, "device 99 out of range");
		else
			assert_has(j[r].err.message, "the first collectives");
		assert_true(j[r].secs < 10);
	}
}

struct rank_load {
	const ch_ckpt *c;
	const int *dims;
	fst_comm *comm;
	int rc;
	fst_error err;
	fst_buffer *buf;
};

static void *load_rank(void *arg)
{
	struct rank_load *l = arg;
	fst_load_opts o = opts();
	l->rc = fst_load_sharded(l->c->ck, &o, l->comm, l->dims, &l->buf, &l->err);
	return NULL;
}

/* Rank 0 starts a load, which waits for the other ranks; a second load on
 * its communicator meanwhile is refused at once (two would interleave
 * their collectives), and the first goes on to load whole. */
static void test_one_load_at_a_time(void **state)
{
	(void)state;
	ch_ckpt c;
	ch_write_random("dist-busy", 27, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	int *dims = random_dims(&c, 10);
	unsigned char id[FST_COMM_ID_BYTES];
	struct joiner j[WORLD];
	join_ranks(id, -1, j);
	for (int r = 0; r < WORLD; r++)
		if (j[r].rc)
			fail_msg("rank %d: %s", r, j[r].err.message);
	fst_error err;
	pthread_t t[WORLD];
	struct rank_load l[WORLD];
	for (int r = 0; r < WORLD; r++)
		l[r] = (struct rank_load){.c = &c, .dims = dims, .comm = j[r].comm};
	assert_int_equal(pthread_create(&t[0], NULL, load_rank, &l[0]), 0);
	struct timespec ms200 = {0, 200 * 1000000};
	nanosleep(&ms200, NULL);
	fst_load_opts o = opts();
	fst_buffer *buf = (fst_buffer *)&o;
	assert_int_equal(fst_load_sharded(c.ck, &o, j[0].comm, dims, &buf, &err), FST_EUSAGE);
	assert_null(buf);
	assert_has(err.message, "rank 0: the group's communicator is in use by another load");
	for (int r = 1; r < WORLD; r++)
		assert_int_equal(pthread_create(&t[r], NULL, load_rank, &l[r]), 0);
	for (int r = 0; r < WORLD; r++)
		pthread_join(t[r], NULL);
	for (int r = 0; r < WORLD; r++) {
		if (l[r].rc)
			fail_msg("rank %d: %s", r, l[r].err.message);
		assert_shards(&c, dims, l[r].buf, r, "one load at a time");
		fst_buffer_release(l[r].buf);
		fst_comm_destroy(j[r].comm);
	}
	ch_assert_clean("one load at a time", c.host_base);
	free(dims);
	ch_close(&c);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	if (!getenv("FST_NCCL_LIBRARY")) {
		fprintf(stderr, "FST_NCCL_LIBRARY is not set (ctest sets it to the NCCL double)\n");
		return 77;
	}
	setenv("FST_NCCL_DOUBLE_LAZY", "1", 1);
	setenv("FST_NCCL_DOUBLE_CONNECT_MS", "5000", 1);
	/* steps of 4 KiB of broadcast: every load crosses many, and waits for
	 * the one two before each */
	setenv("FST_DIST_GROUP_BYTES", "4096", 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_loads, ch_reset),
		cmocka_unit_test_setup(test_bad_node_communicators, ch_reset),
		cmocka_unit_test_setup(test_read_failure, ch_reset),
		cmocka_unit_test_setup(test_allocation_failure, ch_reset),
		cmocka_unit_test_setup(test_vanished_rank, ch_reset),
		cmocka_unit_test_setup(test_departure_reported, ch_reset),
		cmocka_unit_test_setup(test_rows_past_the_pitch_limit, ch_reset),
		cmocka_unit_test_setup(test_rank_that_cannot_join, ch_reset),
		cmocka_unit_test_setup(test_one_load_at_a_time, ch_reset),
	};
	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
}
