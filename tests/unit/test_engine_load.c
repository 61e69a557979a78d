/* Description: fst_load and the streaming form on random checkpoints
 * (fst_writer: 0-byte, odd-sized, scalar and sub-byte tensors, several
 * shards, misaligned offsets) with io = pread, uring, mmap and auto, 1 to 5
 * threads, chunks from 4 KiB, several align, staging and pinned values, with
 * and without filters: every tensor's bytes equal an independent read(2) of
 * the file, data is aligned (except mmap), inside the one allocation, in
 * order and disjoint; the table, fst_buffer_find, counts, sizes and describe
 * are right; streaming hands out every selected tensor exactly once, already
 * complete, and views kept past finish stay right. Replay a failure with
 * FST_TEST_SEED. */
#include "format.h"
#include "load_helpers.h"

static void random_opts(lh_rng *r, int io, fst_load_opts *o)
{
	static const uint64_t chunks[] = {4096, 8192, 12288, 65536, 100000, 1u << 20, 0};
	static const uint32_t aligns[] = {0, 1, 8, 64, 256, 4096};
	static const uint64_t staging[] = {0, 0, 1u << 20, 200000};
	fst_load_opts_init(o);
	o->io = io;
	o->threads = 1 + (unsigned)lh_below(r, 5);
	o->chunk_bytes = chunks[lh_below(r, 7)];
	o->align = aligns[lh_below(r, 6)];
	o->staging_bytes = staging[lh_below(r, 4)];
	o->pinned = lh_below(r, 8) == 0;
}

static void test_random_loads(void **state)
{
	(void)state;
	uint64_t base = lh_base_seed() + 100;
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	unsigned loads = 0;
	for (unsigned it = 0; it < 40; it++) {
		uint64_t seed = base + it;
		lh_shape sh = lh_default_shape();
		sh.max_big = 400000;
		lh_ckpt lc;
		lh_write_random("load", seed, &sh, &lc);
		fst_checkpoint *ck = lh_open(lc.path);
		lh_files fs;
		lh_files_read(ck, &fs);
		lh_rng r = {seed * 31};
		for (int k = 0; k < 4; k++) {
			if (lh_io_skipped(ios[k]))
				continue;
			fst_load_opts o;
			random_opts(&r, ios[k], &o);
			lh_filter flt = {lh_next(&r), (unsigned)lh_below(&r, 101), 0};
			bool filtered = lh_below(&r, 3) == 0;
			if (filtered) {
				o.filter = lh_filter_fn;
				o.filter_ctx = &flt;
			}
			bool stream = lh_below(&r, 2);
			char ctx[300];
			snprintf(ctx, sizeof ctx,
				 "seed %" PRIu64 " io=%s threads=%u chunk=%" PRIu64
				 " align=%u staging=%" PRIu64 " pinned=%d filter=%u%% %s",
				 seed, lh_io_name(o.io), o.threads, o.chunk_bytes, o.align,
				 o.staging_bytes, o.pinned, filtered ? flt.percent : 100,
				 stream ? "streaming" : "fst_load");
			fst_buffer *buf = NULL;
			fst_error err;
			if (stream) {
				buf = lh_load_streaming(ck, &fs, &o, filtered ? &flt : NULL, ctx);
			} else if (fst_load(ck, &o, &buf, &err)) {
				fail_msg("%s: %s", ctx, err.message);
			}
			lh_check_buffer(ck, &fs, buf, &o, filtered ? &flt : NULL, ctx);
			fst_buffer_release(buf);
			loads++;
		}
		lh_files_free(&fs);
		fst_checkpoint_close(ck);
		assert_int_equal(fsti_live_allocations(), allocs);
		assert_int_equal(lh_count_fds(), fds);
	}
	assert_int_equal(loads, lh_uring_usable() ? 160 : 120);
}

/* One fst_load with o, checked whole. */
static void load_checked(fst_checkpoint *ck, lh_files *fs, const fst_load_opts *o,
			 const char *ctx)
{
	fst_buffer *buf;
	fst_error err;
	if (fst_load(ck, o, &buf, &err))
		fail_msg("%s: %s", ctx, err.message);
	lh_check_buffer(ck, fs, buf, o, NULL, ctx);
	fst_buffer_release(buf);
}

/* Every io method and thread count on one checkpoint with many chunks. */
static void test_every_io_and_threads(void **state)
{
	(void)state;
	lh_shape sh = {3, 30, 300000, 20, 10, false};
	lh_ckpt lc;
	lh_write_random("every", lh_base_seed() + 5, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	lh_files fs;
	lh_files_read(ck, &fs);
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	for (int k = 0; k < 4; k++)
		for (unsigned t = 1; t <= 5; t++) {
			if (lh_io_skipped(ios[k]))
				continue;

			fst_load_opts o;
			fst_load_opts_init(&o);
			o.io = ios[k];
			o.threads = t;
			o.chunk_bytes = 4096 * t;
			o.align = 1u << (2 * t);
			char ctx[100];
			snprintf(ctx, sizeof ctx, "io=%s threads=%u", lh_io_name(o.io), t);
			load_checked(ck, &fs, &o, ctx);
		}
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

/* An align past the 2 MiB the host memory's base gets anyway: the base
 * follows it, so every tensor lands on a multiple of it. */
static void test_align_past_the_huge_page(void **state)
{
	(void)state;
	lh_shape sh = {2, 4, 100000, 3, 3, false};
	lh_ckpt lc;
	lh_write_random("bigalign", lh_base_seed() + 7, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	lh_files fs;
	lh_files_read(ck, &fs);
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_AUTO};
	static const uint32_t aligns[] = {4u << 20, 64u << 20};
	for (int k = 0; k < 3; k++)
		for (int a = 0; a < 2; a++) {
			if (lh_io_skipped(ios[k]))
				continue;
			fst_load_opts o;
			fst_load_opts_init(&o);
			o.io = ios[k];
			o.align = aligns[a];
			char ctx[100];
			snprintf(ctx, sizeof ctx, "io=%s align=%u", lh_io_name(o.io), o.align);
			load_checked(ck, &fs, &o, ctx);
		}
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_loads),
		cmocka_unit_test(test_every_io_and_threads),
		cmocka_unit_test(test_align_past_the_huge_page),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
