/* Description: streams (stream_bytes): each reader thread reads a stretch
 * of the plan in order, then the next; a thread with no fresh stretch joins
 * the one with the most left. Every combination of reader (pread straight
 * into host memory, uring through landing slots), thread count and stretch
 * (one chunk, a few, more than the whole checkpoint, off) gives the files'
 * bytes, whole and streamed, and says "streams of" exactly when they are on;
 * a cold load with streams still reads ahead; a failing allocation of the
 * stretches' counters fails the load with FST_ENOMEM and leaves nothing. */
#include "format.h"
#include "load_helpers.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

double fsti_cached_fraction(const fst_checkpoint *ck);

static lh_ckpt lc;
static fst_checkpoint *ck;

static int setup(void **state)
{
	(void)state;
	lh_shape sh = lh_default_shape();
	lh_write_random("streams", lh_base_seed() + 5, &sh, &lc);
	ck = lh_open(lc.path);
	return lh_uring_probe() < 0;
}

static int teardown(void **state)
{
	(void)state;
	fst_checkpoint_close(ck);
	lh_rmdir(lc.dir);
	return 0;
}

static void load_and_check(const fst_load_opts *o, bool streams, const char *ctx)
{
	lh_files fs;
	lh_files_read(ck, &fs);
	fst_buffer *buf;
	fst_error err;
	if (fst_load(ck, o, &buf, &err))
		fail_msg("%s: %s", ctx, err.message);
	const char *d = fst_buffer_describe(buf);
	if (streams != (strstr(d, "streams of") != NULL))
		fail_msg("%s: \"%s\" %s streams", ctx, d, streams ? "does not say" : "says");
	lh_check_buffer(ck, &fs, buf, o, NULL, ctx);
	fst_buffer_release(buf);
	buf = lh_load_streaming(ck, &fs, o, NULL, ctx);
	fst_buffer_release(buf);
	lh_files_free(&fs);
}

static void test_streams_give_the_files_bytes(void **state)
{
	(void)state;
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING};
	static const unsigned threads[] = {1, 3, 7};
	const uint64_t chunk = 16 << 10;
	const uint64_t stretches[] = {1, chunk, 3 * chunk + 5, 1ull << 40, FST_STREAM_OFF, 0};
	for (size_t i = 0; i < sizeof ios / sizeof ios[0]; i++) {
		if (lh_io_skipped(ios[i]))
			continue;
		for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++)
			for (size_t s = 0; s < sizeof stretches / sizeof stretches[0]; s++) {
				fst_load_opts o;
				fst_load_opts_init(&o);
				o.io = ios[i];
				o.threads = threads[t];
				o.chunk_bytes = chunk;
				o.stream_bytes = stretches[s];
				char ctx[120];
				snprintf(ctx, sizeof ctx, "io=%s threads=%u stream_bytes=%llu",
					 lh_io_name(o.io), o.threads,
					 (unsigned long long)o.stream_bytes);
				load_and_check(&o, stretches[s] && stretches[s] != FST_STREAM_OFF,
					       ctx);
			}
	}
}

/* io=pread, 3 threads, 16 KiB chunks, stretches of `chunks` chunks. */
static fst_load_opts pread_streams(uint64_t chunks)
{
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = FST_IO_PREAD;
	o.threads = 3;
	o.chunk_bytes = 16 << 10;
	o.stream_bytes = chunks * o.chunk_bytes;
	return o;
}

static void test_cold_streams_read_ahead(void **state)
{
	(void)state;
	if (fsti_cached_fraction(ck) < 0)
		skip(); /* residency cannot be told here: no readahead decision */
	fst_load_opts o = pread_streams(4);
	lh_files fs;
	lh_files_read(ck, &fs);
	lh_evict(ck);
	fst_error err;
	assert_int_equal(fst_fault_set("prefetch:1+", &err), 0); /* counts, refuses */
	fst_buffer *buf;
	int rc = fst_load(ck, &o, &buf, &err);
	long asked = fst_fault_last(NULL, 0);
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
	if (rc)
		fail_msg("cold load with streams: %s", err.message);
	const char *d = fst_buffer_describe(buf);
	if (!strstr(d, "streams of 64 KiB") || !strstr(d, "readahead"))
		fail_msg("cold load with streams: \"%s\"", d);
	if (asked < 1)
		fail_msg("cold load with streams asked for no readahead");
	lh_check_buffer(ck, &fs, buf, &o, NULL, "cold, streams");
	fst_buffer_release(buf);
	lh_files_free(&fs);
}

static void test_streams_out_of_memory(void **state)
{
	(void)state;
	fst_load_opts o = pread_streams(2);
	lh_files fs;
	lh_files_read(ck, &fs);
	/* fail allocation N = 1, 2, ... until the load succeeds: every
	 * failure is FST_ENOMEM with no buffer, the success the files' bytes */
	for (int n = 1;; n++) {
		char spec[32];
		snprintf(spec, sizeof spec, "alloc:%d", n);
		fst_error err;
		assert_int_equal(fst_fault_set(spec, &err), 0);
		fst_buffer *buf = NULL;
		int rc = fst_load(ck, &o, &buf, &err);
		assert_int_equal(fst_fault_set(NULL, NULL), 0);
		if (!rc) {
			lh_check_buffer(ck, &fs, buf, &o, NULL, "streams, after the faults");
			fst_buffer_release(buf);
			assert_true(n > 1);
			break;
		}
		assert_int_equal(rc, FST_ENOMEM);
		assert_null(buf);
		assert_non_null(strstr(err.message, "out of memory"));
		assert_true(n < 1000);
	}
	lh_files_free(&fs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_streams_give_the_files_bytes),
		cmocka_unit_test(test_cold_streams_read_ahead),
		cmocka_unit_test(test_streams_out_of_memory),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
