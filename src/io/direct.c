/*
 * direct.c - O_DIRECT descriptors for files already opened and validated:
 * reopened so that only the very file opened is ever read, and cached per
 * load for the io_uring reader.
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fsti_open_direct(const fst_file *f, bool *other_file, char *why, size_t why_size)
{
	*other_file = false;
	char self[64];
	snprintf(self, sizeof self, "/proc/self/fd/%d", f->fd);
	int fd = open(self, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0)
		fd = open(f->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		snprintf(why, why_size, "O_DIRECT refused: %s", strerror(e));
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

struct fsti_direct_fds {
	pthread_mutex_t lock;
	size_t n;
	bool refusal_logged;
	int fd[]; /* -2: not tried yet, -1: refused */
};

struct fsti_direct_fds *fsti_direct_fds_new(size_t nfiles)
{
	struct fsti_direct_fds *d = fsti_malloc(sizeof *d + (nfiles + 1) * sizeof(int));
	if (!d)
		return NULL;
	pthread_mutex_init(&d->lock, NULL);
	d->n = nfiles;
	d->refusal_logged = false;
	for (size_t i = 0; i < nfiles; i++)
		d->fd[i] = -2;
	return d;
}

int fsti_direct_fd(struct fsti_direct_fds *d, uint32_t i, const fst_file *f)
{
	if (!d || i >= d->n)
		return -1;
	pthread_mutex_lock(&d->lock);
	int fd = d->fd[i];
	if (fd == -2) {
		char why[96] = "";
		bool other;
		fd = fsti_open_direct(f, &other, why, sizeof why);
		if (fd < 0 && !d->refusal_logged) {
			d->refusal_logged = true;
			fsti_log(FST_LOG_INFO, "%s: no O_DIRECT descriptor (%s); reading through "
					       "the page cache",
				 f->path, why);
		}
		d->fd[i] = fd < 0 ? -1 : fd;
	}
	pthread_mutex_unlock(&d->lock);
	return fd;
}

void fsti_direct_fds_free(struct fsti_direct_fds *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n; i++)
		if (d->fd[i] >= 0)
			close(d->fd[i]);
	pthread_mutex_destroy(&d->lock);
	fsti_free(d);
}
