/*
 * cufile_double.c - a stand-in for libcufile.so.0 so the GPUDirect Storage
 * path runs on machines without a GPU or nvidia-fs. Selected with
 * FST_CUFILE_LIBRARY=path/to/libfst_cufile_double.so; never used otherwise.
 * It goes with the libcuda double (cuda_double.c), whose "device" pointers
 * are host pointers: cuFileRead preads straight into (char *)base + offset.
 *
 * Reads complete late: the destination range is poisoned (0xDB) first, the
 * call sleeps a little, and only then are the real bytes written, before it
 * returns (cuFileRead is synchronous). A failed or short read leaves poison
 * over the part it did not deliver, as a broken DMA may leave garbage.
 *
 * Environment, read at each call:
 *   FST_CUFILE_DOUBLE_DELAY_US      delay per read, microseconds (default 100)
 *   FST_CUFILE_DOUBLE_OPEN_ERR      cuFileDriverOpen fails with this code
 *   FST_CUFILE_DOUBLE_REGISTER_ERR  cuFileHandleRegister fails with this code
 *   FST_CUFILE_DOUBLE_REGISTER_ERR_FILE  ... only for paths containing this
 *   FST_CUFILE_DOUBLE_BUFREG_ERR    cuFileBufRegister fails with this code
 *   FST_CUFILE_DOUBLE_SHORT=1       every read returns at most half of what
 *                                   was asked (at least 1 byte)
 *   FST_CUFILE_DOUBLE_FAIL_AFTER=N  once N bytes have been read in total by
 *                                   this process, reads fail (a read that
 *                                   would cross N stops at it)
 *   FST_CUFILE_DOUBLE_FAIL_RC       what a failing read returns (default -5,
 *                                   -EIO); -1 also sets errno to EIO, as the
 *                                   real library does for file system errors
 *   FST_CUFILE_DOUBLE_NVFS=MAJ.MIN  nvidia-fs version in the driver
 *                                   properties (default 2.17)
 *
 * Counters for tests: fst_cufile_double_live_handles, _live_bufs, _reads,
 * _failed_reads, _misuse, _driver_opens, _handle_registers,
 * _buf_registers, _bytes, _path_reads(substring) and _forget_bufs.
 *
 * Misuse (a read with an unknown handle, outside a registered buffer, before
 * the driver is open; deregistering what is not registered) is counted, and
 * reported on stderr: tests assert fst_cufile_double_misuse() stays 0.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define POISON 0xDB
#define MAX_HANDLES 1024
#define MAX_BUFS 1024
#define MAX_HISTORY 4096

typedef struct CUfileError {
	int err;
	int cu_err;
} CUfileError_t;

typedef struct CUfileDescr {
	int type; /* 1: CU_FILE_HANDLE_TYPE_OPAQUE_FD */
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} CUfileDescr_t;

/* The head of CUfileDrvProps_t (the caller gives room for all of it). */
typedef struct CUfileDrvProps {
	struct {
		unsigned major_version, minor_version;
		size_t poll_thresh_size, max_direct_io_size;
		unsigned dstatusflags, dcontrolflags;
	} nvfs;
	unsigned fflags;
	unsigned max_device_cache_size;
	unsigned per_buffer_cache_size;
	unsigned max_device_pinned_mem_size;
	unsigned max_batch_io_size;
	unsigned max_batch_io_timeout_msecs;
} CUfileDrvProps_t;

enum {
	SUCCESS = 0,
	DRIVER_NOT_INITIALIZED = 5001,
	CUDA_POINTER_RANGE_ERROR = 5014,
	INVALID_VALUE = 5022,
	MEMORY_ALREADY_REGISTERED = 5023,
	MEMORY_NOT_REGISTERED = 5024,
	HANDLE_NOT_REGISTERED = 5027,
};

struct handle {
	int in_use;
	int fd;              /* our own descriptor (no O_DIRECT), for pread */
	char path[PATH_MAX];
	size_t history;      /* slot in the per-path history */
};

