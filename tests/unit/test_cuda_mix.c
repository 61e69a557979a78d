/* Description: the cold mix (FST_COLD_MIX), onto the libcuda double. How
 * chunks are handed out: O_DIRECT readers from the front, page-cache readers
 * in stretches from the back, each stretch in order, an O_DIRECT reader with
 * no front left helping with the last stretch, every chunk exactly once
 * (one thread in a set order, and 8 threads at once). A staged load of
 * cold files under io=auto with the mix, 2, 3 and 8 threads, half or one of
 * them with O_DIRECT, whole and streamed: every tensor equals the file, and
 * the description says how the bytes split (the two shares make the whole).
 * No mix where it does not apply (unset or off; cached files; io asked
 * for; streams; the CPU; one thread; the probe asked for too, which wins).
 * A bad FST_COLD_MIX is FST_EUSAGE naming it. A read failing either way,
 * or an io_uring submission, fails the load cleanly; a load freed at once
 * stops. */
#include "cuda_helpers.h"
#include "engine.h"

#include <pthread.h>
#include <stdatomic.h>

#define CHUNK (16u << 10)

static ch_ckpt c;
static bool can_evict;

static int group_setup(void **state)
{
	int rc = ch_setup(state);
	if (rc)
		return rc;
	can_evict = ch_write_cold("mix", lh_base_seed() + 12, &c);
	return 0;
}

static int group_teardown(void **state)
{
	ch_close(&c);
	unsetenv("FST_COLD_MIX");
	unsetenv("FST_COLD_PROBE");
	return ch_teardown(state);
}

/* An engine with only what fsti_mix_take reads: nc chunks, stretches of
 * `stretch`. */
static void fake_mix(struct fsti_engine *e, size_t nc, size_t stretch)
{
	memset(e, 0, sizeof *e);
	e->plan.nc = nc;
	e->mix.on = true;
	e->mix.stretch = stretch;
	e->mix.back = nc;
	pthread_mutex_init(&e->mix.lock, NULL);
}

static void test_take_order(void **state)
{
	(void)state;
	struct fsti_engine e;
	fake_mix(&e, 10, 3);
	size_t lo = 99, hi = 99;
	/* the front, one chunk at a time */
	assert_int_equal(fsti_mix_take(&e, true, &lo, &hi), 0);
	assert_int_equal(fsti_mix_take(&e, true, &lo, &hi), 1);
	assert_int_equal(lo, 99); /* front chunks have no stretch */
	/* the back: the stretch [7, 10), in order */
	assert_int_equal(fsti_mix_take(&e, false, &lo, &hi), 7);
	assert_int_equal(lo, 7);
	assert_int_equal(hi, 10);
	assert_int_equal(fsti_mix_take(&e, false, &lo, &hi), 8);
	assert_int_equal(fsti_mix_take(&e, true, &lo, &hi), 2);
	assert_int_equal(fsti_mix_take(&e, false, &lo, &hi), 9);
	/* the next stretch, [4, 7) */
	assert_int_equal(fsti_mix_take(&e, false, &lo, &hi), 4);
	assert_int_equal(lo, 4);
	assert_int_equal(hi, 7);
	/* the front meets it: chunk 3 is the last of the front */
	assert_int_equal(fsti_mix_take(&e, true, &lo, &hi), 3);
	/* an O_DIRECT reader with no front left helps finish the stretch */
	assert_int_equal(fsti_mix_take(&e, true, &lo, &hi), 5);
	assert_int_equal(lo, 4);
	assert_int_equal(hi, 7);
	assert_int_equal(fsti_mix_take(&e, false, &lo, &hi), 6);
	/* nothing left either way */
	assert_int_equal(fsti_mix_take(&e, false, &lo, &hi), 10);
	assert_int_equal(fsti_mix_take(&e, true, &lo, &hi), 10);
	/* a short last stretch: only what lies between the front and the back */
	fake_mix(&e, 5, 4);
	assert_int_equal(fsti_mix_take(&e, true, &lo, &hi), 0);
	assert_int_equal(fsti_mix_take(&e, true, &lo, &hi), 1);
	assert_int_equal(fsti_mix_take(&e, false, &lo, &hi), 2);
	assert_int_equal(lo, 2);
	assert_int_equal(hi, 5);
	pthread_mutex_destroy(&e.mix.lock);
}

