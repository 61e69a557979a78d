/* Description: the tensor-parallel layout (fsti_dist_layout), over random
 * checkpoints, world sizes and shard dimensions: every byte is read from
 * storage exactly once in the group; shards cut as fastsafetensors cuts them
 * (block = ceil(size / world)); contiguous shards need no broadcast; every
 * rank agrees on the owners, whose bytes balance; destinations are aligned
 * and disjoint. With nodes (worlds 2, 4, 8 and 16, every node size that
 * divides them): one node is the layout above, owners by the rule it has
 * always had; in each node every broadcast tensor is read exactly once, by
 * a rank of that node chosen by the same rule over the node's ranks, and the
 * node's reads add up to the broadcast bytes and its ranks' own shards; the
 * shards and the buffer do not depend on the nodes; a node size that does
 * not divide the world is refused, naming both. */
#include "helpers.h"

#include "layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* w's file written to file in the test's folder, freed, and opened; *n its
 * tensor count. */
static fst_checkpoint *finish_and_open(fst_writer *w, const char *file, size_t *n)
{
	fst_error err;
	assert_int_equal(fst_writer_finish(w, test_path(file), &err), 0);
	fst_writer_free(w);
	fst_checkpoint *ck;
	assert_int_equal(fst_checkpoint_open(test_path(file), &ck, &err), 0);
	*n = fst_checkpoint_tensor_count(ck);
	return ck;
}

static fst_checkpoint *random_checkpoint(int k, size_t *n)
{
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	static unsigned char data[1 << 16];
	size_t count = 1 + next() % 12;
	static const fst_dtype types[] = {FST_DTYPE_BF16, FST_DTYPE_F32, FST_DTYPE_U8, FST_DTYPE_I64};
	for (size_t i = 0; i < count; i++) {
		uint32_t ndim = (uint32_t)(next() % 4);
		uint64_t shape[3], numel = 1;
		for (uint32_t d = 0; d < ndim; d++) {
			shape[d] = next() % 9; /* 0..8, so empty and tiny shards happen */
			numel *= shape[d];
		}
		fst_dtype dt = types[next() % 4];
		char name[32];
		snprintf(name, sizeof name, "t%zu", i);
		assert_int_equal(fst_writer_add(w, name, dt, ndim, shape, data,
						numel * fst_dtype_bits(dt) / 8, &err),
				 0);
	}
	char file[64];
	snprintf(file, sizeof file, "dist%d.safetensors", k);
	return finish_and_open(w, file, n);
}

/* A shard dimension or FST_REPLICATE per tensor, at random. */
static int *random_dims(const fst_checkpoint *ck, size_t n)
{
	int *dims = calloc(n + 1, sizeof *dims);
	assert_non_null(dims);
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info t;
		fst_checkpoint_tensor(ck, i, &t, NULL);
		dims[i] = t.ndim && next() % 3 ? (int)(next() % t.ndim) : FST_REPLICATE;
	}
	return dims;
}

/* The layout of rank r of world in nodes of ns ranks, which must succeed. */
static void layout(const fst_checkpoint *ck, const int *dims, int world, int r, int ns,
		   struct fsti_dist *d)
{
	fst_error err;
	int rc = fsti_dist_layout(ck, NULL, NULL, dims, world, r, ns, 256, d, &err);
	if (rc)
		fail_msg("layout of rank %d of %d, nodes of %d: %s", r, world, ns, err.message);
}

