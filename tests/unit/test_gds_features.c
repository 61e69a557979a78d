/* Description: cuFile with the rest of the loader's features: a filter (only
 * the kept tensors loaded, through cuFile), cancelling and freeing a loader
 * while slow reads are in flight (a view outlives the loader; nothing left
 * registered), a caller's allocator giving the libcuda double's memory (one
 * allocation and one free a load, given back after a failed gds=on load),
 * and two loads in flight at once on two devices, handed out in turn. Cold
 * files under io=auto: cuFile keeps its large requests, while without it the
 * O_DIRECT default reads 512 KiB chunks. */
#include "gds_helpers.h"

double fsti_cached_fraction(const fst_checkpoint *ck); /* io/residency.c */

static void test_cold_auto_keeps_cufile_requests(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "cold", 2, lh_base_seed() + 17);
	lh_evict(x.ck);
	double cached = fsti_cached_fraction(x.ck);
	if (cached < 0 || cached >= 0.5 || !gh_uring_ok) {
		gh_fixture_close(&x);
		skip(); /* no cold decision here, or no io_uring to read with */
	}
	gh_base b = gh_snapshot();
	static const int gds[] = {FST_GDS_AUTO, FST_GDS_OFF};
	for (int k = 0; k < 2; k++) {
		fst_load_opts o = gh_opts("cuda:0", gds[k], FST_IO_AUTO, 0);
		char desc[1200] = "";
		lh_evict(x.ck);
		gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
		assert_has(desc, "cold files read with O_DIRECT");
		if (gds[k] == FST_GDS_AUTO) {
			assert_has(desc, "GPUDirect Storage for 2 of 2 files");
			if (strstr(desc, "512 KiB chunks"))
				fail_msg("cuFile reads in 512 KiB chunks: \"%s\"", desc);
		} else {
			assert_has(desc, "512 KiB chunks");
		}
		gh_assert_back(&b, gds[k] == FST_GDS_AUTO ? "cold, gds auto" : "cold, gds off");
	}
	gh_fixture_close(&x);
}

static void test_filter(void **state)
{
	(void)state;
	lh_shape sh = lh_default_shape();
	sh.max_big = 200000;
	for (unsigned k = 0; k < 4; k++) {
		char name[32];
		snprintf(name, sizeof name, "filter%u", k);
		gh_fixture x;
		lh_write_random(name, lh_base_seed() + 60 + k, &sh, &x.c);
		gh_fixture_open(&x, name);
		lh_filter flt = {lh_base_seed() + k, 50, 0};
		fst_load_opts o = gh_opts("cuda:0", k % 2 ? FST_GDS_ON : FST_GDS_AUTO,
					  FST_IO_PREAD, 1 + k);
		o.filter = lh_filter_fn;
		o.filter_ctx = &flt;
		o.chunk_bytes = 8 * KiB;
		gh_base b = gh_snapshot();
		long r0 = gh.reads();
		fst_buffer *buf = NULL;
		fst_error err;
		if (fst_load(x.ck, &o, &buf, &err))
			fail_msg("%s: %s", name, err.message);
		size_t kept = 0;
		uint64_t kept_bytes = 0;
		for (size_t i = 0; i < fst_checkpoint_tensor_count(x.ck); i++) {
			fst_tensor_info info;
			assert_int_equal(fst_checkpoint_tensor(x.ck, i, &info, NULL), 0);
			long j = fst_buffer_find(buf, info.name);
			if (!lh_keeps(&flt, info.name)) {
				assert_int_equal(j, -1);
				continue;
			}
			kept++;
			kept_bytes += info.nbytes;
			if (j < 0)
				fail_msg("%s: kept by the filter but not loaded", info.name);
			fst_tensor_view v;
			assert_int_equal(fst_buffer_tensor(buf, (size_t)j, &v), 0);
			gh_check_view(x.ck, &x.fs, &v, 0, 256);
			fst_view_release(&v);
		}
		assert_int_equal(fst_buffer_tensor_count(buf), kept);
		if (kept_bytes)
			assert_true(gh.reads() > r0);
		else
			assert_int_equal(gh.reads(), r0);
		fst_buffer_release(buf);
		gh_log_expect(0, FST_LOG_WARN, NULL, NULL);
		gh_assert_back(&b, name);
		gh_fixture_close(&x);
	}
}

static void test_cancel_and_free(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "cancel", 3, lh_base_seed() + 14);
	/* slow reads: the loads are still running when they are stopped */
	setenv("FST_CUFILE_DOUBLE_DELAY_US", "2000", 1);
	for (int gds = FST_GDS_AUTO; gds <= FST_GDS_ON; gds++) {
		fst_load_opts o = gh_opts("cuda:0", gds, FST_IO_PREAD, 2);
		o.chunk_bytes = 8 * KiB;
		gh_base b = gh_snapshot();
		fst_error err;
		fst_loader *ld = NULL;
		fst_tensor_view v;

		/* free after the first tensor; its view outlives the loader */
		assert_int_equal(fst_load_start(x.ck, &o, &ld, &err), 0);
		assert_int_equal(fst_loader_next(ld, &v, &err), 1);
		fst_loader_free(ld);
		gh_check_view(x.ck, &x.fs, &v, 0, 256);
		fst_view_release(&v);
		gh_assert_back(&b, "loader freed");

		/* cancel, then finish */
		assert_int_equal(fst_load_start(x.ck, &o, &ld, &err), 0);
		fst_loader_cancel(ld);
		fst_buffer *buf = (fst_buffer *)(uintptr_t)1;
		assert_int_equal(fst_loader_finish(ld, &buf, &err), FST_ECANCELED);
		assert_null(buf);
		gh_assert_back(&b, "loader cancelled");
	}
	gh_fixture_close(&x);
}

