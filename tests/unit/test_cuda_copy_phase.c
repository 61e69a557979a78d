/* Description: copies in phase (FST_ALIGN_COPIES), onto the libcuda double,
 * which counts the host-to-device bytes whose source and destination sit at
 * different offsets within 256 bytes. On shards whose data start at 8 mod
 * 16 (so a tensor is off its device alignment by 8, and odd-sized ones by
 * more), loaded warm with io=pread by 1 and 4 workers in chunks of 16 to
 * 256 KiB, whole and streamed, every tensor equals the file, and:
 *  - with 1, each chunk is read into its slot where its largest piece's
 *    copy is in phase: at most the bytes of the chunks that hold a tensor's
 *    start besides their largest piece go out of phase (no more than a
 *    chunk per tensor), and the description says so;
 *  - with 2, each chunk is copied whole to device scratch in its slot's
 *    phase and from there to its tensors: no byte goes out of phase, the
 *    description says so, and the scratch is freed with the load;
 *  - unset, empty or 0 (the default), most bytes go out of phase (so the
 *    count can fail).
 * Cold loads (O_DIRECT into the slots' starts) with 1 and 2 load every
 * byte. With 2, the scratch's allocation and each copy failing in turn fail
 * the load with FST_EDEVICE and nothing left. A value other than 0, 1 or 2
 * is a usage error naming the variable. */
#include "cuda_helpers.h"

#include <stdlib.h>

static ch_ckpt c;
static long (*h2d_bytes)(int out_of_phase);
/* mostly tensors of 1 byte to 3 MiB, so that most chunks hold one */
static const ch_gen big_tensors = {2, 12, 3 << 20, 78};

static int group_setup(void **state)
{
	int rc = ch_setup(state);
	if (rc)
		return rc;
	ch_write_random("copy-phase", lh_base_seed() + 31, &big_tensors, &c);
	ch_open(&c, c.dir);
	*(void **)&h2d_bytes = ch_sym("fst_double_h2d_bytes");
	return 0;
}

static int group_teardown(void **state)
{
	ch_close(&c);
	unsetenv("FST_ALIGN_COPIES");
	return ch_teardown(state);
}

/* The bytes a warm load of c with o copied out of phase, *all of them in
 * all, its description in d; every tensor checked against the file. */
static long out_of_phase(const fst_load_opts *o, bool stream, long *all, char *d, size_t dn,
			 const char *ctx)
{
	ch_temperature(&c, false);
	h2d_bytes(0);
	h2d_bytes(1);
	fst_buffer *buf;
	fst_error err;
	if (ch_load_whole_or_streamed(&c, o, stream, &buf, &err))
		fail_msg("%s: %s", ctx, err.message);
	snprintf(d, dn, "%s", fst_buffer_describe(buf));
	fst_buffer_release(buf);
	*all = h2d_bytes(0);
	long off = h2d_bytes(1);
	ch_assert_clean(ctx, c.host_base);
	if (*all <= 0)
		fail_msg("%s: no bytes copied to the device", ctx);
	return off;
}

/* What a value of FST_ALIGN_COPIES must do to every shape of warm load. */
enum want { MOSTLY_OUT, AT_MOST_A_CHUNK_PER_TENSOR, NONE_OUT };

/* Each shape of warm load, with FST_ALIGN_COPIES as value (NULL: unset),
 * its description saying says (NULL: nothing of FST_ALIGN_COPIES). A chunk
 * with more than one piece holds the start of a tensor: read in phase, at
 * most those chunks' bytes may go out of phase. */
