/* Description: fst_load_opts.on_landed with io = pread and uring, block
 * sizes of 4 KiB to 1 MiB, chunks smaller and larger than a block, filters,
 * alignments and misaligned shards (block edges on both sides of 4 KiB,
 * 64 KiB and 1 MiB): every selected byte reported once, equal to the file,
 * never across a block (whole blocks for pread chunks of a block or more),
 * by checkpoint index, before its tensor is handed out; a callback error
 * (first, middle or last call) fails the load cleanly, naming the tensor,
 * and the next load works; io=mmap never calls it; empty tensors are never
 * reported; bad landed_block values are refused. */
#include "format.h"
#include "load_helpers.h"

/*
 * Two shards (the first with its data section at 8 mod 16) of U8 tensors
 * whose sizes sit on both sides of 4 KiB, 64 KiB and 1 MiB multiples, with
 * empty tensors between them. Names "fF.tT", as lh_write_random's.
 */
static void write_block_edges(lh_ckpt *lc)
{
	static const uint64_t sizes0[] = {4095, 0, 4096, 1, 4097, 65535, 65536, 0, 65537,
					  131072, 1u << 20, (1u << 20) + 1, 3};
	static const uint64_t sizes1[] = {(1u << 20) - 1, (2u << 20) + 4097, 0, 7, 3 * 65536 + 5};
	static const uint64_t *const sizes[] = {sizes0, sizes1};
	static const size_t counts[] = {sizeof sizes0 / sizeof sizes0[0],
					sizeof sizes1 / sizeof sizes1[0]};
	memset(lc, 0, sizeof *lc);
	snprintf(lc->dir, sizeof lc->dir, "%s/block_edges", test_tmpdir());
	snprintf(lc->path, sizeof lc->path, "%s", lc->dir);
	lh_rmdir(lc->dir);
	if (mkdir(lc->dir, 0755))
		fail_msg("mkdir %s: %s", lc->dir, strerror(errno));
	lc->nfiles = 2;
	for (unsigned f = 0; f < 2; f++) {
		fst_writer_opts wo;
		fst_writer_opts_init(&wo);
		wo.data_align = f ? 4096 : 16;
		wo.header_extra = f ? 0 : 8;
		fst_writer *w;
		fst_error err;
		if (fst_writer_new(&wo, &w, &err))
			fail_msg("writer: %s", err.message);
		struct lh_fill_ctx ctxs[16];
		for (size_t t = 0; t < counts[f]; t++) {
			char name[32];
			snprintf(name, sizeof name, "f%u.t%zu", f, t);
			ctxs[t].key = lh_mix(0xb10c + f * 100 + t);
			uint64_t shape[1] = {sizes[f][t]};
			if (fst_writer_add_fill(w, name, FST_DTYPE_U8, 1, shape, lh_fill, &ctxs[t],
						&err))
				fail_msg("add %s: %s", name, err.message);
			lc->ntensors++;
			lc->total_bytes += sizes[f][t];
		}
		char file[700];
		snprintf(file, sizeof file, "%s/%02u.safetensors", lc->dir, f);
		if (fst_writer_finish(w, file, &err))
			fail_msg("finish %s: %s", file, err.message);
		fst_writer_free(w);
	}
	fst_checkpoint *ck = lh_open(lc->path);
	if (fst_file_data_offset(fst_checkpoint_file(ck, 0)) % 16 != 8)
		fail_msg("block_edges: the first shard's data section is not at 8 mod 16");
	fst_checkpoint_close(ck);
}

/* The checkpoints of the on_landed tests: the block edges above, then
 * random ones with tensors of up to 1.5 MiB (several blocks of the default 256 KiB). */
static void write_landed_ckpt(unsigned i, lh_ckpt *lc)
{
	if (i == 0) {
		write_block_edges(lc);
		return;
	}
	lh_shape sh = {3, 8, 3u << 19, 25, 12, true};
	char name[32];
	snprintf(name, sizeof name, "landed%u", i);
	lh_write_random(name, lh_base_seed() + 700 + i, &sh, lc);
}

