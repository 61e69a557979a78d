/* Description: checkpoints of memory images (fst_file_open_memory named like
 * the files on disk, whose bytes are scrambled meanwhile): pread, uring and
 * auto load the images' bytes and never open the names; io=mmap refuses
 * them with FST_EUNSUPPORTED. */
#include "format.h"
#include "load_helpers.h"

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
		if (lh_io_skipped(io))
			continue;
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
			lh_check_buffer(ck, &fs, buf, &o, NULL, "memory images");
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_memory_images),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
