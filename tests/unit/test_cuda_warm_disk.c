/* Description: disk helpers (FST_WARM_DISK), onto the libcuda double. A
 * load of files in the page cache onto a GPU with FST_WARM_DISK=N (1 to 8)
 * starts N helpers beside its workers, says so, and reads every byte once:
 * whole and streamed, with 1, 4 and 12 workers, every tensor equal to the
 * file; with the workers slowed, the helpers read a share of the bytes
 * (more than none, less than all) and the description gives it. Where a
 * helper cannot set up its ring the workers read everything. 0, and loads
 * the helpers are not for (cold files, residency not measured, host
 * memory, streams, a plan of too few chunks) say nothing of them. A value other than 0 to 8 is a usage
 * error naming the variable (fst_load_explain too). Each io_uring read of
 * a helper failing in turn fails the load with FST_EIO and nothing left;
 * loads freed at once stop. */
#include "cuda_helpers.h"

#include <stdlib.h>

static ch_ckpt c;

static int group_setup(void **state)
{
	int rc = ch_setup(state);
	if (rc)
		return rc;
	ch_write_random("warm-disk", lh_base_seed() + 29, &ch_big_gen, &c);
	ch_open(&c, c.dir);
	return 0;
}

static int group_teardown(void **state)
{
	ch_close(&c);
	unsetenv("FST_WARM_DISK");
	return ch_teardown(state);
}

#define SAYS "disk helper"
#define SHARE "% of the bytes read from the disk by the helpers"

/* The helpers' share (percent) that the description gives, or -1. */
static double share_of(const char *d)
{
	const char *end = strstr(d, SHARE);
	if (!end)
		return -1;
	const char *p = end;
	while (p > d && (p[-1] == '.' || (p[-1] >= '0' && p[-1] <= '9')))
		p--;
	return p < end ? strtod(p, NULL) : -1;
}

/* c loaded warm onto cuda:0 with o and FST_WARM_DISK=helpers, whole or
 * streamed, every byte checked; the description, which must name the
 * helpers (or not, where want is false), returned in d. */
static void warm_load(const fst_load_opts *o, const char *helpers, bool stream, bool want,
		      char *d, size_t dn, const char *ctx)
{
	setenv("FST_WARM_DISK", helpers, 1);
	ch_temperature(&c, false);
	fst_buffer *buf;
	fst_error err;
	if (ch_load_whole_or_streamed(&c, o, stream, &buf, &err))
		fail_msg("%s: %s", ctx, err.message);
	snprintf(d, dn, "%s", fst_buffer_describe(buf));
	fst_buffer_release(buf);
	unsetenv("FST_WARM_DISK");
	ch_assert_clean(ctx, c.host_base);
	if (want != (strstr(d, SAYS) != NULL))
		fail_msg("%s: \"%s\" %s \"%s\"", ctx, d, want ? "lacks" : "says", SAYS);
	if (want != (share_of(d) >= 0))
		fail_msg("%s: \"%s\" %s the share", ctx, d, want ? "lacks" : "gives");
}

static void test_every_byte_once(void **state)
{
	(void)state;
	if (!ch_uring_ok)
		skip();
	static const char *const counts[] = {"1", "2", "8"};
	static const unsigned workers[] = {1, 4, 12};
	char d[1200], ctx[96];
	for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
		for (size_t w = 0; w < sizeof workers / sizeof *workers; w++)
			for (int stream = 0; stream < 2; stream++) {
				fst_load_opts o;
				ch_opts(&o, "cuda:0", FST_IO_AUTO, workers[w], 8 * MiB);
				o.chunk_bytes = 16 << 10;
				snprintf(ctx, sizeof ctx, "FST_WARM_DISK=%s, %u workers, %s",
					 counts[k], workers[w], stream ? "streamed" : "whole");
				warm_load(&o, counts[k], stream, true, d, sizeof d, ctx);
				char n[48];
				snprintf(n, sizeof n, "%u thread", workers[w]);
				if (!strstr(d, n) || !strstr(d, "pread"))
					fail_msg("%s: \"%s\"", ctx, d);
			}
}

