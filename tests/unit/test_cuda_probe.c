/* Description: the cold probe (FST_COLD_PROBE), onto the libcuda double: a
 * staged load of cold files under io=auto reads its first stretch with
 * O_DIRECT through io_uring, the next through the page cache with
 * readahead, and the rest the faster way. With 1, 4 and 16 threads, the way
 * left to the rates or forced either way, whole and streamed, every tensor
 * equals the file and the description says what was measured and kept; the
 * readahead asked for follows the way kept. No probe where it does not
 * apply (FST_COLD_PROBE unset or off, where io=auto reads cold files with
 * O_DIRECT; files cached, io asked for, streams, a plan too small for it). A bad FST_COLD_PROBE is FST_EUSAGE naming it. A read
 * failing in either stretch, or an io_uring submission, fails the load
 * cleanly (no hang, nothing left); a worker whose ring cannot be set up
 * reads through the page cache instead; a load freed while it probes
 * stops. */
#include "cuda_helpers.h"

#include <fcntl.h>

#define STRETCH 65536u
#define CHUNK (16u << 10)

static ch_ckpt c;
static bool can_evict;

static int group_setup(void **state)
{
	int rc = ch_setup(state);
	if (rc)
		return rc;
	can_evict = ch_write_cold("probe", lh_base_seed() + 11, &c);
	return 0;
}

static int group_teardown(void **state)
{
	ch_close(&c);
	unsetenv("FST_COLD_PROBE");
	return ch_teardown(state);
}

/* A cold load onto cuda:0 with io=auto and the probe set to env; returns
 * the status, the buffer in *out (checked against the files when loaded)
 * and how many readahead requests it made in *asked. */
static int cold_load(const char *env, unsigned threads, bool stream, fst_buffer **out,
		     long *asked, fst_error *err)
{
	if (env)
		setenv("FST_COLD_PROBE", env, 1);
	else
		unsetenv("FST_COLD_PROBE");
	fst_load_opts o;
	ch_opts(&o, "cuda:0", FST_IO_AUTO, threads, 1 * MiB);
	o.chunk_bytes = CHUNK;
	lh_evict(c.ck);
	assert_int_equal(fst_fault_set("prefetch:1+", err), 0); /* counts, refuses */
	int rc = ch_load_whole_or_streamed(&c, &o, stream, out, err);
	*asked = fst_fault_last(NULL, 0);
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
	return rc;
}

static void test_probe_gives_the_files_bytes(void **state)
{
	(void)state;
	if (!can_evict || !ch_uring_ok)
		skip();
	static const char *const envs[] = {"65536", "65536:direct", "65536:readahead"};
	static const char *const kept[] = {NULL, "the rest with O_DIRECT",
					   "the rest through the page cache"};
	static const unsigned threads[] = {1, 4, 16};
	/* the readahead stretch's chunks, and one more for a partial one */
	const long stretch_chunks = STRETCH / CHUNK + 2;
	for (size_t e = 0; e < 3; e++)
		for (size_t t = 0; t < 3; t++)
			for (int stream = 0; stream < 2; stream++) {
				fst_buffer *buf;
				long asked;
				fst_error err;
				if (cold_load(envs[e], threads[t], stream, &buf, &asked, &err))
					fail_msg("%s, %u threads%s: %s", envs[e], threads[t],
						 stream ? ", streamed" : "", err.message);
				const char *d = fst_buffer_describe(buf);
				if (!strstr(d, "pread or uring (O_DIRECT)") ||
				    !strstr(d, "the faster way kept after 64 KiB read each way") ||
				    !strstr(d, "cold probe: O_DIRECT in 512 KiB requests read ") ||
				    !strstr(d, " the page cache with readahead ") ||
				    (kept[e] && !strstr(d, kept[e])))
					fail_msg("%s, %u threads: \"%s\"", envs[e], threads[t], d);
				bool direct = strstr(d, "the rest with O_DIRECT") != NULL;
				if (asked < 1 || (direct && asked > stretch_chunks) ||
				    (!direct && asked <= stretch_chunks))
					fail_msg("%s, %u threads: %ld readahead requests, the rest %s",
						 envs[e], threads[t], asked,
						 direct ? "with O_DIRECT" : "through the page cache");
				fst_buffer_release(buf);
				ch_assert_clean(envs[e], c.host_base);
			}
}

/* A load with no probe: O_DIRECT only where io=uring was asked for or, when
 * direct, where io=auto chose it for cold files. */
