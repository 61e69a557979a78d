/*
 * Description: a shard overwritten in place with its modification time put
 * back (what rsync --inplace -t or touch -d leave) is caught after open,
 * during a load and before each streamed tensor, on every read path: a load
 * either fails with FST_ECHANGED or returns exactly the bytes of the file
 * that was opened, never other bytes.
 */
#include "load_helpers.h"

#include "format.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define NT 16
#define TBYTES (256u << 10)

/* NT tensors of TBYTES each in one file; its bytes are returned. */
static unsigned char *make_file(const char *name, char *path, size_t size, uint64_t *len)
{
	snprintf(path, size, "%s/%s.safetensors", test_tmpdir(), name);
	fst_writer_opts wo;
	fst_writer_opts_init(&wo);
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(&wo, &w, &err), 0);
	struct lh_fill_ctx ctx[NT];
	for (unsigned i = 0; i < NT; i++) {
		char tname[16];
		snprintf(tname, sizeof tname, "t%02u", i);
		ctx[i].key = lh_mix(i + 17);
		uint64_t shape[1] = {TBYTES};
		assert_int_equal(fst_writer_add_fill(w, tname, FST_DTYPE_U8, 1, shape, lh_fill,
						     &ctx[i], &err),
				 0);
	}
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	return lh_slurp(path, len);
}

/* Write bytes that differ from the file's at [off, off + n), then put the
 * access and modification times back as they were. */
static void overwrite_keep_mtime(const char *path, const unsigned char *orig, uint64_t off,
				 uint64_t n)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	unsigned char *b = malloc(n);
	for (uint64_t i = 0; i < n; i++)
		b[i] = orig[off + i] ^ 0xa5;
	assert_int_equal(pwrite(fd, b, n, (off_t)off), (ssize_t)n);
	free(b);
	struct timespec ts[2] = {st.st_atim, st.st_mtim};
	assert_int_equal(futimens(fd, ts), 0);
	struct stat after;
	assert_int_equal(fstat(fd, &after), 0);
	assert_int_equal(after.st_mtim.tv_sec, st.st_mtim.tv_sec);
	assert_int_equal(after.st_mtim.tv_nsec, st.st_mtim.tv_nsec);
	close(fd);
}

static void restore(const char *path, const unsigned char *orig, uint64_t len)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, orig, len, 0), (ssize_t)len);
	close(fd);
}

static uint64_t data_offset(const char *path)
{
	fst_file *f;
	fst_error err;
	assert_int_equal(fst_file_open(path, &f, &err), 0);
	uint64_t off = fst_file_data_offset(f);
	fst_file_close(f);
	return off;
}

static void opts_for(fst_load_opts *o, int io, unsigned threads)
{
	fst_load_opts_init(o);
	o->io = io;
	o->threads = threads;
	o->chunk_bytes = 64 << 10;
}

/* Every tensor of buf equals the bytes of orig. */
static void assert_buffer_is(const fst_checkpoint *ck, fst_buffer *buf,
			     const unsigned char *orig, uint64_t len)
{
	lh_files fs = {1, (unsigned char **)&orig, &len};
	for (size_t i = 0; i < fst_buffer_tensor_count(buf); i++) {
		fst_tensor_view v;
		assert_int_equal(fst_buffer_tensor(buf, i, &v), 0);
		fst_tensor_info info;
		const unsigned char *want = lh_expected(ck, &fs, (size_t)fst_checkpoint_find(ck, v.name),
							&info);
		lh_assert_bytes(v.name, v.data, want, v.nbytes);
		fst_view_release(&v);
	}
}

