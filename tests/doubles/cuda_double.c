/*
 * cuda_double.c - a stand-in for libcuda.so.1 so the CUDA path runs, with
 * its ordering rules, on machines without a GPU. Selected with
 * FST_CUDA_LIBRARY=path/to/libfst_cuda_double.so; never used otherwise.
 *
 * "Device" memory is host memory. Asynchronous copies are done late, by one
 * thread per stream that sleeps a little before each operation, and the
 * destination is poisoned (0xDB) when a copy is queued, so any read made
 * before the copy's completion has been waited for sees poison, and any
 * staging buffer reused too early corrupts what lands. Strided device
 * copies (cuMemcpy2DAsync, for tensor-parallel shards, refused past the
 * pitch limit as the driver does) and device-to-device ones are late and
 * poisoned the same way; cuStreamQuery says when a stream is idle. Device-to-host
 * copies are immediate and wait for nothing, like copies beside
 * non-blocking streams on a real GPU. fst_double_stream_call queues a
 * function for a stream's thread to run in its turn: the NCCL double's
 * collectives, which wait there for their peers as a kernel would.
 *
 * Environment: FST_DOUBLE_DEVICES (default 2), FST_DOUBLE_MEM (bytes per
 * device, default 16 GiB), FST_DOUBLE_DELAY_US (max delay per operation,
 * default 200), FST_DOUBLE_RDMA (GPU_DIRECT_RDMA_SUPPORTED, default 1),
 * FST_DOUBLE_INTEGRATED (default 0), FST_DOUBLE_MAX_PITCH (MAX_PITCH, the
 * widest pitch a strided copy takes; default 2^31 - 1).
 *
 * FST_DOUBLE_PLATFORM picks the attributes of a kind of machine
 * (docs/platforms.md): discrete (default; an H200 on x86-64), integrated
 * (GB10-like: one memory, RDMA 0), jetson (integrated, no pageable access),
 * coherent (GH200-like: pageable access through the host's page tables) or
 * hmm (x86-64 with HMM: pageable access, not through the host's page
 * tables). FST_DOUBLE_INTEGRATED and FST_DOUBLE_RDMA, when set, override it.
 * cuMemHostAlloc with DEVICEMAP maps the block twice (one memfd): the host
 * address, and a different "device" address of the same bytes that
 * cuMemHostGetDevicePointer returns, so code that hands out the host
 * address where the device one is due reads the right bytes but fails the
 * pointer checks. cuMemFreeHost unmaps both.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define POISON 0xDB
#define MAX_ALLOCS 4096

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101,
       INVALID_HANDLE = 400, NOT_READY = 600, ILLEGAL_ADDRESS = 700 };

struct alloc {
	char *p;
	size_t n;
	int device;
	char *host; /* mapped host memory: p is its device alias */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct alloc allocs[MAX_ALLOCS];
static size_t used[64];
static atomic_long live_device, live_host, live_mapped, live_registered;
static int initialized;
static __thread int current = -1;

static long env_long(const char *name, long dflt)
{
	const char *v = getenv(name);
	return v && *v ? atol(v) : dflt;
}

static int ndevices(void) { return (int)env_long("FST_DOUBLE_DEVICES", 2); }

/* ---- streams: a queue run late by a thread */

enum { OP_COPY, OP_MARK, OP_CALL };
struct op {
	int kind;
	char *dst;
	const char *src;
	size_t n;
	void (*fn)(void *);
	void *arg;
	uint64_t seq;
	struct op *next;
};

struct stream {
	pthread_t thread;
	pthread_mutex_t m;
	pthread_cond_t cv;
	struct op *head, *tail;
	uint64_t queued, done;
	int quit;
	unsigned seed;
};

struct event {
	struct stream *s;
	uint64_t seq;
	int recorded;
};