static void test_layout_properties(void **state)
{
	(void)state;
	for (int k = 0; k < 300; k++) {
		size_t n;
		fst_checkpoint *ck = random_checkpoint(k % 8, &n);
		int world = 1 + (int)(next() % 4);
		int *dims = random_dims(ck, n);
		struct fsti_dist d[4];
		uint64_t read_total = 0, full_total = 0;
		for (int r = 0; r < world; r++) {
			layout(ck, dims, world, r, 0, &d[r]);
			assert_int_equal(d[r].n, n);
			read_total += d[r].read_bytes;
		}
		uint64_t bcast = 0, biggest = 0, owned[4] = {0};
		for (size_t i = 0; i < n; i++) {
			const struct fsti_dist_tensor *t0 = &d[0].t[i];
			full_total += t0->full_bytes;
			uint64_t sum_len = 0, expect_start = 0;
			for (int r = 0; r < world; r++) {
				const struct fsti_dist_tensor *t = &d[r].t[i];
				assert_int_equal(t->owner, t0->owner);
				assert_int_equal(t->contiguous, t0->contiguous);
				assert_int_equal(t->shard_bytes, t->outer * t->len * t->inner_bytes);
				if (t->dim >= 0) {
					uint64_t block = (t->mid + (uint64_t)world - 1) / (uint64_t)world;
					assert_true(t->len <= block);
					if (t->len)
						assert_int_equal(t->start, expect_start);
					expect_start += t->len;
					sum_len += t->len;
					assert_int_equal(t->contiguous, t->outer == 1 || t->full_bytes == 0);
				} else {
					assert_int_equal(t->shard_bytes, t->full_bytes);
					assert_false(t->contiguous);
				}
				assert_int_equal(t->dst_off % 256, 0);
			}
			if (t0->dim >= 0)
				assert_int_equal(sum_len, t0->mid);
			if (!t0->contiguous) {
				assert_true(t0->owner >= 0 && t0->owner < world);
				bcast += t0->full_bytes;
				owned[t0->owner] += t0->full_bytes;
				if (t0->full_bytes > biggest)
					biggest = t0->full_bytes;
			} else {
				assert_int_equal(t0->owner, -1);
			}
		}
		/* each byte read once in the whole group */
		assert_int_equal(read_total, full_total);
		for (int r = 0; r < world; r++) {
			assert_true(owned[r] <= bcast / (uint64_t)world + biggest);
			/* destinations disjoint and inside the buffer */
			for (size_t i = 0; i + 1 < n; i++)
				assert_true(d[r].t[i].dst_off + d[r].t[i].shard_bytes <=
					    d[r].t[i + 1].dst_off);
			if (n)
				assert_true(d[r].t[n - 1].dst_off + d[r].t[n - 1].shard_bytes <=
					    d[r].dst_bytes);
			fsti_dist_free(&d[r]);
		}
		free(dims);
		fst_checkpoint_close(ck);
	}
}

#define MAX_WORLD 16

/* The owner of each broadcast tensor as one-node loads have always chosen
 * it, written out apart from layout.c: the rank whose 1/world of the
 * broadcast bytes holds the tensor's middle byte. */
static void reference_owners(const struct fsti_dist *d, int world, int *owner)
{
	uint64_t total = 0, before = 0;
	for (size_t i = 0; i < d->n; i++)
		total += d->t[i].contiguous ? 0 : d->t[i].full_bytes;
	for (size_t i = 0; i < d->n; i++) {
		const struct fsti_dist_tensor *t = &d->t[i];
		owner[i] = -1;
		if (t->contiguous)
			continue;
		uint64_t mid = before + t->full_bytes / 2;
		owner[i] = total ? (int)(mid * (uint64_t)world / total) : 0;
		if (owner[i] > world - 1)
			owner[i] = world - 1;
		before += t->full_bytes;
	}
}

/* What does not depend on the nodes: the shards and this rank's buffer. */
static void assert_same_shards(const struct fsti_dist *a, const struct fsti_dist *b)
{
	assert_int_equal(a->n, b->n);
	assert_int_equal(a->dst_bytes, b->dst_bytes);
	assert_int_equal(a->temp_bytes, b->temp_bytes);
	assert_int_equal(a->bcast_bytes, b->bcast_bytes);
	for (size_t i = 0; i < a->n; i++) {
		const struct fsti_dist_tensor *x = &a->t[i], *y = &b->t[i];
		assert_int_equal(x->entry, y->entry);
		assert_int_equal(x->dim, y->dim);
		assert_int_equal(x->full_bytes, y->full_bytes);
		assert_int_equal(x->start, y->start);
		assert_int_equal(x->len, y->len);
		assert_int_equal(x->shard_bytes, y->shard_bytes);
		assert_int_equal(x->contiguous, y->contiguous);
		assert_int_equal(x->dst_off, y->dst_off);
	}
}

