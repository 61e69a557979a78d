/*
 * direct.c - O_DIRECT descriptors for files already opened and validated:
 * reopened so that only the very file opened is ever read, and cached per
 * load for the io_uring reader (or, under FST_URING_PAGE_CACHE, descriptors
 * of their own without O_DIRECT, read in the same requests). A chunk the
 * page cache holds whole is better read from it than from the disk again:
 * fsti_direct_cached asks mincore, through a view of the file that is
 * never touched.
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int fsti_reopen(const fst_file *f, int flags, bool *other_file, char *why, size_t why_size)
{
	*other_file = false;
	char self[64];
	snprintf(self, sizeof self, "/proc/self/fd/%d", f->fd);
	int fd = open(self, O_RDONLY | O_CLOEXEC | flags);
	if (fd < 0)
		fd = open(f->path, O_RDONLY | O_CLOEXEC | flags);
	if (fd < 0) {
		int e = errno;
		snprintf(why, why_size, "%s refused: %s", flags & O_DIRECT ? "O_DIRECT" : "open",
			 strerror(e));
		errno = e;
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) || (uint64_t)st.st_dev != f->dev || (uint64_t)st.st_ino != f->ino) {
		close(fd);
		*other_file = true;
		snprintf(why, why_size, "the path names another file now");
		return -1;
	}
	return fd;
}

int fsti_open_direct(const fst_file *f, bool *other_file, char *why, size_t why_size)
{
	return fsti_reopen(f, O_DIRECT, other_file, why, why_size);
}

int fsti_page_cache_mode(enum fsti_page_cache *out, fst_error *err)
{
	const char *v = fsti_env(FSTI_ENV_URING_PAGE_CACHE);
	*out = FSTI_PAGE_CACHE_OFF;
	if (!v || !strcmp(v, "off"))
		return 0;
	if (!strcmp(v, "random"))
		*out = FSTI_PAGE_CACHE_RANDOM;
	else if (!strcmp(v, "readahead"))
		*out = FSTI_PAGE_CACHE_READAHEAD;
	else
		return fsti_err(err, FST_EUSAGE, "%s=\"%s\": expected off, random or readahead",
				fsti_env_name(FSTI_ENV_URING_PAGE_CACHE), v);
	return 0;
}

const char *fsti_page_cache_text(enum fsti_page_cache mode)
{
	switch (mode) {
	case FSTI_PAGE_CACHE_RANDOM:
		return "io_uring through the page cache, readahead off (FST_URING_PAGE_CACHE=random)";
	case FSTI_PAGE_CACHE_READAHEAD:
		return "io_uring through the page cache (FST_URING_PAGE_CACHE=readahead)";
	default:
		return "";
	}
}

struct fsti_direct_fds {
	pthread_mutex_t lock;
	size_t n;
	bool refusal_logged;
	enum fsti_page_cache mode;
	/* per file: O_DIRECT reads refused after the open (fsti_direct_refuse);
	 * its descriptor stays open (requests may be in flight on it) until
	 * fsti_direct_fds_free */
	bool *read_refused;
	/* fsti_direct_fds_watch: other loads looked for at most every
	 * SHARE_CHECK_S; once one is seen, every file through the page cache */
	const struct fsti_presence *watch;
	double last_check;
	bool shared;
	/* per file: a read-only view for mincore, never touched (p NULL: not
	 * made yet; MAP_FAILED: none, mincore cannot tell for this file) */
	struct view {
		void *p;
		uint64_t len;
	} *view;
	bool check_cache; /* fsti_direct_fds_check_cache */
	atomic_uint_fast64_t cached_bytes;
	int fd[]; /* -2: not tried yet, -1: refused */
};

#define SHARE_CHECK_S 0.01

struct fsti_direct_fds *fsti_direct_fds_new(size_t nfiles, enum fsti_page_cache mode)
{
	struct fsti_direct_fds *d = fsti_malloc(sizeof *d + (nfiles + 1) * sizeof(int));
	bool *refused = fsti_calloc(nfiles + 1, sizeof *refused);
	struct view *view = fsti_calloc(nfiles + 1, sizeof *view);
	if (!d || !refused || !view) {
		fsti_free(d);
		fsti_free(refused);
		fsti_free(view);
		return NULL;
	}
	d->read_refused = refused;
	d->view = view;
	d->check_cache = false;
	atomic_init(&d->cached_bytes, 0);
	pthread_mutex_init(&d->lock, NULL);
	d->n = nfiles;
	d->refusal_logged = false;
	d->mode = mode;
	d->watch = NULL;
	d->last_check = 0;
	d->shared = false;
	for (size_t i = 0; i < nfiles; i++)
		d->fd[i] = -2;
	return d;
}