static void *stream_main(void *arg)
{
	struct stream *s = arg;
	long delay = env_long("FST_DOUBLE_DELAY_US", 200);
	pthread_mutex_lock(&s->m);
	for (;;) {
		while (!s->head && !s->quit)
			pthread_cond_wait(&s->cv, &s->m);
		if (!s->head && s->quit)
			break;
		struct op *o = s->head;
		pthread_mutex_unlock(&s->m);
		if (delay > 0)
			usleep((useconds_t)(rand_r(&s->seed) % (delay + 1)));
		if (o->kind == OP_COPY)
			memcpy(o->dst, o->src, o->n);
		else if (o->kind == OP_CALL)
			o->fn(o->arg);
		pthread_mutex_lock(&s->m);
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		s->done = o->seq;
		free(o);
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->m);
	return NULL;
}

static uint64_t enqueue_op(struct stream *s, struct op *o)
{
	pthread_mutex_lock(&s->m);
	/* o belongs to the stream's thread once queued: it may run and free it
	 * as soon as the lock is dropped, so its number is kept here. */
	uint64_t seq = o->seq = ++s->queued;
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->m);
	return seq;
}

static uint64_t enqueue(struct stream *s, int kind, char *dst, const char *src, size_t n)
{
	struct op *o = calloc(1, sizeof *o);
	o->kind = kind;
	o->dst = dst;
	o->src = src;
	o->n = n;
	return enqueue_op(s, o);
}

API void fst_double_stream_call(void *h, void (*fn)(void *), void *arg)
{
	struct op *o = calloc(1, sizeof *o);
	o->kind = OP_CALL;
	o->fn = fn;
	o->arg = arg;
	enqueue_op(h, o);
}

static void wait_seq(struct stream *s, uint64_t seq)
{
	pthread_mutex_lock(&s->m);
	while (s->done < seq)
		pthread_cond_wait(&s->cv, &s->m);
	pthread_mutex_unlock(&s->m);
}

/* ---- the driver API */

API CUresult cuInit(unsigned flags)
{
	(void)flags;
	initialized = 1;
	return OK;
}

API CUresult cuDriverGetVersion(int *v)
{
	*v = 13000;
	return OK;
}

API CUresult cuGetErrorName(CUresult e, const char **s)
{
	static const char *names[] = {[OK] = "CUDA_SUCCESS", [INVALID_VALUE] = "CUDA_ERROR_INVALID_VALUE",
				      [OUT_OF_MEMORY] = "CUDA_ERROR_OUT_OF_MEMORY",
				      [NOT_INITIALIZED] = "CUDA_ERROR_NOT_INITIALIZED"};
	*s = e >= 0 && e <= 3 ? names[e] : e == NOT_READY ? "CUDA_ERROR_NOT_READY"
		: e == INVALID_DEVICE ? "CUDA_ERROR_INVALID_DEVICE"
		: e == ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_UNKNOWN";
	return OK;
}

API CUresult cuGetErrorString(CUresult e, const char **s)
{
	*s = e == OUT_OF_MEMORY ? "out of memory" : e == ILLEGAL_ADDRESS ? "an illegal memory access"
		: "test double error";
	return OK;
}

API CUresult cuDeviceGetCount(int *n)
{
	if (!initialized)
		return NOT_INITIALIZED;
	*n = ndevices();
	return OK;
}

API CUresult cuDeviceGet(int *d, int ordinal)
{
	if (ordinal < 0 || ordinal >= ndevices())
		return INVALID_DEVICE;
	*d = ordinal;
	return OK;
}

API CUresult cuDeviceGetName(char *name, int len, int d)
{
	snprintf(name, (size_t)len, "fst test double %d", d);
	return OK;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, int d)
{
	(void)d;
	*bytes = (size_t)env_long("FST_DOUBLE_MEM", 16l << 30);
	return OK;
}

/* The attributes of the platform FST_DOUBLE_PLATFORM names. */
struct platform {
	const char *name;
	int integrated, can_map, pageable, host_page_tables, host_pointer, rdma;
};
static const struct platform platforms[] = {
	{"discrete", 0, 1, 0, 0, 1, 1},
	{"integrated", 1, 1, 1, 1, 1, 0},
	{"jetson", 1, 1, 0, 0, 1, 0},
	{"coherent", 0, 1, 1, 1, 1, 1},
	{"hmm", 0, 1, 1, 0, 1, 1},
};

