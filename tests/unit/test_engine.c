/* Description: loads of random checkpoints (fst_writer: 0-byte, odd-sized,
 * scalar and sub-byte tensors, several shards, misaligned offsets) with
 * io = pread, uring, mmap and auto, 1 to 5 threads, chunks from 4 KiB,
 * several align and staging values, with and without filters: every
 * tensor's bytes equal an independent read(2) of the file, data is aligned
 * (except mmap), the table, fst_buffer_find, counts, sizes and describe are
 * right. Streaming hands out every selected tensor exactly once, already
 * complete. Views keep the buffer alive past fst_buffer_release and
 * fst_checkpoint_close. Cancellation, fst_loader_free without finish,
 * progress callbacks, the allocator hook (size, align, one free; NULL and
 * misaligned results), bad options, empty checkpoints, filters selecting
 * nothing, memory-image checkpoints and concurrent loads. on_landed with
 * io = pread and uring, several landed_block and chunk sizes, filters:
 * every selected byte reported once, equal to the file, never across a
 * block (whole blocks for pread chunks of a block or more), by checkpoint
 * index, before its tensor is handed out; a failing callback fails the load
 * cleanly; io=mmap never calls it; bad landed_block values are refused.
 * io=mmap with mmap_private gives writable copy-on-write views: a write
 * reaches neither the file nor other loads. Replay a failure with
 * FST_TEST_SEED. */
#include "engine.h"
#include "load_helpers.h"

#include <pthread.h>
#include <time.h>

/* Check one view against checkpoint tensor `entry`. */
static void check_view(const fst_checkpoint *ck, const lh_files *fs, size_t entry,
		       const fst_tensor_view *v, uint32_t align, bool mapped, const char *ctx)
{
	fst_tensor_info info;
	const unsigned char *want = lh_expected(ck, fs, entry, &info);
	assert_string_equal(v->name, info.name);
	assert_int_equal(v->dtype, info.dtype);
	assert_int_equal(v->ndim, info.ndim);
	if (info.ndim == 0)
		assert_null(v->shape);
	for (uint32_t d = 0; d < info.ndim; d++)
		assert_int_equal(v->shape[d], info.shape[d]);
	assert_int_equal(v->nbytes, info.nbytes);
	assert_int_equal(v->device_type, FST_DEVICE_CPU);
	assert_int_equal(v->device_id, 0);
	assert_non_null(v->buffer);
	if (!mapped && (uintptr_t)v->data % align)
		fail_msg("%s: tensor %s at %p is not aligned to %u", ctx, info.name, v->data,
			 align);
	char what[300];
	snprintf(what, sizeof what, "%s: tensor %s", ctx, info.name);
	lh_assert_bytes(what, v->data, want, info.nbytes);
}

/* Check a whole buffer: the selected tensors of ck, in checkpoint order. */
static void check_buffer(const fst_checkpoint *ck, const lh_files *fs, fst_buffer *buf,
			 const fst_load_opts *o, const lh_filter *flt, const char *ctx)
{
	uint32_t align = o->align ? o->align : 256;
	bool mapped = o->io == FST_IO_MMAP;
	size_t n = fst_checkpoint_tensor_count(ck), k = 0;
	uint64_t bytes = 0;
	const char *prev_end = NULL;
	const char *base = buf->base;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info info;
		assert_int_equal(fst_checkpoint_tensor(ck, i, &info, NULL), 0);
		if (flt && !lh_keeps(flt, info.name)) {
			if (fst_buffer_find(buf, info.name) != -1)
				fail_msg("%s: filtered-out tensor %s is in the buffer", ctx, info.name);
			continue;
		}
		if (fst_buffer_find(buf, info.name) != (long)k)
			fail_msg("%s: fst_buffer_find(%s) = %ld, want %zu", ctx, info.name,
				 fst_buffer_find(buf, info.name), k);
		fst_tensor_view v;
		assert_int_equal(fst_buffer_tensor(buf, k, &v), 0);
		assert_int_equal(v.index, k);
		assert_ptr_equal(v.buffer, buf);
		check_view(ck, fs, i, &v, align, mapped, ctx);
		if (!mapped) {
			/* inside the one allocation, in order, disjoint */
			const char *d = v.data;
			assert_true(d >= base && d + v.nbytes <= base + fst_buffer_size(buf));
			if (prev_end && d < prev_end)
				fail_msg("%s: tensor %s overlaps the previous one", ctx, info.name);
			prev_end = d + v.nbytes;
		}
		fst_view_release(&v);
		assert_null(v.buffer);
		assert_null(v.data);
		bytes += info.nbytes;
		k++;
	}
	assert_int_equal(fst_buffer_tensor_count(buf), k);
	assert_int_equal(fst_buffer_tensor_bytes(buf), bytes);
	assert_int_equal(fst_buffer_find(buf, "no such tensor"), -1);
	fst_tensor_view v;
	assert_int_equal(fst_buffer_tensor(buf, k, &v), FST_EUSAGE);
	if (mapped)
		assert_int_equal(fst_buffer_size(buf), 0);
	else
		assert_true(fst_buffer_size(buf) >= bytes);
	const char *why = fst_buffer_describe(buf);
	assert_non_null(why);
	assert_true(strlen(why) > 10);
	switch (o->io) {
	case FST_IO_PREAD: assert_has(why, "pread, "); break;
	case FST_IO_URING: assert_has(why, "uring, "); break;
	case FST_IO_MMAP: assert_has(why, "mmap"); break;
	default: assert_has(why, "auto: "); break;
	}
}

