/* Description: device errors against the libcuda double. A device index out
 * of range (the count read from the driver at each call) is FST_EDEVICE (no
 * such device, as with no driver: exit 6), a malformed one a usage error,
 * from fst_load, fst_load_explain and fst_load_start; running
 * out of device memory (exactly enough per device, then one byte short) is
 * FST_EDEVICE with CUDA_ERROR_OUT_OF_MEMORY, the device and the size named,
 * for fst_load and the streaming form; nothing is left live, and the
 * process loads fine afterwards. */
#include "cuda_helpers.h"

static void test_device_out_of_range(void **state)
{
	(void)state;
	ch_ckpt c;
	ch_write_random("range", 31, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	fst_load_opts o;
	ch_opts(&o, "cuda:5", FST_IO_PREAD, 2, 1 * MiB);
	fst_buffer *buf = (fst_buffer *)&o; /* must be cleared */
	fst_error err;
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EDEVICE);
	assert_null(buf);
	assert_int_equal(err.code, FST_EDEVICE);
	assert_has(err.message, "device 5 out of range (2 devices)");
	char text[256];
	assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), FST_EDEVICE);
	assert_has(err.message, "device 5 out of range (2 devices)");
	fst_loader *ld = NULL;
	assert_int_equal(fst_load_start(c.ck, &o, &ld, &err), FST_EDEVICE);
	assert_null(ld);
	/* the count comes from the driver, at each call */
	setenv("FST_DOUBLE_DEVICES", "1", 1);
	o.device = "cuda:1";
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EDEVICE);
	assert_has(err.message, "device 1 out of range (1 device)");
	unsetenv("FST_DOUBLE_DEVICES");
	o.device = "cuda:x";
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EUSAGE);
	ch_assert_clean("after refused devices", c.host_base);
	/* and the process loads fine afterwards */
	o.device = "cuda:1";
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	ch_assert_buffer(&c, buf, 1);
	fst_buffer_release(buf);
	ch_assert_clean("after a load", c.host_base);
	ch_close(&c);
}

static void test_device_out_of_memory(void **state)
{
	(void)state;
	ch_set_delay("20");
	ch_ckpt c;
	ch_write_random("oom", 37, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	fst_load_opts o;
	ch_opts(&o, "cuda:1", FST_IO_PREAD, 2, 1 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	uint64_t need = fst_buffer_size(buf);
	fst_buffer_release(buf);
	char limit[32], bytes[48];
	/* exactly enough, per device: a second buffer on cuda:1 does not fit,
	 * one on cuda:0 does */
	snprintf(limit, sizeof limit, "%" PRIu64, need);
	setenv("FST_DOUBLE_MEM", limit, 1);
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("with exactly %s bytes: %s", limit, err.message);
	ch_assert_buffer(&c, buf, 1);
	fst_buffer *second = NULL;
	assert_int_equal(fst_load(c.ck, &o, &second, &err), FST_EDEVICE);
	assert_null(second);
	o.device = "cuda:0";
	if (fst_load(c.ck, &o, &second, &err))
		fail_msg("cuda:0 beside a full cuda:1: %s", err.message);
	ch_assert_buffer(&c, second, 0);
	fst_buffer_release(second);
	fst_buffer_release(buf);
	ch_assert_clean("after filling the device", c.host_base);
	o.device = "cuda:1";
	/* one byte short, for the load and the streaming form */
	snprintf(limit, sizeof limit, "%" PRIu64, need - 1);
	setenv("FST_DOUBLE_MEM", limit, 1);
	snprintf(bytes, sizeof bytes, "%" PRIu64 " bytes", need);
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
		if (io == FST_IO_URING && !ch_uring_ok)
			continue;
		o.io = io;
		buf = (fst_buffer *)&o;
		assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EDEVICE);
		assert_null(buf);
		assert_int_equal(err.code, FST_EDEVICE);
		assert_int_equal(err.backend_code, 2); /* CUDA_ERROR_OUT_OF_MEMORY */
		assert_has(err.message, "cuda:1");
		assert_has(err.message, bytes);
		assert_has(err.message, "out of memory");
		ch_assert_clean("after running out of device memory", c.host_base);
		fst_loader *ld = NULL;
		assert_int_equal(fst_load_start(c.ck, &o, &ld, &err), FST_EDEVICE);
		assert_null(ld);
		ch_assert_clean("after running out of device memory, streaming", c.host_base);
	}
	unsetenv("FST_DOUBLE_MEM");
	o.device = "cuda:1";
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("after the limit: %s", err.message);
	ch_assert_buffer(&c, buf, 1);
	fst_buffer_release(buf);
	ch_assert_clean("at the end", c.host_base);
	ch_close(&c);
	ch_set_delay("50");
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_device_out_of_range, ch_reset),
		cmocka_unit_test_setup(test_device_out_of_memory, ch_reset),
	};
	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
}
