/* Description: on_landed onto the CUDA target (libcuda double): the bytes
 * reported from pinned staging on their way to the device, with pread and
 * io_uring, landed_block of 4 KiB, 64 KiB and the default, 1 and 4 MiB of
 * staging, whole and streamed: every byte once, equal to the file, inside
 * one block, before its tensor is handed out. A callback that fails on its
 * first, middle or last call fails the load with its code (FST_ECANCELED
 * for one that is none), naming the tensor, with no buffer, device memory
 * or pinned block left, and the next load works. */
#include "cuda_helpers.h"

/* Tensors of up to 1.5 MiB: more than one block of every size below. */
static const ch_gen landed_gen = {3, 16, 3u << 19, 20};

/* One load to cuda:dev with a recording on_landed, whole or streamed;
 * streamed, each tensor must have been reported in full when it is handed
 * out. */
static void landed_load(const ch_ckpt *c, const fst_load_opts *o, int dev, lh_landed *l,
			bool stream, const char *ctx)
{
	fst_buffer *buf = NULL;
	fst_error err;
	if (!stream) {
		if (fst_load(c->ck, o, &buf, &err))
			fail_msg("%s: %s", ctx, err.message);
	} else {
		fst_loader *ld;
		if (fst_load_start(c->ck, o, &ld, &err))
			fail_msg("%s: start: %s", ctx, err.message);
		fst_tensor_view v;
		int rc;
		size_t n = 0;
		while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
			long entry = fst_checkpoint_find(c->ck, v.name);
			assert_true(entry >= 0);
			if (!lh_landed_complete(l, (size_t)entry))
				fail_msg("%s: %s handed out before all of it was reported%s%s", ctx,
					 v.name, l->problem[0] ? "; earlier: " : "", l->problem);
			fst_view_release(&v);
			n++;
		}
		if (rc)
			fail_msg("%s: next: %s", ctx, err.message);
		assert_int_equal(n, fst_checkpoint_tensor_count(c->ck));
		if (fst_loader_finish(ld, &buf, &err))
			fail_msg("%s: finish: %s", ctx, err.message);
	}
	lh_landed_check(l, ctx);
	assert_true(l->calls > 0);
	ch_assert_buffer(c, buf, dev);
	fst_buffer_release(buf);
}

/* Every byte of every tensor is reported once, from host staging, equal to
 * the file, in pieces that stay inside one landed_block of their tensor;
 * streamed, a tensor is handed out only once all of it was reported. */
static void test_landed(void **state)
{
	(void)state;
	ch_set_delay("20");
	ch_ckpt c;
	ch_write_random("landed", 91, &landed_gen, &c);
	ch_open(&c, c.dir);
	static const uint64_t blocks[] = {4096, 65536, 0};
	static const uint64_t staging[] = {1 * MiB, 4 * MiB};
	unsigned loads = 0;
	/* io x block x (device, threads, staging) */
	for (int i = 0; i < 12; i++) {
		int io = i < 6 ? FST_IO_PREAD : FST_IO_URING, b = i / 2 % 3, s = i % 2;
		if (io == FST_IO_URING && !ch_uring_ok)
			continue;
		bool stream = (b + s) % 2;
		fst_load_opts o;
		ch_opts(&o, s ? "cuda:1" : "cuda:0", io, 1 + 2 * (unsigned)s, staging[s]);
		o.landed_block = blocks[b];
		lh_landed l;
		lh_landed_init(&l, c.ck, c.bytes, NULL, blocks[b], false);
		l.sleep_every = stream ? 3 : 0;
		o.on_landed = lh_on_landed;
		o.on_landed_ctx = &l;
		char ctx[160];
		snprintf(ctx, sizeof ctx,
			 "%s %s %u threads, %" PRIu64 " MiB staging, landed_block %" PRIu64 "%s",
			 o.device, lh_io_name(io), o.threads, staging[s] >> 20, blocks[b],
			 stream ? ", streaming" : "");
		landed_load(&c, &o, s, &l, stream, ctx);
		lh_landed_free(&l);
		ch_assert_clean(ctx, c.host_base);
		loads++;
	}
	assert_true(loads >= 6);
	ch_close(&c);
	ch_set_delay("50");
}