static const struct platform *platform(void)
{
	const char *v = getenv("FST_DOUBLE_PLATFORM");
	for (size_t i = 0; v && i < sizeof platforms / sizeof platforms[0]; i++)
		if (!strcmp(v, platforms[i].name))
			return &platforms[i];
	if (v && *v) {
		fprintf(stderr, "cuda double: unknown FST_DOUBLE_PLATFORM=%s\n", v);
		abort();
	}
	return &platforms[0];
}

/* The widest pitch a strided copy takes: a real device's 2^31 - 1, or less
 * (FST_DOUBLE_MAX_PITCH), so that small tensors cross it. */
static long max_pitch(void) { return env_long("FST_DOUBLE_MAX_PITCH", 2147483647L); }

API CUresult cuDeviceGetAttribute(int *v, int attr, int d)
{
	const struct platform *pl = platform();
	switch (attr) {
	case 11: *v = (int)max_pitch(); break;
	case 18: *v = (int)env_long("FST_DOUBLE_INTEGRATED", pl->integrated); break;
	case 19: *v = pl->can_map; break;
	case 88: *v = pl->pageable; break;
	case 91: *v = pl->host_pointer; break;
	case 100: *v = pl->host_page_tables; break;
	case 116: *v = (int)env_long("FST_DOUBLE_RDMA", pl->rdma); break;
	case 75: *v = 9; break;
	case 33: *v = 0x3b + d; break;
	default: *v = 0;
	}
	return OK;
}

static int contexts[64];

API CUresult cuDevicePrimaryCtxRetain(void **ctx, int d)
{
	if (d < 0 || d >= ndevices())
		return INVALID_DEVICE;
	*ctx = &contexts[d];
	return OK;
}

API CUresult cuCtxSetCurrent(void *ctx)
{
	if (!ctx)
		return INVALID_VALUE;
	current = (int)((int *)ctx - contexts);
	return OK;
}

API CUresult cuCtxGetCurrent(void **ctx)
{
	*ctx = current < 0 ? NULL : &contexts[current];
	return OK;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	if (current < 0)
		return INVALID_VALUE; /* no context current: a real driver fails too */
	size_t limit = (size_t)env_long("FST_DOUBLE_MEM", 16l << 30);
	pthread_mutex_lock(&lock);
	if (used[current] + n > limit) {
		pthread_mutex_unlock(&lock);
		return OUT_OF_MEMORY;
	}
	char *m = NULL;
	if (posix_memalign((void **)&m, 512, n ? n : 1)) {
		pthread_mutex_unlock(&lock);
		return OUT_OF_MEMORY;
	}
	memset(m, POISON, n);
	size_t i = 0;
	while (i < MAX_ALLOCS && allocs[i].p)
		i++;
	if (i == MAX_ALLOCS) {
		pthread_mutex_unlock(&lock);
		free(m);
		return OUT_OF_MEMORY;
	}
	allocs[i] = (struct alloc){m, n, current, NULL};
	used[current] += n;
	pthread_mutex_unlock(&lock);
	atomic_fetch_add(&live_device, 1);
	*p = (CUdeviceptr)(uintptr_t)m;
	return OK;
}

API CUresult cuMemFree_v2(CUdeviceptr p)
{
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].p == (char *)(uintptr_t)p && !allocs[i].host) {
			used[allocs[i].device] -= allocs[i].n;
			free(allocs[i].p);
			allocs[i].p = NULL;
			pthread_mutex_unlock(&lock);
			atomic_fetch_sub(&live_device, 1);
			return OK;
		}
	pthread_mutex_unlock(&lock);
	fprintf(stderr, "cuda double: cuMemFree of unknown pointer %p\n", (void *)(uintptr_t)p);
	abort();
}