/* Streaming: each view is checked the moment it is handed out. Returns the
 * buffer from finish. */
static fst_buffer *load_streaming(const fst_checkpoint *ck, const lh_files *fs,
				  const fst_load_opts *o, const lh_filter *flt, const char *ctx)
{
	size_t n = fst_checkpoint_tensor_count(ck);
	/* buffer index -> checkpoint entry, for the selected tensors */
	size_t *entry = calloc(n + 1, sizeof *entry), nsel = 0;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info info;
		fst_checkpoint_tensor(ck, i, &info, NULL);
		if (!flt || lh_keeps(flt, info.name))
			entry[nsel++] = i;
	}
	fst_loader *ld;
	fst_error err;
	if (fst_load_start(ck, o, &ld, &err))
		fail_msg("%s: start: %s", ctx, err.message);
	unsigned char *seen = calloc(nsel + 1, 1);
	fst_tensor_view *views = calloc(nsel + 1, sizeof *views);
	size_t got = 0;
	uint32_t align = o->align ? o->align : 256;
	for (;;) {
		fst_tensor_view v;
		int rc = fst_loader_next(ld, &v, &err);
		if (rc == 0)
			break;
		if (rc != 1)
			fail_msg("%s: next: %d %s", ctx, rc, err.message);
		if (v.index >= nsel || seen[v.index]++)
			fail_msg("%s: tensor index %zu handed out twice or out of range", ctx,
				 v.index);
		check_view(ck, fs, entry[v.index], &v, align, o->io == FST_IO_MMAP, ctx);
		uint64_t done, total;
		fst_loader_progress(ld, &done, &total);
		assert_true(done <= total);
		views[got++] = v;
		/* release some views before finish, keep others past it */
		if (got % 2)
			fst_view_release(&views[got - 1]);
	}
	if (got != nsel)
		fail_msg("%s: %zu tensors handed out, %zu selected", ctx, got, nsel);
	fst_tensor_view extra;
	assert_int_equal(fst_loader_next(ld, &extra, NULL), 0); /* still the end */
	fst_buffer *buf;
	if (fst_loader_finish(ld, &buf, &err))
		fail_msg("%s: finish: %s", ctx, err.message);
	assert_non_null(buf);
	for (size_t i = 0; i < got; i++) {
		if (views[i].buffer) {
			assert_ptr_equal(views[i].buffer, buf);
			check_view(ck, fs, entry[views[i].index], &views[i], align,
				   o->io == FST_IO_MMAP, ctx);
		}
		fst_view_release(&views[i]);
	}
	free(views);
	free(seen);
	free(entry);
	return buf;
}

/* ---- random loads */

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
				buf = load_streaming(ck, &fs, &o, filtered ? &flt : NULL, ctx);
			} else if (fst_load(ck, &o, &buf, &err)) {
				fail_msg("%s: %s", ctx, err.message);
			}
			check_buffer(ck, &fs, buf, &o, filtered ? &flt : NULL, ctx);
			fst_buffer_release(buf);
			loads++;
		}
		lh_files_free(&fs);
		fst_checkpoint_close(ck);
		assert_int_equal(fsti_live_allocations(), allocs);
		assert_int_equal(lh_count_fds(), fds);
	}
	assert_int_equal(loads, 160);
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
			fst_load_opts o;
			fst_load_opts_init(&o);
			o.io = ios[k];
			o.threads = t;
			o.chunk_bytes = 4096 * t;
			o.align = 1u << (2 * t);
			char ctx[100];
			snprintf(ctx, sizeof ctx, "io=%s threads=%u", lh_io_name(o.io), t);
			fst_buffer *buf;
			fst_error err;
			if (fst_load(ck, &o, &buf, &err))
				fail_msg("%s: %s", ctx, err.message);
			check_buffer(ck, &fs, buf, &o, NULL, ctx);
			fst_buffer_release(buf);
		}
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

/* ---- lifetimes */

