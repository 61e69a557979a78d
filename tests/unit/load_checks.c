/* load_checks.c - CPU loads checked against independent reads of the
 * files (see load_helpers.h): views, whole buffers, the streaming form,
 * refused options, and the shared "big" checkpoint. */
#include "engine.h"
#include "load_helpers.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Check one view against checkpoint tensor `entry`. */
void lh_check_view(const fst_checkpoint *ck, const lh_files *fs, size_t entry,
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
void lh_check_buffer(const fst_checkpoint *ck, const lh_files *fs, fst_buffer *buf,
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
		lh_check_view(ck, fs, i, &v, align, mapped, ctx);
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
fst_buffer *lh_load_streaming(const fst_checkpoint *ck, const lh_files *fs, const fst_load_opts *o,
			      const lh_filter *flt, const char *ctx)
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
		lh_check_view(ck, fs, entry[v.index], &v, align, o->io == FST_IO_MMAP, ctx);
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
			lh_check_view(ck, fs, entry[views[i].index], &views[i], align,
				      o->io == FST_IO_MMAP, ctx);
		}
		fst_view_release(&views[i]);
	}
	free(views);
	free(seen);
	free(entry);
	return buf;
}

void lh_expect_usage(const fst_checkpoint *ck, const fst_load_opts *o, int code, const char *needle)
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

const char *lh_big_path(void)
{
	static char path[700];
	if (path[0])
		return path;
	/* one shard of 96 tensors of 96 KiB: 9 MiB, 2304 chunks of 4 KiB */
	char dir[600];
	snprintf(dir, sizeof dir, "%s/big", test_tmpdir());
	mkdir(dir, 0755);
	snprintf(path, sizeof path, "%s/big.safetensors", dir);
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
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	return path;
}
