/* Description: the caller's allocator hook (fst_load_opts.allocator) with
 * pread, uring and auto and several alignments: one allocation of the
 * planned size and alignment on the CPU, the data inside it, one free when
 * the last view goes. io=mmap never allocates; a NULL result is FST_ENOMEM
 * with nothing to free; a misaligned block is a usage error and goes back to
 * the caller; an allocator without free is refused. */
#include "engine.h"
#include "load_helpers.h"

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
			if (lh_io_skipped(ios[k]))
				continue;

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
			lh_check_buffer(ck, &fs, buf, &o, NULL, "allocator");
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_allocator),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
