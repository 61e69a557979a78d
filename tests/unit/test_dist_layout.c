/* Description: the tensor-parallel layout (fsti_dist_layout), over random
 * checkpoints, world sizes and shard dimensions: every byte is read from
 * storage exactly once in the group; shards cut as fastsafetensors cuts them
 * (block = ceil(size / world)); contiguous shards need no broadcast; every
 * rank agrees on the owners, whose bytes balance; destinations are aligned
 * and disjoint. */
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
	assert_int_equal(fst_writer_finish(w, test_path(file), &err), 0);
	fst_writer_free(w);
	fst_checkpoint *ck;
	assert_int_equal(fst_checkpoint_open(test_path(file), &ck, &err), 0);
	*n = fst_checkpoint_tensor_count(ck);
	return ck;
}

static void test_layout_properties(void **state)
{
	(void)state;
	for (int k = 0; k < 300; k++) {
		size_t n;
		fst_checkpoint *ck = random_checkpoint(k % 8, &n);
		int world = 1 + (int)(next() % 4);
		int *dims = calloc(n + 1, sizeof *dims);
		for (size_t i = 0; i < n; i++) {
			fst_tensor_info t;
			fst_checkpoint_tensor(ck, i, &t, NULL);
			dims[i] = t.ndim && next() % 3 ? (int)(next() % t.ndim) : FST_REPLICATE;
		}
		struct fsti_dist d[4];
		uint64_t read_total = 0, full_total = 0;
		fst_error err;
		for (int r = 0; r < world; r++) {
			assert_int_equal(fsti_dist_layout(ck, NULL, NULL, dims, world, r, 256, &d[r], &err),
					 0);
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
	assert_int_equal(fsti_dist_layout(ck, NULL, NULL, dims, 2, 0, 256, &d, &err), FST_EUSAGE);
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
		cmocka_unit_test(test_bad_dims),
		cmocka_unit_test(test_no_nccl_is_a_clear_error),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
