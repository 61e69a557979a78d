/*
 * nccl_double.c - a stand-in for libnccl.so.2 so tensor-parallel loads run
 * on machines without GPUs, with the libcuda double (FST_CUDA_LIBRARY,
 * which it finds already loaded). Selected with FST_NCCL_LIBRARY; never
 * used otherwise.
 *
 * The ranks of a communicator are threads of one process. A collective is
 * queued on the caller's stream (the libcuda double's
 * fst_double_stream_call) and runs there in its turn, waiting for the
 * same collective of every rank as a kernel would: so it finishes late, in
 * stream order, and never while a rank is missing. The ranks' calls must
 * match (the same collective, count, type and root, in the same order);
 * a mismatch is a bug in the caller and aborts the process with a message.
 *
 * ncclCommAbort ends the rank's waiting collectives and those it queued
 * after; the communicator is then dead for every rank: the others'
 * collectives never finish, as on NVLink, where NCCL notices nothing, and
 * they must time out. With FST_NCCL_DOUBLE_ASYNC=1, read at each call,
 * ncclCommGetAsyncError of a dead communicator's ranks says
 * ncclRemoteError instead, as NCCL's socket transport may. A rank that
 * destroys its communicator also leaves it dead for the others.
 *
 * With FST_NCCL_DOUBLE_LAZY=1, each rank's first ncclBroadcast on a
 * communicator connects its peers inside the call, as NCCL's runtime
 * connection does (NCCL_RUNTIME_CONNECT, on by default since 2.22; a
 * broadcast runs on rings, which a small all-reduce may not have
 * connected): the call blocks until every rank has made its first
 * broadcast, and fails with ncclRemoteError after
 * FST_NCCL_DOUBLE_CONNECT_MS (default 2000) when one never comes, or at
 * once when the communicator is dead. (NCCL's socket transport retries
 * about a minute there.)
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define MAX_RANKS 64

enum { SUCCESS = 0, INVALID_ARGUMENT = 4, SYSTEM_ERROR = 2, REMOTE_ERROR = 6 };
enum { UINT8 = 1, INT32 = 2 };
enum { MAX = 2 };
enum { BROADCAST, ALLREDUCE };

typedef struct {
	char internal[128];
} unique_id;

struct part {
	int op;
	const void *send;
	void *recv;
	size_t count;
	int type, root, red;
};

struct world {
	char id[128];
	int nranks, joined;
	int refs; /* comms not yet freed; under lock */
	int dead; /* a rank aborted or left */
	uint64_t done; /* collectives finished */
	int arrived;
	int connected; /* ranks past their first broadcast (FST_NCCL_DOUBLE_LAZY) */
	struct part parts[MAX_RANKS];
	pthread_cond_t cv;
	struct world *next;
};

struct comm {
	struct world *w;
	int rank;
	int gone; /* aborted or destroyed by its rank */
	int refs; /* its rank, and each queued collective; under lock */
	int connected; /* its first broadcast connected (FST_NCCL_DOUBLE_LAZY) */
};

/* One lock for everything: collectives here move little data. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct world *worlds;
static unsigned long ids;

static void (*stream_call)(void *stream, void (*fn)(void *), void *arg);

static void find_stream_call(void)
{
	const char *lib = getenv("FST_CUDA_LIBRARY");
	void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
	stream_call = h ? (void (*)(void *, void (*)(void *), void *))dlsym(h, "fst_double_stream_call")
			: NULL;
	if (!stream_call) {
		fprintf(stderr, "nccl double: needs the libcuda double loaded (FST_CUDA_LIBRARY)\n");
		abort();
	}
}

/* Under lock. */
static int env_on(const char *name)
{
	const char *e = getenv(name);
	return e && !strcmp(e, "1");
}

static void comm_unref(struct comm *c)
{
	if (--c->refs)
		return;
	struct world *w = c->w;
	free(c);
	if (--w->refs)
		return;
	for (struct world **p = &worlds; *p; p = &(*p)->next)
		if (*p == w) {
			*p = w->next;
			break;
		}
	pthread_cond_destroy(&w->cv);
	free(w);
}

