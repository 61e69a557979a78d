/*
 * pipeline_probe.c - what the warm path onto a GPU can reach on this
 * machine, taken apart: the CPU's copies out of the page cache alone, the
 * copy engine alone, both at once on separate buffers, and the two joined
 * as fst joins them (each worker reads a chunk into one of its pinned
 * slots, queues its copy to the device, and reuses the slot only after the
 * copy's event). Nothing of libfst: the bare pipeline, so that its shape
 * (workers, slots, chunk size, streams) can be swept apart from the plan,
 * the tensors and Python.
 *
 *   pipeline_probe [options] MODE FILE...
 *   MODE  pread      workers pread chunks into one faulted-in buffer of the
 *                    files' size (fst bench's pread limit with --threads 16
 *                    --chunk 16777216)
 *         h2d        one thread copies 16 MiB pieces of a 256 MiB pinned
 *                    buffer to the device, over and over, for --seconds
 *         pread+h2d  pread, and h2d beside it for as long as the reads run:
 *                    each one's rate while they share the machine
 *         slots      workers pread chunks into their own pinned slots, in
 *                    turn, with no copies (the slots, as fst's staging: an
 *                    anonymous mapping advised for 2 MiB pages, faulted in,
 *                    then registered with cuMemHostRegister)
 *         pipeline   slots, each chunk copied to its place in one device
 *                    buffer of the files' size; a slot reused after its event
 *         copies     pipeline with the reads left out: each chunk's copy
 *                    queued from its slot as it stands, so the copy engine at
 *                    the pipeline's shape (its copies' size, streams and
 *                    event waits) with no CPU copy beside it
 *   --threads N (12)  --slots S (3)  --chunk BYTES (3727360: 128 MiB over
 *   12 workers' 3 slots, in 4 KiB, as fst's page-cache staging cuts it)  --runs R (3)
 *   --device I (0)  --shared-stream (pipeline, copies: one stream for all workers)
 *   --blocking (pipeline, copies: events wait by sleeping, not spinning)  --deferred
 *   (pipeline: a chunk's copy queued only after the worker's next read, as
 *   fst's slot loop did with a synchronous reader and two reads "in flight";
 *   at least 3 slots)  --seconds S (2)
 *   --check (pipeline: the device buffer read back and compared with the
 *   files after the last run)
 *   --slot-skew B (slots, pipeline, copies: each chunk read B bytes into its
 *   slot)  --device-skew B (pipeline, copies: each chunk copied B bytes past
 *   its place): fst's copies of a checkpoint whose tensors sit at 8 mod 16
 *   in the file go from slot bytes at a page boundary to a device address
 *   8 bytes off one (--device-skew 8); with both, source and destination
 *   share their offset within every 256 bytes again
 *
 * Prints one line per run and a last line of JSON (best and median GB/s).
 * libcuda is opened at run time: FST_CUDA_LIBRARY names another (the test
 * double), as for libfst. Exit: 0 done (and bytes equal with --check),
 * 1 bytes differ, 2 usage, 3 a file or CUDA failure.
 *
 * Build: cc -std=c11 -O2 -I/usr/local/cuda/include bench/pipeline_probe.c
 *        -o pipeline_probe -ldl -lpthread
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_SLOTS 16
#define COPY_PIECE (16ull << 20)
#define COPY_BUFFER (256ull << 20)

/* ---- libcuda, opened at run time */

static struct {
	CUresult (*Init)(unsigned);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*CtxSetCurrent)(CUcontext);
	CUresult (*MemAlloc)(CUdeviceptr *, size_t);
	CUresult (*MemFree)(CUdeviceptr);
	CUresult (*MemHostAlloc)(void **, size_t, unsigned);
	CUresult (*MemFreeHost)(void *);
	CUresult (*MemHostRegister)(void *, size_t, unsigned);
	CUresult (*MemHostUnregister)(void *);
	CUresult (*StreamCreate)(CUstream *, unsigned);
	CUresult (*StreamSynchronize)(CUstream);
	CUresult (*StreamDestroy)(CUstream);
	CUresult (*EventCreate)(CUevent *, unsigned);
	CUresult (*EventRecord)(CUevent, CUstream);
	CUresult (*EventSynchronize)(CUevent);
	CUresult (*EventDestroy)(CUevent);
	CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
} cu;