static const int landed_ios[] = {FST_IO_PREAD, FST_IO_URING};

/* One load with a recording on_landed (l, set up for o and flt), whole or
 * streamed; streamed, each tensor must have been reported in full when it
 * is handed out. The bytes loaded are checked too. */
static void landed_load(const fst_checkpoint *ck, const lh_files *fs, fst_load_opts *o,
			const lh_filter *flt, lh_landed *l, bool stream, const char *ctx)
{
	o->on_landed = lh_on_landed;
	o->on_landed_ctx = l;
	fst_buffer *buf = NULL;
	fst_error err;
	if (!stream) {
		if (fst_load(ck, o, &buf, &err))
			fail_msg("%s: %s", ctx, err.message);
	} else {
		fst_loader *ld;
		if (fst_load_start(ck, o, &ld, &err))
			fail_msg("%s: start: %s", ctx, err.message);
		size_t handed = 0, selected = 0;
		for (size_t i = 0; i < l->n; i++)
			selected += l->selected[i];
		fst_tensor_view v;
		int rc;
		while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
			long entry = fst_checkpoint_find(ck, v.name);
			assert_true(entry >= 0);
			if (!lh_landed_complete(l, (size_t)entry))
				fail_msg("%s: tensor %s handed out with %" PRIu64 " of its %" PRIu64
					 " bytes reported%s%s",
					 ctx, v.name, l->reported[entry], l->nbytes[entry],
					 l->problem[0] ? "; earlier: " : "", l->problem);
			uint32_t align = o->align ? o->align : 256;
			lh_check_view(ck, fs, (size_t)entry, &v, align, false, ctx);
			fst_view_release(&v);
			handed++;
		}
		if (rc)
			fail_msg("%s: next: %s", ctx, err.message);
		assert_int_equal(handed, selected);
		if (fst_loader_finish(ld, &buf, &err))
			fail_msg("%s: finish: %s", ctx, err.message);
	}
	lh_landed_check(l, ctx);
	lh_check_buffer(ck, fs, buf, o, flt, ctx);
	fst_buffer_release(buf);
	o->on_landed = NULL;
	o->on_landed_ctx = NULL;
}

/* For io=pread and io=uring, several blocks, chunks smaller and larger than
 * a block, with and without a filter: every byte of every selected tensor
 * is reported once, as the file has it, in pieces within one block (whole
 * blocks where pread reads chunks of at least a block), for its
 * checkpoint index; and the loaded bytes are still right. */
static void test_landed_pieces(void **state)
{
	(void)state;
	static const struct {
		uint64_t block, chunk;
	} cases[] = {
		{4096, 4096}, {4096, 100000}, {65536, 12288},          {65536, 1u << 20},
		{0, 65536},   {0, 4u << 20},  {0, (3u << 20) + 12288},
	};
	const size_t ncases = sizeof cases / sizeof cases[0];
	static const uint32_t aligns[] = {0, 1, 64, 4096};
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	unsigned loads = 0;
	for (unsigned ci = 0; ci < 4; ci++) {
		lh_ckpt lc;
		write_landed_ckpt(ci, &lc);
		fst_checkpoint *ck = lh_open(lc.path);
		lh_files fs;
		lh_files_read(ck, &fs);
		lh_rng r = {lh_base_seed() * 7 + ci};
		for (size_t i = 0; i < 2 * ncases; i++) {
			size_t c = i % ncases;
			fst_load_opts o;
			fst_load_opts_init(&o);
			o.io = landed_ios[i / ncases];
			if (o.io == FST_IO_URING && !lh_uring_usable())
				continue;
			o.threads = 1 + (unsigned)lh_below(&r, 4);
			o.chunk_bytes = cases[c].chunk;
			o.landed_block = cases[c].block;
			o.align = aligns[lh_below(&r, 4)];
			lh_filter flt = {lh_next(&r), 30 + (unsigned)lh_below(&r, 60), 0};
			bool filtered = c % 2 == 1;
			if (filtered) {
				o.filter = lh_filter_fn;
				o.filter_ctx = &flt;
			}
			bool whole = o.io == FST_IO_PREAD &&
				     o.chunk_bytes >= lh_block_of(o.landed_block);
			lh_landed l;
			lh_landed_init(&l, ck, fs.bytes, filtered ? &flt : NULL, o.landed_block,
				       whole);
			char ctx[300];
			snprintf(ctx, sizeof ctx,
				 "checkpoint %u io=%s threads=%u chunk=%" PRIu64
				 " landed_block=%" PRIu64 " align=%u filter=%u%%",
				 ci, lh_io_name(o.io), o.threads, o.chunk_bytes, o.landed_block,
				 o.align, filtered ? flt.percent : 100);
			landed_load(ck, &fs, &o, filtered ? &flt : NULL, &l, false, ctx);
			lh_landed_free(&l);
			loads++;
		}
		lh_files_free(&fs);
		fst_checkpoint_close(ck);
		lh_rmdir(lc.dir);
		assert_int_equal(fsti_live_allocations(), allocs);
		assert_int_equal(lh_count_fds(), fds);
	}
	assert_true(loads >= 28);
}