API int ncclGetVersion(int *v)
{
	*v = 22703;
	return SUCCESS;
}

API const char *ncclGetErrorString(int r)
{
	switch (r) {
	case SUCCESS:
		return "no error";
	case SYSTEM_ERROR:
		return "unhandled system error (nccl double)";
	case INVALID_ARGUMENT:
		return "invalid argument (nccl double)";
	case REMOTE_ERROR:
		return "remote process exited or there was a network error (nccl double)";
	default:
		return "unknown result (nccl double)";
	}
}

API int ncclGetUniqueId(unique_id *id)
{
	memset(id, 0, sizeof *id);
	pthread_mutex_lock(&lock);
	unsigned long n = ++ids;
	pthread_mutex_unlock(&lock);
	snprintf(id->internal, sizeof id->internal, "nccl-double %ld %lu", (long)getpid(), n);
	return SUCCESS;
}

/* Blocks until every rank has joined, as NCCL does (up to a minute). */
API int ncclCommInitRank(struct comm **out, int nranks, unique_id id, int rank)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, find_stream_call);
	if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
		return INVALID_ARGUMENT;
	pthread_mutex_lock(&lock);
	struct world *w = worlds;
	while (w && memcmp(w->id, id.internal, sizeof w->id))
		w = w->next;
	if (!w) {
		w = calloc(1, sizeof *w);
		memcpy(w->id, id.internal, sizeof w->id);
		w->nranks = nranks;
		pthread_cond_init(&w->cv, NULL);
		w->next = worlds;
		worlds = w;
	}
	if (w->nranks != nranks || w->joined == nranks) {
		pthread_mutex_unlock(&lock);
		return INVALID_ARGUMENT;
	}
	struct comm *c = calloc(1, sizeof *c);
	c->w = w;
	c->rank = rank;
	c->refs = 1;
	w->refs++;
	if (++w->joined == nranks)
		pthread_cond_broadcast(&w->cv);
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 60;
	while (w->joined < nranks)
		if (pthread_cond_timedwait(&w->cv, &lock, &until)) {
			w->dead = 1;
			c->gone = 1;
			comm_unref(c);
			pthread_mutex_unlock(&lock);
			return SYSTEM_ERROR;
		}
	pthread_mutex_unlock(&lock);
	*out = c;
	return SUCCESS;
}

static void leave(struct comm *c)
{
	pthread_mutex_lock(&lock);
	c->gone = 1;
	c->w->dead = 1;
	pthread_cond_broadcast(&c->w->cv);
	comm_unref(c);
	pthread_mutex_unlock(&lock);
}

API int ncclCommAbort(struct comm *c)
{
	leave(c);
	return SUCCESS;
}

API int ncclCommDestroy(struct comm *c)
{
	leave(c);
	return SUCCESS;
}

API int ncclCommGetAsyncError(struct comm *c, int *r)
{
	int async = env_on("FST_NCCL_DOUBLE_ASYNC");
	pthread_mutex_lock(&lock);
	*r = async && c->w->dead ? REMOTE_ERROR : SUCCESS;
	pthread_mutex_unlock(&lock);
	return SUCCESS;
}

API int ncclGroupStart(void) { return SUCCESS; }
API int ncclGroupEnd(void) { return SUCCESS; }

static size_t type_size(int type) { return type == INT32 ? 4 : 1; }

