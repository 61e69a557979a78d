/* Description: copies in phase (FST_ALIGN_COPIES), onto the libcuda double,
 * which counts the host-to-device bytes whose source and destination sit at
 * different offsets within 256 bytes. On shards whose data start at 8 mod
 * 16 (so a tensor is off its device alignment by 8, and odd-sized ones by
 * more), loaded warm with io=pread by 1 and 4 workers in chunks of 16 to
 * 256 KiB, whole and streamed, every tensor equals the file, and:
 *  - with 1, each chunk is read into its slot where its largest piece's
 *    copy is in phase: exactly the bytes of the other pieces whose phase
 *    differs from it go out of phase, worked out here from the chunks' rule
 *    and the tensors' device addresses (so the offset of a chunk holding a
 *    tensor's start, or a piece other than the largest, would show), and
 *    the description says so;
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

/* A chunk's pieces so far, for expected_out_of_phase. */
struct chunk_pieces {
	uint64_t *len;
	unsigned *phase;
	size_t n;
};

/* The bytes of a chunk whose pieces' phase is not that of its first
 * largest piece; the chunk emptied. */
static long chunk_out_of_phase(struct chunk_pieces *p)
{
	size_t largest = 0;
	for (size_t i = 1; i < p->n; i++)
		if (p->len[i] > p->len[largest])
			largest = i;
	long out = 0;
	for (size_t i = 0; i < p->n; i++)
		if (p->phase[i] != p->phase[largest])
			out += (long)p->len[i];
	p->n = 0;
	return out;
}

/* What FST_ALIGN_COPIES=1 must leave out of phase in a warm load of c into
 * buf in chunks of chunk bytes, worked out here from the plan's rules
 * rather than taken from the engine: chunks end at multiples of chunk in
 * the file, within runs of contiguous tensors; each chunk lands where its
 * first largest piece is copied in phase; any other piece whose tensor's
 * device address less its file offset differs from that piece's tensor's
 * within 256 bytes goes out of phase. */
static long expected_out_of_phase(fst_buffer *buf, uint64_t chunk)
{
	size_t n = fst_checkpoint_tensor_count(c.ck);
	struct chunk_pieces p = {malloc(2 * n * sizeof *p.len), malloc(2 * n * sizeof *p.phase), 0};
	assert_non_null(p.len);
	assert_non_null(p.phase);
	long out = 0;
	size_t file = SIZE_MAX;
	uint64_t run_end = 0, chunk_end = 0;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info info;
		size_t f;
		assert_int_equal(fst_checkpoint_tensor(c.ck, i, &info, &f), 0);
		if (!info.nbytes)
			continue; /* no read: no piece, and no break in a run */
		fst_tensor_view v;
		long k = fst_buffer_find(buf, info.name);
		assert_true(k >= 0);
		assert_int_equal(fst_buffer_tensor(buf, (size_t)k, &v), 0);
		unsigned phase = (unsigned)(((uintptr_t)v.data - info.file_offset) & 255);
		fst_view_release(&v);
		uint64_t at = info.file_offset, end = at + info.nbytes;
		if (f != file || at != run_end) { /* a run of its own */
			out += chunk_out_of_phase(&p);
			chunk_end = (at / chunk + 1) * chunk;
		}
		while (at < end) {
			if (at >= chunk_end) {
				out += chunk_out_of_phase(&p);
				chunk_end = (at / chunk + 1) * chunk;
			}
			uint64_t stop = end < chunk_end ? end : chunk_end;
			assert_true(p.n < 2 * n);
			p.len[p.n] = stop - at;
			p.phase[p.n++] = phase;
			at = stop;
		}
		file = f;
		run_end = end;
	}
	out += chunk_out_of_phase(&p);
	free(p.len);
	free(p.phase);
	return out;
}

/* The bytes a warm load of c with o copied out of phase, *all of them in
 * all, its description in d; every tensor checked against the file. With
 * expected, what FST_ALIGN_COPIES=1 must leave out of phase in that load. */
static long out_of_phase(const fst_load_opts *o, bool stream, long *all, char *d, size_t dn,
			 long *expected, const char *ctx)
{
	ch_temperature(&c, false);
	h2d_bytes(0);
	h2d_bytes(1);
	fst_buffer *buf;
	fst_error err;
	if (ch_load_whole_or_streamed(&c, o, stream, &buf, &err))
		fail_msg("%s: %s", ctx, err.message);
	snprintf(d, dn, "%s", fst_buffer_describe(buf));
	if (expected)
		*expected = expected_out_of_phase(buf, o->chunk_bytes);
	fst_buffer_release(buf);
	*all = h2d_bytes(0);
	long off = h2d_bytes(1);
	ch_assert_clean(ctx, c.host_base);
	if (*all <= 0)
		fail_msg("%s: no bytes copied to the device", ctx);
	return off;
}

/* What a value of FST_ALIGN_COPIES must do to every shape of warm load. */
enum want { MOSTLY_OUT, LARGEST_PIECES_IN_PHASE, NONE_OUT };

/* Each shape of warm load, with FST_ALIGN_COPIES as value (NULL: unset),
 * its description saying says (NULL: nothing of FST_ALIGN_COPIES). A chunk
 * with more than one piece holds the start of a tensor: read in phase, at
 * most those chunks' bytes may go out of phase. */
static void every_shape(const char *value, enum want want, const char *says)
{
	static const unsigned workers[] = {1, 4};
	static const uint64_t chunks[] = {16 << 10, 64 << 10, 256 << 10};
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
				long all, expected = 0;
				long off = out_of_phase(&o, stream, &all, d, sizeof d,
							want == LARGEST_PIECES_IN_PHASE ? &expected
											: NULL,
							ctx);
				if (says ? !strstr(d, says) : strstr(d, "FST_ALIGN_COPIES") != NULL)
					fail_msg("%s: \"%s\"", ctx, d);
				if (want == MOSTLY_OUT	? 2 * off < all
				    : want == NONE_OUT	? off != 0
							: off != expected)
					fail_msg("%s: %ld of %ld bytes out of phase (%ld expected)",
						 ctx, off, all, expected);
			}
	unsetenv("FST_ALIGN_COPIES");
}

static void test_in_phase(void **state)
{
	(void)state;
	every_shape("1", LARGEST_PIECES_IN_PHASE, "in the copies' phase (FST_ALIGN_COPIES=1)");
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