/* Streaming: when a tensor is handed out, every byte of it has been
 * reported (the callback is slowed down now and then, before it records,
 * so a tensor made ready before its report would show). */
static void test_landed_before_ready(void **state)
{
	(void)state;
	static const struct {
		uint64_t block, chunk;
	} cases[] = {{4096, 65536}, {65536, 4096}, {0, 4u << 20}, {0, 65536}};
	const size_t ncases = sizeof cases / sizeof cases[0];
	long allocs = fsti_live_allocations();
	for (unsigned ci = 0; ci < 2; ci++) {
		lh_ckpt lc;
		write_landed_ckpt(ci, &lc);
		fst_checkpoint *ck = lh_open(lc.path);
		lh_files fs;
		lh_files_read(ck, &fs);
		lh_rng r = {lh_base_seed() * 11 + ci};
		for (size_t i = 0; i < 2 * ncases; i++) {
			size_t c = i % ncases;
			fst_load_opts o;
			fst_load_opts_init(&o);
			o.io = landed_ios[i / ncases];
			if (o.io == FST_IO_URING && !lh_uring_usable())
				continue;
			o.threads = 2 + (unsigned)lh_below(&r, 3);
			o.chunk_bytes = cases[c].chunk;
			o.landed_block = cases[c].block;
			lh_filter flt = {lh_next(&r), 50, 0};
			bool filtered = c == 1;
			if (filtered) {
				o.filter = lh_filter_fn;
				o.filter_ctx = &flt;
			}
			lh_landed l;
			lh_landed_init(&l, ck, fs.bytes, filtered ? &flt : NULL, o.landed_block,
				       false);
			l.sleep_every = 5;
			char ctx[300];
			snprintf(ctx, sizeof ctx,
				 "streaming checkpoint %u io=%s threads=%u chunk=%" PRIu64
				 " landed_block=%" PRIu64 "%s",
				 ci, lh_io_name(o.io), o.threads, o.chunk_bytes, o.landed_block,
				 filtered ? " filter=50%" : "");
			landed_load(ck, &fs, &o, filtered ? &flt : NULL, &l, true, ctx);
			lh_landed_free(&l);
		}
		lh_files_free(&fs);
		fst_checkpoint_close(ck);
		lh_rmdir(lc.dir);
		assert_int_equal(fsti_live_allocations(), allocs);
	}
}

/* A load whose on_landed returns code at call `at`: it fails with that
 * code (FST_ECANCELED for one that is no FST_E* code), naming the tensor of
 * that call; no buffer, nothing left behind. Streamed, what was handed out
 * before the failure is whole. */
