/*
 * io_pread.c - the pread reader: each worker reads its chunks with plain
 * pread straight into their destination. The fastest path when the files
 * are in the page cache: one copy, done by the kernel, in parallel.
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int fsti_copy_from_image(const fst_file *f, uint64_t off, uint64_t len, void *dst,
			 fst_error *err)
{
	if (off > f->size || len > f->size - off)
		return fsti_err(err, FST_EIO,
				"%s: read of %" PRIu64 " bytes at offset %" PRIu64
				" past the end of the %" PRIu64 "-byte image",
				f->path, len, off, f->size);
	memcpy(dst, f->mem + off, (size_t)len);
	return 0;
}

int fsti_pread_exact(int fd, const char *path, void *dst, uint64_t len, uint64_t off,
		     fst_error *err)
{
	uint64_t done = 0;
	while (done < len) {
		size_t want = (size_t)FSTI_MIN(len - done, (uint64_t)1 << 30);
		ssize_t n;
		int fault = fsti_fault("read");
		if (fault) {
			errno = fault;
			n = -1;
		} else if (fsti_fault("short_read")) {
			n = 0; /* behave as if the file ended here */
		} else {
			n = pread(fd, (char *)dst + done, want, (off_t)(off + done));
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return fsti_err_sys(err, FST_EIO, errno,
					    "%s: read of %" PRIu64 " bytes at offset %" PRIu64
					    " failed",
					    path, len - done, off + done);
		}
		if (n == 0)
			return fsti_err(err, FST_ECHANGED,
					"%s: file ended at offset %" PRIu64 " while %" PRIu64
					" more bytes were expected (file truncated during the "
					"load?)",
					path, off + done, len - done);
		done += (uint64_t)n;
	}
	return 0;
}

/* where[] first, as fsti_sync_wait wants */
struct pread_worker {
	const char *where[FSTI_SLOTS];
};

static int pread_init(const struct fsti_source *src, void **state, fst_error *err)
{
	(void)src;
	*state = fsti_calloc(1, sizeof(struct pread_worker));
	return *state ? 0 : fsti_err(err, FST_ENOMEM, "out of memory for a reader");
}

static int pread_read(const struct fsti_source *src, void *state, uint32_t file, uint64_t off,
		      uint64_t len, void *dst, fst_error *err)
{
	(void)state;
	/* A memory image (fst_file_open_memory) has no descriptor: its bytes
	 * are already here, and were validated at open. */
	const fst_file *f = fst_checkpoint_file(src->ck, file);
	if (f->fd < 0 && f->mem)
		return fsti_copy_from_image(f, off, len, dst, err);
	return fsti_pread_exact(f->fd, f->path, dst, len, off, err);
}

/* pread has no asynchronous form: start reads, wait only reports where. */
static int pread_start(const struct fsti_source *src, void *state, int slot, uint32_t file, uint64_t off,
		       uint64_t len, char *buf, fst_error *err)
{
	struct pread_worker *w = state;
	w->where[slot] = buf;
	return pread_read(src, state, file, off, len, buf, err);
}

int fsti_sync_wait(const struct fsti_source *src, void *state, int slot, const char **where,
		   fst_error *err)
{
	(void)src;
	(void)err;
	*where = ((struct pread_worker *)state)->where[slot];
	return 0;
}

static void pread_fini(void *state)
{
	fsti_free(state);
}

/* Readahead of a cold file: the kernel queues the reads and returns, so the
 * disk has many requests in flight while the workers copy what has landed.
 * Advice only: a refusal changes nothing but speed. */
static void pread_prefetch(const struct fsti_source *src, uint32_t file, uint64_t off,
			   uint64_t len)
{
	const fst_file *f = fst_checkpoint_file(src->ck, file);
	if (f->fd >= 0 && !fsti_fault("prefetch"))
		(void)posix_fadvise(f->fd, (off_t)off, (off_t)len, POSIX_FADV_WILLNEED);
}

const struct fsti_reader fsti_reader_pread = {
	.name = "pread",
	.exact_reads = true,
	.default_staging = FSTI_STAGING_CACHED,
	.reads_at_start = true,
	.any_buffer = true,
	.worker_init = pread_init,
	.read_exact = pread_read,
	.start = pread_start,
	.wait = fsti_sync_wait,
	.worker_fini = pread_fini,
	.prefetch = pread_prefetch,
};