/* Any device range must lie inside one allocation: a stray write is a bug. */
static int device_range_ok(CUdeviceptr p, size_t n)
{
	char *a = (char *)(uintptr_t)p;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].p && a >= allocs[i].p && a + n <= allocs[i].p + allocs[i].n) {
			pthread_mutex_unlock(&lock);
			return 1;
		}
	pthread_mutex_unlock(&lock);
	return 0;
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	size_t limit = (size_t)env_long("FST_DOUBLE_MEM", 16l << 30);
	pthread_mutex_lock(&lock);
	size_t u = used[current < 0 ? 0 : current];
	pthread_mutex_unlock(&lock);
	*total = limit;
	*free_bytes = u < limit ? limit - u : 0;
	return OK;
}

#define DEVICEMAP 0x2

/* DEVICEMAP: one memfd mapped twice, host and device addresses apart. */
static CUresult map_host(void **p, size_t n)
{
	if (current < 0)
		return INVALID_VALUE;
	size_t len = n ? n : 1;
	int fd = memfd_create("cuda-double-mapped", MFD_CLOEXEC);
	if (fd < 0)
		return OUT_OF_MEMORY;
	if (ftruncate(fd, (off_t)len)) {
		close(fd);
		return OUT_OF_MEMORY;
	}
	char *host = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	char *dev = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (host == MAP_FAILED || dev == MAP_FAILED) {
		if (host != MAP_FAILED)
			munmap(host, len);
		if (dev != MAP_FAILED)
			munmap(dev, len);
		return OUT_OF_MEMORY;
	}
	memset(host, POISON, len);
	pthread_mutex_lock(&lock);
	size_t i = 0;
	while (i < MAX_ALLOCS && allocs[i].p)
		i++;
	if (i == MAX_ALLOCS) {
		pthread_mutex_unlock(&lock);
		munmap(host, len);
		munmap(dev, len);
		return OUT_OF_MEMORY;
	}
	allocs[i] = (struct alloc){dev, len, current, host};
	pthread_mutex_unlock(&lock);
	atomic_fetch_add(&live_mapped, 1);
	*p = host;
	return OK;
}

API CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags)
{
	if (flags & DEVICEMAP)
		return map_host(p, n);
	if (posix_memalign(p, 4096, n ? n : 1))
		return OUT_OF_MEMORY;
	atomic_fetch_add(&live_host, 1);
	return OK;
}

API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags)
{
	if (flags)
		return INVALID_VALUE;
	char *h = p;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].p && allocs[i].host && h >= allocs[i].host &&
		    h < allocs[i].host + allocs[i].n) {
			*d = (CUdeviceptr)(uintptr_t)(allocs[i].p + (h - allocs[i].host));
			pthread_mutex_unlock(&lock);
			return OK;
		}
	pthread_mutex_unlock(&lock);
	return INVALID_VALUE; /* not mapped with DEVICEMAP */
}

API CUresult cuMemFreeHost(void *p)
{
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < MAX_ALLOCS; i++)
		if (allocs[i].p && allocs[i].host == (char *)p) {
			munmap(allocs[i].host, allocs[i].n);
			munmap(allocs[i].p, allocs[i].n);
			allocs[i] = (struct alloc){0};
			pthread_mutex_unlock(&lock);
			atomic_fetch_sub(&live_mapped, 1);
			return OK;
		}
	pthread_mutex_unlock(&lock);
	free(p);
	atomic_fetch_sub(&live_host, 1);
	return OK;
}

/* Registered host ranges: what cuMemHostUnregister must be given back. */
#define MAX_REGISTERED 4096
static struct {
	char *p;
	size_t n;
} registered[MAX_REGISTERED];

/* The share of a block's pages already faulted in when it was registered
 * last, in thousandths (-1: mincore failed). */
static atomic_long resident_at_register = -1;

static void note_resident(void *p, size_t n)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
	size_t len = (size_t)((uintptr_t)p + n - a), pages = (len + (size_t)page - 1) / (size_t)page;
	unsigned char *v = malloc(pages);
	long in = 0;
	if (v && mincore((void *)a, len, v) == 0) {
		for (size_t i = 0; i < pages; i++)
			in += v[i] & 1;
		atomic_store(&resident_at_register, (long)(in * 1000 / (long)pages));
	} else {
		atomic_store(&resident_at_register, -1);
	}
	free(v);
}

/* Streams made so far, and how many had been made when the last
 * registration returned: whether workers set up while staging was pinned. */