struct taker {
	struct fsti_engine *e;
	bool direct;
	atomic_uint *seen; /* per chunk, how often it was taken */
};

static void *take_all(void *arg)
{
	struct taker *t = arg;
	size_t lo, hi, i, last = SIZE_MAX, last_hi = 0;
	while ((i = fsti_mix_take(t->e, t->direct, &lo, &hi)) < t->e->plan.nc) {
		atomic_fetch_add(&t->seen[i], 1);
		/* page-cache chunks come in order within their stretch */
		if (!t->direct && last != SIZE_MAX && hi == last_hi && i <= last)
			return "out of order";
		if (!t->direct)
			last = i, last_hi = hi;
	}
	return NULL;
}

static void test_take_exactly_once(void **state)
{
	(void)state;
	enum { NC = 20011, THREADS = 8 };
	static atomic_uint seen[NC];
	for (size_t stretch = 1; stretch <= 4096; stretch *= 8) {
		for (size_t i = 0; i < NC; i++)
			atomic_store(&seen[i], 0);
		struct fsti_engine e;
		fake_mix(&e, NC, stretch);
		pthread_t th[THREADS];
		struct taker t[THREADS];
		for (int k = 0; k < THREADS; k++) {
			t[k] = (struct taker){&e, k % 2 == 0, seen};
			assert_int_equal(pthread_create(&th[k], NULL, take_all, &t[k]), 0);
		}
		for (int k = 0; k < THREADS; k++) {
			void *why;
			pthread_join(th[k], &why);
			if (why)
				fail_msg("stretch %zu: %s", stretch, (const char *)why);
		}
		for (size_t i = 0; i < NC; i++)
			if (atomic_load(&seen[i]) != 1)
				fail_msg("stretch %zu: chunk %zu taken %u times", stretch, i,
					 atomic_load(&seen[i]));
		pthread_mutex_destroy(&e.mix.lock);
	}
}

/* A cold load onto cuda:0 with io=auto and FST_COLD_MIX=env. */
static int cold_load(const char *env, unsigned threads, bool stream, fst_buffer **out,
		     fst_error *err)
{
	if (env)
		setenv("FST_COLD_MIX", env, 1);
	else
		unsetenv("FST_COLD_MIX");
	fst_load_opts o;
	ch_opts(&o, "cuda:0", FST_IO_AUTO, threads, 1 * MiB);
	o.chunk_bytes = CHUNK;
	lh_evict(c.ck);
	return ch_load_whole_or_streamed(&c, &o, stream, out, err);
}

static void test_mix_gives_the_files_bytes(void **state)
{
	(void)state;
	if (!can_evict || !ch_uring_ok)
		skip();
	static const char *const envs[] = {"on", "1"};
	static const unsigned threads[] = {2, 3, 8};
	for (size_t k = 0; k < 2; k++)
		for (size_t t = 0; t < 3; t++)
			for (int stream = 0; stream < 2; stream++) {
				fst_buffer *buf;
				fst_error err;
				if (cold_load(envs[k], threads[t], stream, &buf, &err))
					fail_msg("%s, %u threads%s: %s", envs[k], threads[t],
						 stream ? ", streamed" : "", err.message);
				const char *d = fst_buffer_describe(buf);
				unsigned want = k == 0 ? threads[t] / 2 : 1, direct, cached;
				char says[96];
				snprintf(says, sizeof says, "both at once: %u thread%s read the front "
					 "with O_DIRECT", want, want == 1 ? "" : "s");
				const char *note = strstr(d, "cold mix: ");
				if (!strstr(d, "pread or uring (O_DIRECT)") || !strstr(d, says) || !note ||
				    sscanf(strstr(note, "O_DIRECT read ") + 14, "%u%%", &direct) != 1 ||
				    sscanf(strstr(note, "page cache ") + 11, "%u%%", &cached) != 1 ||
				    direct + cached < 99 || direct + cached > 101)
					fail_msg("%s, %u threads: \"%s\"", envs[k], threads[t], d);
				fst_buffer_release(buf);
				ch_assert_clean(envs[k], c.host_base);
			}
}

