/* Description: which file cuFile reads. A file renamed over the
 * checkpoint's path after it was opened: gds.c reopens the opened file
 * itself (through /proc/self/fd), so both shards keep cuFile under auto and
 * on and the bytes are the opened file's. Memory images and descriptors
 * opened under a label have no path to open again: under auto they load
 * through staging (gds.c once opened files again by path and failed them). */
#include "gds_helpers.h"

/*
 * A file renamed over the checkpoint's path after it was opened: libfst
 * reads the file it opened and validated, never the one the path names now.
 * gds.c reopens the opened file itself for cuFile (through /proc/self/fd),
 * so both files keep cuFile, under auto and on, and the bytes are the
 * opened file's.
 */
static void test_replaced_path(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "replaced", 2, lh_base_seed() + 10);
	/* the same header (names, shapes, layout), other bytes */
	lh_ckpt other;
	gh_write_founding_salted("replaced-other", 2, lh_base_seed() + 10, 0x5a17, &other);
	char from[900], to[900];
	snprintf(from, sizeof from, "%s/01.safetensors", other.dir);
	snprintf(to, sizeof to, "%s/01.safetensors", x.c.dir);
	uint64_t other_size;
	unsigned char *other_bytes = lh_slurp(from, &other_size);
	uint64_t data_at = fst_file_data_offset(fst_checkpoint_file(x.ck, 1));
	assert_int_equal(other_size, x.fs.size[1]);
	assert_int_equal(memcmp(other_bytes, x.fs.bytes[1], (size_t)data_at), 0);
	assert_true(memcmp(other_bytes + data_at, x.fs.bytes[1] + data_at,
			   (size_t)(other_size - data_at)) != 0);
	free(other_bytes);
	if (rename(from, to))
		fail_msg("rename: %s", strerror(errno));
	gh_base b = gh_snapshot();
	for (int stream = 0; stream < 2; stream++) {
		long r0 = gh.path_reads(gh_shard_key("replaced", 0));
		long r1 = gh.path_reads(gh_shard_key("replaced", 1));
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 2);
		char desc[1200] = "";
		if (stream)
			gh_stream_ok(x.ck, &x.fs, &o);
		else
			gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
		/* both with cuFile, 01 from the opened (now unlinked) file: the
		 * bytes checked above are the opened file's, not the new one's */
		assert_true(gh.path_reads(gh_shard_key("replaced", 0)) > r0);
		assert_true(gh.path_reads(gh_shard_key("replaced", 1)) > r1);
		/* the engine says the path was replaced; nothing is staged */
		assert_int_equal(gh_log_count(FST_LOG_WARN, gh_shard_key("replaced", 1),
					      "pinned staging"), 0);
		if (!stream)
			assert_has(desc, "GPUDirect Storage for 2 of 2 files");
		gh_assert_back(&b, "replaced path, auto");
	}
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	gh_assert_back(&b, "replaced path, on");
	lh_rmdir(other.dir);
	gh_fixture_close(&x);
}

/* Memory images and descriptors opened under a label have no path to open
 * again: under auto they must load through staging. */
static void test_files_without_paths(void **state)
{
	(void)state;
	gh_fixture x;
	gh_founding(&x, "nopath", 2, lh_base_seed() + 12);
	for (int kind = 0; kind < 2; kind++) {
		fst_file *files[2] = {NULL, NULL};
		fst_error err;
		int fds[2] = {-1, -1};
		for (size_t f = 0; f < 2; f++) {
			char label[64];
			snprintf(label, sizeof label, "label-%d-%zu.safetensors", kind, f);
			if (kind == 0) {
				assert_int_equal(fst_file_open_memory(x.fs.bytes[f], x.fs.size[f], label,
								      &files[f], &err),
						 0);
			} else {
				fds[f] = open(fst_file_path(fst_checkpoint_file(x.ck, f)),
					      O_RDONLY | O_CLOEXEC);
				assert_true(fds[f] >= 0);
				assert_int_equal(fst_file_open_fd(fds[f], label, &files[f], &err), 0);
			}
		}
		fst_checkpoint *ck = NULL;
		assert_int_equal(fst_checkpoint_from_files(files, 2, &ck, &err), 0);
		gh_base b = gh_snapshot();
		/* control: without cuFile this loads */
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_OFF, FST_IO_PREAD, 2);
		gh_load_ok(ck, &x.fs, &o, NULL, 0);
		gh_assert_back(&b, "no path, gds=off");
		o.gds = FST_GDS_AUTO;
		fst_buffer *buf = NULL;
		int rc = fst_load(ck, &o, &buf, &err);
		if (rc) {
			char why[1300];
			snprintf(why, sizeof why, "%s checkpoint on cuda:0 with gds=auto: %s",
				 kind ? "a descriptor opened under a label" : "a memory",
				 err.message);
			lh_known_bug(kind ? "GDS-FD-OPENED-FILES" : "GDS-MEMORY-FILES", why);
		} else {
			gh_check_buffer(ck, &x.fs, buf, 0, 256);
			fst_buffer_release(buf);
		}
		gh_assert_back(&b, "no path, gds=auto");
		fst_checkpoint_close(ck);
		for (size_t f = 0; f < 2; f++)
			if (fds[f] >= 0)
				close(fds[f]);
	}
	gh_fixture_close(&x);
}

int main(void)
{
	int rc = gh_open_doubles();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_replaced_path, gh_reset),
		cmocka_unit_test_setup(test_files_without_paths, gh_reset),
	};
	return cmocka_run_group_tests(tests, gh_group_setup, gh_group_teardown);
}