static void test_views_outlive_buffer_and_checkpoint(void **state)
{
	(void)state;
	long allocs = fsti_live_allocations();
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	for (int k = 0; k < 4; k++) {
		lh_shape sh = {3, 10, 50000, 20, 10, false};
		lh_ckpt lc;
		lh_write_random("alive", lh_base_seed() + 50 + (uint64_t)k, &sh, &lc);
		fst_checkpoint *ck = lh_open(lc.path);
		lh_files fs;
		lh_files_read(ck, &fs);
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = ios[k];
		fst_buffer *buf;
		fst_error err;
		if (fst_load(ck, &o, &buf, &err))
			fail_msg("%s: %s", lh_io_name(o.io), err.message);
		size_t n = fst_buffer_tensor_count(buf);
		assert_int_equal(n, fst_checkpoint_tensor_count(ck));
		fst_tensor_view *v = calloc(n + 1, sizeof *v);
		unsigned char **want = calloc(n + 1, sizeof *want);
		for (size_t i = 0; i < n; i++) {
			assert_int_equal(fst_buffer_tensor(buf, i, &v[i]), 0);
			fst_tensor_info info;
			const unsigned char *w = lh_expected(ck, &fs, i, &info);
			want[i] = malloc(info.nbytes + 1);
			memcpy(want[i], w, info.nbytes);
		}
		/* retain/release pairs keep it too */
		fst_buffer_retain(buf);
		fst_buffer_release(buf);
		fst_buffer_release(buf);
		fst_checkpoint_close(ck);
		lh_files_free(&fs);
		/* names, shapes and bytes are still there (ASan checks the reads) */
		for (size_t i = 0; i < n; i++) {
			char name[64];
			snprintf(name, sizeof name, "%s", v[i].name);
			assert_true(name[0] == 'f');
			for (uint32_t d = 0; d < v[i].ndim; d++)
				assert_true(v[i].shape[d] < (1u << 30));
			lh_assert_bytes(name, v[i].data, want[i], v[i].nbytes);
			assert_int_equal(fst_buffer_find(v[i].buffer, v[i].name), (long)i);
		}
		for (size_t i = 0; i < n; i++) {
			fst_view_release(&v[i]);
			free(want[i]);
		}
		fst_view_release(NULL);
		fst_view_release(&v[0]); /* already released: a no-op */
		free(v);
		free(want);
		assert_int_equal(fsti_live_allocations(), allocs);
	}
	fst_buffer_release(NULL);
}

/* ---- a larger checkpoint for cancellation and progress */

static lh_ckpt big;

static void write_big(void)
{
	if (big.path[0])
		return;
	/* one shard of 96 tensors of 96 KiB: 9 MiB, 2304 chunks of 4 KiB */
	snprintf(big.dir, sizeof big.dir, "%s/big", test_tmpdir());
	mkdir(big.dir, 0755);
	snprintf(big.path, sizeof big.path, "%s/big.safetensors", big.dir);
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	static struct lh_fill_ctx ctxs[96];
	for (unsigned t = 0; t < 96; t++) {
		char name[32];
		snprintf(name, sizeof name, "big.%u", t);
		uint64_t shape[2] = {48, 1024};
		ctxs[t].key = lh_mix(t + 1000);
		assert_int_equal(fst_writer_add_fill(w, name, FST_DTYPE_BF16, 2, shape, lh_fill,
						     &ctxs[t], &err),
				 0);
	}
	assert_int_equal(fst_writer_finish(w, big.path, &err), 0);
	fst_writer_free(w);
}