struct buf {
	const char *base;
	size_t len;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct handle handles[MAX_HANDLES];
static struct buf bufs[MAX_BUFS];
/* Reads per path, kept after the handle is gone. */
static struct {
	char path[PATH_MAX];
	long reads;
} history[MAX_HISTORY];
static size_t nhistory;
static int driver_open;
static long bytes_total; /* under lock: FAIL_AFTER is exact */
static atomic_long live_handles, live_bufs, reads, misuse, driver_opens, driver_closes,
	handle_registers, buf_registers, failed_reads;
static __thread unsigned seed;

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

static long env_long(const char *name, long dflt)
{
	const char *v = env(name);
	return v ? strtol(v, NULL, 0) : dflt;
}

static void misused(const char *what, long a, long b)
{
	atomic_fetch_add(&misuse, 1);
	fprintf(stderr, "cufile double: misuse: %s (%ld, %ld)\n", what, a, b);
}

static CUfileError_t result(int err)
{
	return (CUfileError_t){err, 0};
}

/* ---- the driver */

API CUfileError_t cuFileDriverOpen(void)
{
	atomic_fetch_add(&driver_opens, 1);
	long e = env_long("FST_CUFILE_DOUBLE_OPEN_ERR", 0);
	if (e)
		return result((int)e);
	pthread_mutex_lock(&lock);
	driver_open = 1;
	pthread_mutex_unlock(&lock);
	return result(SUCCESS);
}

API CUfileError_t cuFileDriverClose_v2(void)
{
	atomic_fetch_add(&driver_closes, 1);
	pthread_mutex_lock(&lock);
	int was = driver_open;
	driver_open = 0;
	pthread_mutex_unlock(&lock);
	return result(was ? SUCCESS : DRIVER_NOT_INITIALIZED);
}

API CUfileError_t cuFileDriverGetProperties(CUfileDrvProps_t *props)
{
	if (!props)
		return result(INVALID_VALUE);
	memset(props, 0, sizeof *props);
	unsigned major = 2, minor = 17;
	const char *v = env("FST_CUFILE_DOUBLE_NVFS");
	if (v && sscanf(v, "%u.%u", &major, &minor) != 2)
		major = minor = 0;
	props->nvfs.major_version = major;
	props->nvfs.minor_version = minor;
	props->nvfs.poll_thresh_size = 4;
	props->nvfs.max_direct_io_size = 16384;
	return result(SUCCESS);
}

/* ---- file handles */

API CUfileError_t cuFileHandleRegister(void **fh, CUfileDescr_t *d)
{
	atomic_fetch_add(&handle_registers, 1);
	if (!fh || !d || d->type != 1)
		return result(INVALID_VALUE);
	char link[64], path[PATH_MAX];
	snprintf(link, sizeof link, "/proc/self/fd/%d", d->handle.fd);
	ssize_t n = readlink(link, path, sizeof path - 1);
	if (n < 0)
		return result(INVALID_VALUE); /* not an open descriptor */
	path[n] = 0;
	long e = env_long("FST_CUFILE_DOUBLE_REGISTER_ERR", 0);
	const char *only = env("FST_CUFILE_DOUBLE_REGISTER_ERR_FILE");
	if (e && (!only || strstr(path, only)))
		return result((int)e);
	/* The caller's descriptor may have O_DIRECT, whose alignment rules the
	 * real library deals with: read through a plain descriptor of the very
	 * same file instead. */
	int fd = open(link, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return result(INVALID_VALUE);
	pthread_mutex_lock(&lock);
	size_t i = 0;
	while (i < MAX_HANDLES && handles[i].in_use)
		i++;
	if (i == MAX_HANDLES) {
		pthread_mutex_unlock(&lock);
		close(fd);
		return result(INVALID_VALUE);
	}
	size_t h = 0;
	while (h < nhistory && strcmp(history[h].path, path))
		h++;
	if (h == nhistory && nhistory < MAX_HISTORY)
		snprintf(history[nhistory++].path, PATH_MAX, "%s", path);
	handles[i].in_use = 1;
	handles[i].fd = fd;
	handles[i].history = h;
	snprintf(handles[i].path, sizeof handles[i].path, "%s", path);
	pthread_mutex_unlock(&lock);
	atomic_fetch_add(&live_handles, 1);
	*fh = &handles[i];
	return result(SUCCESS);
}

static struct handle *find_handle_locked(void *fh)
{
	struct handle *h = fh;
	if (h < handles || h >= handles + MAX_HANDLES || !h->in_use)
		return NULL;
	return h;
}

API void cuFileHandleDeregister(void *fh)
{
	pthread_mutex_lock(&lock);
	struct handle *h = find_handle_locked(fh);
	if (!h) {
		pthread_mutex_unlock(&lock);
		misused("cuFileHandleDeregister of an unknown handle", 0, 0);
		return;
	}
	close(h->fd);
	h->in_use = 0;
	pthread_mutex_unlock(&lock);
	atomic_fetch_sub(&live_handles, 1);
}

/* ---- buffers */

API CUfileError_t cuFileBufRegister(const void *base, size_t len, int flags)
{
	(void)flags;
	atomic_fetch_add(&buf_registers, 1);
	long e = env_long("FST_CUFILE_DOUBLE_BUFREG_ERR", 0);
	if (e)
		return result((int)e);
	if (!base || !len)
		return result(INVALID_VALUE);
	const char *b = base;
	pthread_mutex_lock(&lock);
	size_t free_slot = MAX_BUFS;
	for (size_t i = 0; i < MAX_BUFS; i++) {
		if (!bufs[i].base) {
			if (free_slot == MAX_BUFS)
				free_slot = i;
			continue;
		}
		if (b < bufs[i].base + bufs[i].len && bufs[i].base < b + len) {
			pthread_mutex_unlock(&lock);
			return result(MEMORY_ALREADY_REGISTERED);
		}
	}
	if (free_slot == MAX_BUFS) {
		pthread_mutex_unlock(&lock);
		return result(INVALID_VALUE);
	}
	bufs[free_slot].base = b;
	bufs[free_slot].len = len;
	pthread_mutex_unlock(&lock);
	atomic_fetch_add(&live_bufs, 1);
	return result(SUCCESS);
}

API CUfileError_t cuFileBufDeregister(const void *base)
{
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < MAX_BUFS; i++)
		if (bufs[i].base && bufs[i].base == (const char *)base) {
			bufs[i].base = NULL;
			bufs[i].len = 0;
			pthread_mutex_unlock(&lock);
			atomic_fetch_sub(&live_bufs, 1);
			return result(SUCCESS);
		}
	pthread_mutex_unlock(&lock);
	misused("cuFileBufDeregister of memory never registered", 0, 0);
	return result(MEMORY_NOT_REGISTERED);
}

/* ---- reads */

static void pause_a_little(void)
{
	long delay = env_long("FST_CUFILE_DOUBLE_DELAY_US", 100);
	if (delay <= 0)
		return;
	if (!seed)
		seed = (unsigned)(uintptr_t)&seed ^ (unsigned)time(NULL);
	usleep((useconds_t)(delay / 2 + rand_r(&seed) % (delay / 2 + 1)));
}

static ssize_t fail_read(void)
{
	atomic_fetch_add(&failed_reads, 1);
	long rc = env_long("FST_CUFILE_DOUBLE_FAIL_RC", -EIO);
	if (rc == -1)
		errno = EIO;
	return (ssize_t)rc;
}

API ssize_t cuFileRead(void *fh, void *base, size_t size, off_t file_offset, off_t buf_offset)
{
	atomic_fetch_add(&reads, 1);
	pthread_mutex_lock(&lock);
	struct handle *h = find_handle_locked(fh);
	int fd = h ? h->fd : -1;
	int open_now = driver_open;
	if (h && h->history < nhistory)
		history[h->history].reads++;
	/* Inside a registered buffer, the whole range must be in it. */
	long range_bad = 0;
	const char *dst = (const char *)base + buf_offset;
	for (size_t i = 0; i < MAX_BUFS; i++)
		if (bufs[i].base && (const char *)base >= bufs[i].base &&
		    (const char *)base < bufs[i].base + bufs[i].len)
			range_bad = buf_offset < 0 || dst + size > bufs[i].base + bufs[i].len;
	pthread_mutex_unlock(&lock);
	if (!h) {
		misused("cuFileRead with an unknown handle", 0, 0);
		return -HANDLE_NOT_REGISTERED;
	}
	if (!open_now) {
		misused("cuFileRead before cuFileDriverOpen", 0, 0);
		return -DRIVER_NOT_INITIALIZED;
	}
	if (range_bad || file_offset < 0) {
		misused("cuFileRead outside its registered buffer (bytes, buffer offset)",
			(long)size, (long)buf_offset);
		return -CUDA_POINTER_RANGE_ERROR;
	}
	if (!size)
		return 0;

	/* How much this read delivers: all, half (SHORT), up to FAIL_AFTER. */
	size_t want = size;
	if (env_long("FST_CUFILE_DOUBLE_SHORT", 0)) {
		want = size / 2;
		if (!want)
			want = 1;
	}
	const char *fa = env("FST_CUFILE_DOUBLE_FAIL_AFTER");
	int fail = 0;
	pthread_mutex_lock(&lock);
	if (fa) {
		long limit = strtol(fa, NULL, 0);
		if (bytes_total >= limit)
			fail = 1;
		else if ((long)want > limit - bytes_total)
			want = (size_t)(limit - bytes_total);
	}
	if (!fail)
		bytes_total += (long)want; /* reserved now, so concurrent reads stop at N */
	pthread_mutex_unlock(&lock);

	/* Late completion: poison, wait, then the bytes. */
	char *d = (char *)base + buf_offset;
	memset(d, POISON, size);
	pause_a_little();
	if (fail)
		return fail_read();
	size_t got = 0;
	int failed = 0;
	while (got < want) {
		ssize_t n = pread(fd, d + got, want - got, file_offset + (off_t)got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			failed = 1;
		if (n <= 0)
			break; /* an error, or the end of the file */
		got += (size_t)n;
	}
	if (got < want) {
		pthread_mutex_lock(&lock);
		bytes_total -= (long)(want - got);
		pthread_mutex_unlock(&lock);
	}
	if (failed && !got)
		return fail_read();
	return (ssize_t)got;
}

/* ---- for tests */

API long fst_cufile_double_live_handles(void) { return atomic_load(&live_handles); }
API long fst_cufile_double_live_bufs(void) { return atomic_load(&live_bufs); }
API long fst_cufile_double_reads(void) { return atomic_load(&reads); }
API long fst_cufile_double_failed_reads(void) { return atomic_load(&failed_reads); }
API long fst_cufile_double_misuse(void) { return atomic_load(&misuse); }
API long fst_cufile_double_driver_opens(void) { return atomic_load(&driver_opens); }
API long fst_cufile_double_driver_closes(void) { return atomic_load(&driver_closes); }
API long fst_cufile_double_handle_registers(void) { return atomic_load(&handle_registers); }
API long fst_cufile_double_buf_registers(void) { return atomic_load(&buf_registers); }

/* Bytes delivered by reads so far (what FST_CUFILE_DOUBLE_FAIL_AFTER counts). */
API long fst_cufile_double_bytes(void)
{
	pthread_mutex_lock(&lock);
	long b = bytes_total;
	pthread_mutex_unlock(&lock);
	return b;
}

/* Reads through handles of files whose path contains substr, since the
 * process started. */
API long fst_cufile_double_path_reads(const char *substr)
{
	long n = 0;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < nhistory; i++)
		if (strstr(history[i].path, substr))
			n += history[i].reads;
	pthread_mutex_unlock(&lock);
	return n;
}

/* Forget every registered buffer (after a test has reported buffers left
 * registered, so the next test starts clean); returns how many there were. */
API long fst_cufile_double_forget_bufs(void)
{
	long n = 0;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < MAX_BUFS; i++)
		if (bufs[i].base) {
			bufs[i].base = NULL;
			bufs[i].len = 0;
			n++;
		}
	pthread_mutex_unlock(&lock);
	atomic_fetch_sub(&live_bufs, n);
	return n;
}
