/* Description: memory lifetimes on the CUDA target (libcuda double). Pinned
 * staging blocks outlive a load, serve the next one (no new page-locking,
 * even with pinning made to fail) and fst_trim gives them all back; device
 * memory lives as long as a view of it does, and the last view to go frees
 * it, on whatever thread that is. New staging blocks are huge-page memory
 * registered with the driver, faulted in before the registration (left to
 * the driver with FST_STAGING_PAGES=lazy), or cuMemHostAlloc's with
 * FST_STAGING_PAGES=driver; both kinds go back to their own free call. A
 * first load's workers set themselves up while its staging is pinned. */
#include "cuda_helpers.h"

#include <pthread.h>
#include <stdlib.h>

static void *release_on_thread(void *arg)
{
	fst_view_release(arg);
	return NULL;
}

/* Pinned staging blocks outlive a load, are reused by the next one (no new
 * page-locking), and fst_trim gives them all back. */
static void test_pinned_pool(void **state)
{
	(void)state;
	ch_set_delay("20");
	ch_ckpt c;
	ch_write_random("pool", 47, &ch_big_gen, &c);
	ch_open(&c, c.dir);
	fst_trim();
	assert_int_equal(ch_live_host() - ch_pinned_base, 0);
	fst_load_opts o;
	ch_opts(&o, "cuda:0", FST_IO_PREAD, 2, 2 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	fst_buffer_release(buf);
	long kept = ch_live_host() - ch_pinned_base;
	assert_true(kept >= 1 && kept <= 2); /* at most one block per worker */
	assert_int_equal(ch_live_device() - ch_device_base, 0);
	/* the same load again, on the other device, with pinning made to
	 * fail: the kept blocks serve it */
	assert_int_equal(fst_fault_set("pin:1+", &err), 0);
	o.device = "cuda:1";
	int rc = fst_load(c.ck, &o, &buf, &err);
	fst_fault_set(NULL, NULL);
	if (rc)
		fail_msg("with the kept blocks: %s", err.message);
	ch_assert_buffer(&c, buf, 1);
	fst_buffer_release(buf);
	assert_int_equal(ch_live_host() - ch_pinned_base, kept);
	fst_trim();
	assert_int_equal(ch_live_host() - ch_pinned_base, 0);
	fst_trim(); /* nothing left: a no-op */
	ch_assert_clean("after trimming", c.host_base);
	ch_close(&c);
}

/* Staging comes from registered huge-page memory by default, every page
 * faulted in before the registration (none with FST_STAGING_PAGES=lazy),
 * from cuMemHostAlloc with FST_STAGING_PAGES=driver; each kind is freed by
 * its own call (the double refuses to unregister what it never
 * registered). */
static void test_staging_pages(void **state)
{
	(void)state;
	long (*live_registered)(void) = (long (*)(void))ch_sym("fst_double_live_registered");
	long (*resident)(void) = (long (*)(void))ch_sym("fst_double_resident_at_register");
	ch_ckpt c;
	ch_write_random("pages", 48, &ch_big_gen, &c);
	ch_open(&c, c.dir);
	static const char *const kinds[] = {NULL, "driver", "huge", "lazy"};
	for (int k = 0; k < 4; k++) {
		fst_trim();
		if (kinds[k])
			setenv("FST_STAGING_PAGES", kinds[k], 1);
		else
			unsetenv("FST_STAGING_PAGES");
		long r0 = live_registered();
		fst_load_opts o;
		ch_opts(&o, "cuda:0", FST_IO_PREAD, 2, 2 * MiB);
		fst_buffer *buf = NULL;
		fst_error err;
		if (fst_load(c.ck, &o, &buf, &err))
			fail_msg("FST_STAGING_PAGES=%s: %s", kinds[k] ? kinds[k] : "(unset)", err.message);
		ch_assert_buffer(&c, buf, 0);
		fst_buffer_release(buf);
		long kept = ch_live_host() - ch_pinned_base, registered = live_registered() - r0;
		assert_true(kept >= 1);
		if (k == 1) {
			assert_int_equal(registered, 0); /* all from cuMemHostAlloc */
		} else {
			assert_int_equal(registered, kept); /* all registered */
			/* faulted in on the workers' count of threads before the
			 * registration, except lazy's (the driver faults them in) */
			if (k == 3)
				assert_true(resident() >= 0 && resident() < 100);
			else
				assert_int_equal(resident(), 1000);
		}
		fst_trim();
		assert_int_equal(live_registered(), r0);
		assert_int_equal(ch_live_host() - ch_pinned_base, 0);
	}
	unsetenv("FST_STAGING_PAGES");
	/* huge-page memory refused: the blocks come from cuMemHostAlloc and the
	 * load goes on, its bytes whole */
	fst_trim();
	long r0 = live_registered();
	fst_error err;
	assert_int_equal(fst_fault_set("host_alloc:1+", &err), 0);
	fst_load_opts o;
	ch_opts(&o, "cuda:0", FST_IO_PREAD, 2, 2 * MiB);
	fst_buffer *buf = NULL;
	int rc = fst_load(c.ck, &o, &buf, &err);
	fst_fault_set(NULL, NULL);
	if (rc)
		fail_msg("without huge-page memory: %s", err.message);
	ch_assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
	assert_int_equal(live_registered(), r0);
	assert_true(ch_live_host() - ch_pinned_base >= 1);
	fst_trim();
	ch_assert_clean("after trimming", c.host_base);
	ch_close(&c);
}

/* A first load pins its staging while its workers make their streams and
 * events: with a registration that takes 150 ms, every worker's stream
 * exists before it returns (the workers used to start only after it). A
 * later load takes the kept block and registers nothing. */
static void test_staging_pinned_beside_workers(void **state)
{
	(void)state;
	long (*made)(void) = (long (*)(void))ch_sym("fst_double_streams_made");
	long (*at_register)(void) = (long (*)(void))ch_sym("fst_double_streams_at_register");
	long (*live_registered)(void) = (long (*)(void))ch_sym("fst_double_live_registered");
	ch_ckpt c;
	ch_write_random("gate", 49, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	fst_trim();
	setenv("FST_DOUBLE_REGISTER_MS", "150", 1);
	fst_load_opts o;
	ch_opts(&o, "cuda:0", FST_IO_PREAD, 4, 1 * MiB);
	for (int load = 0; load < 2; load++) {
		long before = made(), r0 = live_registered();
		fst_buffer *buf = NULL;
		fst_error err;
		if (fst_load(c.ck, &o, &buf, &err))
			fail_msg("load %d: %s", load + 1, err.message);
		ch_assert_buffer(&c, buf, 0);
		fst_buffer_release(buf);
		if (load == 0) {
			if (at_register() - before < 1)
				fail_msg("no worker had made its stream when the staging's "
					 "registration returned (%ld of %ld)",
					 at_register() - before, made() - before);
		} else {
			assert_int_equal(live_registered(), r0); /* the kept block */
		}
	}
	unsetenv("FST_DOUBLE_REGISTER_MS");
	fst_trim();
	ch_assert_clean("after trimming", c.host_base);
	ch_close(&c);
}

/* Views keep the device memory alive; the last one to go frees it, on
 * whatever thread that is. */
static void test_lifetime(void **state)
{
	(void)state;
	ch_set_delay("20");
	ch_ckpt c;
	ch_write_random("life", 43, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	fst_load_opts o;
	ch_opts(&o, "cuda:1", FST_IO_PREAD, 2, 1 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	size_t nt = fst_buffer_tensor_count(buf);
	assert_true(nt > 3);
	fst_tensor_view *views = calloc(nt, sizeof *views);
	for (size_t i = 0; i < nt; i++)
		assert_int_equal(fst_buffer_tensor(buf, i, &views[i]), 0);
	fst_buffer_release(buf);
	assert_int_equal(ch_live_device() - ch_device_base, 1);
	for (size_t i = 0; i < nt; i++)
		ch_assert_view(&c, &views[i], 1);
	for (size_t i = 0; i + 1 < nt; i++) {
		fst_view_release(&views[i]);
		assert_null(views[i].buffer);
		assert_int_equal(ch_live_device() - ch_device_base, 1);
	}
	ch_assert_view(&c, &views[nt - 1], 1);
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, release_on_thread, &views[nt - 1]), 0);
	pthread_join(th, NULL);
	assert_int_equal(ch_live_device() - ch_device_base, 0);
	fst_view_release(&views[nt - 1]); /* cleared: a no-op */
	free(views);
	ch_assert_clean("after the last view", c.host_base);
	ch_close(&c);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_pinned_pool, ch_reset),
		cmocka_unit_test_setup(test_staging_pages, ch_reset),
		cmocka_unit_test_setup(test_staging_pinned_beside_workers, ch_reset),
		cmocka_unit_test_setup(test_lifetime, ch_reset),
	};
	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
}
