/*
 * io_uring.c - the io_uring reader, with O_DIRECT where the filesystem
 * allows it.
 *
 * O_DIRECT bypasses the page cache: the right way to read files that are not
 * cached (no cache pollution, no readahead guesswork, deep queues). It needs
 * block-aligned offsets, lengths and buffers, so a chunk is read as its
 * aligned superset into a landing slot, and the sink copies out the exact
 * bytes. Each worker keeps two chunks' requests in flight while the sink
 * copies a third, so the copy hides behind the storage. Where O_DIRECT
 * is refused (tmpfs, some FUSE filesystems) the worker reads through the
 * page cache with the same ring, and the engine logs that once. A file
 * whose O_DIRECT reads fail with EINVAL or EOPNOTSUPP although its open
 * succeeded (a filesystem that wants larger alignment, e.g. ZFS on a
 * kernel of 64 KiB pages) is read the same way from that read on: the
 * request again on the file's own descriptor, into the same place.
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIRECT_ALIGN FSTI_DIRECT_ALIGN
#define MIN_PIECE (8u << 20) /* bytes per request, at least: big requests suit
				* virtio and NVMe alike */
#define PIECES 8u            /* requests per window, about */
#define DEPTH (FSTI_SLOTS * (PIECES + 2))

struct window {
	char *buf;
	uint64_t off;     /* file offset of buf[0] */
	uint64_t len;     /* bytes asked for */
	uint64_t need;    /* bytes that must arrive (past it, end of file is fine) */
	uint64_t eof_at;  /* first byte not read because the file ended */
	unsigned pending; /* requests in flight */
	int fd;
	/* O_DIRECT windows: the file's own descriptor for a read O_DIRECT
	 * refuses, and where to say so; -1 otherwise */
	int page_cache_fd;
	struct fsti_direct_fds *direct;
	uint32_t file;
	int rc;
	const char *path;
	const char *where; /* the chunk's first byte, for wait */
	fst_error err;
};

struct req {
	uint64_t at, n; /* offset within the window, length */
	int fd;
	struct window *win;
};

struct uring_worker {
	struct io_uring ring;
	struct window win[FSTI_SLOTS];
	struct req reqs[DEPTH];
	unsigned free_slots[DEPTH], nfree;
};

static int uring_init(const struct fsti_source *src, void **state, fst_error *err)
{
	(void)src;
	struct uring_worker *w = fsti_calloc(1, sizeof *w);
	if (!w)
		return fsti_err(err, FST_ENOMEM, "out of memory for an io_uring worker");
	int fault = fsti_fault("uring_submit");
	int rc = fault ? -fault : io_uring_queue_init(DEPTH, &w->ring, 0);
	if (rc < 0) {
		fsti_free(w);
		return fsti_err_sys(err, FST_EUNSUPPORTED, -rc, "io_uring_queue_init failed");
	}
	for (unsigned i = 0; i < DEPTH; i++)
		w->free_slots[i] = i;
	w->nfree = DEPTH;
	*state = w;
	return 0;
}

static void uring_fini(void *state)
{
	struct uring_worker *w = state;
	if (!w)
		return;
	/* Tearing the ring down does not wait for requests in flight: closing
	 * the ring only queues its cancellation, and an O_DIRECT read or an
	 * io-wq copy may still write into a landing slot after the slot is
	 * freed. Normally every request has been reaped by now; after an error
	 * (window_wait gives up when submitting fails) some may not have been,
	 * so wait for them here. Queued requests are submitted first, as
	 * nothing tells them apart from those already in flight. */
	unsigned outstanding = DEPTH - w->nfree;
	while (outstanding) {
		int got = io_uring_submit_and_wait(&w->ring, 1);
		if (got < 0 && got != -EINTR)
			break; /* nothing more can be done */
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&w->ring, head, cqe)
			seen++;
		io_uring_cq_advance(&w->ring, seen);
		outstanding -= FSTI_MIN(seen, outstanding);
	}
	io_uring_queue_exit(&w->ring);
	fsti_free(w);
}

static void queue_piece(struct uring_worker *w, struct window *win, uint64_t at, uint64_t n)
{
	unsigned slot = w->free_slots[--w->nfree];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
	/* never NULL: no more than DEPTH requests are queued or in flight */
	io_uring_prep_read(sqe, win->fd, win->buf + at, (unsigned)n, win->off + at);
	io_uring_sqe_set_data64(sqe, slot);
	w->reqs[slot] = (struct req){at, n, win->fd, win};
	win->pending++;
}

/* Ask for [off, off + len) of fd into win->buf: a few big requests at once. */
static void window_start(struct uring_worker *w, struct window *win, int fd, uint64_t off,
			 uint64_t len, uint64_t need)
{
	uint64_t piece = FSTI_MAX((uint64_t)MIN_PIECE, (len / PIECES + DIRECT_ALIGN - 1) &
							   ~(uint64_t)(DIRECT_ALIGN - 1));
	win->fd = fd;
	win->off = off;
	win->len = len;
	win->need = need;
	win->eof_at = UINT64_MAX;
	win->pending = 0;
	win->rc = 0;
	win->page_cache_fd = -1;
	for (uint64_t at = 0; at < len; at += piece)
		queue_piece(w, win, at, FSTI_MIN(piece, len - at));
}