static void landed_fail(const fst_checkpoint *ck, const lh_files *fs, fst_load_opts *o,
			unsigned long at, int code, bool stream, const char *ctx)
{
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	int want = code > 0 ? FST_ECANCELED : code;
	lh_landed l;
	lh_landed_init(&l, ck, fs->bytes, NULL, o->landed_block, false);
	l.fail_at = at;
	l.fail_rc = code;
	o->on_landed = lh_on_landed;
	o->on_landed_ctx = &l;
	fst_buffer *buf = (fst_buffer *)&l; /* must be cleared */
	fst_error err;
	int rc;
	if (!stream) {
		rc = fst_load(ck, o, &buf, &err);
	} else {
		fst_loader *ld;
		if (fst_load_start(ck, o, &ld, &err))
			fail_msg("%s: start: %s", ctx, err.message);
		fst_tensor_view v;
		while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
			long entry = fst_checkpoint_find(ck, v.name);
			assert_true(entry >= 0);
			lh_check_view(ck, fs, (size_t)entry, &v, 256, false, ctx);
			fst_view_release(&v);
		}
		if (rc != want)
			fail_msg("%s: next gave %d (%s), expected %d", ctx, rc, err.message, want);
		rc = fst_loader_finish(ld, &buf, &err);
	}
	lh_landed_check_failed(&l, o, rc, want, &err, buf, ctx);
	assert_int_equal(fsti_live_allocations(), allocs);
	assert_int_equal(lh_count_fds(), fds);
}

/* A callback that returns nonzero on its k-th call (the first, one in the
 * middle, the last) fails the load, whole or streamed, and the next load
 * without it works. */
