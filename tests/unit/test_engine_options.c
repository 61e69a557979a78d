/* Description: load options. Bad values are refused by fst_load and
 * fst_load_start alike with FST_EUSAGE and a message naming them (align,
 * chunk size, io method, gds, threads, device names, struct_size), nothing
 * allocated; GPU devices on this machine give a clean error (or a load);
 * io=mmap refuses a GPU; missing arguments; NULL options are the defaults.
 * io=mmap with mmap_private gives writable copy-on-write views: a write
 * reaches neither the file nor other loads. */
#include "format.h"
#include "load_helpers.h"

static void test_bad_options(void **state)
{
	(void)state;
	lh_shape sh = {1, 4, 100, 0, 0, false};
	lh_ckpt lc;
	lh_write_random("badopts", 3, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	fst_load_opts o;

	fst_load_opts_init(&o);
	o.align = 3;
	lh_expect_usage(ck, &o, FST_EUSAGE, "align 3");
	o.align = 48;
	lh_expect_usage(ck, &o, FST_EUSAGE, "align 48");

	fst_load_opts_init(&o);
	o.chunk_bytes = 1;
	lh_expect_usage(ck, &o, FST_EUSAGE, "chunk size 1");
	o.chunk_bytes = (1ull << 30) + 1;
	lh_expect_usage(ck, &o, FST_EUSAGE, "chunk size");

	fst_load_opts_init(&o);
	o.io = 7;
	lh_expect_usage(ck, &o, FST_EUSAGE, "io method 7");
	o.io = -1;
	lh_expect_usage(ck, &o, FST_EUSAGE, "io method -1");

	fst_load_opts_init(&o);
	o.gds = 5;
	lh_expect_usage(ck, &o, FST_EUSAGE, "gds");

	fst_load_opts_init(&o);
	o.threads = 65;
	lh_expect_usage(ck, &o, FST_EUSAGE, "65 threads");

	static const char *const bad_devices[] = {"gpu", "", "cuda:", "cuda:x", "cuda:-1",
						  "CPU", "cuda0", "cuda: 1", "cuda:+2", "cuda:-0",
						  "cuda:\t3", "cuda:007", "cuda:1 ", "cuda:99999999999"};
	for (size_t i = 0; i < sizeof bad_devices / sizeof bad_devices[0]; i++) {
		fst_load_opts_init(&o);
		o.device = bad_devices[i];
		char needle[64];
		snprintf(needle, sizeof needle, "device \"%s\"", bad_devices[i]);
		lh_expect_usage(ck, &o, FST_EUSAGE, needle);
	}

	fst_load_opts_init(&o);
	o.struct_size = 0;
	lh_expect_usage(ck, &o, FST_EUSAGE, "fst_load_opts_init");
	o.struct_size = sizeof o + 8;
	lh_expect_usage(ck, &o, FST_EUSAGE, "fst_load_opts_init");
	/* a size that ends inside a field (half of the device pointer): no
	 * release had it, so it is refused rather than copied */
	o.struct_size = offsetof(fst_load_opts, device) + sizeof(void *) / 2;
	lh_expect_usage(ck, &o, FST_EUSAGE, "fst_load_opts_init");
	o.struct_size = sizeof o - 1;
	lh_expect_usage(ck, &o, FST_EUSAGE, "fst_load_opts_init");

	/* a GPU on this machine: a clean error, not a crash (or, where a GPU
	 * and the CUDA target exist, a load) */
	static const char *const gpus[] = {"cuda", "cuda:0", "cuda:7"};
	for (size_t i = 0; i < 3; i++) {
		fst_load_opts_init(&o);
		o.device = gpus[i];
		long allocs = fsti_live_allocations();
		fst_buffer *buf = NULL;
		fst_error err;
		int rc = fst_load(ck, &o, &buf, &err);
		if (rc == 0) {
			fst_buffer_release(buf);
			continue;
		}
		if (rc != FST_EUNSUPPORTED && rc != FST_EDEVICE)
			fail_msg("device %s: %d: %s", gpus[i], rc, err.message);
		assert_null(buf);
		assert_true(strlen(err.message) > 10);
		assert_has(err.message, "cuda");
		assert_int_equal(fsti_live_allocations(), allocs);
	}
	/* io=mmap gives views of files: the CPU only */
	fst_load_opts_init(&o);
	o.io = FST_IO_MMAP;
	o.device = "cuda:0";
	fst_buffer *buf = NULL;
	fst_error err;
	assert_true(fst_load(ck, &o, &buf, &err) < 0);
	assert_null(buf);

	/* missing arguments */
	fst_load_opts_init(&o);
	assert_int_equal(fst_load(NULL, &o, &buf, &err), FST_EUSAGE);
	assert_int_equal(fst_load(ck, &o, NULL, &err), FST_EUSAGE);
	assert_int_equal(fst_load_start(ck, &o, NULL, &err), FST_EUSAGE);
	fst_tensor_view v;
	assert_int_equal(fst_loader_next(NULL, &v, &err), FST_EUSAGE);
	assert_int_equal(fst_loader_finish(NULL, &buf, &err), FST_EUSAGE);
	assert_null(buf);
	fst_loader *ld;
	assert_int_equal(fst_load_start(ck, &o, &ld, &err), 0);
	assert_int_equal(fst_loader_next(ld, NULL, &err), FST_EUSAGE);
	assert_int_equal(fst_loader_finish(ld, NULL, &err), 0); /* the buffer dropped */
	/* NULL options are the defaults */
	assert_int_equal(fst_load(ck, NULL, &buf, &err), 0);
	assert_has(fst_buffer_describe(buf), "auto");
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
}

/* io=mmap with mmap_private: writable views that never reach the file. */

static void test_mmap_private(void **state)
{
	(void)state;
	char *path = test_path("mmap-private.safetensors");
	const char *header = "{\"x\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}";
	const unsigned char data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	write_raw(path, header, strlen(header), data, sizeof data);
	fst_checkpoint *ck = lh_open(path);
	fst_load_opts o;
	fst_error err;
	fst_buffer *shared, *priv, *copied;
	fst_load_opts_init(&o);
	o.io = FST_IO_MMAP;
	assert_int_equal(fst_load(ck, &o, &shared, &err), 0);
	assert_true(fst_buffer_read_only(shared));
	assert_has(fst_buffer_describe(shared), "read-only");
	o.mmap_private = 1;
	assert_int_equal(fst_load(ck, &o, &priv, &err), 0);
	assert_false(fst_buffer_read_only(priv));
	assert_has(fst_buffer_describe(priv), "copy-on-write");
	fst_tensor_view vp, vs;
	assert_int_equal(fst_buffer_tensor(priv, 0, &vp), 0);
	assert_int_equal(fst_buffer_tensor(shared, 0, &vs), 0);
	assert_int_equal(fst_buffer_size(priv), 0); /* a view of the file, no allocation */
	((unsigned char *)vp.data)[3] = 99;
	/* the shared mapping, another load and the file keep the file's bytes */
	assert_int_equal(((unsigned char *)vs.data)[3], 4);
	uint64_t size;
	unsigned char *bytes = lh_slurp(path, &size);
	assert_int_equal(bytes[size - 8 + 3], 4);
	free(bytes);
	o.io = FST_IO_PREAD; /* mmap_private means nothing for copies */
	assert_int_equal(fst_load(ck, &o, &copied, &err), 0);
	assert_false(fst_buffer_read_only(copied));
	fst_tensor_view vc;
	assert_int_equal(fst_buffer_tensor(copied, 0, &vc), 0);
	assert_memory_equal(vc.data, data, sizeof data);
	fst_view_release(&vc);
	fst_view_release(&vp);
	fst_view_release(&vs);
	fst_buffer_release(copied);
	fst_buffer_release(priv);
	fst_buffer_release(shared);
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_options),
		cmocka_unit_test(test_mmap_private),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
