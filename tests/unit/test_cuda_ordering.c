/* Description: the order of copies against the libcuda double, whose
 * destinations hold poison (0xDB) until their queued copies run, late. The
 * double's poisoning itself: a read made before a copy is waited for sees
 * poison, and the right bytes once the stream is synchronized (without this
 * the other test would prove nothing). Streaming readiness: onto cuda:0 and
 * cuda:1, with pread and io_uring, 1 and 4 threads and 1 and 4 MiB of
 * staging, each tensor handed out is already complete on the device (no
 * poison when copied back at once), exactly once, and progress ends at the
 * checkpoint's bytes. */
#include "cuda_helpers.h"

/* The double's poisoning itself: a read made before the copy is waited for
 * sees poison, and the right bytes once the stream is synchronized. Without
 * this, the streaming test below would prove nothing. */
static void test_double_catches_early_read(void **state)
{
	(void)state;
	int (*cuInit)(unsigned) = NULL;
	int (*cuDevicePrimaryCtxRetain)(void **, int) = NULL;
	int (*cuCtxSetCurrent)(void *) = NULL;
	int (*cuMemAlloc)(dptr *, size_t) = NULL;
	int (*cuMemFree)(dptr) = NULL;
	int (*cuStreamCreate)(void **, unsigned) = NULL;
	int (*cuStreamDestroy)(void *) = NULL;
	int (*cuStreamSynchronize)(void *) = NULL;
	int (*cuMemcpyHtoDAsync)(dptr, const void *, size_t, void *) = NULL;
	int (*cuMemcpyDtoH)(void *, dptr, size_t) = NULL;
	*(void **)&cuInit = ch_sym("cuInit");
	*(void **)&cuDevicePrimaryCtxRetain = ch_sym("cuDevicePrimaryCtxRetain");
	*(void **)&cuCtxSetCurrent = ch_sym("cuCtxSetCurrent");
	*(void **)&cuMemAlloc = ch_sym("cuMemAlloc_v2");
	*(void **)&cuMemFree = ch_sym("cuMemFree_v2");
	*(void **)&cuStreamCreate = ch_sym("cuStreamCreate");
	*(void **)&cuStreamDestroy = ch_sym("cuStreamDestroy_v2");
	*(void **)&cuStreamSynchronize = ch_sym("cuStreamSynchronize");
	*(void **)&cuMemcpyHtoDAsync = ch_sym("cuMemcpyHtoDAsync_v2");
	*(void **)&cuMemcpyDtoH = ch_sym("cuMemcpyDtoH_v2");

	ch_set_delay("20000"); /* up to 20 ms per queued operation */
	void *ctx = NULL, *stream = NULL;
	assert_int_equal(cuInit(0), 0);
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
	assert_int_equal(cuCtxSetCurrent(ctx), 0);
	enum { N = 4, LEN = 4096 };
	dptr dev = 0;
	assert_int_equal(cuMemAlloc(&dev, N * LEN), 0);
	assert_int_equal(ch_live_device() - ch_device_base, 1);
	assert_int_equal(cuStreamCreate(&stream, 1), 0);
	unsigned char *src = malloc(N * LEN), *back = malloc(LEN);
	for (size_t i = 0; i < N * LEN; i++)
		src[i] = (unsigned char)(i % 251 == POISON ? 7 : i % 251); /* never poison */
	/* Several copies: the last completes after all their delays. */
	for (int k = 0; k < N; k++)
		assert_int_equal(cuMemcpyHtoDAsync(dev + (dptr)k * LEN, src + k * LEN, LEN, stream),
				 0);
	assert_int_equal(cuMemcpyDtoH(back, dev + (N - 1) * LEN, LEN), 0);
	size_t poisoned = 0;
	for (size_t i = 0; i < LEN; i++)
		poisoned += back[i] == POISON && src[(N - 1) * LEN + i] != POISON;
	if (!poisoned)
		fail_msg("a read before the copy completed saw no poison");
	assert_int_equal(cuStreamSynchronize(stream), 0);
	unsigned char *all = malloc(N * LEN);
	assert_int_equal(cuMemcpyDtoH(all, dev, N * LEN), 0);
	assert_memory_equal(all, src, N * LEN);
	/* a range outside every allocation is refused, not written */
	assert_int_not_equal(cuMemcpyHtoDAsync(dev + N * LEN - 8, src, 16, stream), 0);
	assert_int_equal(cuStreamDestroy(stream), 0);
	assert_int_equal(cuMemFree(dev), 0);
	assert_int_equal(ch_live_device() - ch_device_base, 0);
	free(src);
	free(back);
	free(all);
	ch_set_delay("50");
}

/* Streaming: each tensor is complete on the device when it is handed out.
 * The double poisons destinations until their copies run, late, so a
 * tensor reported before its copies completed would show 0xDB. */
static void test_streaming_readiness(void **state)
{
	(void)state;
	ch_set_delay("300");
	ch_ckpt c;
	ch_write_random("stream", 23, &ch_big_gen, &c);
	ch_open(&c, c.dir);
	size_t nt = fst_checkpoint_tensor_count(c.ck);
	unsigned char *seen = calloc(nt, 1);
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING};
	static const unsigned threads[] = {1, 4};
	static const uint64_t staging[] = {1 * MiB, 4 * MiB};
	for (int dev = 0; dev < 2; dev++)
		for (int k = 0; k < 2; k++)
			for (int t = 0; t < 2; t++)
				for (int s = 0; s < 2; s++) {
					if (ios[k] == FST_IO_URING && !ch_uring_ok)
						continue;
					fst_load_opts o;
					ch_opts(&o, dev ? "cuda:1" : "cuda:0", ios[k], threads[t],
						staging[s]);
					fst_loader *ld = NULL;
					fst_error err;
					if (fst_load_start(c.ck, &o, &ld, &err))
						fail_msg("start: %s", err.message);
					memset(seen, 0, nt);
					size_t n = 0;
					fst_tensor_view v;
					int rc;
					while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
						/* copy back at once: no waiting of our own */
						ch_assert_view(&c, &v, dev);
						assert_true(v.index < nt);
						assert_int_equal(seen[v.index], 0);
						seen[v.index] = 1;
						n++;
						fst_view_release(&v);
					}
					if (rc)
						fail_msg("next: %s", err.message);
					assert_int_equal(n, nt);
					uint64_t done, total;
					fst_loader_progress(ld, &done, &total);
					assert_int_equal(total, fst_checkpoint_total_bytes(c.ck));
					assert_int_equal(done, total);
					fst_buffer *buf = NULL;
					if (fst_loader_finish(ld, &buf, &err))
						fail_msg("finish: %s", err.message);
					ch_assert_buffer(&c, buf, dev);
					fst_buffer_release(buf);
					ch_assert_clean("after streaming", c.host_base);
				}
	free(seen);
	ch_close(&c);
	ch_set_delay("50");
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_double_catches_early_read, ch_reset),
		cmocka_unit_test_setup(test_streaming_readiness, ch_reset),
	};
	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
}