static atomic_long streams_made, streams_at_register = -1;

API CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags)
{
	if (!p || !n || (flags & ~1u))
		return INVALID_VALUE;
	note_resident(p, n);
	/* FST_DOUBLE_REGISTER_MS: a registration as slow as a real driver's */
	long ms = env_long("FST_DOUBLE_REGISTER_MS", 0);
	if (ms > 0)
		usleep((useconds_t)ms * 1000);
	atomic_store(&streams_at_register, atomic_load(&streams_made));
	/* the driver touches every page it pins: so does the double */
	for (size_t i = 0; i < n; i += 4096)
		((volatile char *)p)[i] = ((volatile char *)p)[i];
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < MAX_REGISTERED; i++)
		if (!registered[i].p) {
			registered[i].p = p;
			registered[i].n = n;
			pthread_mutex_unlock(&lock);
			atomic_fetch_add(&live_registered, 1);
			atomic_fetch_add(&live_host, 1); /* a pinned host block too */
			return OK;
		}
	pthread_mutex_unlock(&lock);
	return OUT_OF_MEMORY;
}

API CUresult cuMemHostUnregister(void *p)
{
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < MAX_REGISTERED; i++)
		if (registered[i].p == p) {
			registered[i].p = NULL;
			pthread_mutex_unlock(&lock);
			atomic_fetch_sub(&live_registered, 1);
			atomic_fetch_sub(&live_host, 1);
			return OK;
		}
	pthread_mutex_unlock(&lock);
	return INVALID_VALUE; /* not registered */
}

API CUresult cuStreamCreate(void **out, unsigned flags)
{
	(void)flags;
	struct stream *s = calloc(1, sizeof *s);
	pthread_mutex_init(&s->m, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->seed = (unsigned)(uintptr_t)s ^ (unsigned)time(NULL);
	pthread_create(&s->thread, NULL, stream_main, s);
	*out = s;
	atomic_fetch_add(&streams_made, 1);
	return OK;
}

API CUresult cuStreamSynchronize(void *h)
{
	struct stream *s = h;
	pthread_mutex_lock(&s->m);
	uint64_t q = s->queued;
	pthread_mutex_unlock(&s->m);
	wait_seq(s, q);
	return OK;
}

API CUresult cuStreamDestroy_v2(void *h)
{
	struct stream *s = h;
	pthread_mutex_lock(&s->m);
	s->quit = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->m);
	pthread_join(s->thread, NULL);
	free(s);
	return OK;
}

/* Host-to-device bytes queued, and those whose source and destination sat
 * at different offsets within 256 bytes (fst_double_h2d_bytes). */
static atomic_long h2d_bytes, h2d_out_of_phase;

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *h)
{
	if (!device_range_ok(dst, n))
		return ILLEGAL_ADDRESS;
	atomic_fetch_add(&h2d_bytes, (long)n);
	if (((uintptr_t)src - (uintptr_t)dst) % 256)
		atomic_fetch_add(&h2d_out_of_phase, (long)n);
	/* Poison now: whoever reads before waiting for the copy sees it. */
	memset((char *)(uintptr_t)dst, POISON, n);
	enqueue(h, OP_COPY, (char *)(uintptr_t)dst, src, n);
	return OK;
}

struct memcpy2d {
	size_t srcXInBytes, srcY;
	int srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	void *srcArray;
	size_t srcPitch;
	size_t dstXInBytes, dstY;
	int dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	void *dstArray;
	size_t dstPitch;
	size_t WidthInBytes, Height;
};

