/* Description: the GPUDirect Storage probe's outcomes, against the libcuda
 * and libcufile test doubles. The probe is cached per process (library,
 * driver) and per device (the rest), so each scenario is its own process,
 * chosen by the first argument, and within one the devices probed differ:
 *   devices (default): nvidia-fs 0.0 (compatibility mode), an integrated GPU,
 *     GPU_DIRECT_RDMA_SUPPORTED 0: each not usable (the last two with
 *     FST_GDS_TRY=1 too); a good device usable;
 *     gds=off never touches cuFile; the driver is opened once per process.
 *   nonvfs: no /dev/nvidia-fs*: the driver is never opened (the double's
 *     counter stays 0); FST_GDS_TRY=1 opens it and uses cuFile anyway.
 *   nolib: FST_CUFILE_LIBRARY names no file.
 *   lacksym: FST_CUFILE_LIBRARY is a library without the cuFile symbols.
 *   openerr: cuFileDriverOpen fails with 5001, once for the whole process.
 * Where GDS is not usable, gds=auto loads every byte through pinned staging
 * with one info line naming the device and the reason and no warning, the
 * description and fst_load_explain give the reason, and gds=on (load,
 * streaming and explain) fails with FST_EUNSUPPORTED naming the device and
 * the reason (the library, the symbol, the code); nothing is left
 * registered, allocated or open. fst_gds_probe reports the same. Loads
 * here pass unified=off: the probe serves the discrete path. */
#include "gds_helpers.h"

static const char *scenario = "devices";
static const char *cuda_double_path;

/* one small checkpoint for every load */
static lh_ckpt ckc;
static fst_checkpoint *ck;
static lh_files fs;

/* The probe's outcomes are those of the discrete path: an integrated GPU
 * would otherwise load through unified memory and never ask the probe
 * (tests/unit/test_cuda_unified.c covers that). */
static fst_load_opts probe_opts(const char *device, int gds, int io, unsigned threads)
{
	fst_load_opts o = gh_opts(device, gds, io, threads);
	o.unified = FST_UNIFIED_OFF;
	return o;
}

static void expect_explain(const char *device, int gds, int code, const char *a, const char *b)
{
	fst_load_opts o = probe_opts(device, gds, FST_IO_PREAD, 2);
	char text[1200] = "";
	fst_error err;
	int rc = fst_load_explain(ck, &o, text, sizeof text, &err);
	assert_int_equal(rc, code);
	const char *what = rc ? err.message : text;
	if (a)
		assert_has(what, a);
	if (b)
		assert_has(what, b);
}

/* fst_gds_probe's report for device ("cuda:N"): usable as expected and the
 * reason containing why. */
static fst_gds_report report(const char *device, int usable, const char *why)
{
	fst_gds_report r;
	fst_error err;
	if (fst_gds_probe(gh_device_id(device), &r, &err))
		fail_msg("fst_gds_probe(%s): %s", device, err.message);
	assert_int_equal(r.usable, usable);
	assert_has(r.reason, why);
	return r;
}

/*
 * GDS must not be used on device: auto loads every byte through staging,
 * silently (info), saying why; on fails saying why. why and why2 (NULL: not
 * checked) are parts of the reason.
 */
