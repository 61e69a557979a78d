/* Description: the progress callback, with every io method: done never goes
 * back, total is the checkpoint's bytes, the last call reports the end, calls
 * come at most every 100 ms (and once at the end), and a load that selects
 * nothing still reports its end once. fst_loader_next reports too while it
 * waits for a tensor (from its own thread), and a cancel from there ends
 * the wait with FST_ECANCELED. */
#include "format.h"
#include "load_helpers.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

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

/* ---- progress from fst_loader_next's wait */

struct next_wait {
	fst_loader *ld;
	pthread_t waiter;
	atomic_int from_waiter, elsewhere;
	bool cancel;
	atomic_bool slept;
};

/* The first bytes to land take 350 ms: the first next() waits that long. */
static int slow_first(void *ctx, size_t tensor, uint64_t offset, const void *bytes, uint64_t len)
{
	(void)tensor, (void)offset, (void)bytes, (void)len;
	struct next_wait *w = ctx;
	if (!atomic_exchange(&w->slept, true))
		nanosleep(&(struct timespec){0, 350 * 1000000}, NULL);
	return 0;
}

static void next_progress(void *ctx, uint64_t done, uint64_t total)
{
	(void)done, (void)total;
	struct next_wait *w = ctx;
	if (pthread_equal(pthread_self(), w->waiter))
		atomic_fetch_add(&w->from_waiter, 1);
	else
		atomic_fetch_add(&w->elsewhere, 1);
	if (w->cancel)
		fst_loader_cancel(w->ld);
}

static void test_progress_while_next_waits(void **state)
{
	(void)state;
	fst_checkpoint *ck = lh_open(lh_big_path());
	for (int cancel = 0; cancel < 2; cancel++) {
		struct next_wait w = {.waiter = pthread_self(), .cancel = cancel};
		atomic_init(&w.from_waiter, 0);
		atomic_init(&w.elsewhere, 0);
		atomic_init(&w.slept, false);
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = FST_IO_PREAD;
		o.threads = 1;
		o.on_landed = slow_first;
		o.on_landed_ctx = &w;
		o.progress = next_progress;
		o.progress_ctx = &w;
		fst_error err;
		assert_int_equal(fst_load_start(ck, &o, &w.ld, &err), 0);
		fst_tensor_view v;
		int rc = fst_loader_next(w.ld, &v, &err);
		int calls = atomic_load(&w.from_waiter);
		if (cancel) {
			/* stopped from the first report, 100 ms into the wait */
			assert_int_equal(rc, FST_ECANCELED);
			assert_int_equal(calls, 1);
		} else {
			assert_int_equal(rc, 1);
			fst_view_release(&v);
			/* 350 ms of waiting: reports at 100, 200 and 300 ms */
			if (calls < 1 || calls > 4)
				fail_msg("%d progress calls from next()'s 350 ms wait", calls);
			fst_loader_cancel(w.ld);
		}
		assert_int_equal(atomic_load(&w.elsewhere), 0);
		fst_buffer *buf = NULL;
		assert_int_equal(fst_loader_finish(w.ld, &buf, &err), FST_ECANCELED);
		assert_null(buf);
	}
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_progress),
		cmocka_unit_test(test_progress_while_next_waits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
