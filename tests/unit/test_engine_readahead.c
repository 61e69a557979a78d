/* Description: readahead of cold files read through the page cache. A load
 * with io=pread of files evicted from the page cache asks the kernel to
 * fetch ahead (the "prefetch" fault site counts the calls), says so in its
 * description, and its bytes equal the files'; refused advice changes no
 * byte; readahead_bytes = FST_READAHEAD_OFF, files in the page cache and
 * io=uring never ask. With the thread count left to fst, a cold load reads
 * with 16 threads whatever the core count, a warm one with one per CPU (at
 * most 16), and a count the caller gives stands. */
#include "format.h"
#include "load_helpers.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

/* io/residency.c: the suite links the static library. */
double fsti_cached_fraction(const fst_checkpoint *ck);

/* Load ck with o, every prefetch refused (fault site "prefetch" armed for
 * every call), check every byte, and return how many prefetches were asked. */
static long load_counting(const fst_checkpoint *ck, const fst_load_opts *o, bool cold,
			  const char *want_in_describe, const char *ctx)
{
	lh_files fs;
	lh_files_read(ck, &fs); /* reads the files: evict after */
	if (cold)
		lh_evict(ck);
	fst_error err;
	assert_int_equal(fst_fault_set("prefetch:1+", &err), 0);
	fst_buffer *buf;
	int rc = fst_load(ck, o, &buf, &err);
	long asked = fst_fault_last(NULL, 0);
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
	if (rc)
		fail_msg("%s: %s", ctx, err.message);
	const char *d = fst_buffer_describe(buf);
	if (want_in_describe && !strstr(d, want_in_describe))
		fail_msg("%s: \"%s\" lacks \"%s\"", ctx, d, want_in_describe);
	if (!want_in_describe && strstr(d, "readahead"))
		fail_msg("%s: \"%s\" says readahead", ctx, d);
	lh_check_buffer(ck, &fs, buf, o, NULL, ctx);
	fst_buffer_release(buf);
	lh_files_free(&fs);
	return asked;
}

static void test_readahead(void **state)
{
	(void)state;
	lh_shape sh = lh_default_shape();
	lh_ckpt lc;
	lh_write_random("readahead", 11, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	if (fsti_cached_fraction(ck) < 0) {
		fst_checkpoint_close(ck);
		skip(); /* residency cannot be told here: no readahead decision */
	}
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = FST_IO_PREAD;
	o.chunk_bytes = 64 << 10;
	o.threads = 3;

	/* default: 1 GiB ahead, more than the checkpoint, so every chunk but
	 * the first is asked for by the first chunk's taker */
	long asked = load_counting(ck, &o, true, "readahead", "cold, default");
	if (asked < 1)
		fail_msg("cold io=pread load asked for no readahead");

	/* a window of one chunk: each chunk taken asks for the next */
	o.readahead_bytes = o.chunk_bytes;
	asked = load_counting(ck, &o, true, "readahead 64 KiB", "cold, one chunk ahead");
	assert_true(asked >= 1);

	o.readahead_bytes = FST_READAHEAD_OFF;
	assert_int_equal(load_counting(ck, &o, true, NULL, "cold, readahead off"), 0);

	o.readahead_bytes = 0;
	assert_int_equal(load_counting(ck, &o, false, NULL, "warm"), 0);

	/* threads left to fst: 16 cold whatever the cores; one per CPU warm */
	uint64_t total = 0;
	for (size_t i = 0; i < fst_checkpoint_tensor_count(ck); i++) {
		fst_tensor_info info;
		fst_checkpoint_tensor(ck, i, &info, NULL);
		total += info.nbytes;
	}
	o.chunk_bytes = 4096;
	if (total / o.chunk_bytes < 16)
		fail_msg("the checkpoint (%llu bytes) makes fewer than 16 chunks",
			 (unsigned long long)total);
	o.threads = 0;
	load_counting(ck, &o, true, "pread, 16 threads", "cold, threads left to fst");
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned warm = cpus < 1 ? 1 : cpus > 16 ? 16 : (unsigned)cpus;
	char want[32];
	snprintf(want, sizeof want, "pread, %u thread%s", warm, warm == 1 ? "" : "s");
	lh_files fs;
	lh_files_read(ck, &fs); /* in the page cache */
	fst_buffer *buf;
	fst_error err;
	assert_int_equal(fst_load(ck, &o, &buf, &err), 0);
	if (!strstr(fst_buffer_describe(buf), want))
		fail_msg("warm, threads left to fst: \"%s\" lacks \"%s\"",
			 fst_buffer_describe(buf), want);
	fst_buffer_release(buf);
	lh_files_free(&fs);
	o.threads = 3;
	load_counting(ck, &o, true, "pread, 3 threads", "cold, 3 threads asked");
	o.chunk_bytes = 64 << 10;

	if (lh_uring_usable()) {
		o.io = FST_IO_URING;
		assert_int_equal(load_counting(ck, &o, true, NULL, "cold, io=uring"), 0);
	}
	fst_checkpoint_close(ck);
	lh_rmdir(lc.dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_readahead),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
