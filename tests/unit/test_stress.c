/* Description: concurrency stress. Ten random checkpoints (fst_writer:
 * several shards, misaligned data offsets and header padding, odd-sized,
 * empty, scalar and sub-byte tensors, a few MB each) are loaded by 8 threads
 * at once, 50 loads each: every load picks a checkpoint, io = pread, uring,
 * mmap or auto, 1 to 3 reader threads, a chunk size, a staging budget and an
 * alignment at random; some use the streaming API, some are cancelled midway
 * (from the loading thread or from another one) or dropped with
 * fst_loader_free, some use a name filter, and about half use one
 * fst_checkpoint handle shared by all threads (which also serve
 * fst_load_explain and lookups from it meanwhile). Every tensor handed out
 * or in a finished buffer must equal an independent read(2) of the file; a
 * cancelled load must end with FST_ECANCELED (or succeed if it was done).
 * A second test shares one loaded buffer between threads that take and drop
 * views while the owner's reference goes. Built to run clean under
 * ThreadSanitizer (make tsan); FST_TEST_SEED replays another seed. The
 * worker threads never call cmocka: they record their first failure and the
 * main thread reports it. */
#include "engine.h"
#include "load_helpers.h"

#include <pthread.h>
#include <time.h>

#define NCKPT 10
#define NTHREADS 8
#define LOADS 50

/* What every thread reads and nobody writes once the threads run. */
struct corpus {
	lh_ckpt lc[NCKPT];
	fst_checkpoint *ck[NCKPT]; /* the handles shared by all threads */
	lh_files fs[NCKPT];        /* the files' bytes, read with read(2) */
};

enum mode {
	MODE_LOAD,          /* fst_load */
	MODE_STREAM,        /* fst_load_start, next until the end, finish */
	MODE_CANCEL,        /* streaming, cancelled after some tensors */
	MODE_CANCEL_THREAD, /* streaming, cancelled by another thread */
	MODE_FREE,          /* streaming, fst_loader_free midway */
	MODE_COUNT
};

struct worker {
	const struct corpus *c;
	unsigned id;
	uint64_t seed;
	char ctx[1024];  /* the load being run, for messages */
	char fail[2304]; /* the first failure; empty when all went well */
	unsigned loads, shared, filtered, canceled, cancel_late, io[4], mode[MODE_COUNT];
};

#define W_FAIL(w, ...)                                                                 \
	do {                                                                               \
		if (!(w)->fail[0]) {                                                       \
			int n_ = snprintf((w)->fail, sizeof (w)->fail, "thread %u: %s: ",  \
					  (w)->id, (w)->ctx);                              \
			if (n_ > 0 && (size_t)n_ < sizeof (w)->fail)                       \
				snprintf((w)->fail + n_, sizeof (w)->fail - (size_t)n_,    \
					 __VA_ARGS__);                                     \
		}                                                                          \
		return false;                                                              \
	} while (0)

/* The selected entries of checkpoint table ck (buffer index -> entry). */
static size_t selected(const fst_checkpoint *ck, const lh_filter *flt, size_t *entry)
{
	size_t n = fst_checkpoint_tensor_count(ck), k = 0;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info info;
		fst_checkpoint_tensor(ck, i, &info, NULL);
		if (!flt || lh_keeps(flt, info.name))
			entry[k++] = i;
	}
	return k;
}