static void assert_no_probe(const char *env, const fst_load_opts *o, bool evict, bool direct,
			    const char *ctx)
{
	if (env)
		setenv("FST_COLD_PROBE", env, 1);
	else
		unsetenv("FST_COLD_PROBE");
	if (evict)
		lh_evict(c.ck);
	fst_buffer *buf;
	fst_error err;
	if (fst_load(c.ck, o, &buf, &err))
		fail_msg("%s: %s", ctx, err.message);
	const char *d = fst_buffer_describe(buf);
	if ((strstr(d, "uring") != NULL) != (direct || o->io == FST_IO_URING))
		fail_msg("%s: \"%s\"", ctx, d);
	if (strstr(d, "probe"))
		fail_msg("%s: \"%s\"", ctx, d);
	ch_assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
}

static void test_no_probe_where_it_does_not_apply(void **state)
{
	(void)state;
	if (!can_evict || !ch_uring_ok)
		skip();
	fst_load_opts o;
	ch_opts(&o, "cuda:0", FST_IO_AUTO, 4, 1 * MiB);
	o.chunk_bytes = CHUNK;
	assert_no_probe("off", &o, true, true, "FST_COLD_PROBE=off");
	assert_no_probe(NULL, &o, true, true, "FST_COLD_PROBE unset (off by default)");
	assert_no_probe("1073741824", &o, true, false, "a plan under 8 stretches");
	/* the files in the page cache */
	fst_buffer *warm;
	fst_error err;
	assert_int_equal(fst_load(c.ck, &o, &warm, &err), 0);
	fst_buffer_release(warm);
	assert_no_probe("65536", &o, false, false, "cached files");
	fst_load_opts p = o;
	p.io = FST_IO_PREAD;
	assert_no_probe("65536", &p, true, false, "io=pread");
	p.io = FST_IO_URING;
	assert_no_probe("65536", &p, true, false, "io=uring");
	fst_load_opts s = o;
	s.stream_bytes = 4 * CHUNK;
	assert_no_probe("65536", &s, true, false, "streams");
	fst_load_opts h = o;
	h.device = "cpu"; /* straight into host memory: no staging to probe with */
	if (fst_load(c.ck, &h, &warm, &err))
		fail_msg("cpu: %s", err.message);
	assert_null(strstr(fst_buffer_describe(warm), "probe"));
	fst_buffer_release(warm);
	ch_assert_clean("no probe", c.host_base);
}

static void test_bad_env_is_a_usage_error(void **state)
{
	(void)state;
	static const char *const bad[] = {"fast", "65536:both", "-5", "12x", ":direct:"};
	ch_cold_bad_env(&c, "FST_COLD_PROBE", bad, sizeof bad / sizeof bad[0]);
}

static void test_failures_in_the_probe_are_clean(void **state)
{
	(void)state;
	if (!can_evict || !ch_uring_ok)
		skip();
	/* O_DIRECT reads: the first stretch, and the rest when kept */
	ch_cold_fault_loop(&c, "FST_COLD_PROBE", "65536:direct", CHUNK, "uring_complete", FST_EIO,
			   "cold probe");
	/* io_uring's set-up (a worker whose ring cannot be made reads its
	 * O_DIRECT chunks through the page cache) and submissions */
	ch_cold_fault_loop(&c, "FST_COLD_PROBE", "65536:direct", CHUNK, "uring_submit", FST_EIO,
			   "cold probe");
	/* reads through the page cache: the second stretch, and the rest */
	ch_cold_fault_loop(&c, "FST_COLD_PROBE", "65536:readahead", CHUNK, "read", FST_EIO,
			   "cold probe");
}

/* A load freed while its workers wait for the first stretch stops. */
static void test_free_while_probing(void **state)
{
	(void)state;
	if (!can_evict || !ch_uring_ok)
		skip();
	static const unsigned threads[] = {1, 4, 16};
	ch_cold_freed_at_once(&c, "FST_COLD_PROBE", "65536", CHUNK, threads, 3);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_probe_gives_the_files_bytes, ch_reset),
		cmocka_unit_test_setup(test_no_probe_where_it_does_not_apply, ch_reset),
		cmocka_unit_test_setup(test_bad_env_is_a_usage_error, ch_reset),
		cmocka_unit_test_setup(test_failures_in_the_probe_are_clean, ch_reset),
		cmocka_unit_test_setup(test_free_while_probing, ch_reset),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