static void check_not_used(const char *device, const char *why, const char *why2)
{
	gh_base b = gh_snapshot();
	long r0 = gh.reads(), reg0 = gh.handle_registers(), buf0 = gh.buf_registers();
	for (int stream = 0; stream < 2; stream++) {
		gh_log_clear();
		fst_load_opts o = probe_opts(device, FST_GDS_AUTO, FST_IO_PREAD, 2);
		char desc[1200] = "";
		if (stream)
			gh_stream_ok(ck, &fs, &o);
		else
			gh_load_ok(ck, &fs, &o, desc, sizeof desc);
		char head[96];
		snprintf(head, sizeof head, "GPUDirect Storage not used on %s: ", device);
		gh_log_expect(1, FST_LOG_INFO, head, why);
		if (why2)
			gh_log_expect(1, FST_LOG_INFO, head, why2);
		gh_log_expect(0, FST_LOG_WARN, NULL, NULL);
		gh_log_expect(0, FST_LOG_ERROR, NULL, NULL);
		if (!stream) {
			assert_has(desc, "GPUDirect Storage not used: ");
			assert_has(desc, why);
			if (strstr(desc, "cuFile where registered"))
				fail_msg("description claims cuFile: %s", desc);
		}
		gh_assert_back(&b, "gds=auto where GDS is not usable");
	}
	assert_int_equal(gh.reads(), r0);
	assert_int_equal(gh.handle_registers(), reg0);
	assert_int_equal(gh.buf_registers(), buf0);
	expect_explain(device, FST_GDS_AUTO, 0, "GPUDirect Storage not used", why);

	char head[96];
	snprintf(head, sizeof head, "gds=on but GPUDirect Storage cannot run on %s: ", device);
	fst_load_opts o = probe_opts(device, FST_GDS_ON, FST_IO_PREAD, 2);
	gh_load_fails(ck, &o, FST_EUNSUPPORTED, 0, head, why);
	if (why2)
		gh_load_fails(ck, &o, FST_EUNSUPPORTED, 0, head, why2);
	gh_assert_back(&b, "gds=on where GDS is not usable");
	gh_stream_fails(ck, &fs, &o, FST_EUNSUPPORTED, why);
	gh_assert_back(&b, "gds=on where GDS is not usable, streaming");
	expect_explain(device, FST_GDS_ON, FST_EUNSUPPORTED, head, why);
	assert_int_equal(gh.reads(), r0);
	assert_int_equal(gh.handle_registers(), reg0);
	report(device, 0, why);
}

/* GDS must be used on device, under auto and on. */
static void check_used(const char *device, const char *why)
{
	gh_base b = gh_snapshot();
	for (int gds = FST_GDS_AUTO; gds <= FST_GDS_ON; gds++) {
		long r0 = gh.reads();
		gh_log_clear();
		fst_load_opts o = probe_opts(device, gds, FST_IO_PREAD, 2);
		char desc[1200];
		gh_load_ok(ck, &fs, &o, desc, sizeof desc);
		assert_true(gh.reads() > r0);
		assert_has(desc, "cuFile where registered");
		assert_has(desc, why);
		gh_log_expect(0, FST_LOG_WARN, NULL, NULL);
		gh_assert_back(&b, "GDS usable");
	}
	expect_explain(device, FST_GDS_ON, 0, "cuFile where registered", why);
	fst_gds_report r = report(device, 1, why);
	assert_int_equal(r.library, 1);
	assert_int_equal(r.driver_opened, 1);
	assert_int_equal(r.nvfs_devices, 1);
	assert_int_equal(r.gpu_direct_rdma, 1);
	assert_int_equal(r.integrated, 0);
	assert_int_equal(r.compat_allowed, -1); /* no cufile.json */
}

/* ---- scenario "devices": one device per probe outcome */

static void test_nvfs_zero(void **state)
{
	(void)state;
	setenv("FST_CUFILE_DOUBLE_NVFS", "0.0", 1);
	check_not_used("cuda:0", "nvidia-fs version 0.0", "compatibility mode");
	/* the outcome is kept for the device */
	unsetenv("FST_CUFILE_DOUBLE_NVFS");
	check_not_used("cuda:0", "nvidia-fs version 0.0", NULL);
	fst_gds_report r = report("cuda:0", 0, "compatibility mode");
	assert_int_equal(r.driver_opened, 1);
	assert_int_equal(r.nvfs_major, 0);
	assert_int_equal(r.nvfs_minor, 0);
}

static void test_integrated(void **state)
{
	(void)state;
	setenv("FST_DOUBLE_INTEGRATED", "1", 1);
	check_not_used("cuda:1", "cuda:1 is integrated", NULL);
	/* FST_GDS_TRY=1 opens a driver that says no, never an integrated GPU */
	setenv("FST_GDS_TRY", "1", 1);
	check_not_used("cuda:1", "cuda:1 is integrated", NULL);
	unsetenv("FST_GDS_TRY");
	unsetenv("FST_DOUBLE_INTEGRATED");
	assert_int_equal(report("cuda:1", 0, "integrated").integrated, 1);
}

static void test_no_rdma(void **state)
{
	(void)state;
	setenv("FST_DOUBLE_RDMA", "0", 1);
	check_not_used("cuda:2", "GPU_DIRECT_RDMA_SUPPORTED = 0", NULL);
	setenv("FST_GDS_TRY", "1", 1);
	check_not_used("cuda:2", "GPU_DIRECT_RDMA_SUPPORTED = 0", NULL);
	unsetenv("FST_GDS_TRY");
	unsetenv("FST_DOUBLE_RDMA");
	assert_int_equal(report("cuda:2", 0, "RDMA").gpu_direct_rdma, 0);
}