static void every_shape(const char *value, enum want want, const char *says)
{
	static const unsigned workers[] = {1, 4};
	static const uint64_t chunks[] = {16 << 10, 64 << 10, 256 << 10};
	const long tensors = (long)fst_checkpoint_tensor_count(c.ck);
	char d[1200];
	if (value)
		setenv("FST_ALIGN_COPIES", value, 1);
	else
		unsetenv("FST_ALIGN_COPIES");
	char ctx[128];
	for (size_t w = 0; w < sizeof workers / sizeof *workers; w++)
		for (size_t k = 0; k < sizeof chunks / sizeof *chunks; k++)
			for (int stream = 0; stream < 2; stream++) {
				fst_load_opts o;
				ch_opts(&o, "cuda:0", FST_IO_PREAD, workers[w], 8 * MiB);
				o.chunk_bytes = chunks[k];
				snprintf(ctx, sizeof ctx,
					 "FST_ALIGN_COPIES=%s, %u workers, %llu-byte chunks, %s",
					 value ? value : "(unset)", workers[w],
					 (unsigned long long)chunks[k], stream ? "streamed" : "whole");
				long all, off = out_of_phase(&o, stream, &all, d, sizeof d, ctx);
				if (says ? !strstr(d, says) : strstr(d, "FST_ALIGN_COPIES") != NULL)
					fail_msg("%s: \"%s\"", ctx, d);
				if (want == MOSTLY_OUT	? 2 * off < all
				    : want == NONE_OUT	? off != 0
							: off > tensors * (long)chunks[k])
					fail_msg("%s: %ld of %ld bytes out of phase (%ld tensors)",
						 ctx, off, all, tensors);
			}
	unsetenv("FST_ALIGN_COPIES");
}

static void test_in_phase(void **state)
{
	(void)state;
	every_shape("1", AT_MOST_A_CHUNK_PER_TENSOR, "in the copies' phase (FST_ALIGN_COPIES=1)");
}

static void test_on_device(void **state)
{
	(void)state;
	every_shape("2", NONE_OUT, "through device scratch (FST_ALIGN_COPIES=2)");
}

static void test_off(void **state)
{
	(void)state;
	every_shape(NULL, MOSTLY_OUT, NULL);
	every_shape("", MOSTLY_OUT, NULL);
	every_shape("0", MOSTLY_OUT, NULL);
}

static void test_cold(void **state)
{
	(void)state;
	if (!ch_uring_ok)
		skip();
	/* io=auto reads cold files with O_DIRECT into the slots' starts */
	static const char *const values[] = {"1", "2"};
	for (int v = 0; v < 2; v++) {
		setenv("FST_ALIGN_COPIES", values[v], 1);
		fst_load_opts o;
		ch_opts(&o, "cuda:0", FST_IO_AUTO, 4, 8 * MiB);
		lh_evict(c.ck);
		fst_buffer *buf;
		fst_error err;
		if (fst_load(c.ck, &o, &buf, &err))
			fail_msg("cold, %s: %s", values[v], err.message);
		if (!strstr(fst_buffer_describe(buf), "uring"))
			fail_msg("cold, %s: \"%s\"", values[v], fst_buffer_describe(buf));
		ch_assert_buffer(&c, buf, 0);
		fst_buffer_release(buf);
		ch_assert_clean(values[v], c.host_base);
	}
	unsetenv("FST_ALIGN_COPIES");
}

static void test_bad_values(void **state)
{
	(void)state;
	static const char *const bad[] = {"3", "on", "-0", " 1", "1 ", "01"};
	ch_cold_bad_env(&c, "FST_ALIGN_COPIES", bad, sizeof bad / sizeof *bad);
}

static void test_failures(void **state)
{
	(void)state;
	ch_fault_loop(&c, false, "FST_ALIGN_COPIES", "2", 256 << 10, "device_alloc", FST_EDEVICE,
		      "device scratch");
	ch_fault_loop(&c, false, "FST_ALIGN_COPIES", "2", 256 << 10, "h2d", FST_EDEVICE,
		      "device scratch");
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_in_phase, ch_reset),
		cmocka_unit_test_setup(test_on_device, ch_reset),
		cmocka_unit_test_setup(test_off, ch_reset),
		cmocka_unit_test_setup(test_cold, ch_reset),
		cmocka_unit_test_setup(test_bad_values, ch_reset),
		cmocka_unit_test_setup(test_failures, ch_reset),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