/* A caller's allocator giving memory of the libcuda double. */
struct dev_allocator {
	int (*mem_alloc)(unsigned long long *p, size_t n);
	int (*mem_free)(unsigned long long p);
	long allocs, frees;
};

static void *dev_alloc(void *ctx, uint64_t size, uint32_t align, int device_type, int device_id)
{
	struct dev_allocator *a = ctx;
	(void)align;
	assert_int_equal(device_type, FST_DEVICE_CUDA);
	assert_int_equal(device_id, 0);
	unsigned long long p = 0;
	if (a->mem_alloc(&p, (size_t)size))
		return NULL;
	a->allocs++;
	return (void *)(uintptr_t)p;
}

static void dev_free(void *ctx, void *ptr, uint64_t size, int device_type, int device_id)
{
	struct dev_allocator *a = ctx;
	(void)size;
	(void)device_type;
	(void)device_id;
	a->mem_free((unsigned long long)(uintptr_t)ptr);
	a->frees++;
}

static void test_caller_allocator(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "allocator", 2, lh_base_seed() + 15);
	struct dev_allocator da = {0};
	*(void **)(&da.mem_alloc) = gh_sym(gh.cuda, "cuMemAlloc_v2");
	*(void **)(&da.mem_free) = gh_sym(gh.cuda, "cuMemFree_v2");
	fst_allocator al = {dev_alloc, dev_free, &da};
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	o.allocator = &al;
	gh_base b = gh_snapshot();
	long r0 = gh.reads();
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	assert_true(gh.reads() > r0);
	assert_int_equal(da.allocs, 1);
	assert_int_equal(da.frees, 1);
	gh_assert_back(&b, "caller's allocator");
	/* a failed gds=on load gives the caller's memory back */
	setenv("FST_CUFILE_DOUBLE_BUFREG_ERR", "5016", 1);
	gh_load_fails(x.ck, &o, FST_EDEVICE, 5016, "cuFileBufRegister", "5016");
	assert_int_equal(da.allocs, 2);
	assert_int_equal(da.frees, 2);
	gh_assert_back(&b, "caller's allocator, failed");
	unsetenv("FST_CUFILE_DOUBLE_BUFREG_ERR");
	gh_fixture_close(&x);
}

/* Two loads in flight at once, on two devices, handed out in turn. */
static void test_two_loaders(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "two", 2, lh_base_seed() + 16);
	gh_base b = gh_snapshot();
	fst_load_opts oa = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	fst_load_opts ob = gh_opts("cuda:1", FST_GDS_AUTO, FST_IO_PREAD, 3);
	oa.chunk_bytes = ob.chunk_bytes = 8 * KiB;
	fst_loader *la = NULL, *lb = NULL;
	fst_error err;
	assert_int_equal(fst_load_start(x.ck, &oa, &la, &err), 0);
	assert_int_equal(fst_load_start(x.ck, &ob, &lb, &err), 0);
	int ra = 1, rb = 1;
	size_t na = 0, nb = 0;
	while (ra == 1 || rb == 1) {
		fst_tensor_view v;
		if (ra == 1 && (ra = fst_loader_next(la, &v, &err)) == 1) {
			gh_check_view(x.ck, &x.fs, &v, 0, 256);
			fst_view_release(&v);
			na++;
		}
		if (rb == 1 && (rb = fst_loader_next(lb, &v, &err)) == 1) {
			gh_check_view(x.ck, &x.fs, &v, 1, 256);
			fst_view_release(&v);
			nb++;
		}
	}
	assert_int_equal(ra, 0);
	assert_int_equal(rb, 0);
	assert_int_equal(na, fst_checkpoint_tensor_count(x.ck));
	assert_int_equal(nb, fst_checkpoint_tensor_count(x.ck));
	fst_buffer *ba = NULL, *bb = NULL;
	assert_int_equal(fst_loader_finish(la, &ba, &err), 0);
	assert_int_equal(fst_loader_finish(lb, &bb, &err), 0);
	gh_check_buffer(x.ck, &x.fs, ba, 0, 256);
	gh_check_buffer(x.ck, &x.fs, bb, 1, 256);
	fst_buffer_release(ba);
	fst_buffer_release(bb);
	gh_assert_back(&b, "two loaders");
	gh_fixture_close(&x);
}

int main(void)
{
	int rc = gh_open_doubles();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_filter, gh_reset),
		cmocka_unit_test_setup(test_cancel_and_free, gh_reset),
		cmocka_unit_test_setup(test_caller_allocator, gh_reset),
		cmocka_unit_test_setup(test_two_loaders, gh_reset),
		cmocka_unit_test_setup(test_cold_auto_keeps_cufile_requests, gh_reset),
	};
	return cmocka_run_group_tests(tests, gh_group_setup, gh_group_teardown);
}