/* Overwritten after open, before the load: refused on every path. */
static void test_after_open(void **state)
{
	(void)state;
	char path[600];
	uint64_t len;
	unsigned char *orig = make_file("after-open", path, sizeof path, &len);
	for (int io = FST_IO_PREAD; io <= FST_IO_MMAP; io++) {
		restore(path, orig, len);
		fst_checkpoint *ck = lh_open(path);
		overwrite_keep_mtime(path, orig, len - 100, 50);
		fst_load_opts o;
		opts_for(&o, io, 2);
		fst_buffer *buf = NULL;
		fst_error err;
		int rc = fst_load(ck, &o, &buf, &err);
		if (rc != FST_ECHANGED)
			fail_msg("io=%s: %d: %s", lh_io_name(io), rc, err.message);
		assert_null(buf);
		assert_has(err.message, path);
		assert_has(err.message, "status change time");
		fst_checkpoint_close(ck);
	}
	free(orig);
}

struct hook {
	const char *path;
	const unsigned char *orig;
	uint64_t off, n;
	atomic_int calls;
};

static int overwrite_on_first_block(void *ctx, size_t tensor, uint64_t offset, const void *bytes,
				    uint64_t len)
{
	(void)tensor, (void)offset, (void)bytes, (void)len;
	struct hook *h = ctx;
	if (atomic_fetch_add(&h->calls, 1) == 0)
		overwrite_keep_mtime(h->path, h->orig, h->off, h->n);
	return 0;
}

/* Overwritten while the readers run (from inside the load, so the timing is
 * certain): the finished load says so and hands out nothing. */
static void test_during_load(void **state)
{
	(void)state;
	char path[600];
	uint64_t len;
	unsigned char *orig = make_file("during", path, sizeof path, &len);
	uint64_t data = data_offset(path);
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++)
		for (int where = 0; where < 2; where++) {
			if (lh_io_skipped(io))
				continue;

			restore(path, orig, len);
			fst_checkpoint *ck = lh_open(path);
			/* bytes already read, or bytes still to come */
			struct hook h = {path, orig, where ? len - TBYTES : data, 4096, 0};
			fst_load_opts o;
			opts_for(&o, io, 1);
			o.on_landed = overwrite_on_first_block;
			o.on_landed_ctx = &h;
			fst_buffer *buf = NULL;
			fst_error err;
			long allocs = fsti_live_allocations();
			int rc = fst_load(ck, &o, &buf, &err);
			if (rc != FST_ECHANGED)
				fail_msg("io=%s where=%d: %d: %s", lh_io_name(io), where, rc,
					 err.message);
			assert_null(buf);
			assert_true(atomic_load(&h.calls) > 0);
			assert_has(err.message, "during the load");
			assert_int_equal(fsti_live_allocations(), allocs);
			fst_checkpoint_close(ck);
		}
	free(orig);
}

/* Streaming: tensors handed out before the change are the file's; once the
 * file has changed, no further tensor is handed out. */
static void test_streamed(void **state)
{
	(void)state;
	char path[600];
	uint64_t len;
	unsigned char *orig = make_file("streamed", path, sizeof path, &len);
	lh_files fs = {1, &orig, &len};
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
		if (lh_io_skipped(io))
			continue;
		restore(path, orig, len);
		fst_checkpoint *ck = lh_open(path);
		fst_load_opts o;
		opts_for(&o, io, 2);
		fst_loader *ld;
		fst_error err;
		assert_int_equal(fst_load_start(ck, &o, &ld, &err), 0);
		fst_tensor_view v;
		assert_int_equal(fst_loader_next(ld, &v, &err), 1);
		fst_tensor_info info;
		lh_assert_bytes(v.name, v.data,
				lh_expected(ck, &fs, (size_t)fst_checkpoint_find(ck, v.name), &info),
				v.nbytes);
		fst_view_release(&v);
		/* wait until every tensor is ready, so only the check can stop one */
		uint64_t done = 0, total = 0;
		do
			fst_loader_progress(ld, &done, &total);
		while (done < total);
		overwrite_keep_mtime(path, orig, len - 10, 10);
		int rc = fst_loader_next(ld, &v, &err);
		if (rc != FST_ECHANGED)
			fail_msg("io=%s: next after the change: %d: %s", lh_io_name(io), rc, err.message);
		assert_has(err.message, path);
		assert_int_equal(fst_loader_next(ld, &v, &err), FST_ECHANGED);
		fst_buffer *buf = NULL;
		assert_int_equal(fst_loader_finish(ld, &buf, &err), FST_ECHANGED);
		assert_null(buf);
		fst_checkpoint_close(ck);
	}
	free(orig);
}