/* One view against entry i of the shared table of checkpoint k. */
static bool check_view(struct worker *w, size_t k, size_t i, const fst_tensor_view *v,
		       uint32_t align, bool mapped)
{
	const fst_checkpoint *ck = w->c->ck[k];
	const lh_files *fs = &w->c->fs[k];
	fst_tensor_info info;
	size_t file;
	if (fst_checkpoint_tensor(ck, i, &info, &file))
		W_FAIL(w, "no checkpoint tensor %zu", i);
	if (!v->buffer || !v->name || strcmp(v->name, info.name))
		W_FAIL(w, "view %zu is \"%s\", want \"%s\"", v->index, v->name ? v->name : "(null)",
		       info.name);
	if (v->dtype != info.dtype || v->ndim != info.ndim || v->nbytes != info.nbytes)
		W_FAIL(w, "tensor %s: dtype %d ndim %u nbytes %" PRIu64 ", want %d %u %" PRIu64,
		       info.name, (int)v->dtype, v->ndim, v->nbytes, (int)info.dtype, info.ndim,
		       info.nbytes);
	for (uint32_t d = 0; d < info.ndim; d++)
		if (v->shape[d] != info.shape[d])
			W_FAIL(w, "tensor %s: dim %u is %" PRIu64 ", want %" PRIu64, info.name, d,
			       v->shape[d], info.shape[d]);
	if (v->device_type != FST_DEVICE_CPU || v->device_id != 0)
		W_FAIL(w, "tensor %s: device %d:%d", info.name, v->device_type, v->device_id);
	if (!mapped && (uintptr_t)v->data % align)
		W_FAIL(w, "tensor %s at %p is not aligned to %u", info.name, v->data, align);
	if (file >= fs->n || info.file_offset + info.nbytes > fs->size[file])
		W_FAIL(w, "tensor %s lies outside its file", info.name);
	const unsigned char *want = fs->bytes[file] + info.file_offset;
	if (info.nbytes && memcmp(v->data, want, (size_t)info.nbytes)) {
		const unsigned char *g = v->data;
		uint64_t b = 0;
		while (g[b] == want[b])
			b++;
		W_FAIL(w, "tensor %s: byte %" PRIu64 " of %" PRIu64 " differs: loaded 0x%02x, "
			  "file 0x%02x",
		       info.name, b, info.nbytes, g[b], want[b]);
	}
	return true;
}

/* A finished buffer: exactly the selected tensors, in table order, right. */
static bool check_buffer(struct worker *w, size_t k, fst_buffer *buf, const fst_load_opts *o,
			 const lh_filter *flt)
{
	const fst_checkpoint *ck = w->c->ck[k];
	size_t n = fst_checkpoint_tensor_count(ck);
	size_t *entry = calloc(n + 1, sizeof *entry);
	size_t nsel = selected(ck, flt, entry);
	uint32_t align = o->align ? o->align : 256;
	bool mapped = o->io == FST_IO_MMAP, ok = true;
	uint64_t bytes = 0;
	if (fst_buffer_tensor_count(buf) != nsel) {
		free(entry);
		W_FAIL(w, "%zu tensors in the buffer, %zu selected", fst_buffer_tensor_count(buf),
		       nsel);
	}
	for (size_t b = 0; ok && b < nsel; b++) {
		fst_tensor_info info;
		fst_checkpoint_tensor(ck, entry[b], &info, NULL);
		fst_tensor_view v;
		if (fst_buffer_find(buf, info.name) != (long)b || fst_buffer_tensor(buf, b, &v)) {
			free(entry);
			W_FAIL(w, "tensor %s is not at index %zu of the buffer", info.name, b);
		}
		ok = v.index == b && v.buffer == buf && check_view(w, k, entry[b], &v, align, mapped);
		fst_view_release(&v);
		bytes += info.nbytes;
	}
	free(entry);
	if (!ok)
		return false;
	if (fst_buffer_tensor_bytes(buf) != bytes)
		W_FAIL(w, "buffer holds %" PRIu64 " tensor bytes, want %" PRIu64,
		       fst_buffer_tensor_bytes(buf), bytes);
	if (mapped ? fst_buffer_size(buf) != 0 : fst_buffer_size(buf) < bytes)
		W_FAIL(w, "buffer size %" PRIu64 " for %" PRIu64 " bytes", fst_buffer_size(buf),
		       bytes);
	const char *why = fst_buffer_describe(buf);
	static const char *const want[] = {"auto: ", "pread, ", "uring, ", "mmap"};
	if (!why || !strstr(why, want[o->io]))
		W_FAIL(w, "describe \"%s\" lacks \"%s\"", why ? why : "(null)", want[o->io]);
	return true;
}

struct canceller {
	fst_loader *ld;
	unsigned delay_us;
};

static void *cancel_later(void *arg)
{
	struct canceller *c = arg;
	struct timespec ts = {0, (long)c->delay_us * 1000};
	nanosleep(&ts, NULL);
	fst_loader_cancel(c->ld);
	return NULL;
}