/* Device-to-device strided copies, done late row by row on the stream. */
API CUresult cuMemcpy2DAsync_v2(const struct memcpy2d *c, void *h)
{
	if (c->srcMemoryType != 2 || c->dstMemoryType != 2)
		return INVALID_VALUE;
	/* as the driver: no pitch past the device's limit */
	if (c->srcPitch > (size_t)max_pitch() || c->dstPitch > (size_t)max_pitch())
		return INVALID_VALUE;
	for (size_t y = 0; y < c->Height; y++) {
		CUdeviceptr s = c->srcDevice + (c->srcY + y) * c->srcPitch + c->srcXInBytes;
		CUdeviceptr d = c->dstDevice + (c->dstY + y) * c->dstPitch + c->dstXInBytes;
		if (!device_range_ok(s, c->WidthInBytes) || !device_range_ok(d, c->WidthInBytes))
			return ILLEGAL_ADDRESS;
	}
	for (size_t y = 0; y < c->Height; y++) {
		CUdeviceptr s = c->srcDevice + (c->srcY + y) * c->srcPitch + c->srcXInBytes;
		CUdeviceptr d = c->dstDevice + (c->dstY + y) * c->dstPitch + c->dstXInBytes;
		memset((char *)(uintptr_t)d, POISON, c->WidthInBytes);
		enqueue(h, OP_COPY, (char *)(uintptr_t)d, (const char *)(uintptr_t)s, c->WidthInBytes);
	}
	return OK;
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *h)
{
	if (!device_range_ok(src, n) || !device_range_ok(dst, n))
		return ILLEGAL_ADDRESS;
	memset((char *)(uintptr_t)dst, POISON, n);
	enqueue(h, OP_COPY, (char *)(uintptr_t)dst, (const char *)(uintptr_t)src, n);
	return OK;
}

API CUresult cuStreamQuery(void *h)
{
	struct stream *s = h;
	pthread_mutex_lock(&s->m);
	int idle = s->done >= s->queued;
	pthread_mutex_unlock(&s->m);
	return idle ? OK : NOT_READY;
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	if (!device_range_ok(src, n))
		return ILLEGAL_ADDRESS;
	memcpy(dst, (const char *)(uintptr_t)src, n);
	return OK;
}

API CUresult cuEventCreate(void **out, unsigned flags)
{
	(void)flags;
	*out = calloc(1, sizeof(struct event));
	return OK;
}

API CUresult cuEventRecord(void *ev, void *h)
{
	struct event *e = ev;
	e->s = h;
	e->seq = enqueue(h, OP_MARK, NULL, NULL, 0);
	e->recorded = 1;
	return OK;
}

API CUresult cuEventQuery(void *ev)
{
	struct event *e = ev;
	if (!e->recorded)
		return OK;
	pthread_mutex_lock(&e->s->m);
	int done = e->s->done >= e->seq;
	pthread_mutex_unlock(&e->s->m);
	return done ? OK : NOT_READY;
}

API CUresult cuEventSynchronize(void *ev)
{
	struct event *e = ev;
	if (e->recorded)
		wait_seq(e->s, e->seq);
	return OK;
}

API CUresult cuEventDestroy_v2(void *ev)
{
	free(ev);
	return OK;
}

/* For tests: live device allocations and pinned blocks. */
API long fst_double_live_device(void) { return atomic_load(&live_device); }
API long fst_double_live_host(void) { return atomic_load(&live_host); }
/* Live DEVICEMAP blocks (unified-memory destinations). */
API long fst_double_live_mapped(void) { return atomic_load(&live_mapped); }
API long fst_double_live_registered(void) { return atomic_load(&live_registered); }
API long fst_double_resident_at_register(void) { return atomic_load(&resident_at_register); }
API long fst_double_streams_made(void) { return atomic_load(&streams_made); }
API long fst_double_streams_at_register(void) { return atomic_load(&streams_at_register); }
/* Bytes of cuMemcpyHtoDAsync since the last call: all of them, or
 * (out_of_phase) those copied between addresses at different offsets within
 * 256 bytes; the count restarts. */
API long fst_double_h2d_bytes(int out_of_phase)
{
	return atomic_exchange(out_of_phase ? &h2d_out_of_phase : &h2d_bytes, 0);
}
/* Whether p is a device address of a DEVICEMAP block (not its host address). */
API int fst_double_is_mapped_device(const void *p)
{
	const char *a = p;
	int found = 0;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < MAX_ALLOCS && !found; i++)
		found = allocs[i].p && allocs[i].host && a >= allocs[i].p && a < allocs[i].p + allocs[i].n;
	pthread_mutex_unlock(&lock);
	return found;
}
