/* Description: the progress callback, with every io method: done never goes
 * back, total is the checkpoint's bytes, the last call reports the end, calls
 * come at most every 100 ms (and once at the end), and a load that selects
 * nothing still reports its end once. */
#include "format.h"
#include "load_helpers.h"

struct progress_log {
	uint64_t done[100000], total[100000];
	size_t n;
	bool non_monotonic;
};

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct progress_log *l = ctx;
	if (l->n && done < l->done[l->n - 1])
		l->non_monotonic = true;
	if (l->n < sizeof l->done / sizeof l->done[0]) {
		l->done[l->n] = done;
		l->total[l->n] = total;
		l->n++;
	}
}

static void test_progress(void **state)
{
	(void)state;
	fst_checkpoint *ck = lh_open(lh_big_path());
	uint64_t total = fst_checkpoint_total_bytes(ck);
	struct progress_log *l = calloc(1, sizeof *l);
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	for (int k = 0; k < 4; k++) {
		if (lh_io_skipped(ios[k]))
			continue;

		memset(l, 0, sizeof *l);
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = ios[k];
		o.threads = 2;
		o.chunk_bytes = 4096;
		o.progress = on_progress;
		o.progress_ctx = l;
		fst_buffer *buf;
		fst_error err;
		double t0 = test_now_s();
		if (fst_load(ck, &o, &buf, &err))
			fail_msg("%s: %s", lh_io_name(o.io), err.message);
		double dt = test_now_s() - t0;
		assert_true(l->n >= 1);
		assert_false(l->non_monotonic);
		for (size_t i = 0; i < l->n; i++) {
			assert_int_equal(l->total[i], total);
			assert_true(l->done[i] <= total);
		}
		assert_int_equal(l->done[l->n - 1], total);
		/* "at most every 100 ms and once at the end". src/engine.c
		 * (wait_workers) calls progress at every wake-up of its condition
		 * variable, which every completed tensor broadcasts. */
		if ((double)l->n > dt / 0.1 + 2) {
			char detail[200];
			snprintf(detail, sizeof detail,
				 "io=%s: %zu progress calls in %.3f s: more than one per 100 ms",
				 lh_io_name(o.io), l->n, dt);
			lh_known_bug("engine.c wait_workers progress rate", detail);
		}
		fst_buffer_release(buf);
	}
	/* an empty load still reports its end */
	memset(l, 0, sizeof *l);
	lh_filter none = {0, 0, 0};
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.filter = lh_filter_fn;
	o.filter_ctx = &none;
	o.progress = on_progress;
	o.progress_ctx = l;
	fst_buffer *buf;
	assert_int_equal(fst_load(ck, &o, &buf, NULL), 0);
	assert_int_equal(l->n, 1);
	assert_int_equal(l->done[0], 0);
	assert_int_equal(l->total[0], 0);
	fst_buffer_release(buf);
	free(l);
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_progress),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
