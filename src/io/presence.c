/*
 * presence.c - other loads reading the same files, in any process.
 *
 * A load that reads a file cold holds a read lock on one byte far past the
 * end of any file: an open file description lock (F_OFD_SETLK), on a
 * descriptor of its own. Whether a write lock on that byte would conflict
 * (F_OFD_GETLK) tells whether another load holds one; a load's own lock never
 * conflicts with itself. Read locks need only read access, so every user
 * who can read a model takes part, and the locks go with the descriptors: a
 * load that ends, fails or is killed leaves none behind. The byte is past
 * any data, so the locks touch no reader that does not ask for them.
 *
 * Where locks are not to be had (a filesystem without them, a kernel
 * before 3.15, a checkpoint of so many files that three descriptors each
 * would crowd RLIMIT_NOFILE), a load is alone as far as it can tell. So it
 * is on filesystems shared between machines (NFS, SMB, Lustre, GPFS, Ceph,
 * BeeGFS, FUSE): their locks reach loads on other machines, whose page
 * caches are their own, and each look would be a round trip. A child
 * forked during a load keeps the lock until it closes its copy or exits;
 * the worst a stale lock does is send a load through the page cache.
 */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <unistd.h>

/* Far past any file's data, inside a 64-bit off_t. */
#define PRESENCE_BYTE ((off_t)1 << 62)

struct fsti_presence {
	size_t n;
	int fd[]; /* -1: no lock held on that file */
};

/* Whether fd's filesystem is one machine's own (statfs magic numbers). */
static bool local_filesystem(int fd)
{
	static const unsigned long shared[] = {
		0x6969,     /* NFS */
		0xff534d42, /* CIFS */
		0xfe534d42, /* SMB2 */
		0x517b,     /* SMB */
		0x0bd00bd0, /* Lustre */
		0x47504653, /* GPFS */
		0x00c36400, /* Ceph */
		0x19830326, /* BeeGFS */
		0x65735546, /* FUSE */
	};
	struct statfs sf;
	if (fstatfs(fd, &sf))
		return false;
	for (size_t i = 0; i < sizeof shared / sizeof *shared; i++)
		if ((unsigned long)sf.f_type == shared[i])
			return false;
	return true;
}

static struct flock presence_lock(short type)
{
	struct flock l = {0};
	l.l_type = type;
	l.l_whence = SEEK_SET;
	l.l_start = PRESENCE_BYTE;
	l.l_len = 1;
	return l;
}

struct fsti_presence *fsti_presence_join(const fst_checkpoint *ck, bool hold)
{
	size_t n = fst_checkpoint_file_count(ck);
	struct fsti_presence *p = fsti_malloc(sizeof *p + (n + 1) * sizeof(int));
	if (!p)
		return NULL;
	p->n = n;
	/* A load keeps each file's own descriptor and may open an O_DIRECT one:
	 * a lock's descriptor too must leave room under the process's limit,
	 * or the O_DIRECT opens would be the ones refused. */
	struct rlimit lim;
	bool room = getrlimit(RLIMIT_NOFILE, &lim) == 0 &&
		    (lim.rlim_cur == RLIM_INFINITY || (rlim_t)n * 3 + 64 <= lim.rlim_cur);
	for (size_t i = 0; i < n; i++) {
		const fst_file *f = fst_checkpoint_file(ck, i);
		p->fd[i] = -1;
		if (!room || !f || f->fd < 0 || !local_filesystem(f->fd))
			continue; /* a remote file, a memory image, a shared filesystem */
		char why[96];
		bool other = false;
		int fd = fsti_reopen(f, 0, &other, why, sizeof why);
		if (fd < 0)
			continue;
		/* a descriptor without a lock still sees the others' (F_OFD_GETLK) */
		struct flock l = presence_lock(F_RDLCK);
		if (hold && (fsti_fault("presence") || fcntl(fd, F_OFD_SETLK, &l))) {
			close(fd);
			continue;
		}
		p->fd[i] = fd;
	}
	return p;
}

bool fsti_presence_others(const struct fsti_presence *p, size_t i)
{
	if (!p || i >= p->n || p->fd[i] < 0)
		return false;
	struct flock l = presence_lock(F_WRLCK);
	return fcntl(p->fd[i], F_OFD_GETLK, &l) == 0 && l.l_type != F_UNLCK;
}

bool fsti_presence_any(const struct fsti_presence *p, size_t *which)
{
	for (size_t i = 0; p && i < p->n; i++)
		if (fsti_presence_others(p, i)) {
			if (which)
				*which = i;
			return true;
		}
	return false;
}

void fsti_presence_leave(struct fsti_presence *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++)
		if (p->fd[i] >= 0)
			close(p->fd[i]);
	fsti_free(p);
}
