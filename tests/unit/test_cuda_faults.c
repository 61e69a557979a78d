/* Description: injected faults onto the CUDA target (libcuda double): the
 * N-th call at device_alloc, pin, h2d and event fails, N = 1, 2, ... until a
 * load succeeds, with pread and io_uring, whole and streamed. Every failure
 * is clean (FST_EDEVICE with a message, no buffer, no device memory, pinned
 * block or libfst allocation left), no tensor handed out before the error
 * is wrong, the load that finally succeeds is right, and a fault in every
 * h2d call with several workers fails the load naming the device. A worker
 * thread that cannot start fails the load cleanly, with workers already
 * waiting for the staging to be pinned. */
#include "cuda_helpers.h"

/* Fail the N-th call at a site, N = 1, 2, ... until a load succeeds: every
 * failure is clean (a device error, no buffer, nothing live), and the load
 * that finally succeeds is right. */
static void fault_loop(const ch_ckpt *c, const char *site, int io, unsigned threads, bool stream)
{
	unsigned failures = 0;
	for (long n = 1;; n++) {
		if (n > 5000)
			fail_msg("%s: still failing after 5000 calls", site);
		char spec[64];
		snprintf(spec, sizeof spec, "%s:%ld", site, n);
		fst_error err;
		assert_int_equal(fst_fault_set(spec, &err), 0);
		fst_load_opts o;
		ch_opts(&o, n % 2 ? "cuda:1" : "cuda:0", io, threads, 1 * MiB);
		o.chunk_bytes = 16384; /* many chunks, so many calls */
		int dev = n % 2;
		fst_buffer *buf = (fst_buffer *)&o;
		int rc;
		if (!stream) {
			rc = fst_load(c->ck, &o, &buf, &err);
		} else {
			fst_loader *ld = NULL;
			rc = fst_load_start(c->ck, &o, &ld, &err);
			if (!rc) {
				fst_tensor_view v;
				while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
					char why[512];
					int bad = ch_view_check(c, &v, dev, why, sizeof why);
					fst_view_release(&v);
					if (bad) {
						/* leave nothing behind for the next tests */
						fst_loader_free(ld);
						fst_fault_set(NULL, NULL);
						fail_msg("%s, stream: a tensor handed out before "
							 "the error was wrong: %s",
							 spec, why);
					}
				}
				fst_error ferr;
				int frc = fst_loader_finish(ld, &buf, &ferr);
				if (rc == 0)
					rc = frc, err = ferr;
				else
					assert_int_equal(frc, rc);
			} else {
				buf = NULL;
			}
		}
		fst_fault_set(NULL, NULL);
		if (!rc) {
			assert_non_null(buf);
			ch_assert_buffer(c, buf, dev);
			fst_buffer_release(buf);
			ch_assert_clean(spec, c->host_base);
			break;
		}
		failures++;
		if (rc != FST_EDEVICE)
			fail_msg("%s: status %d (%s), expected FST_EDEVICE", spec, rc, err.message);
		assert_int_equal(err.code, rc);
		assert_true(err.message[0] != '\0');
		assert_null(buf);
		ch_assert_clean(spec, c->host_base);
	}
	if (!failures)
		fail_msg("%s: the first call did not fail", site);
}

static void run_faults(bool stream)
{
	ch_set_delay("10");
	ch_ckpt c;
	ch_write_random(stream ? "faults_stream" : "faults", 41, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	static const char *const sites[] = {"device_alloc", "pin", "h2d", "event"};
	/* h2d while streaming was once a bug: a chunk whose copy failed was
	 * still reported done, handing out a tensor of poison before the error */
	for (int s = 0; s < 4; s++)
		for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
			if (io == FST_IO_URING && !ch_uring_ok)
				continue;
			fault_loop(&c, sites[s], io, io == FST_IO_PREAD ? 1 : 3, stream);
		}
	/* a fault in every call from the first, with several workers */
	fst_error err;
	assert_int_equal(fst_fault_set("h2d:1+", &err), 0);
	fst_load_opts o;
	ch_opts(&o, "cuda:0", FST_IO_PREAD, 4, 1 * MiB);
	fst_buffer *buf = NULL;
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EDEVICE);
	assert_has(err.message, "cuda:0");
	assert_null(buf);
	fst_fault_set(NULL, NULL);
	ch_assert_clean("after h2d:1+", c.host_base);
	/* and the process loads again */
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	ch_assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
	ch_assert_clean("after the faults", c.host_base);
	ch_close(&c);
	ch_set_delay("50");
}

static void test_faults(void **state)
{
	(void)state;
	run_faults(false);
}

/* The same faults in the streaming form: no tensor handed out before the
 * error may be wrong. */
static void test_faults_streaming(void **state)
{
	(void)state;
	run_faults(true);
}

/* A worker thread that cannot start (FST_FAULT thread:N, as EAGAIN from a
 * pids limit would): with no staging kept from an earlier load, the workers
 * already started wait for the loading thread to pin it, which it then never
 * does. The load lets them go and fails with FST_ENOMEM, whole and streamed,
 * leaving nothing behind; it once waited for them for ever. */
static void test_thread_start_fails(void **state)
{
	(void)state;
	ch_ckpt c;
	ch_write_random("threads", 43, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	for (int stream = 0; stream < 2; stream++) {
		long failures = 0;
		for (long n = 1;; n++) {
			if (n > 64)
				fail_msg("thread:%ld: still failing", n);
			char spec[64];
			snprintf(spec, sizeof spec, "thread:%ld:EAGAIN", n);
			fst_error err;
			fst_trim(); /* nothing kept: the staging is pinned as the workers start */
			assert_int_equal(fst_fault_set(spec, &err), 0);
			fst_load_opts o;
			ch_opts(&o, "cuda:0", FST_IO_PREAD, 4, 1 * MiB);
			fst_buffer *buf = NULL;
			fst_loader *ld = NULL;
			int rc = stream ? fst_load_start(c.ck, &o, &ld, &err)
					: fst_load(c.ck, &o, &buf, &err);
			fst_fault_set(NULL, NULL);
			if (!rc && stream)
				rc = fst_loader_finish(ld, &buf, &err);
			if (!rc) {
				ch_assert_buffer(&c, buf, 0);
				fst_buffer_release(buf);
				ch_assert_clean(spec, c.host_base);
				break;
			}
			failures++;
			if (rc != FST_ENOMEM)
				fail_msg("%s: status %d (%s), expected FST_ENOMEM", spec, rc,
					 err.message);
			assert_has(err.message, "cannot start reader threads");
			assert_null(buf);
			assert_null(ld);
			ch_assert_clean(spec, c.host_base);
		}
		/* the first thread failing, and later ones, with workers waiting */
		if (failures < 2)
			fail_msg("only %ld thread start failed", failures);
	}
	ch_close(&c);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_faults, ch_reset),
		cmocka_unit_test_setup(test_faults_streaming, ch_reset),
		cmocka_unit_test_setup(test_thread_start_fails, ch_reset),
	};
	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
}