static CUcontext ctx;

static void die(int code, const char *what, long long detail)
{
	fprintf(stderr, "pipeline_probe: %s (%lld)\n", what, detail);
	exit(code);
}

static void cuda_check(CUresult r, const char *what)
{
	if (r != CUDA_SUCCESS)
		die(3, what, (long long)r);
}

static void cuda_open(int device)
{
	const char *lib = getenv("FST_CUDA_LIBRARY");
	void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		die(3, "cannot open libcuda", 0);
	/* dlsym returns an object pointer; POSIX guarantees it converts */
#define SYM(field, name)                                                          \
	do {                                                                      \
		*(void **)(&cu.field) = dlsym(h, name);                           \
		if (!cu.field)                                                    \
			die(3, "libcuda lacks " name, 0);                         \
	} while (0)
	SYM(Init, "cuInit");
	SYM(DeviceGet, "cuDeviceGet");
	SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(CtxSetCurrent, "cuCtxSetCurrent");
	SYM(MemAlloc, "cuMemAlloc_v2");
	SYM(MemFree, "cuMemFree_v2");
	SYM(MemHostAlloc, "cuMemHostAlloc");
	SYM(MemFreeHost, "cuMemFreeHost");
	SYM(MemHostRegister, "cuMemHostRegister_v2");
	SYM(MemHostUnregister, "cuMemHostUnregister");
	SYM(StreamCreate, "cuStreamCreate");
	SYM(StreamSynchronize, "cuStreamSynchronize");
	SYM(StreamDestroy, "cuStreamDestroy_v2");
	SYM(EventCreate, "cuEventCreate");
	SYM(EventRecord, "cuEventRecord");
	SYM(EventSynchronize, "cuEventSynchronize");
	SYM(EventDestroy, "cuEventDestroy_v2");
	SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
	SYM(MemcpyDtoH, "cuMemcpyDtoH_v2");
#undef SYM
	CUdevice d;
	cuda_check(cu.Init(0), "cuInit");
	cuda_check(cu.DeviceGet(&d, device), "cuDeviceGet");
	cuda_check(cu.DevicePrimaryCtxRetain(&ctx, d), "cuDevicePrimaryCtxRetain");
	cuda_check(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}

/* ---- the files, cut into chunks at multiples of the chunk size */

struct files {
	size_t n;
	int *fd;
	uint64_t *size, *first_chunk, *offset; /* offset: where in one buffer */
	uint64_t total, nchunks, chunk;
};

static void files_open(struct files *fs, char **paths, size_t n, uint64_t chunk)
{
	fs->n = n;
	fs->chunk = chunk;
	fs->fd = calloc(n, sizeof *fs->fd);
	fs->size = calloc(n, sizeof *fs->size);
	fs->first_chunk = calloc(n + 1, sizeof *fs->first_chunk);
	fs->offset = calloc(n + 1, sizeof *fs->offset);
	if (!fs->fd || !fs->size || !fs->first_chunk || !fs->offset)
		die(3, "out of memory", 0);
	for (size_t i = 0; i < n; i++) {
		struct stat st;
		fs->fd[i] = open(paths[i], O_RDONLY);
		if (fs->fd[i] < 0 || fstat(fs->fd[i], &st))
			die(3, paths[i], (long long)i);
		fs->size[i] = (uint64_t)st.st_size;
		fs->first_chunk[i] = fs->nchunks;
		fs->offset[i] = fs->total;
		fs->nchunks += (fs->size[i] + chunk - 1) / chunk;
		fs->total += fs->size[i];
	}
	fs->first_chunk[n] = fs->nchunks;
	fs->offset[n] = fs->total;
}

/* Chunk k: its file, its offset in the file and its length. */
static void chunk_of(const struct files *fs, uint64_t k, size_t *f, uint64_t *off, uint64_t *len)
{
	size_t i = 0;
	while (i + 1 < fs->n && fs->first_chunk[i + 1] <= k)
		i++;
	*f = i;
	*off = (k - fs->first_chunk[i]) * fs->chunk;
	*len = fs->size[i] - *off < fs->chunk ? fs->size[i] - *off : fs->chunk;
}

static void read_all(const struct files *fs, size_t f, uint64_t off, uint64_t len, char *dst)
{
	while (len) {
		ssize_t got = pread(fs->fd[f], dst, len, (off_t)off);
		if (got <= 0)
			die(3, "pread failed or the file shrank", (long long)off);
		dst += got;
		off += (uint64_t)got;
		len -= (uint64_t)got;
	}
}

/* ---- one run */

struct opts {
	unsigned threads, slots, runs;
	uint64_t chunk;
	double seconds;
	bool shared_stream, blocking, check, deferred;
	int device;
	/* slots, pipeline, copies: where in its slot a chunk lands, and how far
	 * past its file position it lands on the device (a tensor whose file
	 * offset is 8 mod 16 lands on a 256-byte boundary: 8 bytes either
	 * way) */
	unsigned slot_skew, device_skew;
	uint64_t stride; /* a slot's bytes: chunk, plus a page where skewed */
};

struct run {
	const struct opts *o;
	struct files *fs;
	const char *mode;
	atomic_uint_fast64_t next;
	char *host_dst;        /* pread: the files' size, faulted in */
	char *pinned;          /* slots, pipeline: threads * slots * chunk */
	CUdeviceptr dev_dst;   /* pipeline: the files' size */
	CUstream shared;       /* pipeline --shared-stream */
	atomic_bool readers_done;
	double copier_gbps;    /* pread+h2d, h2d */
	char *copy_src;        /* h2d: COPY_BUFFER pinned */
	CUdeviceptr copy_dst;  /* h2d: COPY_BUFFER on the device */
};

struct worker {
	struct run *r;
	unsigned id;
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *pread_worker(void *arg)
{
	struct worker *w = arg;
	struct run *r = w->r;
	for (;;) {
		uint64_t k = atomic_fetch_add(&r->next, 1), off, len;
		size_t f;
		if (k >= r->fs->nchunks)
			return NULL;
		chunk_of(r->fs, k, &f, &off, &len);
		read_all(r->fs, f, off, len, r->host_dst + r->fs->offset[f] + off);
	}
}

/* A chunk read into a slot and not yet copied (pipeline --deferred). */
struct held {
	bool valid;
	unsigned slot;
	uint64_t dst, len;
};

/* h's copy queued on the stream from its slot of mine, the slot's event
 * recorded after it: the slot is pending until that event. */
static void hand_on(const struct run *r, CUstream s, const struct held *h, const char *mine,
		    CUevent *ev, bool *pending)
{
	cuda_check(cu.MemcpyHtoDAsync(r->dev_dst + r->o->device_skew + h->dst,
				      mine + (uint64_t)h->slot * r->o->stride + r->o->slot_skew,
				      h->len, s),
		   "cuMemcpyHtoDAsync");
	cuda_check(cu.EventRecord(ev[h->slot], s), "cuEventRecord");
	pending[h->slot] = true;
}

/* slots, pipeline and copies: a worker's chunks go through its own slots in
 * turn (copies: nothing read into them) */
static void *slot_worker(void *arg)
{
	struct worker *w = arg;
	struct run *r = w->r;
	const struct opts *o = r->o;
	bool reads = strcmp(r->mode, "copies") != 0;
	bool copy = !reads || !strcmp(r->mode, "pipeline");
	char *mine = r->pinned + (uint64_t)w->id * o->slots * o->stride;
	CUstream s = r->shared;
	CUevent ev[MAX_SLOTS] = {0};
	bool pending[MAX_SLOTS] = {0};
	if (copy) {
		cuda_check(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
		if (!s)
			cuda_check(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
		unsigned flags = CU_EVENT_DISABLE_TIMING | (o->blocking ? CU_EVENT_BLOCKING_SYNC : 0);
		for (unsigned i = 0; i < o->slots; i++)
			cuda_check(cu.EventCreate(&ev[i], flags), "cuEventCreate");
	}
	/* --deferred: the chunk read last, whose copy waits for this read */
	struct held held = {0};
	for (unsigned turn = 0;; turn = (turn + 1) % o->slots) {
		uint64_t k = atomic_fetch_add(&r->next, 1), off, len;
		size_t f;
		if (k >= r->fs->nchunks)
			break;
		chunk_of(r->fs, k, &f, &off, &len);
		char *slot = mine + (uint64_t)turn * o->stride + o->slot_skew;
		if (pending[turn])
			cuda_check(cu.EventSynchronize(ev[turn]), "cuEventSynchronize");
		pending[turn] = false;
		if (reads)
			read_all(r->fs, f, off, len, slot);
		if (!copy)
			continue;
		struct held now = {true, turn, r->fs->offset[f] + off, len};
		if (o->deferred) {
			struct held was = held;
			held = now;
			now = was;
		}
		if (now.valid)
			hand_on(r, s, &now, mine, ev, pending);
	}
	if (held.valid)
		hand_on(r, s, &held, mine, ev, pending);
	for (unsigned i = 0; copy && i < o->slots; i++) {
		if (pending[i])
			cuda_check(cu.EventSynchronize(ev[i]), "cuEventSynchronize");
		cuda_check(cu.EventDestroy(ev[i]), "cuEventDestroy");
	}
	if (copy && !r->shared)
		cuda_check(cu.StreamDestroy(s), "cuStreamDestroy");
	return NULL;
}

/* h2d: 16 MiB copies of one pinned buffer to the device, on one stream, until
 * --seconds have passed (h2d) or the readers are done (pread+h2d). */
static void *copier(void *arg)
{
	struct run *r = arg;
	bool alone = !strcmp(r->mode, "h2d");
	CUstream s;
	cuda_check(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
	cuda_check(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
	uint64_t bytes = 0, round = 4 * COPY_PIECE;
	double t0 = now(), t1 = t0;
	for (uint64_t at = 0;; at = (at + round) % COPY_BUFFER) {
		if (alone ? now() - t0 >= r->o->seconds : atomic_load(&r->readers_done))
			break;
		/* short rounds: the copier stops soon after the readers */
		for (uint64_t off = at; off < at + round; off += COPY_PIECE)
			cuda_check(cu.MemcpyHtoDAsync(r->copy_dst + off, r->copy_src + off,
						      COPY_PIECE, s),
				   "cuMemcpyHtoDAsync");
		cuda_check(cu.StreamSynchronize(s), "cuStreamSynchronize");
		/* beside the readers, only rounds done while they read count */
		if (!alone && atomic_load(&r->readers_done))
			break;
		bytes += round;
		t1 = now();
	}
	r->copier_gbps = t1 > t0 ? (double)bytes / (t1 - t0) / 1e9 : 0;
	cuda_check(cu.StreamDestroy(s), "cuStreamDestroy");
	return NULL;
}

/* One timed run of the mode: the readers' GB/s (h2d: the copier's). */
static double run_once(struct run *r)
{
	const struct opts *o = r->o;
	bool copier_too = !strcmp(r->mode, "pread+h2d") || !strcmp(r->mode, "h2d");
	bool readers = strcmp(r->mode, "h2d") != 0;
	void *(*fn)(void *) = !strcmp(r->mode, "pread") || !strcmp(r->mode, "pread+h2d")
				      ? pread_worker
				      : slot_worker;
	pthread_t *t = calloc(o->threads, sizeof *t), ct;
	struct worker *w = calloc(o->threads, sizeof *w);
	if (!t || !w)
		die(3, "out of memory", 0);
	atomic_store(&r->next, 0);
	atomic_store(&r->readers_done, false);
	double t0 = now();
	if (copier_too && pthread_create(&ct, NULL, copier, r))
		die(3, "cannot start a thread", 0);
	for (unsigned i = 0; readers && i < o->threads; i++) {
		w[i] = (struct worker){r, i};
		if (pthread_create(&t[i], NULL, fn, &w[i]))
			die(3, "cannot start a thread", 0);
	}
	for (unsigned i = 0; readers && i < o->threads; i++)
		pthread_join(t[i], NULL);
	if (r->shared)
		cuda_check(cu.StreamSynchronize(r->shared), "cuStreamSynchronize");
	double dt = now() - t0;
	atomic_store(&r->readers_done, true);
	if (copier_too)
		pthread_join(ct, NULL);
	free(t);
	free(w);
	return readers ? (double)r->fs->total / dt / 1e9 : r->copier_gbps;
}

/* --check: the device buffer read back and compared with the files */
static bool bytes_equal(struct run *r)
{
	char *got = malloc(r->o->chunk), *want = malloc(r->o->chunk);
	bool same = got && want;
	for (uint64_t k = 0; same && k < r->fs->nchunks; k++) {
		uint64_t off, len;
		size_t f;
		chunk_of(r->fs, k, &f, &off, &len);
		read_all(r->fs, f, off, len, want);
		cuda_check(cu.MemcpyDtoH(got, r->dev_dst + r->o->device_skew + r->fs->offset[f] + off,
					 len),
			   "cuMemcpyDtoH");
		same = !memcmp(got, want, len);
	}
	free(got);
	free(want);
	return same;
}

static int by_value(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* A whole number from 1 to 4096, else 0 (refused as usage). */
static unsigned count_arg(const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);
	return *s && !*end && v >= 1 && v <= 4096 ? (unsigned)v : 0;
}

/* A skew of 0 to 4095 bytes into *out; false otherwise. */
static bool skew_arg(const char *s, unsigned *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	*out = (unsigned)v;
	return *s && !*end && v >= 0 && v < 4096;
}

static void usage(void)
{
	fprintf(stderr, "usage: pipeline_probe [--threads N] [--slots S] [--chunk BYTES] "
			"[--runs R] [--device I] [--shared-stream] [--blocking] [--deferred] "
			"[--seconds S] [--check] [--slot-skew B] [--device-skew B] "
			"pread|h2d|pread+h2d|slots|pipeline|copies FILE...\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct opts o = {12, 3, 3, 3727360, 2.0, false, false, false, false, 0, 0, 0, 0};
	static const struct option longs[] = {
		{"threads", 1, 0, 't'}, {"slots", 1, 0, 's'},     {"chunk", 1, 0, 'c'},
		{"runs", 1, 0, 'r'},    {"device", 1, 0, 'd'},    {"seconds", 1, 0, 'S'},
		{"shared-stream", 0, 0, 'x'}, {"blocking", 0, 0, 'b'}, {"check", 0, 0, 'k'},
		{"deferred", 0, 0, 'D'}, {"slot-skew", 1, 0, 'K'}, {"device-skew", 1, 0, 'V'},
		{0, 0, 0, 0}};
	bool skew_ok = true;
	int c;
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (c) {
		case 't': o.threads = count_arg(optarg); break;
		case 's': o.slots = count_arg(optarg); break;
		case 'c': o.chunk = strtoull(optarg, NULL, 0); break;
		case 'r': o.runs = count_arg(optarg); break;
		case 'd': o.device = atoi(optarg); break;
		case 'S': o.seconds = atof(optarg); break;
		case 'x': o.shared_stream = true; break;
		case 'b': o.blocking = true; break;
		case 'k': o.check = true; break;
		case 'D': o.deferred = true; break;
		case 'K': skew_ok = skew_ok && skew_arg(optarg, &o.slot_skew); break;
		case 'V': skew_ok = skew_ok && skew_arg(optarg, &o.device_skew); break;
		default: usage();
		}
	}
	static const char *modes[] = {"pread", "h2d", "pread+h2d", "slots", "pipeline", "copies"};
	const char *mode = optind < argc ? argv[optind++] : "";
	bool copying = !strcmp(mode, "pipeline") || !strcmp(mode, "copies");
	bool known = false;
	for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
		known = known || !strcmp(mode, modes[i]);
	if (!known || optind >= argc || !o.threads || !o.slots || o.slots > MAX_SLOTS ||
	    o.chunk < 4096 || !o.runs || o.runs > 64 || o.seconds <= 0 ||
	    (o.deferred && o.slots < 3) ||
	    ((o.shared_stream || o.blocking) && !copying) ||
	    ((o.deferred || o.check) && strcmp(mode, "pipeline")) || !skew_ok ||
	    ((o.slot_skew || o.device_skew) && strcmp(mode, "slots") && !copying))
		usage();
	o.stride = o.chunk + (o.slot_skew ? 4096 : 0);

	struct files fs = {0};
	files_open(&fs, argv + optind, (size_t)(argc - optind), o.chunk);
	struct run r = {.o = &o, .fs = &fs, .mode = mode};
	bool pread_mode = !strcmp(mode, "pread") || !strcmp(mode, "pread+h2d");
	bool slot_mode = !strcmp(mode, "slots") || copying;
	if (strcmp(mode, "pread"))
		cuda_open(o.device);
	/* Every buffer is made and faulted in before any clock starts. */
	if (pread_mode) {
		r.host_dst = malloc(fs.total ? fs.total : 1);
		if (!r.host_dst)
			die(3, "out of memory for the files' size", (long long)fs.total);
		memset(r.host_dst, 0, fs.total);
	}
	size_t staging = (size_t)o.threads * o.slots * o.stride;
	if (slot_mode) {
		/* as fst's staging: 2 MiB pages where the kernel gives them,
		 * faulted in, then pinned */
		void *p = mmap(NULL, staging, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			       -1, 0);
		if (p == MAP_FAILED)
			die(3, "cannot map the slots", (long long)staging);
		madvise(p, staging, MADV_HUGEPAGE);
		memset(p, 0, staging);
		r.pinned = p;
		cuda_check(cu.MemHostRegister(r.pinned, staging, 0), "cuMemHostRegister (slots)");
	}
	if (copying) {
		cuda_check(cu.MemAlloc(&r.dev_dst, fs.total + o.device_skew + 1), "cuMemAlloc");
		if (o.shared_stream)
			cuda_check(cu.StreamCreate(&r.shared, CU_STREAM_NON_BLOCKING),
				   "cuStreamCreate");
	}
	if (!strcmp(mode, "h2d") || !strcmp(mode, "pread+h2d")) {
		cuda_check(cu.MemHostAlloc((void **)&r.copy_src, COPY_BUFFER, 0),
			   "cuMemHostAlloc (copy source)");
		memset(r.copy_src, 0x5A, COPY_BUFFER);
		cuda_check(cu.MemAlloc(&r.copy_dst, COPY_BUFFER), "cuMemAlloc");
	}

	double rates[64], copier[64];
	for (unsigned i = 0; i < o.runs; i++) {
		rates[i] = run_once(&r);
		copier[i] = r.copier_gbps;
		printf("%s run %u: %.2f GB/s", mode, i + 1, rates[i]);
		if (!strcmp(mode, "pread+h2d"))
			printf(", the copy engine beside it %.2f GB/s", copier[i]);
		printf("\n");
	}
	double sorted[64];
	memcpy(sorted, rates, o.runs * sizeof *rates);
	qsort(sorted, o.runs, sizeof *sorted, by_value);
	double best_copier = 0;
	for (unsigned i = 0; i < o.runs; i++)
		best_copier = copier[i] > best_copier ? copier[i] : best_copier;
	int rc = 0;
	const char *check = "";
	if (o.check) {
		rc = bytes_equal(&r) ? 0 : 1;
		check = rc ? ", \"check\": \"bytes differ\"" : ", \"check\": \"bytes equal\"";
	}
	printf("{\"mode\": \"%s\", \"threads\": %u, \"slots\": %u, \"chunk\": %" PRIu64
	       ", \"shared_stream\": %s, \"blocking\": %s, \"deferred\": %s, \"bytes\": %" PRIu64
	       ", \"slot_skew\": %u, \"device_skew\": %u"
	       ", \"runs\": %u, \"best_gbps\": %.3f, \"median_gbps\": %.3f",
	       mode, o.threads, o.slots, o.chunk, o.shared_stream ? "true" : "false",
	       o.blocking ? "true" : "false", o.deferred ? "true" : "false", fs.total,
	       o.slot_skew, o.device_skew, o.runs,
	       sorted[o.runs - 1],
	       (sorted[(o.runs - 1) / 2] + sorted[o.runs / 2]) / 2);
	if (!strcmp(mode, "pread+h2d"))
		printf(", \"copier_best_gbps\": %.3f", best_copier);
	printf("%s}\n", check);

	if (r.dev_dst)
		cuda_check(cu.MemFree(r.dev_dst), "cuMemFree");
	if (r.copy_dst)
		cuda_check(cu.MemFree(r.copy_dst), "cuMemFree");
	if (r.pinned) {
		cuda_check(cu.MemHostUnregister(r.pinned), "cuMemHostUnregister");
		munmap(r.pinned, staging);
	}
	if (r.copy_src)
		cuda_check(cu.MemFreeHost(r.copy_src), "cuMemFreeHost");
	if (r.shared)
		cuda_check(cu.StreamDestroy(r.shared), "cuStreamDestroy");
	free(r.host_dst);
	for (size_t i = 0; i < fs.n; i++)
		close(fs.fd[i]);
	free(fs.fd);
	free(fs.size);
	free(fs.first_chunk);
	free(fs.offset);
	return rc;
}