/*
 * The streaming forms. Views are checked as they are handed out; some are
 * kept past finish (or past a failed or dropped load: a view keeps its
 * buffer) and checked again at the end. *out gets the finished buffer.
 */
static bool stream(struct worker *w, lh_rng *r, size_t k, const fst_checkpoint *ck,
		   const fst_load_opts *o, const lh_filter *flt, enum mode mode, fst_buffer **out)
{
	*out = NULL;
	size_t n = fst_checkpoint_tensor_count(ck);
	size_t *entry = calloc(n + 1, sizeof *entry);
	size_t nsel = selected(w->c->ck[k], flt, entry);
	fst_tensor_view *kept = calloc(nsel + 1, sizeof *kept);
	unsigned char *seen = calloc(nsel + 1, 1);
	size_t nkept = 0, got = 0;
	uint32_t align = o->align ? o->align : 256;
	bool mapped = o->io == FST_IO_MMAP, ok = true, canceled = false;
	/* cancel or drop after this many tensors */
	size_t stop_after = nsel ? (size_t)lh_below(r, nsel + 1) : 0;
	fst_loader *ld = NULL;
	fst_error err;
	struct canceller cc;
	pthread_t th;
	bool thread_started = false;
	if (fst_load_start(ck, o, &ld, &err)) {
		free(entry);
		free(kept);
		free(seen);
		W_FAIL(w, "start: %s", err.message);
	}
	if (mode == MODE_CANCEL_THREAD) {
		cc = (struct canceller){ld, (unsigned)lh_below(r, 3000)};
		if (pthread_create(&th, NULL, cancel_later, &cc)) {
			fst_loader_free(ld);
			free(entry);
			free(kept);
			free(seen);
			W_FAIL(w, "pthread_create failed");
		}
		thread_started = true;
	}
	int rc = 0;
	for (;;) {
		if (mode == MODE_CANCEL && !canceled && got == stop_after) {
			fst_loader_cancel(ld);
			canceled = true;
		}
		if (mode == MODE_FREE && got == stop_after)
			break;
		fst_tensor_view v;
		memset(&v, 0, sizeof v);
		rc = fst_loader_next(ld, &v, &err);
		if (rc <= 0)
			break;
		if (rc != 1 || v.index >= nsel || seen[v.index]++) {
			fst_view_release(&v);
			ok = false;
			snprintf(w->ctx + strlen(w->ctx), sizeof w->ctx - strlen(w->ctx),
				 " (next: %d, index %zu)", rc, v.index);
			break;
		}
		got++;
		if (!check_view(w, k, entry[v.index], &v, align, mapped)) {
			fst_view_release(&v);
			ok = false;
			break;
		}
		if (lh_below(r, 2))
			kept[nkept++] = v;
		else
			fst_view_release(&v);
	}
	if (thread_started)
		pthread_join(th, NULL);
	bool cancels = mode == MODE_CANCEL || mode == MODE_CANCEL_THREAD;
	if (!ok) {
		fst_loader_free(ld);
		if (!w->fail[0])
			snprintf(w->fail, sizeof w->fail, "thread %u: %s: bad view", w->id, w->ctx);
	} else if (mode == MODE_FREE) {
		fst_loader_free(ld); /* cancels, waits, releases */
	} else {
		if (rc < 0 && !(cancels && rc == FST_ECANCELED && err.code == FST_ECANCELED)) {
			fst_loader_free(ld);
			ok = false;
			snprintf(w->fail, sizeof w->fail, "thread %u: %s: next: %d %s", w->id, w->ctx,
				 rc, err.message);
		} else if (rc == 0 && got != nsel) {
			fst_loader_free(ld);
			ok = false;
			snprintf(w->fail, sizeof w->fail,
				 "thread %u: %s: %zu tensors handed out, %zu selected", w->id, w->ctx,
				 got, nsel);
		} else {
			fst_buffer *buf = NULL;
			int frc = fst_loader_finish(ld, &buf, &err);
			if (frc == 0 && buf) {
				/* not cancelled, or done before the cancel took */
				if (cancels)
					w->cancel_late++;
				*out = buf;
			} else if (cancels && frc == FST_ECANCELED && !buf &&
				   err.code == FST_ECANCELED && strlen(err.message) > 5) {
				w->canceled++;
			} else {
				fst_buffer_release(buf);
				ok = false;
				snprintf(w->fail, sizeof w->fail, "thread %u: %s: finish: %d %s",
					 w->id, w->ctx, frc, err.message);
			}
		}
	}
	/* the kept views still hold their tensors, whatever became of the load */
	for (size_t i = 0; i < nkept; i++) {
		if (ok && *out && kept[i].buffer != *out) {
			ok = false;
			snprintf(w->fail, sizeof w->fail, "thread %u: %s: a view of another buffer",
				 w->id, w->ctx);
		}
		if (ok)
			ok = check_view(w, k, entry[kept[i].index], &kept[i], align, mapped);
		fst_view_release(&kept[i]);
	}
	free(entry);
	free(kept);
	free(seen);
	if (!ok) {
		fst_buffer_release(*out);
		*out = NULL;
	}
	return ok;
}