static void assert_no_mix(const char *env, const fst_load_opts *o, bool evict, const char *ctx)
{
	if (env)
		setenv("FST_COLD_MIX", env, 1);
	else
		unsetenv("FST_COLD_MIX");
	if (evict)
		lh_evict(c.ck);
	fst_buffer *buf;
	fst_error err;
	if (fst_load(c.ck, o, &buf, &err))
		fail_msg("%s: %s", ctx, err.message);
	if (strstr(fst_buffer_describe(buf), "cold mix") ||
	    strstr(fst_buffer_describe(buf), "both at once"))
		fail_msg("%s: \"%s\"", ctx, fst_buffer_describe(buf));
	ch_assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
}

static void test_no_mix_where_it_does_not_apply(void **state)
{
	(void)state;
	if (!can_evict || !ch_uring_ok)
		skip();
	fst_load_opts o;
	ch_opts(&o, "cuda:0", FST_IO_AUTO, 4, 1 * MiB);
	o.chunk_bytes = CHUNK;
	assert_no_mix("off", &o, true, "FST_COLD_MIX=off");
	assert_no_mix(NULL, &o, true, "FST_COLD_MIX unset (off by default)");
	fst_load_opts one = o;
	one.threads = 1;
	assert_no_mix("on", &one, true, "one thread");
	fst_load_opts p = o;
	p.io = FST_IO_PREAD;
	assert_no_mix("on", &p, true, "io=pread");
	p.io = FST_IO_URING;
	assert_no_mix("on", &p, true, "io=uring");
	fst_load_opts s = o;
	s.stream_bytes = 4 * CHUNK;
	assert_no_mix("on", &s, true, "streams");
	fst_load_opts h = o;
	h.device = "cpu"; /* straight into host memory: no staging to mix with */
	lh_evict(c.ck);
	fst_buffer *buf;
	fst_error err;
	if (fst_load(c.ck, &h, &buf, &err))
		fail_msg("cpu: %s", err.message);
	assert_null(strstr(fst_buffer_describe(buf), "cold mix"));
	fst_buffer_release(buf);
	/* the probe asked for too: the probe runs, not the mix */
	setenv("FST_COLD_PROBE", "65536", 1);
	setenv("FST_COLD_MIX", "on", 1);
	lh_evict(c.ck);
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("probe and mix: %s", err.message);
	const char *d = fst_buffer_describe(buf);
	if (!strstr(d, "cold probe") || strstr(d, "cold mix"))
		fail_msg("probe and mix: \"%s\"", d);
	ch_assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
	unsetenv("FST_COLD_PROBE");
	/* the files in the page cache */
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), 0);
	fst_buffer_release(buf);
	assert_no_mix("on", &o, false, "cached files");
	ch_assert_clean("no mix", c.host_base);
}

static void test_bad_env_is_a_usage_error(void **state)
{
	(void)state;
	static const char *const bad[] = {"yes", "0", "-2", "3x", "+1", "5000"};
	ch_cold_bad_env(&c, "FST_COLD_MIX", bad, sizeof bad / sizeof bad[0]);
}

static void test_failures_either_way_are_clean(void **state)
{
	(void)state;
	if (!can_evict || !ch_uring_ok)
		skip();
	static const char *const sites[] = {
		"uring_complete", /* an O_DIRECT read */
		"uring_submit",   /* a ring's set-up or a submission */
		"read",           /* a read through the page cache */
	};
	for (size_t k = 0; k < 3; k++)
		ch_cold_fault_loop(&c, "FST_COLD_MIX", "on", CHUNK, sites[k], FST_EIO,
				   "both at once");
}

static void test_free_at_once(void **state)
{
	(void)state;
	if (!can_evict || !ch_uring_ok)
		skip();
	static const unsigned threads[] = {2, 4, 8, 16};
	ch_cold_freed_at_once(&c, "FST_COLD_MIX", "on", CHUNK, threads, 4);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_take_order),
		cmocka_unit_test(test_take_exactly_once),
		cmocka_unit_test_setup(test_mix_gives_the_files_bytes, ch_reset),
		cmocka_unit_test_setup(test_no_mix_where_it_does_not_apply, ch_reset),
		cmocka_unit_test_setup(test_bad_env_is_a_usage_error, ch_reset),
		cmocka_unit_test_setup(test_failures_either_way_are_clean, ch_reset),
		cmocka_unit_test_setup(test_free_at_once, ch_reset),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