static void test_usable(void **state)
{
	(void)state;
	check_used("cuda:3", "nvidia-fs 2.17 and GPUDirect RDMA on cuda:3");
	setenv("FST_CUFILE_DOUBLE_NVFS", "2.5", 1);
	check_used("cuda:4", "nvidia-fs 2.5 and GPUDirect RDMA on cuda:4");
	unsetenv("FST_CUFILE_DOUBLE_NVFS");
	fst_gds_report r = report("cuda:4", 1, "2.5");
	assert_int_equal(r.nvfs_major, 2);
	assert_int_equal(r.nvfs_minor, 5);
	/* a device that does not exist is an error, not a report */
	fst_error err;
	assert_int_not_equal(fst_gds_probe(8, &r, &err), 0);
	assert_int_not_equal(fst_gds_probe(-1, &r, &err), 0);
}

static void test_gds_off(void **state)
{
	(void)state;
	gh_base b = gh_snapshot();
	long r0 = gh.reads(), reg0 = gh.handle_registers(), buf0 = gh.buf_registers();
	fst_load_opts o = probe_opts("cuda:5", FST_GDS_OFF, FST_IO_PREAD, 2);
	char desc[1200];
	gh_load_ok(ck, &fs, &o, desc, sizeof desc);
	assert_has(desc, "gds=off");
	assert_int_equal(gh.reads(), r0);
	assert_int_equal(gh.handle_registers(), reg0);
	assert_int_equal(gh.buf_registers(), buf0);
	gh_assert_back(&b, "gds=off");
	/* and cuda:5 is otherwise usable */
	check_used("cuda:5", "nvidia-fs 2.17");
}

static void test_driver_opened_once(void **state)
{
	(void)state;
	/* six devices probed, one driver */
	assert_int_equal(gh.driver_opens(), 1);
}

/* ---- scenario "nonvfs" */

static void test_no_nvfs_devices(void **state)
{
	(void)state;
	/* nothing has opened the driver, and nothing will */
	assert_int_equal(gh.driver_opens(), 0);
	check_not_used("cuda:0", "no /dev/nvidia-fs*", "the cuFile driver was not opened");
	assert_int_equal(gh.driver_opens(), 0);
	check_not_used("cuda:1", "no /dev/nvidia-fs*", NULL);
	assert_int_equal(gh.driver_opens(), 0);
	fst_gds_report r = report("cuda:0", 0, "nvidia-fs");
	assert_int_equal(r.library, 1);
	assert_int_equal(r.nvfs_devices, 0);
	assert_int_equal(r.driver_opened, 0);
	assert_int_equal(gh.driver_opens(), 0);
}

static void test_gds_try(void **state)
{
	(void)state;
	/* FST_GDS_TRY=1: open the driver anyway, to exercise cuFile there */
	setenv("FST_GDS_TRY", "1", 1);
	gh_base b = gh_snapshot();
	long r0 = gh.reads();
	fst_load_opts o = probe_opts("cuda:2", FST_GDS_AUTO, FST_IO_PREAD, 2);
	char desc[1200];
	gh_load_ok(ck, &fs, &o, desc, sizeof desc);
	assert_int_equal(gh.driver_opens(), 1);
	assert_true(gh.reads() > r0);
	assert_has(desc, "no /dev/nvidia-fs*");
	gh_assert_back(&b, "FST_GDS_TRY=1");
	unsetenv("FST_GDS_TRY");
}

/* ---- scenarios "nolib", "lacksym", "openerr" */

static void test_no_library(void **state)
{
	(void)state;
	check_not_used("cuda:0", "no cuFile library", "/nonexistent/libcufile.so.0");
	check_not_used("cuda:1", "no cuFile library", NULL);
	/* libfst never reached the double */
	assert_int_equal(gh.driver_opens(), 0);
	assert_int_equal(report("cuda:0", 0, "/nonexistent/libcufile.so.0").library, 0);
}

static void test_library_lacks_symbols(void **state)
{
	(void)state;
	char want[700];
	snprintf(want, sizeof want, "%s lacks cuFileDriverOpen", cuda_double_path);
	check_not_used("cuda:0", want, NULL);
	assert_int_equal(gh.driver_opens(), 0);
}

