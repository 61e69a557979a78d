/* Description: what cuFile refuses or fails, through the cuFile double's
 * switches: under gds=auto the load falls back to pinned staging with the
 * same bytes and one warning naming the file and the code; under gds=on it
 * fails cleanly with the code and the file, no buffer, nothing left
 * registered, allocated or open. Handle registration failing with 5027 for
 * every file or one file (the others keep cuFile), buffer registration
 * failing with 5016 (nothing read with cuFile), short reads (resumed, never
 * a failure), reads failing after N bytes (the file falls back mid-load
 * under auto, with 1 to 4 threads), and failing with a cuFile code or with
 * -1 and errno. Allocations failing one by one under gds=on: each fails
 * with FST_ENOMEM, nothing left behind, no descriptor of the caller's
 * closed. */
#include "gds_helpers.h"

#include <fcntl.h>
#include <sys/stat.h>

/* ---- handle registration fails */

static void test_register_error_every_file(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "regall", 3, lh_base_seed() + 1);
	setenv("FST_CUFILE_DOUBLE_REGISTER_ERR", "5027", 1);
	for (int stream = 0; stream < 2; stream++) {
		gh_base b = gh_snapshot();
		long r0 = gh.reads(), reg0 = gh.handle_registers();
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 2);
		char desc[1200] = "";
		if (stream)
			gh_stream_ok(x.ck, &x.fs, &o);
		else
			gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
		assert_int_equal(gh.reads() - r0, 0);
		assert_int_equal(gh.handle_registers() - reg0, 3);
		for (size_t f = 0; f < 3; f++)
			gh_log_expect(1, FST_LOG_WARN, gh_shard_key("regall", f), "5027");
		gh_log_expect(3, FST_LOG_WARN, NULL, NULL);
		if (!stream)
			assert_has(desc, "GPUDirect Storage for 0 of 3 files");
		gh_assert_back(&b, "register 5027, auto");
	}
	/* on: a clean failure naming the first file and the code */
	gh_base b = gh_snapshot();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	gh_load_fails(x.ck, &o, FST_EUNSUPPORTED, 5027, gh_shard_key("regall", 0),
		      "5027 (CU_FILE_HANDLE_NOT_REGISTERED)");
	gh_assert_back(&b, "register 5027, on");
	gh_stream_fails(x.ck, &x.fs, &o, FST_EUNSUPPORTED, "5027");
	gh_assert_back(&b, "register 5027, on, streaming");
	gh_fixture_close(&x);
}

static void test_register_error_one_file(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "regone", 3, lh_base_seed() + 2);
	setenv("FST_CUFILE_DOUBLE_REGISTER_ERR", "5027", 1);
	setenv("FST_CUFILE_DOUBLE_REGISTER_ERR_FILE", gh_shard_key("regone", 1), 1);
	for (int stream = 0; stream < 2; stream++) {
		gh_base b = gh_snapshot();
		long r[3];
		for (size_t f = 0; f < 3; f++)
			r[f] = gh.path_reads(gh_shard_key("regone", f));
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 3);
		char desc[1200] = "";
		if (stream)
			gh_stream_ok(x.ck, &x.fs, &o);
		else
			gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
		/* the other files still use cuFile; this one never does */
		assert_true(gh.path_reads(gh_shard_key("regone", 0)) > r[0]);
		assert_int_equal(gh.path_reads(gh_shard_key("regone", 1)), r[1]);
		assert_true(gh.path_reads(gh_shard_key("regone", 2)) > r[2]);
		gh_log_expect(1, FST_LOG_WARN, gh_shard_key("regone", 1), "5027");
		gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
		if (!stream) {
			assert_has(desc, "GPUDirect Storage for 2 of 3 files");
			assert_has(desc, "cuFile where registered");
		}
		gh_assert_back(&b, "register 5027 for one file, auto");
	}
	gh_base b = gh_snapshot();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 3);
	/* file 00 was registered before 01 failed: it must be deregistered */
	gh_load_fails(x.ck, &o, FST_EUNSUPPORTED, 5027, gh_shard_key("regone", 1), "5027");
	gh_assert_back(&b, "register 5027 for one file, on");
	gh_fixture_close(&x);
}

/* ---- buffer registration fails */

static void test_buffer_register_error(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "bufreg", 2, lh_base_seed() + 3);
	setenv("FST_CUFILE_DOUBLE_BUFREG_ERR", "5016", 1);
	for (int stream = 0; stream < 2; stream++) {
		gh_base b = gh_snapshot();
		long r0 = gh.reads();
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 2);
		if (stream)
			gh_stream_ok(x.ck, &x.fs, &o);
		else
			gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
		/* no partly-trusted mode: nothing is read with cuFile */
		assert_int_equal(gh.reads() - r0, 0);
		gh_log_expect(1, FST_LOG_WARN, "cuFileBufRegister", "5016");
		gh_log_expect(1, FST_LOG_WARN, "cuda:0", NULL);
		gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
		gh_assert_back(&b, "buffer registration 5016, auto");
	}
	gh_base b = gh_snapshot();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	gh_load_fails(x.ck, &o, FST_EDEVICE, 5016, "cuFileBufRegister",
		      "5016 (CU_FILE_INVALID_MAPPING_SIZE)");
	gh_assert_back(&b, "buffer registration 5016, on");
	gh_stream_fails(x.ck, &x.fs, &o, FST_EDEVICE, "5016");
	gh_assert_back(&b, "buffer registration 5016, on, streaming");
	gh_fixture_close(&x);
}