static void test_share(void **state)
{
	(void)state;
	if (!ch_uring_ok)
		skip();
	/* one worker whose copies take 2 ms each: the helpers' reads of the
	 * end come in well before it gets there */
	ch_set_delay("2000");
	fst_load_opts o;
	ch_opts(&o, "cuda:0", FST_IO_AUTO, 1, 4 * MiB);
	o.chunk_bytes = 64 << 10;
	char d[1200];
	warm_load(&o, "2", false, true, d, sizeof d, "slow worker");
	double share = share_of(d);
	if (!(share > 0 && share < 100))
		fail_msg("helpers' share %.1f%%: \"%s\"", share, d);
	if (!strstr(d, "2 disk helpers reading the end with O_DIRECT"))
		fail_msg("\"%s\"", d);

	/* no ring for the helpers: the worker reads it all */
	fst_error err;
	assert_int_equal(fst_fault_set("uring_submit:1+", &err), 0);
	warm_load(&o, "2", false, true, d, sizeof d, "no ring");
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
	if (share_of(d) != 0)
		fail_msg("no ring: \"%s\"", d);
	ch_set_delay("0");
}

static void test_not_for_these(void **state)
{
	(void)state;
	fst_load_opts o;
	char d[1200];
	ch_opts(&o, "cuda:0", FST_IO_AUTO, 2, 8 * MiB);
	o.chunk_bytes = 16 << 10;
	warm_load(&o, "0", false, false, d, sizeof d, "0");
	o.stream_bytes = 256 << 10;
	warm_load(&o, "2", false, false, d, sizeof d, "streams");
	o.stream_bytes = 0;
	/* 40 workers and 2 helpers would want 168 chunks */
	o.chunk_bytes = 0;
	o.threads = 40;
	o.staging_bytes = 120 * MiB;
	warm_load(&o, "2", false, false, d, sizeof d, "few chunks");
	/* residency not measured (io=pread with readahead off) */
	ch_opts(&o, "cuda:0", FST_IO_PREAD, 2, 8 * MiB);
	o.chunk_bytes = 16 << 10;
	o.readahead_bytes = FST_READAHEAD_OFF;
	warm_load(&o, "2", false, false, d, sizeof d, "residency unknown");

	/* cold files (chunks enough for helpers), and host memory */
	setenv("FST_WARM_DISK", "2", 1);
	ch_opts(&o, "cuda:0", FST_IO_AUTO, 2, 8 * MiB);
	o.chunk_bytes = 16 << 10;
	lh_evict(c.ck);
	fst_buffer *buf;
	fst_error err;
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), 0);
	if (strstr(fst_buffer_describe(buf), SAYS))
		fail_msg("cold: \"%s\"", fst_buffer_describe(buf));
	ch_assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
	ch_opts(&o, "cpu", FST_IO_AUTO, 2, 0);
	ch_temperature(&c, false);
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), 0);
	if (strstr(fst_buffer_describe(buf), SAYS))
		fail_msg("cpu: \"%s\"", fst_buffer_describe(buf));
	fst_buffer_release(buf);
	unsetenv("FST_WARM_DISK");
	ch_assert_clean("not for these", c.host_base);
}

static void test_bad_values(void **state)
{
	(void)state;
	static const char *const bad[] = {"9", "10", "-1", "two", " 1", "1 "};
	ch_cold_bad_env(&c, "FST_WARM_DISK", bad, sizeof bad / sizeof *bad);
}

static void test_failures(void **state)
{
	(void)state;
	if (!ch_uring_ok)
		skip();
	/* copies slowed, so the helpers read before the workers are done */
	ch_set_delay("2000");
	ch_fault_loop(&c, false, "FST_WARM_DISK", "2", 64 << 10, "uring_complete", FST_EIO, SAYS);
	static const unsigned threads[] = {1, 4};
	ch_freed_at_once(&c, false, "FST_WARM_DISK", "2", 64 << 10, threads, 2);
	ch_set_delay("0");
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_every_byte_once, ch_reset),
		cmocka_unit_test_setup(test_share, ch_reset),
		cmocka_unit_test_setup(test_not_for_these, ch_reset),
		cmocka_unit_test_setup(test_bad_values, ch_reset),
		cmocka_unit_test_setup(test_failures, ch_reset),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
