/* Description: fst_load_sharded and fst_load_sharded_nodes check their
 * options with the one check fst_load makes, before anything else: an
 * options struct that was not initialised (struct_size 0, garbage, or larger
 * than this library's) is refused with fst_load's status and message,
 * before the communicators are used (here there are none; the node's is a
 * pointer that must not be followed), and no buffer is handed out; the
 * argument checks after it name the function that was called. And the buffer of
 * a sharded load (fsti_buffer_new_sharded) has each rank's shard shapes and
 * bytes, the checkpoint's own shapes untouched. */
#include "helpers.h"

#include "engine.h"

#include <stdio.h>
#include <string.h>

static fst_checkpoint *small_checkpoint(void)
{
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	static const unsigned char data[16];
	uint64_t shape[2] = {2, 2};
	assert_int_equal(fst_writer_add(w, "w", FST_DTYPE_F32, 2, shape, data, sizeof data, &err),
			 0);
	const char *path = test_path("sharded_opts.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	fst_checkpoint *ck;
	assert_int_equal(fst_checkpoint_open(path, &ck, &err), 0);
	return ck;
}

/* Stands for a node's communicator that the checks must not reach. */
static fst_comm *const untouchable = (fst_comm *)(uintptr_t)0x10;

/* fst_load_sharded(_nodes) (with no comm) fails as fst_load does with o. */
static void expect_same_refusal(const fst_checkpoint *ck, const fst_load_opts *o)
{
	for (int nodes = 0; nodes < 2; nodes++) {
		fst_error lerr, serr;
		fst_buffer *lbuf = NULL, *sbuf = (fst_buffer *)&sbuf; /* must be cleared */
		int lrc = fst_load(ck, o, &lbuf, &lerr);
		long allocs = fsti_live_allocations();
		int src = nodes ? fst_load_sharded_nodes(ck, o, NULL, untouchable, NULL, &sbuf, &serr)
				: fst_load_sharded(ck, o, NULL, NULL, &sbuf, &serr);
		assert_int_equal(lrc, FST_EUSAGE);
		assert_null(lbuf);
		assert_int_equal(src, lrc);
		assert_int_equal(serr.code, lrc);
		assert_string_equal(serr.message, lerr.message);
		assert_non_null(strstr(serr.message, "fst_load_opts_init"));
		assert_null(sbuf);
		assert_int_equal(fsti_live_allocations(), allocs);
	}
}

static void test_uninitialised_options(void **state)
{
	(void)state;
	fst_checkpoint *ck = small_checkpoint();
	fst_load_opts o;
	memset(&o, 0, sizeof o);
	expect_same_refusal(ck, &o); /* zeroed: struct_size 0 */
	memset(&o, 0xA5, sizeof o);
	expect_same_refusal(ck, &o); /* stack garbage */
	fst_load_opts_init(&o);
	o.struct_size = sizeof o + 8;
	expect_same_refusal(ck, &o); /* a newer library's struct */
	fst_checkpoint_close(ck);
}

/* Options that pass the check go on to the argument checks: the missing
 * comm is named, not the options. */
static void test_good_options_reach_the_comm_check(void **state)
{
	(void)state;
	fst_checkpoint *ck = small_checkpoint();
	fst_load_opts o;
	fst_load_opts_init(&o);
	const fst_load_opts *cases[] = {&o, NULL};
	for (size_t i = 0; i < 2; i++) {
		fst_error err;
		fst_buffer *buf = NULL;
		assert_int_equal(fst_load_sharded(ck, cases[i], NULL, NULL, &buf, &err), FST_EUSAGE);
		assert_string_equal(err.message,
				    "fst_load_sharded: checkpoint, comm and out are required");
		assert_null(buf);
		int rc = fst_load_sharded_nodes(ck, cases[i], NULL, untouchable, NULL, &buf, &err);
		assert_int_equal(rc, FST_EUSAGE);
		assert_string_equal(err.message,
				    "fst_load_sharded_nodes: checkpoint, comm and out are required");
		assert_null(buf);
	}
	/* the rest of the one check applies too */
	o.align = 3;
	fst_error err;
	fst_buffer *buf = NULL;
	assert_int_equal(fst_load_sharded(ck, &o, NULL, NULL, &buf, &err), FST_EUSAGE);
	assert_non_null(strstr(err.message, "align 3 is not a power of two"));
	fst_checkpoint_close(ck);
}

static void test_buffer_has_shard_shapes(void **state)
{
	(void)state;
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	static const unsigned char data[256];
	uint64_t a[2] = {8, 6}, b[2] = {5, 7}, c[1] = {3}, e[2] = {0, 4};
	assert_int_equal(fst_writer_add(w, "a", FST_DTYPE_F32, 2, a, data, 8 * 6 * 4, &err), 0);
	assert_int_equal(fst_writer_add(w, "b", FST_DTYPE_BF16, 2, b, data, 5 * 7 * 2, &err), 0);
	assert_int_equal(fst_writer_add(w, "c", FST_DTYPE_F32, 1, c, data, 12, &err), 0);
	assert_int_equal(fst_writer_add(w, "d", FST_DTYPE_I64, 0, NULL, data, 8, &err), 0);
	assert_int_equal(fst_writer_add(w, "e", FST_DTYPE_F32, 2, e, data, 0, &err), 0);
	const char *path = test_path("sharded_shapes.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	fst_checkpoint *ck;
	assert_int_equal(fst_checkpoint_open(path, &ck, &err), 0);
	size_t n = fst_checkpoint_tensor_count(ck);
	int dims[5];
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info info;
		fst_checkpoint_tensor(ck, i, &info, NULL);
		dims[i] = FST_REPLICATE;
		if (!strcmp(info.name, "a"))
			dims[i] = 0;
		else if (!strcmp(info.name, "b") || !strcmp(info.name, "e"))
			dims[i] = 1;
	}
	/* rank 1 of 2: a [4, 6] (rows 4..7), b [5, 3] (columns 4..6), e [0, 2],
	 * c and d whole */
	static const struct {
		const char *name;
		uint32_t ndim;
		uint64_t shape[2], nbytes;
	} want[] = {
		{"a", 2, {4, 6}, 4 * 6 * 4}, {"b", 2, {5, 3}, 5 * 3 * 2}, {"c", 1, {3, 0}, 12},
		{"d", 0, {0, 0}, 8},         {"e", 2, {0, 2}, 0},
	};
	long allocs = fsti_live_allocations();
	struct fsti_dist d;
	assert_int_equal(fsti_dist_layout(ck, NULL, NULL, dims, 2, 1, 0, 256, &d, &err), 0);
	struct fst_buffer *buf;
	assert_int_equal(fsti_buffer_new_sharded(ck, &d, &buf, &err), 0);
	assert_int_equal(buf->nt, n);
	uint64_t total = 0;
	for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
		long i = fst_buffer_find(buf, want[k].name);
		assert_true(i >= 0);
		const struct fsti_btensor *t = &buf->t[i];
		assert_int_equal(t->ndim, want[k].ndim);
		for (uint32_t j = 0; j < t->ndim; j++)
			assert_int_equal(t->shape[j], want[k].shape[j]);
		assert_int_equal(t->nbytes, want[k].nbytes);
		assert_int_equal(t->nbytes, d.t[i].shard_bytes);
		total += t->nbytes;
	}
	assert_int_equal(buf->tensor_bytes, total);
	/* the checkpoint keeps the full shapes */
	fst_tensor_info info;
	assert_int_equal(fst_checkpoint_tensor(ck, (size_t)fst_checkpoint_find(ck, "b"), &info, NULL),
			 0);
	assert_int_equal(info.shape[1], 7);
	fsti_buffer_destroy(buf);
	fsti_dist_free(&d);
	assert_int_equal(fsti_live_allocations(), allocs);
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_uninitialised_options),
		cmocka_unit_test(test_good_options_reach_the_comm_check),
		cmocka_unit_test(test_buffer_has_shard_shapes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