struct racer {
	const char *path;
	const unsigned char *orig;
	uint64_t len, data;
	unsigned delay_us;
	uint64_t seed;
};

static void *race_writer(void *arg)
{
	struct racer *r = arg;
	struct timespec ts = {0, (long)r->delay_us * 1000};
	nanosleep(&ts, NULL);
	lh_rng g = {r->seed};
	uint64_t n = 1 + lh_below(&g, 64 << 10);
	uint64_t off = r->data + lh_below(&g, r->len - r->data - n);
	overwrite_keep_mtime(r->path, r->orig, off, n);
	return NULL;
}

/*
 * Many loads, each raced by one in-place overwrite at a random moment (mtime
 * put back): every load either fails with FST_ECHANGED or hands out exactly
 * the opened bytes; streamed tensors are compared as they are handed out.
 */
static void test_race(void **state)
{
	(void)state;
	char path[600];
	uint64_t len;
	unsigned char *orig = make_file("race", path, sizeof path, &len);
	lh_files fs = {1, &orig, &len};
	uint64_t data = data_offset(path);
	unsigned changed = 0, whole = 0;
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++)
		for (int streamed = 0; streamed < 2; streamed++)
			for (unsigned round = 0; round < 25; round++) {
				if (lh_io_skipped(io))
					continue;

				restore(path, orig, len);
				fst_checkpoint *ck = lh_open(path);
				struct racer r = {path, orig, len, data,
						  (unsigned)(lh_mix(round * 31u + (unsigned)io) % 6000),
						  lh_mix(round + 1000u * (unsigned)streamed)};
				pthread_t th;
				assert_int_equal(pthread_create(&th, NULL, race_writer, &r), 0);
				fst_load_opts o;
				opts_for(&o, io, 2);
				fst_buffer *buf = NULL;
				fst_error err;
				int rc;
				if (!streamed) {
					rc = fst_load(ck, &o, &buf, &err);
				} else {
					fst_loader *ld;
					rc = fst_load_start(ck, &o, &ld, &err);
					fst_tensor_view v;
					while (!rc && (rc = fst_loader_next(ld, &v, &err)) == 1) {
						fst_tensor_info info;
						size_t k = (size_t)fst_checkpoint_find(ck, v.name);
						lh_assert_bytes(v.name, v.data,
								lh_expected(ck, &fs, k, &info),
								v.nbytes);
						fst_view_release(&v);
						rc = 0;
					}
					if (rc >= 0 || rc == FST_ECHANGED) {
						int frc = fst_loader_finish(ld, &buf, &err);
						rc = rc < 0 ? rc : frc;
					}
				}
				pthread_join(th, NULL);
				if (rc == 0) {
					assert_buffer_is(ck, buf, orig, len);
					whole++;
				} else if (rc == FST_ECHANGED) {
					assert_null(buf);
					changed++;
				} else {
					fail_msg("io=%s streamed=%d round %u: %d: %s", lh_io_name(io),
						 streamed, round, rc, err.message);
				}
				fst_buffer_release(buf);
				fst_checkpoint_close(ck);
			}
	print_message("race: %u loads caught the change, %u finished before it\n", changed,
		      whole);
	/* the writer lands inside or before most loads: the check was exercised */
	assert_true(changed > 0);
	free(orig);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_after_open),
		cmocka_unit_test(test_during_load),
		cmocka_unit_test(test_streamed),
		cmocka_unit_test(test_race),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