static void test_landed_errors(void **state)
{
	(void)state;
	lh_ckpt lc;
	write_landed_ckpt(0, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	lh_files fs;
	lh_files_read(ck, &fs);
	long allocs = fsti_live_allocations();
	static const int codes[] = {FST_ECANCELED, FST_EMISMATCH, FST_EIO, 7};
	const size_t ncodes = sizeof codes / sizeof codes[0];
	unsigned failures = 0;
	for (int k = 0; k < 2; k++) {
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = landed_ios[k];
		if (o.io == FST_IO_URING && !lh_uring_usable())
			continue;
		o.threads = 3;
		o.chunk_bytes = 65536;
		o.landed_block = 16384;
		/* how many calls a whole load makes */
		lh_landed l;
		lh_landed_init(&l, ck, fs.bytes, NULL, o.landed_block, false);
		landed_load(ck, &fs, &o, NULL, &l, false, lh_io_name(o.io));
		unsigned long calls = l.calls;
		lh_landed_free(&l);
		assert_true(calls > 10);
		const unsigned long ats[] = {1, calls / 2, calls};
		for (size_t i = 0; i < 3 * ncodes; i++) {
			bool stream = (i / 3 + i % 3) % 2;
			char ctx[200];
			snprintf(ctx, sizeof ctx,
				 "io=%s, on_landed returns %d at call %lu of %lu%s", lh_io_name(o.io),
				 codes[i / 3], ats[i % 3], calls, stream ? ", streaming" : "");
			landed_fail(ck, &fs, &o, ats[i % 3], codes[i / 3], stream, ctx);
			failures++;
		}
		/* and a load without the callback works */
		fst_buffer *buf;
		fst_error err;
		if (fst_load(ck, &o, &buf, &err))
			fail_msg("io=%s after the failures: %s", lh_io_name(o.io), err.message);
		lh_check_buffer(ck, &fs, buf, &o, NULL, "after the failures");
		fst_buffer_release(buf);
		assert_int_equal(fsti_live_allocations(), allocs);
	}
	assert_true(failures >= 12);
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

static int keep_e(void *ctx, const char *name)
{
	(void)ctx;
	return name[0] == 'e';
}

/* io=mmap reads nothing through host memory: no call. Empty tensors are
 * never reported. landed_block must be a power of two, 4 KiB to 1 GiB. */
static void test_landed_mmap_empty_and_bad_block(void **state)
{
	(void)state;
	lh_ckpt lc;
	write_landed_ckpt(0, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	lh_files fs;
	lh_files_read(ck, &fs);
	fst_load_opts o;
	for (int stream = 0; stream < 2; stream++) {
		lh_landed l;
		lh_landed_init(&l, ck, fs.bytes, NULL, 0, false);
		fst_load_opts_init(&o);
		o.io = FST_IO_MMAP;
		o.on_landed = lh_on_landed;
		o.on_landed_ctx = &l;
		fst_buffer *buf = NULL;
		if (stream)
			buf = lh_load_streaming(ck, &fs, &o, NULL, "mmap streaming");
		fst_error err;
		if (!stream && fst_load(ck, &o, &buf, &err))
			fail_msg("mmap: %s", err.message);
		lh_check_buffer(ck, &fs, buf, &o, NULL, "mmap");
		fst_buffer_release(buf);
		if (l.calls)
			fail_msg("io=mmap: on_landed called %lu times", l.calls);
		lh_landed_free(&l);
	}

	/* the extremes are fine */
	static const uint64_t good[] = {4096, 1ull << 30};
	for (int i = 0; i < 2; i++) {
		fst_load_opts_init(&o);
		o.io = FST_IO_PREAD;
		o.landed_block = good[i];
		lh_landed l;
		lh_landed_init(&l, ck, fs.bytes, NULL, good[i], false);
		landed_load(ck, &fs, &o, NULL, &l, false, good[i] == 4096 ? "4 KiB" : "1 GiB");
		lh_landed_free(&l);
	}

	static const uint64_t bad[] = {3, 2048, 3u << 20, 2ull << 30, 4095, 4097};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		unsigned long calls = 0;
		fst_load_opts_init(&o);
		o.io = FST_IO_PREAD;
		o.landed_block = bad[i];
		o.on_landed = lh_on_landed;
		o.on_landed_ctx = &calls; /* never called */
		lh_expect_usage(ck, &o, FST_EUSAGE, "landed_block");
		o.io = FST_IO_URING;
		lh_expect_usage(ck, &o, FST_EUSAGE, "landed_block");
		assert_int_equal(calls, 0);
	}
	lh_files_free(&fs);
	fst_checkpoint_close(ck);

	/* empty tensors around a 5000-byte one: two calls, for that one; with
	 * only the empty ones selected, none */
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	uint64_t s0[2] = {0, 5};
	uint64_t s1[1] = {5000};
	struct lh_fill_ctx fc = {42};
	assert_int_equal(fst_writer_add(w, "e1", FST_DTYPE_F32, 2, s0, NULL, 0, &err), 0);
	assert_int_equal(fst_writer_add_fill(w, "full", FST_DTYPE_U8, 1, s1, lh_fill, &fc, &err),
			 0);
	assert_int_equal(fst_writer_add(w, "e2", FST_DTYPE_U8, 1, s0, NULL, 0, &err), 0);
	const char *path = test_path("landed_empty.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	ck = lh_open(path);
	lh_files_read(ck, &fs);
	for (int i = 0; i < 4; i++) {
		fst_load_opts_init(&o);
		o.io = landed_ios[i / 2];
		if (o.io == FST_IO_URING && !lh_uring_usable())
			continue;
		o.threads = 2;
		o.landed_block = 4096;
		if (i % 2) {
			/* no tensor with a byte is selected: the recorder refuses all */
			lh_filter none = {0, 0, 0};
			lh_landed l;
			lh_landed_init(&l, ck, fs.bytes, &none, 4096, false);
			o.filter = keep_e;
			o.on_landed = lh_on_landed;
			o.on_landed_ctx = &l;
			fst_buffer *buf;
			if (fst_load(ck, &o, &buf, &err))
				fail_msg("io=%s, only empty tensors: %s", lh_io_name(o.io),
					 err.message);
			assert_int_equal(fst_buffer_tensor_count(buf), 2);
			fst_buffer_release(buf);
			lh_landed_check(&l, "only empty tensors");
			assert_int_equal(l.calls, 0);
			lh_landed_free(&l);
		} else {
			lh_landed l;
			lh_landed_init(&l, ck, fs.bytes, NULL, 4096, false);
			landed_load(ck, &fs, &o, NULL, &l, false, "empty tensors");
			assert_int_equal(l.calls, 2);
			lh_landed_free(&l);
		}
	}
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_landed_pieces),
		cmocka_unit_test(test_landed_before_ready),
		cmocka_unit_test(test_landed_errors),
		cmocka_unit_test(test_landed_mmap_empty_and_bad_block),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
