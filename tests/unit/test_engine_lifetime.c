/* Description: buffer lifetimes. Views keep their buffer alive past
 * fst_buffer_release and fst_checkpoint_close, with every io method: names,
 * shapes and bytes stay readable (ASan checks the reads), retain/release
 * pairs count, and the last view frees everything (libfst's allocation
 * count is back where it was). Releasing NULL or a released view is a
 * no-op. */
#include "format.h"
#include "load_helpers.h"

static void test_views_outlive_buffer_and_checkpoint(void **state)
{
	(void)state;
	long allocs = fsti_live_allocations();
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	for (int k = 0; k < 4; k++) {
		if (lh_io_skipped(ios[k]))
			continue;

		lh_shape sh = {3, 10, 50000, 20, 10, false};
		lh_ckpt lc;
		lh_write_random("alive", lh_base_seed() + 50 + (uint64_t)k, &sh, &lc);
		fst_checkpoint *ck = lh_open(lc.path);
		lh_files fs;
		lh_files_read(ck, &fs);
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = ios[k];
		fst_buffer *buf;
		fst_error err;
		if (fst_load(ck, &o, &buf, &err))
			fail_msg("%s: %s", lh_io_name(o.io), err.message);
		size_t n = fst_buffer_tensor_count(buf);
		assert_int_equal(n, fst_checkpoint_tensor_count(ck));
		fst_tensor_view *v = calloc(n + 1, sizeof *v);
		unsigned char **want = calloc(n + 1, sizeof *want);
		for (size_t i = 0; i < n; i++) {
			assert_int_equal(fst_buffer_tensor(buf, i, &v[i]), 0);
			fst_tensor_info info;
			const unsigned char *w = lh_expected(ck, &fs, i, &info);
			want[i] = malloc(info.nbytes + 1);
			memcpy(want[i], w, info.nbytes);
		}
		/* retain/release pairs keep it too */
		fst_buffer_retain(buf);
		fst_buffer_release(buf);
		fst_buffer_release(buf);
		fst_checkpoint_close(ck);
		lh_files_free(&fs);
		/* names, shapes and bytes are still there (ASan checks the reads) */
		for (size_t i = 0; i < n; i++) {
			char name[64];
			snprintf(name, sizeof name, "%s", v[i].name);
			assert_true(name[0] == 'f');
			for (uint32_t d = 0; d < v[i].ndim; d++)
				assert_true(v[i].shape[d] < (1u << 30));
			lh_assert_bytes(name, v[i].data, want[i], v[i].nbytes);
			assert_int_equal(fst_buffer_find(v[i].buffer, v[i].name), (long)i);
		}
		for (size_t i = 0; i < n; i++) {
			fst_view_release(&v[i]);
			free(want[i]);
		}
		fst_view_release(NULL);
		fst_view_release(&v[0]); /* already released: a no-op */
		free(v);
		free(want);
		assert_int_equal(fsti_live_allocations(), allocs);
	}
	fst_buffer_release(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_views_outlive_buffer_and_checkpoint),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