static void reap(struct uring_worker *w)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;
	io_uring_for_each_cqe(&w->ring, head, cqe) {
		seen++;
		unsigned slot = (unsigned)io_uring_cqe_get_data64(cqe);
		struct req r = w->reqs[slot];
		struct window *win = r.win;
		int fault = fsti_fault("uring_complete");
		int res = fault ? -fault : cqe->res;
		w->free_slots[w->nfree++] = slot;
		win->pending--;
		if (win->rc)
			continue;
		if ((res == -EINVAL || res == -EOPNOTSUPP) && win->page_cache_fd >= 0 &&
		    r.fd != win->page_cache_fd) {
			/* O_DIRECT refused at the read: this request and the
			 * rest of the file through the page cache */
			fsti_direct_refuse(win->direct, win->file, win->path, -res);
			win->fd = win->page_cache_fd;
			queue_piece(w, win, r.at, r.n);
			continue;
		}
		if (res < 0) {
			win->rc = fsti_err_sys(&win->err, FST_EIO, -res,
					       "%s: read of %" PRIu64 " bytes at offset %" PRIu64
					       " failed",
					       win->path, r.n, win->off + r.at);
			continue;
		}
		uint64_t end = r.at + (uint64_t)res;
		if ((uint64_t)res == r.n)
			continue;
		if (res == 0 || end >= win->need)
			win->eof_at = FSTI_MIN(win->eof_at, end); /* end of file */
		else
			queue_piece(w, win, end, r.n - (uint64_t)res); /* short: the rest */
	}
	io_uring_cq_advance(&w->ring, seen);
}

/* Wait until every request of win has completed; then its bytes are final. */
static int window_wait(struct uring_worker *w, struct window *win, fst_error *err)
{
	unsigned busy = 0; /* kernel short of resources, in a row */
	while (win->pending) {
		int fault = fsti_fault("uring_submit");
		int got = fault ? -fault : io_uring_submit_and_wait(&w->ring, 1);
		if ((got == -EAGAIN || got == -EBUSY) && ++busy <= 1000) {
			/* "wait for some completions and try again": those in
			 * flight land meanwhile, and free what the kernel lacks */
			nanosleep(&(struct timespec){0, 1000000}, NULL);
		} else if (got < 0 && got != -EINTR) {
			return fsti_err_sys(err, FST_EIO, -got, "%s: io_uring submit failed",
					    win->path);
		} else if (got >= 0) {
			busy = 0;
		}
		reap(w);
	}
	if (win->rc) {
		if (err)
			*err = win->err;
		return win->rc;
	}
	if (win->eof_at < win->need)
		return fsti_err(err, FST_ECHANGED,
				"%s: file ended at offset %" PRIu64 " while %" PRIu64
				" more bytes were expected (file truncated during the load?)",
				win->path, win->off + win->eof_at, win->need - win->eof_at);
	return 0;
}

static int uring_start(const struct fsti_source *src, void *state, int slot, uint32_t file, uint64_t off,
		       uint64_t len, char *buf, fst_error *err)
{
	struct uring_worker *w = state;
	struct window *win = &w->win[slot];
	const fst_file *f = fst_checkpoint_file(src->ck, file);
	win->path = f->path;
	win->buf = buf;
	if (f->fd < 0 && f->mem) {
		/* a memory image: nothing to read, never a path to open */
		int rc = fsti_copy_from_image(f, off, len, buf, err);
		if (rc)
			return rc;
		*win = (struct window){.buf = buf, .off = off, .len = len, .need = len,
				       .eof_at = UINT64_MAX, .fd = -1, .path = win->path,
				       .where = buf};
		return 0;
	}
	/* O_DIRECT where the filesystem allows it, on a descriptor that names
	 * the very file opened and validated (direct.c); else buffered. */
	int dfd = fsti_direct_fd(src->direct, file, f);
	/* a chunk the page cache holds whole: from memory, not the disk again */
	if (dfd >= 0 && fsti_direct_cached(src->direct, file, f, off, len))
		dfd = -1;
	if (dfd < 0) {
		/* buffered: the exact bytes at the start of the slot */
		window_start(w, win, f->fd, off, len, len);
		win->where = buf;
	} else {
		uint64_t a0 = off & ~(uint64_t)(DIRECT_ALIGN - 1);
		uint64_t a1 = (off + len + DIRECT_ALIGN - 1) & ~(uint64_t)(DIRECT_ALIGN - 1);
		window_start(w, win, dfd, a0, a1 - a0, off + len - a0);
		win->page_cache_fd = f->fd;
		win->direct = src->direct;
		win->file = file;
		win->where = buf + (off - a0);
	}
	int fault = fsti_fault("uring_submit");
	int got = fault ? -fault : io_uring_submit(&w->ring);
	/* interrupted, or the kernel short of resources until completions are
	 * reaped: the requests stay queued, and window_wait's submit sends
	 * them */
	if (got == -EINTR || got == -EAGAIN || got == -EBUSY)
		return 0;
	if (got < 0)
		return fsti_err_sys(err, FST_EIO, -got, "%s: io_uring submit failed", win->path);
	return 0;
}

static int uring_wait(const struct fsti_source *src, void *state, int slot, const char **where,
		      fst_error *err)
{
	(void)src;
	struct uring_worker *w = state;
	int rc = window_wait(w, &w->win[slot], err);
	*where = w->win[slot].where;
	return rc;
}

const struct fsti_reader fsti_reader_uring = {
	.name = "uring",
	.exact_reads = false,
	.default_staging = FSTI_STAGING_DIRECT,
	.worker_init = uring_init,
	.read_exact = NULL,
	.start = uring_start,
	.wait = uring_wait,
	.worker_fini = uring_fini,
};

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static bool uring_ok;

static void probe_uring(void)
{
	struct io_uring ring;
	if (io_uring_queue_init(2, &ring, 0) == 0) {
		uring_ok = true;
		io_uring_queue_exit(&ring);
	}
}

bool fsti_uring_available(void)
{
	pthread_once(&probe_once, probe_uring);
	return uring_ok;
}
