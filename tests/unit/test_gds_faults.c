/* Description: the fault sites cufile_register and cufile_read (FST_FAULT
 * rules) behave like the cuFile double's switches: under gds=auto, exactly
 * the file refused is staged (one warning, "GPUDirect Storage for 2 of 3
 * files") or the file whose read failed falls back mid-load with identical
 * bytes, once per file even when every read fails; under gds=on, a clean
 * failure naming the file. */
#include "gds_helpers.h"

static void test_fault_register(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "faultreg", 3, lh_base_seed() + 8);
	fst_error err;
	for (size_t nth = 1; nth <= 3; nth++) {
		char spec[32];
		snprintf(spec, sizeof spec, "cufile_register:%zu", nth);
		assert_int_equal(fst_fault_set(spec, &err), 0);
		gh_base b = gh_snapshot();
		long r[3];
		for (size_t f = 0; f < 3; f++)
			r[f] = gh.path_reads(gh_shard_key("faultreg", f));
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 2);
		char desc[1200];
		gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
		/* files are registered in order: the nth is the one refused */
		for (size_t f = 0; f < 3; f++) {
			long grew = gh.path_reads(gh_shard_key("faultreg", f)) - r[f];
			if (f == nth - 1)
				assert_int_equal(grew, 0);
			else
				assert_true(grew > 0);
		}
		gh_log_expect(1, FST_LOG_WARN, gh_shard_key("faultreg", nth - 1), "5027");
		gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
		assert_has(desc, "GPUDirect Storage for 2 of 3 files");
		gh_assert_back(&b, spec);

		assert_int_equal(fst_fault_set(spec, &err), 0);
		o.gds = FST_GDS_ON;
		gh_load_fails(x.ck, &o, FST_EUNSUPPORTED, 5027, gh_shard_key("faultreg", nth - 1),
			      "5027");
		gh_assert_back(&b, spec);
	}
	gh_fixture_close(&x);
}

static void test_fault_read(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "faultread", 3, lh_base_seed() + 9);
	fst_error err;
	gh_base b = gh_snapshot();

	/* the first read fails: with one thread that is file 00's, which falls
	 * back; the others keep using cuFile */
	assert_int_equal(fst_fault_set("cufile_read:1", &err), 0);
	long r1 = gh.path_reads(gh_shard_key("faultread", 1));
	gh_log_clear();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 1);
	o.chunk_bytes = 16 * KiB;
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	gh_log_expect(1, FST_LOG_WARN, gh_shard_key("faultread", 0), "Input/output error");
	gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
	assert_true(gh.path_reads(gh_shard_key("faultread", 1)) > r1);
	gh_assert_back(&b, "cufile_read:1, auto");

	/* a later read, mid-file, through the streaming form */
	assert_int_equal(fst_fault_set("cufile_read:5", &err), 0);
	gh_log_clear();
	o.threads = 3;
	gh_stream_ok(x.ck, &x.fs, &o);
	gh_log_expect(1, FST_LOG_WARN, "cuFileRead", "Input/output error");
	gh_assert_back(&b, "cufile_read:5, auto");

	/* every read fails: every file falls back, once each */
	assert_int_equal(fst_fault_set("cufile_read:1+", &err), 0);
	gh_log_clear();
	o.threads = 4;
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	for (size_t f = 0; f < 3; f++)
		gh_log_expect(1, FST_LOG_WARN, gh_shard_key("faultread", f), "Input/output error");
	gh_log_expect(3, FST_LOG_WARN, NULL, NULL);
	gh_assert_back(&b, "cufile_read:1+, auto");

	/* on: a clean failure */
	for (int stream = 0; stream < 2; stream++) {
		assert_int_equal(fst_fault_set("cufile_read:3", &err), 0);
		o.gds = FST_GDS_ON;
		o.threads = 2;
		if (stream)
			gh_stream_fails(x.ck, &x.fs, &o, FST_EIO, "cuFileRead");
		else
			gh_load_fails(x.ck, &o, FST_EIO, EIO, "/faultread/0", "cuFileRead");
		gh_assert_back(&b, "cufile_read:3, on");
	}
	gh_fixture_close(&x);
}

int main(void)
{
	int rc = gh_open_doubles();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_fault_register, gh_reset),
		cmocka_unit_test_setup(test_fault_read, gh_reset),
	};
	return cmocka_run_group_tests(tests, gh_group_setup, gh_group_teardown);
}