/* Read-only use of a shared handle while other threads load from it. */
static bool poke_shared(struct worker *w, lh_rng *r, size_t k)
{
	const fst_checkpoint *ck = w->c->ck[k];
	size_t n = fst_checkpoint_tensor_count(ck);
	if (n) {
		size_t i = (size_t)lh_below(r, n);
		fst_tensor_info info;
		if (fst_checkpoint_tensor(ck, i, &info, NULL) ||
		    fst_checkpoint_find(ck, info.name) != (long)i)
			W_FAIL(w, "lookup of tensor %zu", i);
	}
	if (fst_checkpoint_find(ck, "no such tensor") != -1)
		W_FAIL(w, "found a tensor that is not there");
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = (int)lh_below(r, 4);
	char text[512];
	fst_error err;
	if (fst_load_explain(ck, &o, text, sizeof text, &err) || strlen(text) < 10)
		W_FAIL(w, "explain: %s", err.message);
	return true;
}

static bool one_load(struct worker *w, lh_rng *r)
{
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP, FST_IO_AUTO};
	static const uint64_t chunks[] = {4096, 8192, 12288, 65536, 100000, 1u << 20, 0};
	static const uint64_t staging[] = {0, 1u << 20, 200000, 4u << 20};
	static const uint32_t aligns[] = {0, 1, 8, 64, 4096};
	size_t k = (size_t)lh_below(r, NCKPT);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = ios[lh_below(r, 4)];
	if (lh_io_skipped(o.io)) /* the probe ran before the threads */
		o.io = FST_IO_PREAD;
	o.threads = 1 + (unsigned)lh_below(r, 3);
	o.chunk_bytes = chunks[lh_below(r, 7)];
	o.staging_bytes = staging[lh_below(r, 4)];
	o.align = aligns[lh_below(r, 5)];
	lh_filter flt = {lh_next(r), (unsigned)lh_below(r, 101), 0};
	bool filtered = lh_below(r, 10) < 3;
	if (filtered) {
		o.filter = lh_filter_fn;
		o.filter_ctx = &flt;
	}
	/* streaming and cancels a little more often than plain loads */
	static const enum mode modes[] = {MODE_LOAD, MODE_LOAD, MODE_STREAM, MODE_STREAM,
					  MODE_CANCEL, MODE_CANCEL_THREAD, MODE_FREE};
	enum mode mode = modes[lh_below(r, 7)];
	bool shared = lh_below(r, 2);
	/* what depends on timing (how many tensors a cancelled load hands out)
	 * draws from its own generator: every thread's sequence of loads is
	 * the same from run to run */
	lh_rng lr = {lh_next(r)};
	snprintf(w->ctx, sizeof w->ctx,
		 "checkpoint %zu (%s) io=%s threads=%u chunk=%" PRIu64 " staging=%" PRIu64
		 " align=%u filter=%u%% mode=%d %s handle",
		 k, w->c->lc[k].path, lh_io_name(o.io), o.threads, o.chunk_bytes, o.staging_bytes,
		 o.align, filtered ? flt.percent : 100, (int)mode, shared ? "shared" : "own");
	const fst_checkpoint *ck = w->c->ck[k];
	fst_checkpoint *own = NULL;
	fst_error err;
	if (!shared) {
		if (fst_checkpoint_open(w->c->lc[k].path, &own, &err))
			W_FAIL(w, "open: %s", err.message);
		if (fst_checkpoint_tensor_count(own) != fst_checkpoint_tensor_count(ck)) {
			fst_checkpoint_close(own);
			W_FAIL(w, "the own handle has another table");
		}
		ck = own;
	}
	fst_buffer *buf = NULL;
	bool ok = true;
	if (mode == MODE_LOAD) {
		if (fst_load(ck, &o, &buf, &err)) {
			fst_checkpoint_close(own);
			W_FAIL(w, "load: %s", err.message);
		}
	} else {
		ok = stream(w, &lr, k, ck, &o, filtered ? &flt : NULL, mode, &buf);
	}
	if (ok && filtered && !flt.calls && fst_checkpoint_tensor_count(ck)) {
		fst_buffer_release(buf);
		fst_checkpoint_close(own);
		W_FAIL(w, "the filter was never called");
	}
	/* the buffer outlives its checkpoint handle */
	fst_checkpoint_close(own);
	if (ok && shared && lh_below(&lr, 4) == 0)
		ok = poke_shared(w, &lr, k);
	if (ok && buf)
		ok = check_buffer(w, k, buf, &o, filtered ? &flt : NULL);
	fst_buffer_release(buf);
	if (ok) {
		w->loads++;
		w->shared += shared;
		w->filtered += filtered;
		w->io[o.io]++;
		w->mode[mode]++;
	}
	return ok;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	lh_rng r = {w->seed};
	for (unsigned i = 0; i < LOADS; i++)
		if (!one_load(w, &r))
			break;
	return NULL;
}

