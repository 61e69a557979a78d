/* Description: loads with no byte to read, with every io method, whole and
 * streamed: a file with no tensors, a file of 0-byte tensors only (no chunk,
 * no reader thread), and a filter that selects nothing. Counts, views,
 * progress and describe are right, and nothing is left allocated. */
#include "format.h"
#include "load_helpers.h"

static void check_empty_load(const fst_checkpoint *ck, fst_load_opts *o, size_t want_tensors)
{
	for (int io = FST_IO_AUTO; io <= FST_IO_MMAP; io++) {
		o->io = io;
		fst_buffer *buf;
		fst_error err;
		if (fst_load(ck, o, &buf, &err))
			fail_msg("io=%s: %s", lh_io_name(io), err.message);
		assert_int_equal(fst_buffer_tensor_count(buf), want_tensors);
		assert_int_equal(fst_buffer_tensor_bytes(buf), 0);
		assert_true(strlen(fst_buffer_describe(buf)) > 0);
		for (size_t i = 0; i < want_tensors; i++) {
			fst_tensor_view v;
			assert_int_equal(fst_buffer_tensor(buf, i, &v), 0);
			assert_int_equal(v.nbytes, 0);
			fst_view_release(&v);
		}
		fst_buffer_release(buf);
		/* streaming: every tensor once, then the end */
		fst_loader *ld;
		assert_int_equal(fst_load_start(ck, o, &ld, &err), 0);
		fst_tensor_view v;
		size_t got = 0;
		int rc;
		while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
			fst_view_release(&v);
			got++;
		}
		assert_int_equal(rc, 0);
		assert_int_equal(got, want_tensors);
		uint64_t done = 1, total = 1;
		fst_loader_progress(ld, &done, &total);
		assert_int_equal(total, 0);
		assert_int_equal(fst_loader_finish(ld, &buf, &err), 0);
		assert_int_equal(fst_buffer_tensor_count(buf), want_tensors);
		fst_buffer_release(buf);
	}
}

static void test_empty_loads(void **state)
{
	(void)state;
	long allocs = fsti_live_allocations();
	/* a file with no tensors */
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	const char *path = test_path("empty.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	fst_checkpoint *ck = lh_open(path);
	assert_int_equal(fst_checkpoint_tensor_count(ck), 0);
	fst_load_opts o;
	fst_load_opts_init(&o);
	check_empty_load(ck, &o, 0);
	fst_checkpoint_close(ck);

	/* only 0-byte tensors: no chunk, no reader thread */
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	uint64_t s0[2] = {0, 5};
	assert_int_equal(fst_writer_add(w, "e1", FST_DTYPE_F32, 2, s0, NULL, 0, &err), 0);
	assert_int_equal(fst_writer_add(w, "e2", FST_DTYPE_U8, 1, s0, NULL, 0, &err), 0);
	path = test_path("zeros.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	ck = lh_open(path);
	fst_load_opts_init(&o);
	o.threads = 4;
	check_empty_load(ck, &o, 2);
	fst_checkpoint_close(ck);

	/* a filter selecting nothing */
	lh_shape sh = {3, 8, 10000, 0, 0, false};
	lh_ckpt lc;
	lh_write_random("nothing", 21, &sh, &lc);
	ck = lh_open(lc.path);
	lh_filter none = {0, 0, 0};
	fst_load_opts_init(&o);
	o.filter = lh_filter_fn;
	o.filter_ctx = &none;
	check_empty_load(ck, &o, 0);
	assert_true(none.calls > 0);
	fst_checkpoint_close(ck);
	assert_int_equal(fsti_live_allocations(), allocs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty_loads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