/* Every rank's part of one collective has arrived: do it. Under lock. */
static void run(struct world *w)
{
	const struct part *p0 = &w->parts[0];
	for (int r = 1; r < w->nranks; r++) {
		const struct part *p = &w->parts[r];
		if (p->op != p0->op || p->count != p0->count || p->type != p0->type ||
		    (p->op == BROADCAST && p->root != p0->root) ||
		    (p->op == ALLREDUCE && p->red != p0->red)) {
			fprintf(stderr,
				"nccl double: collective %llu differs between ranks 0 and %d: op %d/%d, "
				"count %zu/%zu, type %d/%d, root %d/%d\n",
				(unsigned long long)w->done, r, p0->op, p->op, p0->count, p->count,
				p0->type, p->type, p0->root, p->root);
			abort();
		}
	}
	size_t bytes = p0->count * type_size(p0->type);
	if (p0->op == BROADCAST) {
		const void *src = w->parts[p0->root].send;
		for (int r = 0; r < w->nranks; r++)
			if (w->parts[r].recv != src)
				memmove(w->parts[r].recv, src, bytes);
		return;
	}
	if (p0->type != INT32 || p0->red != MAX) {
		fprintf(stderr, "nccl double: only the all-reduce of INT32 by MAX is done\n");
		abort();
	}
	int32_t *m = malloc(bytes ? bytes : 1);
	for (size_t i = 0; i < p0->count; i++) {
		m[i] = INT32_MIN;
		for (int r = 0; r < w->nranks; r++) {
			int32_t v;
			memcpy(&v, (const char *)w->parts[r].send + 4 * i, 4);
			m[i] = v > m[i] ? v : m[i];
		}
	}
	for (int r = 0; r < w->nranks; r++)
		memcpy(w->parts[r].recv, m, bytes);
	free(m);
}

struct call {
	struct comm *c;
	struct part p;
};

/* On the rank's stream, in its turn: arrive, and wait for the others. */
static void collective(void *arg)
{
	struct call *k = arg;
	struct comm *c = k->c;
	pthread_mutex_lock(&lock);
	struct world *w = c->w;
	if (w->dead) {
		/* a dead communicator's collectives never finish: only the rank's
		 * own abort ends the wait */
		while (!c->gone)
			pthread_cond_wait(&w->cv, &lock);
	} else if (!c->gone) {
		uint64_t mine = w->done;
		w->parts[c->rank] = k->p;
		if (++w->arrived == w->nranks) {
			run(w);
			w->arrived = 0;
			w->done++;
			pthread_cond_broadcast(&w->cv);
		}
		/* done, or a peer left before arriving: then as above */
		while (w->done == mine && !c->gone)
			pthread_cond_wait(&w->cv, &lock);
	}
	comm_unref(c);
	pthread_mutex_unlock(&lock);
	free(k);
}

static int queue(struct comm *c, const struct part *p, void *stream)
{
	struct call *k = calloc(1, sizeof *k);
	k->c = c;
	k->p = *p;
	pthread_mutex_lock(&lock);
	c->refs++;
	pthread_mutex_unlock(&lock);
	stream_call(stream, collective, k);
	return SUCCESS;
}

/* FST_NCCL_DOUBLE_LAZY: the first broadcast of c's rank waits, in the
 * call, for the first broadcast of every rank. */
static int lazy_connect(struct comm *c)
{
	if (!env_on("FST_NCCL_DOUBLE_LAZY") || c->connected)
		return SUCCESS;
	const char *ms = getenv("FST_NCCL_DOUBLE_CONNECT_MS");
	long wait = ms && atol(ms) > 0 ? atol(ms) : 2000;
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += wait / 1000;
	until.tv_nsec += (wait % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&lock);
	struct world *w = c->w;
	if (++w->connected == w->nranks)
		pthread_cond_broadcast(&w->cv);
	int rc = SUCCESS;
	while (w->connected < w->nranks && !w->dead && rc == SUCCESS)
		if (pthread_cond_timedwait(&w->cv, &lock, &until))
			rc = REMOTE_ERROR;
	if (w->connected < w->nranks)
		rc = REMOTE_ERROR;
	c->connected = rc == SUCCESS;
	pthread_mutex_unlock(&lock);
	return rc;
}

API int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root,
		      struct comm *c, void *stream)
{
	if (root < 0 || root >= c->w->nranks || (type != UINT8 && type != INT32))
		return INVALID_ARGUMENT;
	int rc = lazy_connect(c);
	if (rc)
		return rc;
	struct part p = {BROADCAST, send, recv, count, type, root, 0};
	return queue(c, &p, stream);
}

API int ncclAllReduce(const void *send, void *recv, size_t count, int type, int red,
		      struct comm *c, void *stream)
{
	struct part p = {ALLREDUCE, send, recv, count, type, -1, red};
	return queue(c, &p, stream);
}