static struct corpus *corpus_make(void)
{
	struct corpus *c = calloc(1, sizeof *c);
	/* a few MB each: 1 to 4 shards of up to 14 tensors, a third of them up
	 * to 1.5 MB, the rest small, empty or scalars */
	lh_shape sh = {4, 14, 1500000, 30, 10, true};
	for (size_t k = 0; k < NCKPT; k++) {
		char name[32];
		snprintf(name, sizeof name, "stress%zu", k);
		lh_write_random(name, lh_base_seed() * 31 + 7 * k, &sh, &c->lc[k]);
		c->ck[k] = lh_open(c->lc[k].path);
		lh_files_read(c->ck[k], &c->fs[k]);
	}
	return c;
}

static void corpus_free(struct corpus *c)
{
	for (size_t k = 0; k < NCKPT; k++) {
		lh_files_free(&c->fs[k]);
		fst_checkpoint_close(c->ck[k]);
		lh_rmdir(c->lc[k].dir);
	}
	free(c);
}

static void test_threads_load_at_random(void **state)
{
	(void)state;
	lh_uring_probe();
	long allocs = fsti_live_allocations();
	int fds = lh_count_fds();
	struct corpus *c = corpus_make();
	uint64_t bytes = 0;
	unsigned shards = 0;
	for (size_t k = 0; k < NCKPT; k++) {
		bytes += fst_checkpoint_total_bytes(c->ck[k]);
		shards += c->lc[k].nfiles;
	}
	struct worker w[NTHREADS];
	pthread_t th[NTHREADS];
	for (unsigned i = 0; i < NTHREADS; i++) {
		memset(&w[i], 0, sizeof w[i]);
		w[i].c = c;
		w[i].id = i;
		w[i].seed = lh_mix(lh_base_seed() + 1000u * i);
		assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
	}
	for (unsigned i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	unsigned loads = 0, shared = 0, filtered = 0, canceled = 0, late = 0, io[4] = {0},
		 mode[MODE_COUNT] = {0};
	for (unsigned i = 0; i < NTHREADS; i++) {
		if (w[i].fail[0])
			fail_msg("seed %" PRIu64 ": %s", lh_base_seed(), w[i].fail);
		loads += w[i].loads;
		shared += w[i].shared;
		filtered += w[i].filtered;
		canceled += w[i].canceled;
		late += w[i].cancel_late;
		for (int j = 0; j < 4; j++)
			io[j] += w[i].io[j];
		for (int j = 0; j < MODE_COUNT; j++)
			mode[j] += w[i].mode[j];
	}
	print_message("%u loads of %zu checkpoints (%u shards, %.1f MB); io auto %u, pread %u, "
		      "uring %u, mmap %u; %u on shared handles, %u filtered; %u loads, %u streamed, "
		      "%u cancel, %u cancel from a thread (%u cancelled, %u done first), "
		      "%u dropped\n",
		      loads, (size_t)NCKPT, shards, (double)bytes / 1e6, io[0], io[1], io[2], io[3],
		      shared, filtered, mode[MODE_LOAD], mode[MODE_STREAM], mode[MODE_CANCEL],
		      mode[MODE_CANCEL_THREAD], canceled, late, mode[MODE_FREE]);
	assert_int_equal(loads, NTHREADS * LOADS);
	/* the mix really happened */
	for (int j = 0; j < 4; j++)
		assert_true(io[j] > 0 || lh_io_skipped(j));
	for (int j = 0; j < MODE_COUNT; j++)
		assert_true(mode[j] > 0);
	assert_true(shared > 0 && shared < loads);
	assert_true(filtered > 0);
	assert_true(canceled > 0);
	corpus_free(c);
	assert_int_equal(fsti_live_allocations(), allocs);
	assert_int_equal(lh_count_fds(), fds);
}

/* ---- one buffer, many readers */

struct viewer {
	fst_buffer *buf;
	const fst_checkpoint *ck;
	const lh_files *fs;
	uint64_t seed;
	char fail[600];
};

static void *view_thread(void *arg)
{
	struct viewer *v = arg;
	lh_rng r = {v->seed};
	size_t n = fst_buffer_tensor_count(v->buf);
	for (unsigned round = 0; round < 2000 && n; round++) {
		size_t i = (size_t)lh_below(&r, n);
		fst_tensor_view tv;
		if (fst_buffer_tensor(v->buf, i, &tv)) {
			snprintf(v->fail, sizeof v->fail, "fst_buffer_tensor(%zu) failed", i);
			return NULL;
		}
		fst_tensor_info info;
		size_t file;
		fst_checkpoint_tensor(v->ck, i, &info, &file);
		if (strcmp(tv.name, info.name) || fst_buffer_find(v->buf, info.name) != (long)i ||
		    tv.nbytes != info.nbytes ||
		    (info.nbytes &&
		     memcmp(tv.data, v->fs->bytes[file] + info.file_offset, (size_t)info.nbytes))) {
			snprintf(v->fail, sizeof v->fail, "tensor %s is wrong", info.name);
			fst_view_release(&tv);
			return NULL;
		}
		if (lh_below(&r, 2)) {
			fst_buffer_retain(tv.buffer);
			fst_buffer_release(tv.buffer);
		}
		fst_view_release(&tv);
	}
	/* each thread was given one reference: the last one out frees it */
	fst_buffer_release(v->buf);
	return NULL;
}

static void test_shared_buffer(void **state)
{
	(void)state;
	long allocs = fsti_live_allocations();
	lh_shape sh = {3, 20, 200000, 20, 10, false};
	lh_ckpt lc;
	lh_write_random("shared-buffer", lh_base_seed() + 77, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	lh_files fs;
	lh_files_read(ck, &fs);
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP};
	for (int k = 0; k < 3; k++) {
		if (lh_io_skipped(ios[k]))
			continue;
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = ios[k];
		fst_buffer *buf;
		fst_error err;
		if (fst_load(ck, &o, &buf, &err))
			fail_msg("io=%s: %s", lh_io_name(o.io), err.message);
		struct viewer v[NTHREADS];
		pthread_t th[NTHREADS];
		for (unsigned i = 0; i < NTHREADS; i++) {
			fst_buffer_retain(buf);
			v[i] = (struct viewer){buf, ck, &fs, lh_mix(lh_base_seed() + i), ""};
			assert_int_equal(pthread_create(&th[i], NULL, view_thread, &v[i]), 0);
		}
		fst_buffer_release(buf); /* the threads' references keep it */
		for (unsigned i = 0; i < NTHREADS; i++) {
			pthread_join(th[i], NULL);
			if (v[i].fail[0])
				fail_msg("io=%s thread %u: %s", lh_io_name(o.io), i, v[i].fail);
		}
	}
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
	assert_int_equal(fsti_live_allocations(), allocs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_threads_load_at_random),
		cmocka_unit_test(test_shared_buffer),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
