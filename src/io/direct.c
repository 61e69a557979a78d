/*
 * direct.c - O_DIRECT descriptors for files already opened and validated:
 * reopened so that only the very file opened is ever read, and cached per
 * load for the io_uring reader (or, under FST_URING_PAGE_CACHE, descriptors
 * of their own without O_DIRECT, read in the same requests).
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
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
	int fd[]; /* -2: not tried yet, -1: refused */
};

#define SHARE_CHECK_S 0.01

struct fsti_direct_fds *fsti_direct_fds_new(size_t nfiles, enum fsti_page_cache mode)
{
	struct fsti_direct_fds *d = fsti_malloc(sizeof *d + (nfiles + 1) * sizeof(int));
	bool *refused = fsti_calloc(nfiles + 1, sizeof *refused);
	if (!d || !refused) {
		fsti_free(d);
		fsti_free(refused);
		return NULL;
	}
	d->read_refused = refused;
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

void fsti_direct_fds_free(struct fsti_direct_fds *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n; i++)
		if (d->fd[i] >= 0)
			close(d->fd[i]);
	pthread_mutex_destroy(&d->lock);
	fsti_free(d->read_refused);
	fsti_free(d);
}