/* A load whose on_landed returns code at call `at`: it fails with want,
 * naming the tensor of that call; no buffer, nothing left on the device or
 * pinned. */
static void landed_fail(const ch_ckpt *c, fst_load_opts *o, unsigned long at, int code,
			bool stream, const char *ctx)
{
	int want = code > 0 ? FST_ECANCELED : code;
	lh_landed l;
	lh_landed_init(&l, c->ck, c->bytes, NULL, o->landed_block, false);
	l.fail_at = at;
	l.fail_rc = code;
	o->on_landed = lh_on_landed;
	o->on_landed_ctx = &l;
	fst_buffer *buf = (fst_buffer *)&l; /* must be cleared */
	fst_error err;
	int rc;
	if (!stream) {
		rc = fst_load(c->ck, o, &buf, &err);
	} else {
		fst_loader *ld;
		if (fst_load_start(c->ck, o, &ld, &err))
			fail_msg("%s: start: %s", ctx, err.message);
		fst_tensor_view v;
		while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
			ch_assert_view(c, &v, 0); /* handed out: whole */
			/* and reported whole, and not the one refused */
			size_t entry = (size_t)fst_checkpoint_find(c->ck, v.name);
			pthread_mutex_lock(&l.lock);
			bool refused = entry == l.failed_tensor;
			pthread_mutex_unlock(&l.lock);
			if (refused || !lh_landed_complete(&l, entry))
				fail_msg("%s: %s handed out %s", ctx, v.name,
					 refused ? "though on_landed refused it"
						 : "before all of it was reported");
			fst_view_release(&v);
		}
		if (rc != want)
			fail_msg("%s: next gave %d (%s)", ctx, rc, err.message);
		rc = fst_loader_finish(ld, &buf, &err);
	}
	lh_landed_check_failed(&l, o, rc, want, &err, buf, ctx);
	ch_assert_clean(ctx, c->host_base);
}

/* A callback that fails on its k-th call fails the load with its code
 * (FST_ECANCELED for a value that is none), naming the tensor: no buffer,
 * no device memory or pinned block left, and the next load works. */
static void test_landed_error(void **state)
{
	(void)state;
	ch_set_delay("20");
	ch_ckpt c;
	ch_write_random("landed_err", 93, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	static const int codes[] = {FST_EMISMATCH, FST_ECANCELED, 7};
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
		if (io == FST_IO_URING && !ch_uring_ok)
			continue;
		fst_load_opts o;
		ch_opts(&o, "cuda:0", io, 2, 1 * MiB);
		o.landed_block = 8192;
		/* how many calls a whole load makes */
		lh_landed l;
		lh_landed_init(&l, c.ck, c.bytes, NULL, o.landed_block, false);
		o.on_landed = lh_on_landed;
		o.on_landed_ctx = &l;
		landed_load(&c, &o, 0, &l, false, lh_io_name(io));
		unsigned long calls = l.calls;
		lh_landed_free(&l);
		ch_assert_clean("a counting load", c.host_base);
		assert_true(calls > 4);
		const unsigned long ats[] = {1, calls / 2, calls};
		for (int k = 0; k < 9; k++) {
			bool stream = (k / 3 + k % 3) % 2;
			char ctx[160];
			snprintf(ctx, sizeof ctx, "%s: on_landed returns %d at call %lu of %lu%s",
				 lh_io_name(io), codes[k / 3], ats[k % 3], calls,
				 stream ? ", streaming" : "");
			landed_fail(&c, &o, ats[k % 3], codes[k / 3], stream, ctx);
		}
		/* and the next load, without the callback, works */
		fst_buffer *buf = NULL;
		fst_error err;
		if (fst_load(c.ck, &o, &buf, &err))
			fail_msg("%s after the failures: %s", lh_io_name(io), err.message);
		ch_assert_buffer(&c, buf, 0);
		fst_buffer_release(buf);
		ch_assert_clean("after the failures", c.host_base);
	}
	ch_close(&c);
	ch_set_delay("50");
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_landed, ch_reset),
		cmocka_unit_test_setup(test_landed_error, ch_reset),
	};
	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
}
