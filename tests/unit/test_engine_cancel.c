/* Description: stopping a load early. fst_loader_cancel mid-load, with every
 * io method (twice is fine; next and finish report FST_ECANCELED; a view
 * handed out before keeps its bytes), from another thread while this one
 * waits in next or finish (a cancel always wins, even after the last byte),
 * after next has handed out every tensor (deterministically), and
 * fst_loader_free without finish after 0 to 20 tensors (a view taken
 * before still works). Nothing is left allocated or open after any of them. */
#include "format.h"
#include "load_helpers.h"

#include <pthread.h>

static void test_cancel_mid_load(void **state)
{
	(void)state;
	fst_checkpoint *ck = lh_open(lh_big_path());
	lh_files fs;
	lh_files_read(ck, &fs);
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	for (int k = 0; k < 4; k++) {
		if (lh_io_skipped(ios[k]))
			continue;
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = ios[k];
		o.threads = 1;
		o.chunk_bytes = 4096;
		fst_loader *ld;
		fst_error err;
		assert_int_equal(fst_load_start(ck, &o, &ld, &err), 0);
		fst_tensor_view v;
		assert_int_equal(fst_loader_next(ld, &v, &err), 1);
		lh_check_view(ck, &fs, v.index, &v, 256, o.io == FST_IO_MMAP, lh_io_name(o.io));
		fst_loader_cancel(ld);
		fst_loader_cancel(ld); /* twice is fine */
		fst_tensor_view v2;
		assert_int_equal(fst_loader_next(ld, &v2, &err), FST_ECANCELED);
		assert_int_equal(err.code, FST_ECANCELED);
		assert_has(err.message, "cancel");
		fst_buffer *buf = (fst_buffer *)&v2; /* must be overwritten */
		assert_int_equal(fst_loader_finish(ld, &buf, &err), FST_ECANCELED);
		assert_null(buf);
		assert_int_equal(err.code, FST_ECANCELED);
		assert_has(err.message, "cancel");
		/* the view handed out before the cancel still holds its bytes */
		lh_check_view(ck, &fs, v.index, &v, 256, o.io == FST_IO_MMAP, lh_io_name(o.io));
		fst_view_release(&v);
		assert_int_equal(fsti_live_allocations(), allocs);
		assert_int_equal(lh_count_fds(), fds);
	}
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

struct canceller {
	fst_loader *ld;
	unsigned delay_us;
};

static void *cancel_later(void *arg)
{
	struct canceller *c = arg;
	usleep(c->delay_us);
	fst_loader_cancel(c->ld);
	return NULL;
}

/* Cancel from another thread while this one waits in next or finish. */
static void test_cancel_from_another_thread(void **state)
{
	(void)state;
	fst_checkpoint *ck = lh_open(lh_big_path());
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	for (int round = 0; round < 12; round++) {
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = round % 2 && !lh_io_skipped(FST_IO_URING) ? FST_IO_URING : FST_IO_PREAD;
		o.threads = 1 + (unsigned)(round % 3);
		o.chunk_bytes = 4096;
		fst_loader *ld;
		assert_int_equal(fst_load_start(ck, &o, &ld, NULL), 0);
		struct canceller c = {ld, (unsigned)(round * 300)};
		pthread_t th;
		assert_int_equal(pthread_create(&th, NULL, cancel_later, &c), 0);
		int rc;
		size_t handed = 0;
		fst_tensor_view v;
		fst_error err;
		if (round % 4 < 2) {
			while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
				fst_view_release(&v);
				handed++;
			}
			/* cancelled before the end, or every tensor came first */
			assert_true(rc == FST_ECANCELED || (rc == 0 && handed == 96));
		}
		pthread_join(th, NULL);
		fst_buffer *buf;
		/* a cancel always wins, even one after the last byte */
		assert_int_equal(fst_loader_finish(ld, &buf, &err), FST_ECANCELED);
		assert_null(buf);
		assert_int_equal(fsti_live_allocations(), allocs);
		assert_int_equal(lh_count_fds(), fds);
	}
	fst_checkpoint_close(ck);
}

/* The deterministic end of the race above: every tensor handed out (next
 * said 0), the workers done, and then a cancel: finish still reports it and
 * hands out nothing; views taken before keep their bytes. */
static void test_cancel_after_the_last_tensor(void **state)
{
	(void)state;
	fst_checkpoint *ck = lh_open(lh_big_path());
	lh_files fs;
	lh_files_read(ck, &fs);
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = FST_IO_PREAD;
	o.threads = 2;
	fst_loader *ld;
	fst_error err;
	assert_int_equal(fst_load_start(ck, &o, &ld, &err), 0);
	fst_tensor_view last = {0}, v;
	size_t handed = 0;
	int rc;
	while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
		fst_view_release(&last);
		last = v;
		handed++;
	}
	assert_int_equal(rc, 0);
	assert_int_equal(handed, fst_checkpoint_tensor_count(ck));
	uint64_t done, total;
	fst_loader_progress(ld, &done, &total);
	assert_int_equal(done, total);
	fst_loader_cancel(ld);
	assert_int_equal(fst_loader_next(ld, &v, &err), FST_ECANCELED);
	fst_buffer *buf = (fst_buffer *)&v; /* must be overwritten */
	assert_int_equal(fst_loader_finish(ld, &buf, &err), FST_ECANCELED);
	assert_null(buf);
	assert_has(err.message, "cancel");
	lh_check_view(ck, &fs, last.index, &last, 256, false, "pread");
	fst_view_release(&last);
	assert_int_equal(fsti_live_allocations(), allocs);
	assert_int_equal(lh_count_fds(), fds);
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

static void test_free_without_finish(void **state)
{
	(void)state;
	fst_checkpoint *ck = lh_open(lh_big_path());
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	for (int k = 0; k < 4; k++)
		for (int nexts = 0; nexts < 3; nexts++) {
			if (lh_io_skipped(ios[k]))
				continue;

			fst_load_opts o;
			fst_load_opts_init(&o);
			o.io = ios[k];
			o.threads = 3;
			o.chunk_bytes = 8192;
			fst_loader *ld;
			assert_int_equal(fst_load_start(ck, &o, &ld, NULL), 0);
			fst_tensor_view v = {0};
			for (int i = 0; i < nexts * 10; i++) {
				assert_int_equal(fst_loader_next(ld, &v, NULL), 1);
				if (i + 1 < nexts * 10)
					fst_view_release(&v);
			}
			fst_loader_free(ld);
			/* a view taken before the free still works */
			if (v.buffer) {
				volatile const unsigned char *p = v.data;
				unsigned sum = 0;
				for (uint64_t i = 0; i < v.nbytes; i++)
					sum += p[i];
				(void)sum;
				fst_view_release(&v);
			}
			assert_int_equal(fsti_live_allocations(), allocs);
			assert_int_equal(lh_count_fds(), fds);
		}
	fst_loader_free(NULL);
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cancel_mid_load),
		cmocka_unit_test(test_cancel_from_another_thread),
		cmocka_unit_test(test_cancel_after_the_last_tensor),
		cmocka_unit_test(test_free_without_finish),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
