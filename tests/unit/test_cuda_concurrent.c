/* Description: several loads onto the CUDA target at once (libcuda double):
 * two loaders on one thread, to cuda:0 and cuda:1 with pread and io_uring,
 * their tensors taken in turn; and two threads loading at the same time, to
 * one device and to two. Every byte right, nothing left live. */
#include "cuda_helpers.h"

#include <pthread.h>

/* Two loaders at once on one thread, their tensors taken in turn. */
static void test_two_loaders_interleaved(void **state)
{
	(void)state;
	ch_set_delay("50");
	ch_ckpt a, b;
	ch_write_random("two_a", 51, &ch_big_gen, &a);
	ch_write_random("two_b", 52, &ch_small_gen, &b);
	ch_open(&a, a.dir);
	ch_open(&b, b.dir);
	long base = fsti_live_allocations();
	fst_load_opts oa, ob;
	ch_opts(&oa, "cuda:0", FST_IO_PREAD, 2, 1 * MiB);
	ch_opts(&ob, "cuda:1", ch_uring_ok ? FST_IO_URING : FST_IO_PREAD, 3, 2 * MiB);
	fst_loader *la, *lb;
	fst_error err;
	if (fst_load_start(a.ck, &oa, &la, &err) || fst_load_start(b.ck, &ob, &lb, &err))
		fail_msg("%s", err.message);
	assert_int_equal(ch_live_device() - ch_device_base, 2);
	int ra = 1, rb = 1;
	size_t na = 0, nb = 0;
	while (ra == 1 || rb == 1) {
		fst_tensor_view v;
		if (ra == 1 && (ra = fst_loader_next(la, &v, &err)) == 1) {
			ch_assert_view(&a, &v, 0);
			fst_view_release(&v);
			na++;
		}
		if (rb == 1 && (rb = fst_loader_next(lb, &v, &err)) == 1) {
			ch_assert_view(&b, &v, 1);
			fst_view_release(&v);
			nb++;
		}
	}
	assert_int_equal(ra, 0);
	assert_int_equal(rb, 0);
	assert_int_equal(na, fst_checkpoint_tensor_count(a.ck));
	assert_int_equal(nb, fst_checkpoint_tensor_count(b.ck));
	fst_buffer *ba, *bb;
	assert_int_equal(fst_loader_finish(lb, &bb, &err), 0);
	assert_int_equal(fst_loader_finish(la, &ba, &err), 0);
	ch_assert_buffer(&a, ba, 0);
	ch_assert_buffer(&b, bb, 1);
	fst_buffer_release(ba);
	fst_buffer_release(bb);
	ch_assert_clean("after two loaders", base);
	ch_close(&b);
	ch_close(&a);
}

struct job {
	const ch_ckpt *c;
	int device, io;
	unsigned threads, rounds;
	int rc;
	char why[512];
};

static void *load_job(void *arg)
{
	struct job *j = arg;
	for (unsigned r = 0; r < j->rounds && !j->rc; r++) {
		fst_load_opts o;
		ch_opts(&o, j->device ? "cuda:1" : "cuda:0", j->io, j->threads, (1 + r) * MiB);
		fst_buffer *buf = NULL;
		fst_error err;
		if ((j->rc = fst_load(j->c->ck, &o, &buf, &err))) {
			snprintf(j->why, sizeof j->why, "load: %.480s", err.message);
			break;
		}
		j->rc = ch_buffer_check(j->c, buf, j->device, j->why, sizeof j->why);
		fst_buffer_release(buf);
	}
	return NULL;
}

/* Two threads loading at the same time, to one device and to two. */
static void test_two_threads(void **state)
{
	(void)state;
	ch_set_delay("30");
	ch_ckpt a, b;
	ch_write_random("thr_a", 61, &ch_big_gen, &a);
	ch_write_random("thr_b", 62, &ch_big_gen, &b);
	ch_open(&a, a.dir);
	ch_open(&b, b.dir);
	long base = fsti_live_allocations();
	for (int same = 0; same < 2; same++) {
		struct job ja = {&a, 0, FST_IO_PREAD, 3, 3, 0, ""};
		struct job jb = {&b, same ? 0 : 1, ch_uring_ok ? FST_IO_URING : FST_IO_PREAD, 2, 3, 0,
				 ""};
		pthread_t ta, tb;
		assert_int_equal(pthread_create(&ta, NULL, load_job, &ja), 0);
		assert_int_equal(pthread_create(&tb, NULL, load_job, &jb), 0);
		pthread_join(ta, NULL);
		pthread_join(tb, NULL);
		if (ja.rc)
			fail_msg("thread a: %s", ja.why);
		if (jb.rc)
			fail_msg("thread b: %s", jb.why);
		ch_assert_clean("after two threads", base);
	}
	ch_close(&b);
	ch_close(&a);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_two_loaders_interleaved, ch_reset),
		cmocka_unit_test_setup(test_two_threads, ch_reset),
	};
	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
}