/* The owned inner-dim tensors of rank r lie apart in its scratch, aligned. */
static void assert_scratch(const struct fsti_dist *d, int r)
{
	uint64_t end = 0;
	for (size_t i = 0; i < d->n; i++) {
		const struct fsti_dist_tensor *t = &d->t[i];
		if (t->contiguous || t->dim < 0 || t->owner != r)
			continue;
		assert_int_equal(t->scratch_off % 256, 0);
		assert_true(t->scratch_off >= end);
		end = t->scratch_off + t->full_bytes;
	}
	assert_true(end <= d->scratch_bytes);
}

static void test_layout_nodes(void **state)
{
	(void)state;
	static const int worlds[] = {2, 4, 8, 16};
	for (int k = 0; k < 200; k++) {
		size_t n;
		fst_checkpoint *ck = random_checkpoint(k % 8, &n);
		int world = worlds[k % 4];
		int *dims = random_dims(ck, n);
		int *ref = calloc(n + 1, sizeof *ref);
		struct fsti_dist one[MAX_WORLD], d[MAX_WORLD];
		fst_error err;
		/* node_size 0 and node_size == world: the layout of one node */
		for (int r = 0; r < world; r++) {
			layout(ck, dims, world, r, 0, &one[r]);
			layout(ck, dims, world, r, world, &d[r]);
			assert_int_equal(one[r].node_size, world);
			assert_int_equal(d[r].node_size, world);
			assert_same_shards(&one[r], &d[r]);
			assert_int_equal(d[r].read_bytes, one[r].read_bytes);
			assert_int_equal(d[r].scratch_bytes, one[r].scratch_bytes);
			reference_owners(&one[r], world, ref);
			for (size_t i = 0; i < n; i++) {
				assert_int_equal(one[r].t[i].owner, ref[i]);
				assert_int_equal(one[r].t[i].root, ref[i]);
				assert_int_equal(d[r].t[i].owner, ref[i]);
				assert_int_equal(d[r].t[i].scratch_off, one[r].t[i].scratch_off);
			}
			fsti_dist_free(&d[r]);
		}
		for (int ns = 1; ns <= world; ns++) {
			if (world % ns) {
				int rc = fsti_dist_layout(ck, NULL, NULL, dims, world, 0, ns, 256,
							  &d[0], &err);
				assert_int_equal(rc, FST_EUSAGE);
				char want[80];
				snprintf(want, sizeof want, "nodes of %d ranks do not divide the "
							    "group of %d ranks",
					 ns, world);
				assert_string_equal(err.message, want);
				continue;
			}
			for (int r = 0; r < world; r++) {
				layout(ck, dims, world, r, ns, &d[r]);
				assert_same_shards(&one[r], &d[r]);
				assert_scratch(&d[r], r);
			}
			/* within a node, the rule of one node over the node's ranks */
			reference_owners(&one[0], ns, ref);
			uint64_t biggest = 0;
			for (size_t i = 0; i < n; i++)
				if (!one[0].t[i].contiguous && one[0].t[i].full_bytes > biggest)
					biggest = one[0].t[i].full_bytes;
			for (int node = 0; node < world / ns; node++) {
				uint64_t reads = 0, own_shards = 0;
				for (int r = node * ns; r < (node + 1) * ns; r++) {
					reads += d[r].read_bytes;
					uint64_t owned = 0;
					for (size_t i = 0; i < n; i++) {
						const struct fsti_dist_tensor *t = &d[r].t[i];
						if (t->contiguous) {
							assert_int_equal(t->owner, -1);
							assert_int_equal(t->root, -1);
							own_shards += t->shard_bytes;
							continue;
						}
						assert_int_equal(t->root, ref[i]);
						assert_int_equal(t->owner, node * ns + ref[i]);
						owned += t->owner == r ? t->full_bytes : 0;
					}
					/* the node's ranks split the broadcast bytes evenly */
					uint64_t share = d[r].bcast_bytes / (uint64_t)ns;
					assert_true(owned <= share + biggest);
				}
				/* each broadcast tensor read exactly once in the node */
				for (size_t i = 0; i < n; i++) {
					if (d[node * ns].t[i].contiguous)
						continue;
					int readers = 0;
					for (int r = node * ns; r < (node + 1) * ns; r++)
						readers += d[r].t[i].owner == r;
					assert_int_equal(readers, 1);
				}
				assert_int_equal(reads, d[0].bcast_bytes + own_shards);
			}
			for (int r = 0; r < world; r++)
				fsti_dist_free(&d[r]);
		}
		for (int r = 0; r < world; r++)
			fsti_dist_free(&one[r]);
		free(ref);
		free(dims);
		fst_checkpoint_close(ck);
	}
}