static void test_cancel_mid_load(void **state)
{
	(void)state;
	write_big();
	fst_checkpoint *ck = lh_open(big.path);
	lh_files fs;
	lh_files_read(ck, &fs);
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	for (int k = 0; k < 4; k++) {
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
		check_view(ck, &fs, v.index, &v, 256, o.io == FST_IO_MMAP, lh_io_name(o.io));
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
		check_view(ck, &fs, v.index, &v, 256, o.io == FST_IO_MMAP, lh_io_name(o.io));
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
	write_big();
	fst_checkpoint *ck = lh_open(big.path);
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	for (int round = 0; round < 12; round++) {
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = round % 2 ? FST_IO_URING : FST_IO_PREAD;
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

static void test_free_without_finish(void **state)
{
	(void)state;
	write_big();
	fst_checkpoint *ck = lh_open(big.path);
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	for (int k = 0; k < 4; k++)
		for (int nexts = 0; nexts < 3; nexts++) {
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

/* ---- progress */

struct progress_log {
	uint64_t done[100000], total[100000];
	size_t n;
	bool non_monotonic;
};

static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct progress_log *l = ctx;
	if (l->n && done < l->done[l->n - 1])
		l->non_monotonic = true;
	if (l->n < sizeof l->done / sizeof l->done[0]) {
		l->done[l->n] = done;
		l->total[l->n] = total;
		l->n++;
	}
}

static void test_progress(void **state)
{
	(void)state;
	write_big();
	fst_checkpoint *ck = lh_open(big.path);
	uint64_t total = fst_checkpoint_total_bytes(ck);
	struct progress_log *l = calloc(1, sizeof *l);
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	for (int k = 0; k < 4; k++) {
		memset(l, 0, sizeof *l);
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = ios[k];
		o.threads = 2;
		o.chunk_bytes = 4096;
		o.progress = on_progress;
		o.progress_ctx = l;
		fst_buffer *buf;
		fst_error err;
		double t0 = test_now_s();
		if (fst_load(ck, &o, &buf, &err))
			fail_msg("%s: %s", lh_io_name(o.io), err.message);
		double dt = test_now_s() - t0;
		assert_true(l->n >= 1);
		assert_false(l->non_monotonic);
		for (size_t i = 0; i < l->n; i++) {
			assert_int_equal(l->total[i], total);
			assert_true(l->done[i] <= total);
		}
		assert_int_equal(l->done[l->n - 1], total);
		/* "at most every 100 ms and once at the end". src/engine.c
		 * (wait_workers) calls progress at every wake-up of its condition
		 * variable, which every completed tensor broadcasts. */
		if ((double)l->n > dt / 0.1 + 2) {
			char detail[200];
			snprintf(detail, sizeof detail,
				 "io=%s: %zu progress calls in %.3f s: more than one per 100 ms",
				 lh_io_name(o.io), l->n, dt);
			lh_known_bug("engine.c wait_workers progress rate", detail);
		}
		fst_buffer_release(buf);
	}
	/* an empty load still reports its end */
	memset(l, 0, sizeof *l);
	lh_filter none = {0, 0, 0};
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.filter = lh_filter_fn;
	o.filter_ctx = &none;
	o.progress = on_progress;
	o.progress_ctx = l;
	fst_buffer *buf;
	assert_int_equal(fst_load(ck, &o, &buf, NULL), 0);
	assert_int_equal(l->n, 1);
	assert_int_equal(l->done[0], 0);
	assert_int_equal(l->total[0], 0);
	fst_buffer_release(buf);
	free(l);
	fst_checkpoint_close(ck);
}

/* ---- the allocator hook */

struct alloc_log {
	unsigned allocs, frees;
	uint64_t size, freed_size;
	uint32_t align;
	int device_type, device_id;
	void *ptr, *freed, *raw;
	int mode; /* 0 aligned, 1 NULL, 2 misaligned */
};

static void *hook_alloc(void *ctx, uint64_t size, uint32_t align, int device_type,
			int device_id)
{
	struct alloc_log *l = ctx;
	l->allocs++;
	l->size = size;
	l->align = align;
	l->device_type = device_type;
	l->device_id = device_id;
	if (l->mode == 1)
		return NULL;
	size_t a = align < 4096 ? 4096 : align;
	if (posix_memalign(&l->raw, a, (size_t)size + a))
		return NULL;
	l->ptr = (char *)l->raw + (l->mode == 2 ? 1 : 0);
	return l->ptr;
}

static void hook_free(void *ctx, void *ptr, uint64_t size, int device_type, int device_id)
{
	struct alloc_log *l = ctx;
	l->frees++;
	l->freed = ptr;
	l->freed_size = size;
	assert_int_equal(device_type, FST_DEVICE_CPU);
	assert_int_equal(device_id, 0);
	if (ptr == l->ptr)
		free(l->raw);
}

static void test_allocator(void **state)
{
	(void)state;
	lh_shape sh = {3, 12, 100000, 10, 10, false};
	lh_ckpt lc;
	lh_write_random("alloc", lh_base_seed() + 77, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	lh_files fs;
	lh_files_read(ck, &fs);
	long allocs = fsti_live_allocations();
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_AUTO};
	static const uint32_t aligns[] = {0, 1, 64, 4096};
	for (int k = 0; k < 3; k++)
		for (int a = 0; a < 4; a++) {
			struct alloc_log l = {0};
			fst_allocator hook = {hook_alloc, hook_free, &l};
			fst_load_opts o;
			fst_load_opts_init(&o);
			o.io = ios[k];
			o.align = aligns[a];
			o.threads = 2;
			o.chunk_bytes = 4096;
			o.allocator = &hook;
			uint32_t align = o.align ? o.align : 256;
			struct fsti_plan p;
			assert_int_equal(fsti_plan_build(ck, NULL, NULL, align, 4096, true, &p, NULL),
					 0);
			uint64_t want = p.dst_size ? p.dst_size : 1;
			fsti_plan_free(&p);
			fst_buffer *buf;
			fst_error err;
			if (fst_load(ck, &o, &buf, &err))
				fail_msg("io=%s: %s", lh_io_name(o.io), err.message);
			assert_int_equal(l.allocs, 1);
			assert_int_equal(l.size, want);
			assert_int_equal(l.align, align);
			assert_int_equal(l.device_type, FST_DEVICE_CPU);
			assert_int_equal(l.device_id, 0);
			assert_int_equal(fst_buffer_size(buf), want);
			check_buffer(ck, &fs, buf, &o, NULL, "allocator");
			/* the data lives in the caller's block */
			fst_tensor_view v;
			assert_int_equal(fst_buffer_tensor(buf, 0, &v), 0);
			assert_true((char *)v.data >= (char *)l.ptr &&
				    (char *)v.data < (char *)l.ptr + want);
			fst_buffer_release(buf);
			assert_int_equal(l.frees, 0); /* the view still holds it */
			fst_view_release(&v);
			assert_int_equal(l.frees, 1);
			assert_ptr_equal(l.freed, l.ptr);
			assert_int_equal(l.freed_size, want);
			assert_int_equal(fsti_live_allocations(), allocs);
		}

	/* mmap never allocates */
	struct alloc_log l = {0};
	fst_allocator hook = {hook_alloc, hook_free, &l};
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = FST_IO_MMAP;
	o.allocator = &hook;
	fst_buffer *buf;
	fst_error err;
	assert_int_equal(fst_load(ck, &o, &buf, &err), 0);
	fst_buffer_release(buf);
	assert_int_equal(l.allocs + l.frees, 0);

	/* NULL: out of memory, nothing to free */
	memset(&l, 0, sizeof l);
	l.mode = 1;
	o.io = FST_IO_PREAD;
	buf = (fst_buffer *)&l;
	assert_int_equal(fst_load(ck, &o, &buf, &err), FST_ENOMEM);
	assert_null(buf);
	assert_int_equal(err.code, FST_ENOMEM);
	assert_has(err.message, "allocator");
	assert_int_equal(l.allocs, 1);
	assert_int_equal(l.frees, 0);
	assert_int_equal(fsti_live_allocations(), allocs);

	/* misaligned: a usage error, and the block goes back to the caller */
	memset(&l, 0, sizeof l);
	l.mode = 2;
	o.align = 64;
	assert_int_equal(fst_load(ck, &o, &buf, &err), FST_EUSAGE);
	assert_null(buf);
	assert_has(err.message, "aligned");
	assert_int_equal(l.allocs, 1);
	assert_int_equal(l.frees, 1);
	assert_ptr_equal(l.freed, l.ptr);
	assert_int_equal(fsti_live_allocations(), allocs);

	/* alloc without free */
	fst_allocator half = {hook_alloc, NULL, &l};
	memset(&l, 0, sizeof l);
	o.allocator = &half;
	assert_int_equal(fst_load(ck, &o, &buf, &err), FST_EUSAGE);
	assert_has(err.message, "free");
	assert_int_equal(l.allocs, 0);
	assert_int_equal(fsti_live_allocations(), allocs);

	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

/* ---- bad options */

static void expect_usage(const fst_checkpoint *ck, const fst_load_opts *o, int code,
			 const char *needle)
{
	long allocs = fsti_live_allocations();
	fst_buffer *buf = (fst_buffer *)&buf;
	fst_error err;
	int rc = fst_load(ck, o, &buf, &err);
	if (rc != code)
		fail_msg("expected %d (%s), got %d: %s", code, needle, rc, err.message);
	assert_int_equal(err.code, code);
	assert_null(buf);
	assert_has(err.message, needle);
	fst_loader *ld = (fst_loader *)&ld;
	assert_int_equal(fst_load_start(ck, o, &ld, &err), code);
	assert_null(ld);
	assert_int_equal(fsti_live_allocations(), allocs);
}

static void test_bad_options(void **state)
{
	(void)state;
	lh_shape sh = {1, 4, 100, 0, 0, false};
	lh_ckpt lc;
	lh_write_random("badopts", 3, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	fst_load_opts o;

	fst_load_opts_init(&o);
	o.align = 3;
	expect_usage(ck, &o, FST_EUSAGE, "align 3");
	o.align = 48;
	expect_usage(ck, &o, FST_EUSAGE, "align 48");

	fst_load_opts_init(&o);
	o.chunk_bytes = 1;
	expect_usage(ck, &o, FST_EUSAGE, "chunk size 1");
	o.chunk_bytes = (1ull << 30) + 1;
	expect_usage(ck, &o, FST_EUSAGE, "chunk size");

	fst_load_opts_init(&o);
	o.io = 7;
	expect_usage(ck, &o, FST_EUSAGE, "io method 7");
	o.io = -1;
	expect_usage(ck, &o, FST_EUSAGE, "io method -1");

	fst_load_opts_init(&o);
	o.gds = 5;
	expect_usage(ck, &o, FST_EUSAGE, "gds");

	fst_load_opts_init(&o);
	o.threads = 65;
	expect_usage(ck, &o, FST_EUSAGE, "65 threads");

	static const char *const bad_devices[] = {"gpu", "", "cuda:", "cuda:x", "cuda:-1",
						  "CPU", "cuda0"};
	for (size_t i = 0; i < sizeof bad_devices / sizeof bad_devices[0]; i++) {
		fst_load_opts_init(&o);
		o.device = bad_devices[i];
		char needle[64];
		snprintf(needle, sizeof needle, "device \"%s\"", bad_devices[i]);
		expect_usage(ck, &o, FST_EUSAGE, needle);
	}

	fst_load_opts_init(&o);
	o.struct_size = 0;
	expect_usage(ck, &o, FST_EUSAGE, "fst_load_opts_init");
	o.struct_size = sizeof o + 8;
	expect_usage(ck, &o, FST_EUSAGE, "fst_load_opts_init");

	/* a GPU on this machine: a clean error, not a crash (or, where a GPU
	 * and the CUDA target exist, a load) */
	static const char *const gpus[] = {"cuda", "cuda:0", "cuda:7"};
	for (size_t i = 0; i < 3; i++) {
		fst_load_opts_init(&o);
		o.device = gpus[i];
		long allocs = fsti_live_allocations();
		fst_buffer *buf = NULL;
		fst_error err;
		int rc = fst_load(ck, &o, &buf, &err);
		if (rc == 0) {
			fst_buffer_release(buf);
			continue;
		}
		if (rc != FST_EUNSUPPORTED && rc != FST_EDEVICE)
			fail_msg("device %s: %d: %s", gpus[i], rc, err.message);
		assert_null(buf);
		assert_true(strlen(err.message) > 10);
		assert_has(err.message, "cuda");
		assert_int_equal(fsti_live_allocations(), allocs);
	}
	/* io=mmap gives views of files: the CPU only */
	fst_load_opts_init(&o);
	o.io = FST_IO_MMAP;
	o.device = "cuda:0";
	fst_buffer *buf = NULL;
	fst_error err;
	assert_true(fst_load(ck, &o, &buf, &err) < 0);
	assert_null(buf);

	/* missing arguments */
	fst_load_opts_init(&o);
	assert_int_equal(fst_load(NULL, &o, &buf, &err), FST_EUSAGE);
	assert_int_equal(fst_load(ck, &o, NULL, &err), FST_EUSAGE);
	assert_int_equal(fst_load_start(ck, &o, NULL, &err), FST_EUSAGE);
	fst_tensor_view v;
	assert_int_equal(fst_loader_next(NULL, &v, &err), FST_EUSAGE);
	assert_int_equal(fst_loader_finish(NULL, &buf, &err), FST_EUSAGE);
	assert_null(buf);
	fst_loader *ld;
	assert_int_equal(fst_load_start(ck, &o, &ld, &err), 0);
	assert_int_equal(fst_loader_next(ld, NULL, &err), FST_EUSAGE);
	assert_int_equal(fst_loader_finish(ld, NULL, &err), 0); /* the buffer dropped */
	/* NULL options are the defaults */
	assert_int_equal(fst_load(ck, NULL, &buf, &err), 0);
	assert_has(fst_buffer_describe(buf), "auto");
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
}

/* ---- io=mmap with mmap_private: writable views that never reach the file */

static void test_mmap_private(void **state)
{
	(void)state;
	char *path = test_path("mmap-private.safetensors");
	const char *header = "{\"x\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}";
	const unsigned char data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	write_raw(path, header, strlen(header), data, sizeof data);
	fst_checkpoint *ck = lh_open(path);
	fst_load_opts o;
	fst_error err;
	fst_buffer *shared, *priv, *copied;
	fst_load_opts_init(&o);
	o.io = FST_IO_MMAP;
	assert_int_equal(fst_load(ck, &o, &shared, &err), 0);
	assert_true(fst_buffer_read_only(shared));
	assert_has(fst_buffer_describe(shared), "read-only");
	o.mmap_private = 1;
	assert_int_equal(fst_load(ck, &o, &priv, &err), 0);
	assert_false(fst_buffer_read_only(priv));
	assert_has(fst_buffer_describe(priv), "copy-on-write");
	fst_tensor_view vp, vs;
	assert_int_equal(fst_buffer_tensor(priv, 0, &vp), 0);
	assert_int_equal(fst_buffer_tensor(shared, 0, &vs), 0);
	assert_int_equal(fst_buffer_size(priv), 0); /* a view of the file, no allocation */
	((unsigned char *)vp.data)[3] = 99;
	/* the shared mapping, another load and the file keep the file's bytes */
	assert_int_equal(((unsigned char *)vs.data)[3], 4);
	uint64_t size;
	unsigned char *bytes = lh_slurp(path, &size);
	assert_int_equal(bytes[size - 8 + 3], 4);
	free(bytes);
	o.io = FST_IO_PREAD; /* mmap_private means nothing for copies */
	assert_int_equal(fst_load(ck, &o, &copied, &err), 0);
	assert_false(fst_buffer_read_only(copied));
	fst_tensor_view vc;
	assert_int_equal(fst_buffer_tensor(copied, 0, &vc), 0);
	assert_memory_equal(vc.data, data, sizeof data);
	fst_view_release(&vc);
	fst_view_release(&vp);
	fst_view_release(&vs);
	fst_buffer_release(copied);
	fst_buffer_release(priv);
	fst_buffer_release(shared);
	fst_checkpoint_close(ck);
}

/* ---- empty loads */

static void check_empty_load(const fst_checkpoint *ck, fst_load_opts *o, size_t want_tensors)
{
	for (int io = FST_IO_AUTO; io <= FST_IO_MMAP; io++) {
		o->io = io;
		fst_buffer *buf;
		fst_error err;
		if (fst_load(ck, o, &buf, &err))
			fail_msg("io=%s: %s", lh_io_name(io), err.message);
		assert_int_equal(fst_buffer_tensor_count(buf), want_tensors);
		assert_int_equal(fst_buffer_tensor_bytes(buf), 0);
		assert_true(strlen(fst_buffer_describe(buf)) > 0);
		for (size_t i = 0; i < want_tensors; i++) {
			fst_tensor_view v;
			assert_int_equal(fst_buffer_tensor(buf, i, &v), 0);
			assert_int_equal(v.nbytes, 0);
			fst_view_release(&v);
		}
		fst_buffer_release(buf);
		/* streaming: every tensor once, then the end */
		fst_loader *ld;
		assert_int_equal(fst_load_start(ck, o, &ld, &err), 0);
		fst_tensor_view v;
		size_t got = 0;
		int rc;
		while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
			fst_view_release(&v);
			got++;
		}
		assert_int_equal(rc, 0);
		assert_int_equal(got, want_tensors);
		uint64_t done = 1, total = 1;
		fst_loader_progress(ld, &done, &total);
		assert_int_equal(total, 0);
		assert_int_equal(fst_loader_finish(ld, &buf, &err), 0);
		assert_int_equal(fst_buffer_tensor_count(buf), want_tensors);
		fst_buffer_release(buf);
	}
}

static void test_empty_loads(void **state)
{
	(void)state;
	long allocs = fsti_live_allocations();
	/* a file with no tensors */
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	const char *path = test_path("empty.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	fst_checkpoint *ck = lh_open(path);
	assert_int_equal(fst_checkpoint_tensor_count(ck), 0);
	fst_load_opts o;
	fst_load_opts_init(&o);
	check_empty_load(ck, &o, 0);
	fst_checkpoint_close(ck);

	/* only 0-byte tensors: no chunk, no reader thread */
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	uint64_t s0[2] = {0, 5};
	assert_int_equal(fst_writer_add(w, "e1", FST_DTYPE_F32, 2, s0, NULL, 0, &err), 0);
	assert_int_equal(fst_writer_add(w, "e2", FST_DTYPE_U8, 1, s0, NULL, 0, &err), 0);
	path = test_path("zeros.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	ck = lh_open(path);
	fst_load_opts_init(&o);
	o.threads = 4;
	check_empty_load(ck, &o, 2);
	fst_checkpoint_close(ck);

	/* a filter selecting nothing */
	lh_shape sh = {3, 8, 10000, 0, 0, false};
	lh_ckpt lc;
	lh_write_random("nothing", 21, &sh, &lc);
	ck = lh_open(lc.path);
	lh_filter none = {0, 0, 0};
	fst_load_opts_init(&o);
	o.filter = lh_filter_fn;
	o.filter_ctx = &none;
	check_empty_load(ck, &o, 0);
	assert_true(none.calls > 0);
	fst_checkpoint_close(ck);
	assert_int_equal(fsti_live_allocations(), allocs);
}

/* ---- checkpoints of memory images */

static void test_memory_images(void **state)
{
	(void)state;
	lh_shape sh = {2, 10, 30000, 10, 10, false};
	lh_ckpt lc;
	lh_write_random("memimg", 33, &sh, &lc);
	fst_checkpoint *disk = lh_open(lc.dir);
	size_t nf = fst_checkpoint_file_count(disk);
	lh_files fs;
	lh_files_read(disk, &fs);
	long allocs = fsti_live_allocations();
	for (int io = FST_IO_AUTO; io <= FST_IO_MMAP; io++) {
		/* images named like the files on disk, whose bytes differ: a
		 * reader must use the image, never open the name */
		fst_file *files[8];
		unsigned char *img[8];
		for (size_t f = 0; f < nf; f++) {
			img[f] = malloc(fs.size[f]);
			memcpy(img[f], fs.bytes[f], fs.size[f]);
			assert_int_equal(fst_file_open_memory(img[f], fs.size[f],
							      fst_file_path(fst_checkpoint_file(disk, f)),
							      &files[f], NULL),
					 0);
		}
		fst_checkpoint *ck;
		assert_int_equal(fst_checkpoint_from_files(files, nf, &ck, NULL), 0);
		/* scramble the disk files' data (same size): any read of them shows */
		for (size_t f = 0; f < nf; f++) {
			const fst_file *ff = fst_checkpoint_file(disk, f);
			int fd = open(fst_file_path(ff), O_WRONLY);
			assert_true(fd >= 0);
			uint64_t d = fst_file_data_offset(ff), n = fs.size[f] - d;
			unsigned char *junk = malloc(n + 1);
			memset(junk, 0xa5, n);
			assert_int_equal(pwrite(fd, junk, n, (off_t)d), (ssize_t)n);
			close(fd);
			free(junk);
		}
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = io;
		o.threads = 2;
		o.chunk_bytes = 4096;
		fst_buffer *buf = NULL;
		fst_error err;
		int rc = fst_load(ck, &o, &buf, &err);
		if (io == FST_IO_MMAP) {
			assert_int_equal(rc, FST_EUNSUPPORTED);
			assert_has(err.message, "memory");
		} else {
			if (rc)
				fail_msg("io=%s on memory images: %d: %s", lh_io_name(io), rc,
					 err.message);
			check_buffer(ck, &fs, buf, &o, NULL, "memory images");
			fst_buffer_release(buf);
		}
		fst_checkpoint_close(ck);
		for (size_t f = 0; f < nf; f++) {
			free(img[f]);
			/* put the disk files' bytes back */
			const fst_file *ff = fst_checkpoint_file(disk, f);
			int fd = open(fst_file_path(ff), O_WRONLY);
			assert_int_equal(pwrite(fd, fs.bytes[f], fs.size[f], 0), (ssize_t)fs.size[f]);
			close(fd);
		}
		assert_int_equal(fsti_live_allocations(), allocs);
	}
	lh_files_free(&fs);
	fst_checkpoint_close(disk);
}

/* ---- concurrency: loads of one checkpoint from several threads */

struct concurrent {
	const fst_checkpoint *ck;
	const lh_files *fs;
	int io;
	int rc;
	char msg[FST_ERROR_MSG_MAX];
};

static void *load_thread(void *arg)
{
	struct concurrent *c = arg;
	for (int i = 0; i < 5 && !c->rc; i++) {
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = c->io;
		o.threads = 2;
		o.chunk_bytes = 8192;
		fst_buffer *buf;
		fst_error err;
		if ((c->rc = fst_load(c->ck, &o, &buf, &err))) {
			snprintf(c->msg, sizeof c->msg, "%s", err.message);
			break;
		}
		for (size_t t = 0; t < fst_buffer_tensor_count(buf); t++) {
			fst_tensor_view v;
			fst_buffer_tensor(buf, t, &v);
			fst_tensor_info info;
			const unsigned char *want = lh_expected(c->ck, c->fs, t, &info);
			if (memcmp(v.data, want, info.nbytes)) {
				c->rc = -100;
				snprintf(c->msg, sizeof c->msg, "tensor %s differs", info.name);
			}
			fst_view_release(&v);
		}
		fst_buffer_release(buf);
	}
	return NULL;
}

static void test_concurrent_loads(void **state)
{
	(void)state;
	lh_shape sh = {3, 12, 200000, 20, 5, false};
	lh_ckpt lc;
	lh_write_random("concurrent", lh_base_seed() + 99, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	lh_files fs;
	lh_files_read(ck, &fs);
	struct concurrent c[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		c[i] = (struct concurrent){ck, &fs, i, 0, ""};
		assert_int_equal(pthread_create(&th[i], NULL, load_thread, &c[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		if (c[i].rc)
			fail_msg("io=%s: %d: %s", lh_io_name(c[i].io), c[i].rc, c[i].msg);
	}
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

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
			check_view(ck, fs, (size_t)entry, &v, align, false, ctx);
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
	check_buffer(ck, fs, buf, o, flt, ctx);
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
			check_view(ck, fs, (size_t)entry, &v, 256, false, ctx);
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
		check_buffer(ck, &fs, buf, &o, NULL, "after the failures");
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
			buf = load_streaming(ck, &fs, &o, NULL, "mmap streaming");
		fst_error err;
		if (!stream && fst_load(ck, &o, &buf, &err))
			fail_msg("mmap: %s", err.message);
		check_buffer(ck, &fs, buf, &o, NULL, "mmap");
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
		expect_usage(ck, &o, FST_EUSAGE, "landed_block");
		o.io = FST_IO_URING;
		expect_usage(ck, &o, FST_EUSAGE, "landed_block");
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
		cmocka_unit_test(test_random_loads),
		cmocka_unit_test(test_every_io_and_threads),
		cmocka_unit_test(test_views_outlive_buffer_and_checkpoint),
		cmocka_unit_test(test_cancel_mid_load),
		cmocka_unit_test(test_cancel_from_another_thread),
		cmocka_unit_test(test_free_without_finish),
		cmocka_unit_test(test_progress),
		cmocka_unit_test(test_allocator),
		cmocka_unit_test(test_bad_options),
		cmocka_unit_test(test_empty_loads),
		cmocka_unit_test(test_memory_images),
		cmocka_unit_test(test_concurrent_loads),
		cmocka_unit_test(test_landed_pieces),
		cmocka_unit_test(test_landed_before_ready),
		cmocka_unit_test(test_landed_errors),
		cmocka_unit_test(test_landed_mmap_empty_and_bad_block),
		cmocka_unit_test(test_mmap_private),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