/* ---- short reads are resumed */

static void test_short_reads(void **state)
{
	(void)state;
	lh_shape sh = lh_default_shape();
	sh.max_big = 100000;
	sh.allow_empty_files = false;
	for (unsigned k = 0; k < 4; k++) {
		char name[32];
		snprintf(name, sizeof name, "short%u", k);
		gh_fixture x;
		if (k == 0) {
			gh_founding(&x, name, 2, lh_base_seed() + 4);
		} else {
			lh_write_random(name, lh_base_seed() + 40 + k, &sh, &x.c);
			gh_fixture_open(&x, name);
		}
		for (int gds = FST_GDS_AUTO; gds <= FST_GDS_ON; gds++) {
			fst_load_opts o = gh_opts("cuda:0", gds, k % 2 ? FST_IO_PREAD : FST_IO_AUTO,
						  1 + k % 3);
			o.chunk_bytes = 32 * KiB;
			gh_base b = gh_snapshot();
			unsetenv("FST_CUFILE_DOUBLE_SHORT");
			long r0 = gh.reads();
			gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
			long whole = gh.reads() - r0;
			gh_assert_back(&b, name);
			setenv("FST_CUFILE_DOUBLE_SHORT", "1", 1);
			gh_log_clear();
			r0 = gh.reads();
			long f0 = gh.failed_reads();
			if (k % 2)
				gh_stream_ok(x.ck, &x.fs, &o);
			else
				gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
			long halves = gh.reads() - r0;
			if (fst_checkpoint_total_bytes(x.ck) && halves <= whole)
				fail_msg("%s: %ld reads of halves, %ld of whole chunks", name, halves,
					 whole);
			assert_int_equal(gh.failed_reads(), f0);
			/* a short read is neither a failure nor a reason to fall back */
			gh_log_expect(0, FST_LOG_WARN, NULL, NULL);
			gh_assert_back(&b, name);
		}
		unsetenv("FST_CUFILE_DOUBLE_SHORT");
		gh_fixture_close(&x);
	}
}

/* ---- reads fail after N bytes */

static void test_fail_after_auto(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "failauto", 3, lh_base_seed() + 5);
	uint64_t b0 = gh_file_bytes(x.ck, 0), b1 = gh_file_bytes(x.ck, 1);

	/* One thread, chunks in plan order: file 00 entirely with cuFile, file
	 * 01 fails half-way (inside a read: a short one, then -EIO) and falls
	 * back mid-load, and 02 fails at its first read. */
	gh_base b = gh_snapshot();
	long start = gh.bytes(), f0 = gh.failed_reads();
	gh_setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", start + (long)(b0 + b1 / 2) + 1);
	gh_log_clear();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 1);
	o.chunk_bytes = 16 * KiB;
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	assert_int_equal(gh.bytes() - start, (long)(b0 + b1 / 2) + 1);
	assert_true(gh.failed_reads() - f0 >= 2);
	gh_log_expect(0, FST_LOG_WARN, gh_shard_key("failauto", 0), NULL);
	gh_log_expect(1, FST_LOG_WARN, gh_shard_key("failauto", 1), "Input/output error");
	gh_log_expect(1, FST_LOG_WARN, gh_shard_key("failauto", 2), "Input/output error");
	gh_log_expect(2, FST_LOG_WARN, NULL, NULL);
	gh_assert_back(&b, "fail after N, auto, 1 thread");

	/* Several threads, through the streaming form: whoever reads past N
	 * falls back; bytes stay right. */
	for (unsigned threads = 2; threads <= 4; threads++) {
		start = gh.bytes();
		gh_setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", start + (long)(b0 / threads));
		gh_log_clear();
		o = gh_opts("cuda:0", FST_GDS_AUTO,
			    threads == 3 && gh_uring_ok ? FST_IO_URING : FST_IO_PREAD, threads);
		o.chunk_bytes = 8 * KiB;
		gh_stream_ok(x.ck, &x.fs, &o);
		assert_true(gh_log_count(FST_LOG_WARN, "cuFileRead", "Input/output error") >= 1);
		assert_int_equal(gh_log_count(FST_LOG_WARN, NULL, NULL),
				 gh_log_count(FST_LOG_WARN, "cuFileRead", "pinned staging"));
		gh_assert_back(&b, "fail after N, auto, threads");
	}
	gh_fixture_close(&x);
}