/* The scratch ring: for random layouts and step sizes, every tensor a rank
 * reads into its scratch lies inside the ring, aligned, and apart from every
 * other such tensor of its own group and of the groups up to
 * FSTI_DIST_RING - 1 after it (their reads and broadcasts overlap); the
 * ring is never larger than the whole load's scratch, and no larger than
 * FSTI_DIST_RING times the largest group's broadcast bytes plus alignment. */
/* 10 to 40 two-dimensional tensors, most split along their inner dim. */
static fst_checkpoint *ring_checkpoint(int k, size_t *n, int **dims)
{
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	static unsigned char data[1 << 16];
	size_t count = 10 + next() % 31;
	*dims = calloc(count + 1, sizeof **dims);
	static const fst_dtype types[] = {FST_DTYPE_BF16, FST_DTYPE_F32, FST_DTYPE_U8};
	for (size_t i = 0; i < count; i++) {
		uint64_t shape[2] = {1 + next() % 6, 1 + next() % 64};
		fst_dtype dt = types[next() % 3];
		char name[32];
		snprintf(name, sizeof name, "r%zu", i);
		assert_int_equal(fst_writer_add(w, name, dt, 2, shape, data,
						shape[0] * shape[1] * fst_dtype_bits(dt) / 8, &err),
				 0);
		uint64_t pick = next() % 6;
		(*dims)[i] = pick < 4 ? 1 : pick == 4 ? 0 : FST_REPLICATE;
	}
	char file[64];
	snprintf(file, sizeof file, "ring%d.safetensors", k);
	fst_checkpoint *ck = finish_and_open(w, file, n);
	assert_int_equal(*n, count);
	return ck;
}

