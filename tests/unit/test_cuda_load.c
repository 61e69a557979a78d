/* Description: loads onto the CUDA target against the libcuda double, every
 * byte compared with the file through fst_copy_to_host (whole and from an
 * offset). Random checkpoints of every dtype, misaligned data sections, odd
 * sizes and several shards go to cuda:0 and cuda:1 with pread and io_uring,
 * 1 to 4 threads and 1, 4 and 16 MiB of staging, and with small chunks; one
 * device allocation a load, tensors aligned to 256 and disjoint. Shards of
 * only empty tensors, only scalars or none at all, a single file opened by
 * its path, and a checkpoint with no byte to read, whole and streamed (it
 * pins no staging). */
#include "cuda_helpers.h"

/* Every combination of device, reader, thread count and staging budget. */
static void test_load_matrix(void **state)
{
	(void)state;
	ch_set_delay("50");
	ch_ckpt c;
	ch_write_random("matrix", 11, &ch_big_gen, &c);
	ch_open(&c, c.dir);
	assert_int_equal(c.nfiles, 3);
	/* the first shard's data section starts at 8 mod 16 */
	assert_int_equal(fst_file_data_offset(fst_checkpoint_file(c.ck, 0)) % 16, 8);
	static const uint64_t staging[] = {1 * MiB, 4 * MiB, 16 * MiB};
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING};
	unsigned loads = 0;
	for (int dev = 0; dev < 2; dev++)
		for (int k = 0; k < 2; k++)
			for (unsigned th = 1; th <= 4; th++)
				for (int s = 0; s < 3; s++) {
					if (ios[k] == FST_IO_URING && !ch_uring_ok)
						continue;
					char device[16];
					snprintf(device, sizeof device, "cuda:%d", dev);
					fst_load_opts o;
					ch_opts(&o, device, ios[k], th, staging[s]);
					fst_buffer *buf = NULL;
					fst_error err;
					int rc = fst_load(c.ck, &o, &buf, &err);
					if (rc)
						fail_msg("%s %s %u threads %" PRIu64 " MiB: %s", device,
							 lh_io_name(ios[k]), th, staging[s] >> 20,
							 err.message);
					assert_has(fst_buffer_describe(buf), "pinned staging");
					assert_true(fst_buffer_size(buf) >=
						    fst_checkpoint_total_bytes(c.ck));
					assert_int_equal(fst_buffer_tensor_bytes(buf),
							 fst_checkpoint_total_bytes(c.ck));
					ch_assert_buffer(&c, buf, dev);
					assert_int_equal(ch_live_device() - ch_device_base, 1);
					fst_buffer_release(buf);
					ch_assert_clean("after a load", c.host_base);
					loads++;
				}
	assert_true(loads >= 24);
	/* "cuda" is cuda:0; small chunks make many pieces per slot */
	fst_load_opts o;
	ch_opts(&o, "cuda", FST_IO_PREAD, 2, 1 * MiB);
	o.chunk_bytes = 4096 * 5;
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("cuda, 20 KiB chunks: %s", err.message);
	ch_assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
	ch_assert_clean("after the last load", c.host_base);
	ch_close(&c);
}

/* Shards of nothing but empty tensors, scalars, or no tensors at all, a
 * single file opened by its path, and a checkpoint with no byte to read. */
static void test_edge_checkpoints(void **state)
{
	(void)state;
	ch_set_delay("50");
	ch_ckpt c;
	memset(&c, 0, sizeof c);
	snprintf(c.dir, sizeof c.dir, "%s/edges", test_tmpdir());
	lh_rmdir(c.dir);
	assert_int_equal(mkdir(c.dir, 0755), 0);
	lh_rng r = {99};
	struct lh_fill_ctx keys[64];
	for (unsigned f = 0; f < 4; f++) {
		fst_writer_opts wo;
		ch_writer_layout(f, &wo);
		fst_writer *w;
		fst_error err;
		assert_int_equal(fst_writer_new(&wo, &w, &err), 0);
		char name[64];
		for (unsigned t = 0; f < 3 && t < 12; t++) {
			struct lh_fill_ctx *k = &keys[f * 16 + t];
			k->key = lh_mix(f * 100 + t);
			snprintf(name, sizeof name, "e%u.%u", f, t);
			if (f == 0) /* empty tensors only */
				ch_add_tensor(w, &r, name, (fst_dtype)(1 + t), 0, false, k);
			else if (f == 1) /* scalars only */
				ch_add_tensor(w, &r, name, t % 2 ? FST_DTYPE_F64 : FST_DTYPE_U8, 0, true, k);
			else /* odd-sized bytes next to scalars and empties */
				ch_add_tensor(w, &r, name, t % 3 ? FST_DTYPE_U8 : FST_DTYPE_I32,
					      t % 3 ? 2 * t + 1 : 0, t % 3 == 0 && t % 2, k);
		}
		char path[700];
		snprintf(path, sizeof path, "%s/%02u.safetensors", c.dir, f);
		if (fst_writer_finish(w, path, &err))
			fail_msg("%s: %s", path, err.message);
		fst_writer_free(w);
	}
	ch_open(&c, c.dir);
	assert_int_equal(c.nfiles, 4);
	for (int dev = 0; dev < 2; dev++)
		for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
			if (io == FST_IO_URING && !ch_uring_ok)
				continue;
			fst_load_opts o;
			ch_opts(&o, dev ? "cuda:1" : "cuda:0", io, 3, 1 * MiB);
			fst_buffer *buf = NULL;
			fst_error err;
			if (fst_load(c.ck, &o, &buf, &err))
				fail_msg("edges: %s", err.message);
			ch_assert_buffer(&c, buf, dev);
			fst_buffer_release(buf);
			ch_assert_clean("edges", c.host_base);
		}
	/* no byte to read: only the empty shard, opened by its path */
	char only[700];
	snprintf(only, sizeof only, "%s/00.safetensors", c.dir);
	ch_ckpt e; /* its dir stays empty: the files are c's, removed with c */
	memset(&e, 0, sizeof e);
	ch_open(&e, only);
	assert_int_equal(fst_checkpoint_total_bytes(e.ck), 0);
	fst_load_opts o;
	ch_opts(&o, "cuda:1", FST_IO_PREAD, 4, 1 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	long pinned = ch_live_host();
	if (fst_load(e.ck, &o, &buf, &err))
		fail_msg("empty tensors only: %s", err.message);
	assert_int_equal(fst_buffer_tensor_count(buf), 12);
	ch_assert_buffer(&e, buf, 1);
	fst_buffer_release(buf);
	/* no worker, so no staging pinned (or kept for the next load) */
	assert_int_equal(ch_live_host(), pinned);
	ch_assert_clean("empty tensors only", e.host_base);
	/* the streaming form hands every empty tensor out at once */
	fst_loader *ld;
	assert_int_equal(fst_load_start(e.ck, &o, &ld, &err), 0);
	fst_tensor_view v;
	size_t n = 0;
	int rc;
	while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
		ch_assert_view(&e, &v, 1);
		fst_view_release(&v);
		n++;
	}
	assert_int_equal(rc, 0);
	assert_int_equal(n, 12);
	assert_int_equal(fst_loader_finish(ld, NULL, &err), 0);
	ch_assert_clean("empty tensors only, streamed", e.host_base);
	ch_close(&e);
	ch_close(&c);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_load_matrix, ch_reset),
		cmocka_unit_test_setup(test_edge_checkpoints, ch_reset),
	};
	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
}