static void test_fail_after_on(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "failon", 2, lh_base_seed() + 6);
	uint64_t total = fst_checkpoint_total_bytes(x.ck);
	for (int stream = 0; stream < 2; stream++)
		for (unsigned threads = 1; threads <= 3; threads += 2) {
			gh_base b = gh_snapshot();
			gh_setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", gh.bytes() + (long)(total / 2));
			fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, threads);
			o.chunk_bytes = 16 * KiB;
			gh_log_clear();
			if (stream)
				gh_stream_fails(x.ck, &x.fs, &o, FST_EIO, "cuFileRead");
			else
				gh_load_fails(x.ck, &o, FST_EIO, EIO, "/failon/0", "cuFileRead");
			gh_assert_back(&b, "fail after N, on");
		}
	/* a negative cuFile code is named as such */
	gh_base b = gh_snapshot();
	gh_setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", gh.bytes());
	setenv("FST_CUFILE_DOUBLE_FAIL_RC", "-5011", 1);
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	gh_load_fails(x.ck, &o, FST_EIO, 5011, "/failon/0", "5011 (CU_FILE_CUDA_DRIVER_ERROR)");
	gh_assert_back(&b, "cuFile code, on");
	gh_log_clear();
	o.gds = FST_GDS_AUTO;
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	gh_log_expect(2, FST_LOG_WARN, "5011", "pinned staging");
	gh_assert_back(&b, "cuFile code, auto");
	unsetenv("FST_CUFILE_DOUBLE_FAIL_RC");
	gh_fixture_close(&x);
}

/*
 * cuFileRead's contract: "-1 on an error, so errno is set to indicate
 * filesystem errors; all other errors return a negative integer value of
 * the CUfileOpError enum value". -1 must be read as errno, not as EPERM.
 */
static void test_fail_minus_one_errno(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "failerrno", 1, lh_base_seed() + 7);
	gh_base b = gh_snapshot();
	gh_setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", gh.bytes());
	setenv("FST_CUFILE_DOUBLE_FAIL_RC", "-1", 1);
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 1);
	gh_load_fails(x.ck, &o, FST_EIO, EIO, "/failerrno/00.safetensors", strerror(EIO));
	gh_assert_back(&b, "-1 and errno, on");
	/* auto falls back and lands the right bytes */
	o.gds = FST_GDS_AUTO;
	gh_log_clear();
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	gh_log_expect(1, FST_LOG_WARN, "/failerrno/00.safetensors", strerror(EIO));
	gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
	gh_assert_back(&b, "-1 and errno, auto");
	gh_fixture_close(&x);
}

/*
 * Every allocation of a gds=on load failing in turn, until one load meets
 * no failure: each fails with FST_ENOMEM and leaves nothing behind; and
 * the process's descriptor 0 stays its own (a file table not yet filled in
 * was once torn down as descriptors 0, closing stdin or whatever had
 * taken its number).
 */
static void test_alloc_failures_on(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "allocon", 2, lh_base_seed() + 8);
	if (fcntl(0, F_GETFD) < 0)
		assert_int_equal(open("/dev/null", O_RDONLY), 0);
	struct stat was;
	assert_int_equal(fstat(0, &was), 0);
	unsigned failures = 0;
	for (long n = 1;; n++) {
		if (n > 3000)
			fail_msg("alloc:%ld: still failing", n);
		char spec[32];
		snprintf(spec, sizeof spec, "alloc:%ld", n);
		gh_base b = gh_snapshot();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
		fst_error err;
		assert_int_equal(fst_fault_set(spec, &err), 0);
		fst_buffer *buf = (fst_buffer *)&o;
		int rc = fst_load(x.ck, &o, &buf, &err);
		long injected = fst_fault_last(NULL, 0);
		assert_int_equal(fst_fault_set(NULL, NULL), 0);
		struct stat now;
		if (fstat(0, &now) || now.st_dev != was.st_dev || now.st_ino != was.st_ino)
			fail_msg("%s: descriptor 0 was closed", spec);
		if (!rc) {
			gh_check_buffer(x.ck, &x.fs, buf, 0, 256);
			fst_buffer_release(buf);
			gh_assert_back(&b, spec);
			if (!injected)
				break;
			continue;
		}
		failures++;
		if (rc != FST_ENOMEM || !err.message[0])
			fail_msg("%s: status %d (%s), expected FST_ENOMEM", spec, rc, err.message);
		assert_null(buf);
		gh_assert_back(&b, spec);
	}
	assert_true(failures > 0);
	gh_fixture_close(&x);
}

int main(void)
{
	int rc = gh_open_doubles();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_register_error_every_file, gh_reset),
		cmocka_unit_test_setup(test_register_error_one_file, gh_reset),
		cmocka_unit_test_setup(test_buffer_register_error, gh_reset),
		cmocka_unit_test_setup(test_short_reads, gh_reset),
		cmocka_unit_test_setup(test_fail_after_auto, gh_reset),
		cmocka_unit_test_setup(test_fail_after_on, gh_reset),
		cmocka_unit_test_setup(test_fail_minus_one_errno, gh_reset),
		cmocka_unit_test_setup(test_alloc_failures_on, gh_reset),
	};
	return cmocka_run_group_tests(tests, gh_group_setup, gh_group_teardown);
}