static void test_scratch_ring(void **state)
{
	(void)state;
	static const uint64_t limits[] = {1, 512, 4096, 65536, UINT64_MAX};
	int smaller = 0;
	for (int k = 0; k < 200; k++) {
		size_t n;
		int *dims;
		fst_checkpoint *ck = ring_checkpoint(k % 8, &n, &dims);
		int world = 2 + k % 3;
		uint64_t limit = limits[k % 5];
		for (int r = 0; r < world; r++) {
			struct fsti_dist d;
			layout(ck, dims, world, r, 0, &d);
			uint64_t whole = d.scratch_bytes;
			fsti_dist_scratch_ring(&d, r, limit, 256);
			assert_true(d.scratch_bytes <= whole);
			smaller += d.scratch_bytes < whole;
			size_t *group = calloc(d.n + 1, sizeof *group);
			uint64_t largest = 0;
			size_t ngroups = 0;
			for (size_t i0 = 0, i1; i0 < d.n; i0 = i1, ngroups++) {
				i1 = fsti_dist_group_end(&d, i0, limit);
				assert_true(i1 > i0 && i1 <= d.n);
				uint64_t bytes = 0;
				for (size_t i = i0; i < i1; i++) {
					group[i] = ngroups;
					bytes += d.t[i].contiguous ? 0 : d.t[i].full_bytes;
				}
				largest = bytes > largest ? bytes : largest;
			}
			uint64_t slack = (uint64_t)(d.n + 1) * 256;
			assert_true(d.scratch_bytes <= FSTI_DIST_RING * (largest + slack));
			for (size_t i = 0; i < d.n; i++) {
				const struct fsti_dist_tensor *a = &d.t[i];
				if (a->contiguous || a->dim < 0 || a->owner != r)
					continue;
				assert_int_equal(a->scratch_off % 256, 0);
				assert_true(a->scratch_off + a->full_bytes <= d.scratch_bytes);
				for (size_t j = i + 1; j < d.n; j++) {
					const struct fsti_dist_tensor *b = &d.t[j];
					if (b->contiguous || b->dim < 0 || b->owner != r ||
					    group[j] - group[i] >= FSTI_DIST_RING)
						continue;
					bool apart = a->scratch_off + a->full_bytes <= b->scratch_off ||
						     b->scratch_off + b->full_bytes <= a->scratch_off;
					if (!apart)
						fail_msg("world %d rank %d limit %llu: tensors %zu and %zu "
							 "(groups %zu, %zu) overlap in the scratch",
							 world, r, (unsigned long long)limit, i, j,
							 group[i], group[j]);
				}
			}
			free(group);
			fsti_dist_free(&d);
		}
		free(dims);
		fst_checkpoint_close(ck);
	}
	/* not vacuous: the ring took the place of the whole load's scratch in
	 * many layouts (47 with this generator) */
	if (smaller < 20)
		fail_msg("the ring was smaller in only %d layouts", smaller);
}

static void test_bad_node_sizes(void **state)
{
	(void)state;
	size_t n;
	fst_checkpoint *ck = random_checkpoint(98, &n);
	static const int sizes[] = {-1, 3, 5, 8};
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		struct fsti_dist d;
		fst_error err;
		long allocs = fsti_live_allocations();
		int rc = fsti_dist_layout(ck, NULL, NULL, NULL, 4, 1, sizes[k], 256, &d, &err);
		assert_int_equal(rc, FST_EUSAGE);
		char want[80];
		snprintf(want, sizeof want, "nodes of %d ranks do not divide the group of 4 ranks",
			 sizes[k]);
		assert_string_equal(err.message, want);
		assert_null(d.t);
		assert_int_equal(fsti_live_allocations(), allocs);
	}
	fst_checkpoint_close(ck);
}

static void test_bad_dims(void **state)
{
	(void)state;
	size_t n;
	fst_checkpoint *ck = random_checkpoint(99, &n);
	int *dims = calloc(n + 1, sizeof *dims);
	for (size_t i = 0; i < n; i++)
		dims[i] = 7; /* no tensor here has 8 dimensions */
	struct fsti_dist d;
	fst_error err;
	assert_int_equal(fsti_dist_layout(ck, NULL, NULL, dims, 2, 0, 0, 256, &d, &err),
			 FST_EUSAGE);
	assert_non_null(strstr(err.message, "cannot shard along dim 7"));
	free(dims);
	fst_checkpoint_close(ck);
}

static void test_no_nccl_is_a_clear_error(void **state)
{
	(void)state;
	setenv("FST_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
	unsigned char id[FST_COMM_ID_BYTES];
	fst_error err;
	assert_int_equal(fst_comm_unique_id(id, &err), FST_EUNSUPPORTED);
	assert_non_null(strstr(err.message, "no NCCL"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout_properties),
		cmocka_unit_test(test_layout_nodes),
		cmocka_unit_test(test_scratch_ring),
		cmocka_unit_test(test_bad_node_sizes),
		cmocka_unit_test(test_bad_dims),
		cmocka_unit_test(test_no_nccl_is_a_clear_error),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