int fsti_direct_fd(struct fsti_direct_fds *d, uint32_t i, const fst_file *f)
{
	if (!d || i >= d->n)
		return -1;
	pthread_mutex_lock(&d->lock);
	if (d->watch && !d->shared) {
		/* every load holds all of its files' locks from start to end:
		 * file i's tells whether another load is reading these files */
		double now = fsti_now();
		if (now - d->last_check >= SHARE_CHECK_S) {
			d->last_check = now;
			if (fsti_presence_others(d->watch, i)) {
				d->shared = true;
				fsti_log(FST_LOG_INFO, "%s: another load is reading these files: the "
						       "rest through the page cache, which reads each "
						       "byte from the disk once for all of them",
					 f->path);
			}
		}
	}
	if (d->read_refused[i] || d->shared) {
		pthread_mutex_unlock(&d->lock);
		return -1;
	}
	int fd = d->fd[i];
	if (fd == -2) {
		char why[96] = "";
		bool other;
		fd = fsti_reopen(f, d->mode == FSTI_PAGE_CACHE_OFF ? O_DIRECT : 0, &other, why,
			    sizeof why);
		/* a descriptor of its own: the advice touches no other reader */
		if (fd >= 0 && d->mode == FSTI_PAGE_CACHE_RANDOM)
			(void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
		if (fd < 0 && !d->refusal_logged) {
			d->refusal_logged = true;
			fsti_log(FST_LOG_INFO, "%s: no %s descriptor (%s); reading through the "
					       "page cache",
				 f->path, d->mode == FSTI_PAGE_CACHE_OFF ? "O_DIRECT" : "second", why);
		}
		d->fd[i] = fd < 0 ? -1 : fd;
	}
	pthread_mutex_unlock(&d->lock);
	return fd;
}

void fsti_direct_refuse(struct fsti_direct_fds *d, uint32_t i, const char *path, int errnum)
{
	if (!d || i >= d->n)
		return;
	pthread_mutex_lock(&d->lock);
	bool first = !d->read_refused[i];
	d->read_refused[i] = true;
	pthread_mutex_unlock(&d->lock);
	if (first)
		fsti_log(FST_LOG_INFO, "%s: O_DIRECT read refused (%s); reading the rest through "
				       "the page cache",
			 path, strerror(errnum));
}

void fsti_direct_fds_watch(struct fsti_direct_fds *d, const struct fsti_presence *p)
{
	if (!d || d->mode != FSTI_PAGE_CACHE_OFF)
		return; /* a page-cache mode shares the page cache already */
	pthread_mutex_lock(&d->lock);
	d->watch = p;
	pthread_mutex_unlock(&d->lock);
}

bool fsti_direct_fds_shared(struct fsti_direct_fds *d)
{
	if (!d)
		return false;
	pthread_mutex_lock(&d->lock);
	bool shared = d->shared;
	pthread_mutex_unlock(&d->lock);
	return shared;
}

/* Whether mincore says every page of [at, end) of view is resident. */
static bool resident(const char *view, uint64_t at, uint64_t end, uint64_t page)
{
	unsigned char vec[256];
	while (at < end) {
		uint64_t k = FSTI_MIN((end - at + page - 1) / page, (uint64_t)sizeof vec);
		if (mincore((void *)(view + at), (size_t)(k * page), vec))
			return false;
		for (uint64_t j = 0; j < k; j++)
			if (!(vec[j] & 1))
				return false;
		at += k * page;
	}
	return true;
}

bool fsti_direct_cached(struct fsti_direct_fds *d, uint32_t i, const fst_file *f, uint64_t off,
			uint64_t len)
{
	if (!d || !d->check_cache || i >= d->n || !len || f->fd < 0)
		return false;
	pthread_mutex_lock(&d->lock);
	void *v = d->view[i].p;
	if (!v) {
		v = MAP_FAILED;
		if (f->size && fsti_mincore_tells(f->fd))
			v = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, f->fd, 0);
		d->view[i] = (struct view){v, f->size};
	}
	pthread_mutex_unlock(&d->lock);
	if (v == MAP_FAILED || off >= f->size)
		return false;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t a0 = off & ~(page - 1), end = FSTI_MIN(off + len, f->size);
	/* the first page alone first: a cold chunk costs one small call */
	if (!resident(v, a0, a0 + page, page) || !resident(v, a0 + page, end, page))
		return false;
	atomic_fetch_add(&d->cached_bytes, len);
	return true;
}

void fsti_direct_fds_check_cache(struct fsti_direct_fds *d)
{
	if (d && d->mode == FSTI_PAGE_CACHE_OFF)
		d->check_cache = true; /* before the workers start */
}

uint64_t fsti_direct_cached_bytes(struct fsti_direct_fds *d)
{
	return d ? (uint64_t)atomic_load(&d->cached_bytes) : 0;
}

void fsti_direct_fds_free(struct fsti_direct_fds *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n; i++)
		if (d->view[i].p && d->view[i].p != MAP_FAILED)
			munmap(d->view[i].p, (size_t)d->view[i].len);
	for (size_t i = 0; i < d->n; i++)
		if (d->fd[i] >= 0)
			close(d->fd[i]);
	pthread_mutex_destroy(&d->lock);
	fsti_free(d->read_refused);
	fsti_free(d->view);
	fsti_free(d);
}