static void test_driver_open_fails(void **state)
{
	(void)state;
	check_not_used("cuda:0", "cuFileDriverOpen failed with 5001",
		       "CU_FILE_DRIVER_NOT_INITIALIZED");
	assert_int_equal(gh.driver_opens(), 1);
	/* the driver is tried once per process: another device, with the
	 * switch off, gets the same answer without a second try */
	unsetenv("FST_CUFILE_DOUBLE_OPEN_ERR");
	check_not_used("cuda:1", "cuFileDriverOpen failed with 5001", NULL);
	assert_int_equal(gh.driver_opens(), 1);
	fst_gds_report r = report("cuda:1", 0, "5001");
	assert_int_equal(r.driver_opened, 0);
	assert_int_equal(r.driver_error, 5001);
}

/* ---- the group */

static int reset(void **state)
{
	(void)state;
	setenv("FST_CUFILE_DOUBLE_DELAY_US", "50", 1);
	setenv("FST_DOUBLE_DELAY_US", "50", 1);
	fst_fault_set(NULL, NULL);
	gh_log_capture(FST_LOG_INFO);
	return 0;
}

static int group_setup(void **state)
{
	(void)state;
	lh_shape sh = lh_default_shape();
	sh.max_files = 2;
	sh.max_tensors = 8;
	sh.max_big = 100000;
	sh.allow_empty_files = false;
	lh_write_random("probe", lh_base_seed(), &sh, &ckc);
	ck = lh_open(ckc.path);
	lh_files_read(ck, &fs);
	if (!fst_checkpoint_total_bytes(ck)) {
		fprintf(stderr, "the probe checkpoint has no bytes\n");
		return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
	lh_rmdir(ckc.dir);
	return gh_leftovers();
}

int main(int argc, char **argv)
{
	if (argc > 1)
		scenario = argv[1];
	int rc = gh_open_doubles();
	if (rc)
		return rc;
	cuda_double_path = getenv("FST_CUDA_LIBRARY");
	/* Before anything probes: what the scenario changes for the process. */
	if (!strcmp(scenario, "nonvfs")) {
		setenv("FST_NVFS_DEVICES", "/nonexistent/nvidia-fs*", 1);
	} else if (!strcmp(scenario, "nolib")) {
		setenv("FST_CUFILE_LIBRARY", "/nonexistent/libcufile.so.0", 1);
	} else if (!strcmp(scenario, "lacksym")) {
		setenv("FST_CUFILE_LIBRARY", cuda_double_path, 1);
	} else if (!strcmp(scenario, "openerr")) {
		setenv("FST_CUFILE_DOUBLE_OPEN_ERR", "5001", 1);
	} else if (strcmp(scenario, "devices")) {
		fprintf(stderr, "unknown scenario %s (devices, nonvfs, nolib, lacksym, openerr)\n",
			scenario);
		return 2;
	}
	unsetenv("FST_GDS_TRY");

	const struct CMUnitTest devices[] = {
		cmocka_unit_test_setup(test_nvfs_zero, reset),
		cmocka_unit_test_setup(test_integrated, reset),
		cmocka_unit_test_setup(test_no_rdma, reset),
		cmocka_unit_test_setup(test_usable, reset),
		cmocka_unit_test_setup(test_gds_off, reset),
		cmocka_unit_test_setup(test_driver_opened_once, reset),
	};
	const struct CMUnitTest nonvfs[] = {
		cmocka_unit_test_setup(test_no_nvfs_devices, reset),
		cmocka_unit_test_setup(test_gds_try, reset),
	};
	const struct CMUnitTest nolib[] = {
		cmocka_unit_test_setup(test_no_library, reset),
	};
	const struct CMUnitTest lacksym[] = {
		cmocka_unit_test_setup(test_library_lacks_symbols, reset),
	};
	const struct CMUnitTest openerr[] = {
		cmocka_unit_test_setup(test_driver_open_fails, reset),
	};
	if (!strcmp(scenario, "nonvfs"))
		return cmocka_run_group_tests_name("gds probe: nonvfs", nonvfs, group_setup,
						   group_teardown);
	if (!strcmp(scenario, "nolib"))
		return cmocka_run_group_tests_name("gds probe: nolib", nolib, group_setup,
						   group_teardown);
	if (!strcmp(scenario, "lacksym"))
		return cmocka_run_group_tests_name("gds probe: lacksym", lacksym, group_setup,
						   group_teardown);
	if (!strcmp(scenario, "openerr"))
		return cmocka_run_group_tests_name("gds probe: openerr", openerr, group_setup,
						   group_teardown);
	return cmocka_run_group_tests_name("gds probe: devices", devices, group_setup,
					   group_teardown);
}
