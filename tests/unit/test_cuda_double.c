/* Description: the CUDA target end to end against the libcuda test double
 * (FST_CUDA_LIBRARY): random checkpoints of every dtype, misaligned data
 * sections, odd sizes, many shards, empty and scalar tensors, loaded to
 * cuda:0 and cuda:1 with pread and io_uring, 1..4 threads and small staging
 * budgets, every byte compared with the file through fst_copy_to_host.
 * Streaming readiness (each tensor's bytes are final when it is handed out),
 * the double's own poison check, device errors (bad index, out of memory),
 * injected faults at device_alloc, pin, h2d and event with leak checks,
 * buffer lifetime through views, concurrent loads, and the device queries.
 * on_landed onto the device: every staged byte reported once, equal to the
 * file, within one landed_block, before its tensor is handed out; a failing
 * callback fails the load cleanly. */
#include "helpers.h"
#include "load_helpers.h"
#include "internal.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1ull << 20)
#define POISON 0xDB

/* ---- the double, opened directly for its counters and raw driver calls */

typedef unsigned long long dptr;
static void *dbl;
static long (*live_device)(void);
static long (*live_host)(void);
/* What was live when the test started: 0, unless a failed test before it
 * left something behind (then only that test reports it). */
static long device_base, pinned_base;

static void *dsym(const char *name)
{
	void *p = dlsym(dbl, name);
	if (!p)
		fail_msg("the double lacks %s", name);
	return p;
}

static void set_delay(const char *us)
{
	/* Read by each stream's thread when the stream is created. */
	setenv("FST_DOUBLE_DELAY_US", us, 1);
}

/* Nothing of the double may be live, and libfst's own host allocations are
 * back to what they were. Pinned staging blocks are kept between loads
 * until fst_trim: a block that was not given back to that pool stays live
 * past it. Only between loads. */
static void assert_clean(const char *when, long host_base)
{
	fst_trim();
	long d = live_device() - device_base, h = live_host() - pinned_base;
	if (d || h)
		fail_msg("%s: %ld device allocations and %ld pinned blocks still live", when, d, h);
	long a = fsti_live_allocations();
	if (a != host_base)
		fail_msg("%s: %ld libfst host allocations live, %ld before", when, a, host_base);
}

/* ---- random checkpoints */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

typedef struct rng {
	uint64_t s;
} rng;

static uint64_t below(rng *r, uint64_t n)
{
	r->s += 0x9e3779b97f4a7c15ull;
	return mix(r->s) % n;
}

struct key {
	uint64_t key;
};

static int fill_fn(void *ctx, void *buf, uint64_t off, size_t len)
{
	const struct key *k = ctx;
	unsigned char *p = buf;
	for (size_t i = 0; i < len; i++) {
		uint64_t pos = off + i;
		p[i] = (unsigned char)(mix(k->key ^ (pos >> 3) * 0x100000001b3ull) >> (8 * (pos & 7)));
	}
	return 0;
}

/* A tensor of dtype dt with about `bytes` bytes (exactly, for byte-sized
 * dtypes); 0 bytes gives an empty shape, scalar a shape of no dimensions. */
static void add_tensor(fst_writer *w, rng *r, const char *name, fst_dtype dt, uint64_t bytes,
		       bool scalar, struct key *k)
{
	unsigned bits = fst_dtype_bits(dt);
	uint32_t ndim;
	uint64_t shape[4] = {0};
	if (scalar) {
		ndim = 0;
	} else if (!bytes) {
		ndim = 1 + (uint32_t)below(r, 3);
		for (uint32_t d = 0; d < ndim; d++)
			shape[d] = 1 + below(r, 4);
		shape[below(r, ndim)] = 0;
	} else {
		uint64_t numel;
		if (bits % 8 == 0) {
			numel = bytes / (bits / 8);
			numel = numel ? numel : 1;
		} else {
			uint64_t unit = bits == 4 ? 2 : 4; /* whole bytes */
			numel = bytes * 8 / bits / unit * unit;
			numel = numel ? numel : unit;
		}
		ndim = 1 + (uint32_t)below(r, 3);
		static const uint64_t divs[] = {1, 2, 3, 4, 8};
		uint64_t rest = numel;
		for (uint32_t d = 0; d + 1 < ndim; d++) {
			uint64_t q = divs[below(r, 5)];
			if (rest % q)
				q = 1;
			shape[d] = q;
			rest /= q;
		}
		shape[ndim - 1] = rest;
	}
	fst_error err;
	if (fst_writer_add_fill(w, name, dt, ndim, ndim ? shape : NULL, fill_fn, k, &err))
		fail_msg("add %s: %s", name, err.message);
}

typedef struct gen {
	unsigned nfiles;
	unsigned extra;   /* random tensors per file besides one of every dtype */
	uint64_t max_big; /* largest tensor */
	unsigned big_percent;
} gen;

typedef struct ckpt {
	char dir[600];
	fst_checkpoint *ck;
	size_t nfiles;
	unsigned char **bytes; /* every file, read independently */
	uint64_t *sizes;
	long host_base;
} ckpt;

static void rm_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	char p[1400];
	while ((e = readdir(d)))
		if (e->d_name[0] != '.') {
			snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
			unlink(p);
		}
	closedir(d);
	rmdir(dir);
}

/* Layouts of the shards, in turn: the first one's data section starts at
 * 8 mod 16. */
static void writer_layout(unsigned f, fst_writer_opts *wo)
{
	static const uint32_t align[] = {16, 4096, 8, 64};
	static const uint32_t extra[] = {8, 0, 0, 24};
	fst_writer_opts_init(wo);
	wo->data_align = align[f % 4];
	wo->header_extra = extra[f % 4];
}

static void write_random(const char *name, uint64_t seed, const gen *g, ckpt *c)
{
	rng r = {seed};
	memset(c, 0, sizeof *c);
	snprintf(c->dir, sizeof c->dir, "%s/%s", test_tmpdir(), name);
	rm_dir(c->dir);
	if (mkdir(c->dir, 0755))
		fail_msg("mkdir %s: %s", c->dir, strerror(errno));
	for (unsigned f = 0; f < g->nfiles; f++) {
		fst_writer_opts wo;
		writer_layout(f, &wo);
		fst_writer *w;
		fst_error err;
		if (fst_writer_new(&wo, &w, &err))
			fail_msg("writer: %s", err.message);
		unsigned n = (unsigned)FST_DTYPE_COUNT - 1 + g->extra;
		struct key *keys = calloc(n, sizeof *keys);
		char tname[64];
		unsigned t = 0;
		/* one of every dtype, small, in a random rotation */
		unsigned rot = (unsigned)below(&r, FST_DTYPE_COUNT - 1);
		for (unsigned i = 0; i < FST_DTYPE_COUNT - 1; i++, t++) {
			fst_dtype dt = (fst_dtype)(1 + (i + rot) % (FST_DTYPE_COUNT - 1));
			snprintf(tname, sizeof tname, "s%u.%s.%u", f, fst_dtype_name(dt), t);
			keys[t].key = mix(seed * 1000003u + f * 1009u + t);
			add_tensor(w, &r, tname, dt, 1 + below(&r, 3000), false, &keys[t]);
		}
		for (unsigned i = 0; i < g->extra; i++, t++) {
			unsigned dice = (unsigned)below(&r, 100);
			fst_dtype dt = (fst_dtype)(1 + below(&r, FST_DTYPE_COUNT - 1));
			uint64_t bytes;
			bool scalar = false;
			if (dice < 12) {
				bytes = 0;
			} else if (dice < 22) {
				static const fst_dtype sc[] = {FST_DTYPE_BOOL, FST_DTYPE_F64, FST_DTYPE_I16,
							       FST_DTYPE_BF16, FST_DTYPE_F32, FST_DTYPE_U8};
				dt = sc[below(&r, 6)];
				scalar = true;
				bytes = fst_dtype_bits(dt) / 8;
			} else if (dice < 22 + g->big_percent) {
				bytes = 1 + below(&r, g->max_big);
			} else if (dice < 60) {
				dt = FST_DTYPE_U8; /* odd sizes */
				bytes = 1 + 2 * below(&r, 10000);
			} else {
				bytes = 1 + below(&r, 30000);
			}
			snprintf(tname, sizeof tname, "s%u.x%u", f, t);
			keys[t].key = mix(seed * 1000003u + f * 1009u + t);
			add_tensor(w, &r, tname, dt, bytes, scalar, &keys[t]);
		}
		char file[700];
		snprintf(file, sizeof file, "%s/%02u.safetensors", c->dir, f);
		if (fst_writer_finish(w, file, &err))
			fail_msg("finish %s: %s", file, err.message);
		fst_writer_free(w);
		free(keys);
	}
}

static void ckpt_open(ckpt *c, const char *path)
{
	fst_error err;
	if (fst_checkpoint_open(path, &c->ck, &err))
		fail_msg("open %s: %s", path, err.message);
	c->nfiles = fst_checkpoint_file_count(c->ck);
	c->bytes = calloc(c->nfiles + 1, sizeof *c->bytes);
	c->sizes = calloc(c->nfiles + 1, sizeof *c->sizes);
	for (size_t i = 0; i < c->nfiles; i++)
		c->bytes[i] = lh_slurp(fst_file_path(fst_checkpoint_file(c->ck, i)), &c->sizes[i]);
	c->host_base = fsti_live_allocations();
}

static void ckpt_close(ckpt *c)
{
	for (size_t i = 0; i < c->nfiles; i++)
		free(c->bytes[i]);
	free(c->bytes);
	free(c->sizes);
	fst_checkpoint_close(c->ck);
	rm_dir(c->dir);
	memset(c, 0, sizeof *c);
}

/* ---- checking loaded tensors (no cmocka asserts: also used off the main
 * thread) */

/* Compare one view with the file; 0, or -1 with why filled. */
static int view_check(const ckpt *c, const fst_tensor_view *v, int device_id, char *why,
		      size_t wn)
{
	if (v->device_type != FST_DEVICE_CUDA || v->device_id != device_id) {
		snprintf(why, wn, "%s: device %d:%d, expected cuda:%d", v->name, v->device_type,
			 v->device_id, device_id);
		return -1;
	}
	if ((uintptr_t)v->data % 256) {
		snprintf(why, wn, "%s: device address %p not aligned to 256", v->name, v->data);
		return -1;
	}
	long idx = fst_checkpoint_find(c->ck, v->name);
	fst_tensor_info info;
	size_t file;
	if (idx < 0 || fst_checkpoint_tensor(c->ck, (size_t)idx, &info, &file)) {
		snprintf(why, wn, "%s: not in the checkpoint", v->name);
		return -1;
	}
	bool same_shape = info.ndim == v->ndim && (!info.ndim || !memcmp(info.shape, v->shape,
									 info.ndim * sizeof(uint64_t)));
	if (info.dtype != v->dtype || !same_shape || info.nbytes != v->nbytes) {
		snprintf(why, wn, "%s: dtype, shape or size differ from the file's", v->name);
		return -1;
	}
	const unsigned char *want = c->bytes[file] + info.file_offset;
	unsigned char *got = malloc(v->nbytes + 1);
	fst_error err;
	int rc = fst_copy_to_host(v, 0, got, v->nbytes, &err);
	if (rc) {
		snprintf(why, wn, "%.200s: fst_copy_to_host: %.280s", v->name, err.message);
		free(got);
		return -1;
	}
	if (memcmp(got, want, v->nbytes)) {
		uint64_t k = 0;
		while (got[k] == want[k])
			k++;
		snprintf(why, wn, "%s: byte %" PRIu64 " of %" PRIu64 " is 0x%02x, the file has 0x%02x",
			 v->name, k, v->nbytes, got[k], want[k]);
		free(got);
		return -1;
	}
	/* a piece from the middle, through the offset argument */
	if (v->nbytes > 16) {
		uint64_t off = v->nbytes / 3, len = v->nbytes / 2;
		memset(got, 0, len);
		if (fst_copy_to_host(v, off, got, len, &err) || memcmp(got, want + off, len)) {
			snprintf(why, wn, "%s: partial copy [%" PRIu64 ", +%" PRIu64 ") differs",
				 v->name, off, len);
			free(got);
			return -1;
		}
	}
	free(got);
	return 0;
}

static void assert_view(const ckpt *c, const fst_tensor_view *v, int device_id)
{
	char why[512];
	if (view_check(c, v, device_id, why, sizeof why))
		fail_msg("%s", why);
}

struct span {
	uintptr_t a;
	uint64_t n;
};

static int span_cmp(const void *x, const void *y)
{
	const struct span *p = x, *q = y;
	return p->a < q->a ? -1 : p->a > q->a;
}

/* Every tensor of the buffer equals the file, and no two overlap. */
static int buffer_check(const ckpt *c, fst_buffer *buf, int device_id, char *why, size_t wn)
{
	size_t nt = fst_buffer_tensor_count(buf);
	if (nt != fst_checkpoint_tensor_count(c->ck)) {
		snprintf(why, wn, "%zu tensors loaded of %zu", nt, fst_checkpoint_tensor_count(c->ck));
		return -1;
	}
	struct span *sp = calloc(nt + 1, sizeof *sp);
	int rc = 0;
	for (size_t i = 0; i < nt && !rc; i++) {
		fst_tensor_view v;
		if (fst_buffer_tensor(buf, i, &v)) {
			snprintf(why, wn, "fst_buffer_tensor(%zu) failed", i);
			rc = -1;
			break;
		}
		if (v.index != i || v.buffer != buf) {
			snprintf(why, wn, "%s: view index %zu, expected %zu", v.name, v.index, i);
			rc = -1;
		}
		if (!rc)
			rc = view_check(c, &v, device_id, why, wn);
		sp[i] = (struct span){(uintptr_t)v.data, v.nbytes};
		fst_view_release(&v);
	}
	if (!rc) {
		qsort(sp, nt, sizeof *sp, span_cmp);
		for (size_t i = 1; i < nt; i++)
			if (sp[i - 1].a + sp[i - 1].n > sp[i].a) {
				snprintf(why, wn, "tensors at %#" PRIxPTR " and %#" PRIxPTR " overlap",
					 sp[i - 1].a, sp[i].a);
				rc = -1;
			}
	}
	free(sp);
	return rc;
}

static void assert_buffer(const ckpt *c, fst_buffer *buf, int device_id)
{
	char why[512];
	if (buffer_check(c, buf, device_id, why, sizeof why))
		fail_msg("%s", why);
}

static void cuda_opts(fst_load_opts *o, const char *device, int io, unsigned threads,
		      uint64_t staging)
{
	fst_load_opts_init(o);
	o->device = device;
	o->io = io;
	o->threads = threads;
	o->staging_bytes = staging;
}

static bool uring_ok = true;

/* ---- the checkpoints most tests share */

static const gen big_gen = {3, 40, 600000, 10};
static const gen small_gen = {2, 12, 60000, 10};

/* ---- tests */

/* The double's poisoning itself: a read made before the copy is waited for
 * sees poison, and the right bytes once the stream is synchronized. Without
 * this, the streaming test below would prove nothing. */
static void test_double_catches_early_read(void **state)
{
	(void)state;
	int (*cuInit)(unsigned) = NULL;
	int (*cuDevicePrimaryCtxRetain)(void **, int) = NULL;
	int (*cuCtxSetCurrent)(void *) = NULL;
	int (*cuMemAlloc)(dptr *, size_t) = NULL;
	int (*cuMemFree)(dptr) = NULL;
	int (*cuStreamCreate)(void **, unsigned) = NULL;
	int (*cuStreamDestroy)(void *) = NULL;
	int (*cuStreamSynchronize)(void *) = NULL;
	int (*cuMemcpyHtoDAsync)(dptr, const void *, size_t, void *) = NULL;
	int (*cuMemcpyDtoH)(void *, dptr, size_t) = NULL;
	*(void **)&cuInit = dsym("cuInit");
	*(void **)&cuDevicePrimaryCtxRetain = dsym("cuDevicePrimaryCtxRetain");
	*(void **)&cuCtxSetCurrent = dsym("cuCtxSetCurrent");
	*(void **)&cuMemAlloc = dsym("cuMemAlloc_v2");
	*(void **)&cuMemFree = dsym("cuMemFree_v2");
	*(void **)&cuStreamCreate = dsym("cuStreamCreate");
	*(void **)&cuStreamDestroy = dsym("cuStreamDestroy_v2");
	*(void **)&cuStreamSynchronize = dsym("cuStreamSynchronize");
	*(void **)&cuMemcpyHtoDAsync = dsym("cuMemcpyHtoDAsync_v2");
	*(void **)&cuMemcpyDtoH = dsym("cuMemcpyDtoH_v2");

	set_delay("20000"); /* up to 20 ms per queued operation */
	void *ctx = NULL, *stream = NULL;
	assert_int_equal(cuInit(0), 0);
	assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, 0), 0);
	assert_int_equal(cuCtxSetCurrent(ctx), 0);
	enum { N = 4, LEN = 4096 };
	dptr dev = 0;
	assert_int_equal(cuMemAlloc(&dev, N * LEN), 0);
	assert_int_equal(live_device() - device_base, 1);
	assert_int_equal(cuStreamCreate(&stream, 1), 0);
	unsigned char *src = malloc(N * LEN), *back = malloc(LEN);
	for (size_t i = 0; i < N * LEN; i++)
		src[i] = (unsigned char)(i % 251 == POISON ? 7 : i % 251); /* never poison */
	/* Several copies: the last completes after all their delays. */
	for (int k = 0; k < N; k++)
		assert_int_equal(cuMemcpyHtoDAsync(dev + (dptr)k * LEN, src + k * LEN, LEN, stream),
				 0);
	assert_int_equal(cuMemcpyDtoH(back, dev + (N - 1) * LEN, LEN), 0);
	size_t poisoned = 0;
	for (size_t i = 0; i < LEN; i++)
		poisoned += back[i] == POISON && src[(N - 1) * LEN + i] != POISON;
	if (!poisoned)
		fail_msg("a read before the copy completed saw no poison");
	assert_int_equal(cuStreamSynchronize(stream), 0);
	unsigned char *all = malloc(N * LEN);
	assert_int_equal(cuMemcpyDtoH(all, dev, N * LEN), 0);
	assert_memory_equal(all, src, N * LEN);
	/* a range outside every allocation is refused, not written */
	assert_int_not_equal(cuMemcpyHtoDAsync(dev + N * LEN - 8, src, 16, stream), 0);
	assert_int_equal(cuStreamDestroy(stream), 0);
	assert_int_equal(cuMemFree(dev), 0);
	assert_int_equal(live_device() - device_base, 0);
	free(src);
	free(back);
	free(all);
	set_delay("50");
}

/* Every combination of device, reader, thread count and staging budget. */
static void test_load_matrix(void **state)
{
	(void)state;
	set_delay("50");
	ckpt c;
	write_random("matrix", 11, &big_gen, &c);
	ckpt_open(&c, c.dir);
	assert_int_equal(c.nfiles, 3);
	/* the first shard's data section starts at 8 mod 16 */
	assert_int_equal(fst_file_data_offset(fst_checkpoint_file(c.ck, 0)) % 16, 8);
	static const uint64_t staging[] = {1 * MiB, 4 * MiB, 16 * MiB};
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING};
	unsigned loads = 0;
	for (int dev = 0; dev < 2; dev++)
		for (int k = 0; k < 2; k++)
			for (unsigned th = 1; th <= 4; th++)
				for (int s = 0; s < 3; s++) {
					if (ios[k] == FST_IO_URING && !uring_ok)
						continue;
					char device[16];
					snprintf(device, sizeof device, "cuda:%d", dev);
					fst_load_opts o;
					cuda_opts(&o, device, ios[k], th, staging[s]);
					fst_buffer *buf = NULL;
					fst_error err;
					int rc = fst_load(c.ck, &o, &buf, &err);
					if (rc)
						fail_msg("%s %s %u threads %" PRIu64 " MiB: %s", device,
							 lh_io_name(ios[k]), th, staging[s] >> 20,
							 err.message);
					assert_has(fst_buffer_describe(buf), "pinned staging");
					assert_true(fst_buffer_size(buf) >=
						    fst_checkpoint_total_bytes(c.ck));
					assert_int_equal(fst_buffer_tensor_bytes(buf),
							 fst_checkpoint_total_bytes(c.ck));
					assert_buffer(&c, buf, dev);
					assert_int_equal(live_device() - device_base, 1);
					fst_buffer_release(buf);
					assert_clean("after a load", c.host_base);
					loads++;
				}
	assert_true(loads >= 24);
	/* "cuda" is cuda:0; small chunks make many pieces per slot */
	fst_load_opts o;
	cuda_opts(&o, "cuda", FST_IO_PREAD, 2, 1 * MiB);
	o.chunk_bytes = 4096 * 5;
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("cuda, 20 KiB chunks: %s", err.message);
	assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
	assert_clean("after the last load", c.host_base);
	ckpt_close(&c);
}

/* Shards of nothing but empty tensors, scalars, or no tensors at all, a
 * single file opened by its path, and a checkpoint with no byte to read. */
static void test_edge_checkpoints(void **state)
{
	(void)state;
	set_delay("50");
	ckpt c;
	memset(&c, 0, sizeof c);
	snprintf(c.dir, sizeof c.dir, "%s/edges", test_tmpdir());
	rm_dir(c.dir);
	assert_int_equal(mkdir(c.dir, 0755), 0);
	rng r = {99};
	struct key keys[64];
	for (unsigned f = 0; f < 4; f++) {
		fst_writer_opts wo;
		writer_layout(f, &wo);
		fst_writer *w;
		fst_error err;
		assert_int_equal(fst_writer_new(&wo, &w, &err), 0);
		char name[64];
		for (unsigned t = 0; f < 3 && t < 12; t++) {
			struct key *k = &keys[f * 16 + t];
			k->key = mix(f * 100 + t);
			snprintf(name, sizeof name, "e%u.%u", f, t);
			if (f == 0) /* empty tensors only */
				add_tensor(w, &r, name, (fst_dtype)(1 + t), 0, false, k);
			else if (f == 1) /* scalars only */
				add_tensor(w, &r, name, t % 2 ? FST_DTYPE_F64 : FST_DTYPE_U8, 0, true, k);
			else /* odd-sized bytes next to scalars and empties */
				add_tensor(w, &r, name, t % 3 ? FST_DTYPE_U8 : FST_DTYPE_I32,
					   t % 3 ? 2 * t + 1 : 0, t % 3 == 0 && t % 2, k);
		}
		char path[700];
		snprintf(path, sizeof path, "%s/%02u.safetensors", c.dir, f);
		if (fst_writer_finish(w, path, &err))
			fail_msg("%s: %s", path, err.message);
		fst_writer_free(w);
	}
	ckpt_open(&c, c.dir);
	assert_int_equal(c.nfiles, 4);
	for (int dev = 0; dev < 2; dev++)
		for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
			if (io == FST_IO_URING && !uring_ok)
				continue;
			fst_load_opts o;
			cuda_opts(&o, dev ? "cuda:1" : "cuda:0", io, 3, 1 * MiB);
			fst_buffer *buf = NULL;
			fst_error err;
			if (fst_load(c.ck, &o, &buf, &err))
				fail_msg("edges: %s", err.message);
			assert_buffer(&c, buf, dev);
			fst_buffer_release(buf);
			assert_clean("edges", c.host_base);
		}
	/* no byte to read: only the empty shard, opened by its path */
	char only[700];
	snprintf(only, sizeof only, "%s/00.safetensors", c.dir);
	ckpt e; /* its dir stays empty: the files are c's, removed with c */
	memset(&e, 0, sizeof e);
	ckpt_open(&e, only);
	assert_int_equal(fst_checkpoint_total_bytes(e.ck), 0);
	fst_load_opts o;
	cuda_opts(&o, "cuda:1", FST_IO_PREAD, 4, 1 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(e.ck, &o, &buf, &err))
		fail_msg("empty tensors only: %s", err.message);
	assert_int_equal(fst_buffer_tensor_count(buf), 12);
	assert_buffer(&e, buf, 1);
	fst_buffer_release(buf);
	assert_clean("empty tensors only", e.host_base);
	/* the streaming form hands every empty tensor out at once */
	fst_loader *ld;
	assert_int_equal(fst_load_start(e.ck, &o, &ld, &err), 0);
	fst_tensor_view v;
	size_t n = 0;
	int rc;
	while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
		assert_view(&e, &v, 1);
		fst_view_release(&v);
		n++;
	}
	assert_int_equal(rc, 0);
	assert_int_equal(n, 12);
	assert_int_equal(fst_loader_finish(ld, NULL, &err), 0);
	assert_clean("empty tensors only, streamed", e.host_base);
	ckpt_close(&e);
	ckpt_close(&c);
}

/* Streaming: each tensor is complete on the device when it is handed out.
 * The double poisons destinations until their copies run, late, so a
 * tensor reported before its copies completed would show 0xDB. */
static void test_streaming_readiness(void **state)
{
	(void)state;
	set_delay("300");
	ckpt c;
	write_random("stream", 23, &big_gen, &c);
	ckpt_open(&c, c.dir);
	size_t nt = fst_checkpoint_tensor_count(c.ck);
	unsigned char *seen = calloc(nt, 1);
	static const int ios[] = {FST_IO_PREAD, FST_IO_URING};
	static const unsigned threads[] = {1, 4};
	static const uint64_t staging[] = {1 * MiB, 4 * MiB};
	for (int dev = 0; dev < 2; dev++)
		for (int k = 0; k < 2; k++)
			for (int t = 0; t < 2; t++)
				for (int s = 0; s < 2; s++) {
					if (ios[k] == FST_IO_URING && !uring_ok)
						continue;
					fst_load_opts o;
					cuda_opts(&o, dev ? "cuda:1" : "cuda:0", ios[k], threads[t],
						  staging[s]);
					fst_loader *ld = NULL;
					fst_error err;
					if (fst_load_start(c.ck, &o, &ld, &err))
						fail_msg("start: %s", err.message);
					memset(seen, 0, nt);
					size_t n = 0;
					fst_tensor_view v;
					int rc;
					while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
						/* copy back at once: no waiting of our own */
						assert_view(&c, &v, dev);
						assert_true(v.index < nt);
						assert_int_equal(seen[v.index], 0);
						seen[v.index] = 1;
						n++;
						fst_view_release(&v);
					}
					if (rc)
						fail_msg("next: %s", err.message);
					assert_int_equal(n, nt);
					uint64_t done, total;
					fst_loader_progress(ld, &done, &total);
					assert_int_equal(total, fst_checkpoint_total_bytes(c.ck));
					assert_int_equal(done, total);
					fst_buffer *buf = NULL;
					if (fst_loader_finish(ld, &buf, &err))
						fail_msg("finish: %s", err.message);
					assert_buffer(&c, buf, dev);
					fst_buffer_release(buf);
					assert_clean("after streaming", c.host_base);
				}
	free(seen);
	ckpt_close(&c);
	set_delay("50");
}

static void test_device_out_of_range(void **state)
{
	(void)state;
	ckpt c;
	write_random("range", 31, &small_gen, &c);
	ckpt_open(&c, c.dir);
	fst_load_opts o;
	cuda_opts(&o, "cuda:5", FST_IO_PREAD, 2, 1 * MiB);
	fst_buffer *buf = (fst_buffer *)&o; /* must be cleared */
	fst_error err;
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EUSAGE);
	assert_null(buf);
	assert_int_equal(err.code, FST_EUSAGE);
	assert_has(err.message, "device 5 out of range (2 devices)");
	char text[256];
	assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), FST_EUSAGE);
	assert_has(err.message, "device 5 out of range (2 devices)");
	fst_loader *ld = NULL;
	assert_int_equal(fst_load_start(c.ck, &o, &ld, &err), FST_EUSAGE);
	assert_null(ld);
	/* the count comes from the driver, at each call */
	setenv("FST_DOUBLE_DEVICES", "1", 1);
	o.device = "cuda:1";
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EUSAGE);
	assert_has(err.message, "device 1 out of range (1 device)");
	unsetenv("FST_DOUBLE_DEVICES");
	o.device = "cuda:x";
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EUSAGE);
	assert_clean("after refused devices", c.host_base);
	/* and the process loads fine afterwards */
	o.device = "cuda:1";
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	assert_buffer(&c, buf, 1);
	fst_buffer_release(buf);
	assert_clean("after a load", c.host_base);
	ckpt_close(&c);
}

static void test_device_out_of_memory(void **state)
{
	(void)state;
	set_delay("20");
	ckpt c;
	write_random("oom", 37, &small_gen, &c);
	ckpt_open(&c, c.dir);
	fst_load_opts o;
	cuda_opts(&o, "cuda:1", FST_IO_PREAD, 2, 1 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	uint64_t need = fst_buffer_size(buf);
	fst_buffer_release(buf);
	char limit[32], bytes[48];
	/* exactly enough, per device: a second buffer on cuda:1 does not fit,
	 * one on cuda:0 does */
	snprintf(limit, sizeof limit, "%" PRIu64, need);
	setenv("FST_DOUBLE_MEM", limit, 1);
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("with exactly %s bytes: %s", limit, err.message);
	assert_buffer(&c, buf, 1);
	fst_buffer *second = NULL;
	assert_int_equal(fst_load(c.ck, &o, &second, &err), FST_EDEVICE);
	assert_null(second);
	o.device = "cuda:0";
	if (fst_load(c.ck, &o, &second, &err))
		fail_msg("cuda:0 beside a full cuda:1: %s", err.message);
	assert_buffer(&c, second, 0);
	fst_buffer_release(second);
	fst_buffer_release(buf);
	assert_clean("after filling the device", c.host_base);
	o.device = "cuda:1";
	/* one byte short, for the load and the streaming form */
	snprintf(limit, sizeof limit, "%" PRIu64, need - 1);
	setenv("FST_DOUBLE_MEM", limit, 1);
	snprintf(bytes, sizeof bytes, "%" PRIu64 " bytes", need);
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
		if (io == FST_IO_URING && !uring_ok)
			continue;
		o.io = io;
		buf = (fst_buffer *)&o;
		assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EDEVICE);
		assert_null(buf);
		assert_int_equal(err.code, FST_EDEVICE);
		assert_int_equal(err.backend_code, 2); /* CUDA_ERROR_OUT_OF_MEMORY */
		assert_has(err.message, "cuda:1");
		assert_has(err.message, bytes);
		assert_has(err.message, "out of memory");
		assert_clean("after running out of device memory", c.host_base);
		fst_loader *ld = NULL;
		assert_int_equal(fst_load_start(c.ck, &o, &ld, &err), FST_EDEVICE);
		assert_null(ld);
		assert_clean("after running out of device memory, streaming", c.host_base);
	}
	unsetenv("FST_DOUBLE_MEM");
	o.device = "cuda:1";
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("after the limit: %s", err.message);
	assert_buffer(&c, buf, 1);
	fst_buffer_release(buf);
	assert_clean("at the end", c.host_base);
	ckpt_close(&c);
	set_delay("50");
}

/* Fail the N-th call at a site, N = 1, 2, ... until a load succeeds: every
 * failure is clean (a device error, no buffer, nothing live), and the load
 * that finally succeeds is right. */
static void fault_loop(const ckpt *c, const char *site, int io, unsigned threads, bool stream)
{
	unsigned failures = 0;
	for (long n = 1;; n++) {
		if (n > 5000)
			fail_msg("%s: still failing after 5000 calls", site);
		char spec[64];
		snprintf(spec, sizeof spec, "%s:%ld", site, n);
		fst_error err;
		assert_int_equal(fst_fault_set(spec, &err), 0);
		fst_load_opts o;
		cuda_opts(&o, n % 2 ? "cuda:1" : "cuda:0", io, threads, 1 * MiB);
		o.chunk_bytes = 16384; /* many chunks, so many calls */
		int dev = n % 2;
		fst_buffer *buf = (fst_buffer *)&o;
		int rc;
		if (!stream) {
			rc = fst_load(c->ck, &o, &buf, &err);
		} else {
			fst_loader *ld = NULL;
			rc = fst_load_start(c->ck, &o, &ld, &err);
			if (!rc) {
				fst_tensor_view v;
				while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
					char why[512];
					int bad = view_check(c, &v, dev, why, sizeof why);
					fst_view_release(&v);
					if (bad) {
						/* leave nothing behind for the next tests */
						fst_loader_free(ld);
						fst_fault_set(NULL, NULL);
						fail_msg("%s, stream: a tensor handed out before "
							 "the error was wrong: %s",
							 spec, why);
					}
				}
				fst_error ferr;
				int frc = fst_loader_finish(ld, &buf, &ferr);
				if (rc == 0)
					rc = frc, err = ferr;
				else
					assert_int_equal(frc, rc);
			} else {
				buf = NULL;
			}
		}
		fst_fault_set(NULL, NULL);
		if (!rc) {
			assert_non_null(buf);
			assert_buffer(c, buf, dev);
			fst_buffer_release(buf);
			assert_clean(spec, c->host_base);
			break;
		}
		failures++;
		if (rc != FST_EDEVICE)
			fail_msg("%s: status %d (%s), expected FST_EDEVICE", spec, rc, err.message);
		assert_int_equal(err.code, rc);
		assert_true(err.message[0] != '\0');
		assert_null(buf);
		assert_clean(spec, c->host_base);
	}
	if (!failures)
		fail_msg("%s: the first call did not fail", site);
}

static void run_faults(bool stream)
{
	set_delay("10");
	ckpt c;
	write_random(stream ? "faults_stream" : "faults", 41, &small_gen, &c);
	ckpt_open(&c, c.dir);
	static const char *const sites[] = {"device_alloc", "pin", "h2d", "event"};
	/* h2d while streaming was once a bug: a chunk whose copy failed was
	 * still reported done, handing out a tensor of poison before the error */
	for (int s = 0; s < 4; s++)
		for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
			if (io == FST_IO_URING && !uring_ok)
				continue;
			fault_loop(&c, sites[s], io, io == FST_IO_PREAD ? 1 : 3, stream);
		}
	/* a fault in every call from the first, with several workers */
	fst_error err;
	assert_int_equal(fst_fault_set("h2d:1+", &err), 0);
	fst_load_opts o;
	cuda_opts(&o, "cuda:0", FST_IO_PREAD, 4, 1 * MiB);
	fst_buffer *buf = NULL;
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EDEVICE);
	assert_has(err.message, "cuda:0");
	assert_null(buf);
	fst_fault_set(NULL, NULL);
	assert_clean("after h2d:1+", c.host_base);
	/* and the process loads again */
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
	assert_clean("after the faults", c.host_base);
	ckpt_close(&c);
	set_delay("50");
}

static void test_faults(void **state)
{
	(void)state;
	run_faults(false);
}

/* The same faults in the streaming form: no tensor handed out before the
 * error may be wrong. */
static void test_faults_streaming(void **state)
{
	(void)state;
	run_faults(true);
}

static void *release_on_thread(void *arg)
{
	fst_view_release(arg);
	return NULL;
}

/* Pinned staging blocks outlive a load, are reused by the next one (no new
 * page-locking), and fst_trim gives them all back. */
static void test_pinned_pool(void **state)
{
	(void)state;
	set_delay("20");
	ckpt c;
	write_random("pool", 47, &big_gen, &c);
	ckpt_open(&c, c.dir);
	fst_trim();
	assert_int_equal(live_host() - pinned_base, 0);
	fst_load_opts o;
	cuda_opts(&o, "cuda:0", FST_IO_PREAD, 2, 2 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	fst_buffer_release(buf);
	long kept = live_host() - pinned_base;
	assert_true(kept >= 1 && kept <= 2); /* at most one block per worker */
	assert_int_equal(live_device() - device_base, 0);
	/* the same load again, on the other device, with pinning made to
	 * fail: the kept blocks serve it */
	assert_int_equal(fst_fault_set("pin:1+", &err), 0);
	o.device = "cuda:1";
	int rc = fst_load(c.ck, &o, &buf, &err);
	fst_fault_set(NULL, NULL);
	if (rc)
		fail_msg("with the kept blocks: %s", err.message);
	assert_buffer(&c, buf, 1);
	fst_buffer_release(buf);
	assert_int_equal(live_host() - pinned_base, kept);
	fst_trim();
	assert_int_equal(live_host() - pinned_base, 0);
	fst_trim(); /* nothing left: a no-op */
	assert_clean("after trimming", c.host_base);
	ckpt_close(&c);
}

/* Views keep the device memory alive; the last one to go frees it, on
 * whatever thread that is. */
static void test_lifetime(void **state)
{
	(void)state;
	set_delay("20");
	ckpt c;
	write_random("life", 43, &small_gen, &c);
	ckpt_open(&c, c.dir);
	fst_load_opts o;
	cuda_opts(&o, "cuda:1", FST_IO_PREAD, 2, 1 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	size_t nt = fst_buffer_tensor_count(buf);
	assert_true(nt > 3);
	fst_tensor_view *views = calloc(nt, sizeof *views);
	for (size_t i = 0; i < nt; i++)
		assert_int_equal(fst_buffer_tensor(buf, i, &views[i]), 0);
	fst_buffer_release(buf);
	assert_int_equal(live_device() - device_base, 1);
	for (size_t i = 0; i < nt; i++)
		assert_view(&c, &views[i], 1);
	for (size_t i = 0; i + 1 < nt; i++) {
		fst_view_release(&views[i]);
		assert_null(views[i].buffer);
		assert_int_equal(live_device() - device_base, 1);
	}
	assert_view(&c, &views[nt - 1], 1);
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, release_on_thread, &views[nt - 1]), 0);
	pthread_join(th, NULL);
	assert_int_equal(live_device() - device_base, 0);
	fst_view_release(&views[nt - 1]); /* cleared: a no-op */
	free(views);
	assert_clean("after the last view", c.host_base);
	ckpt_close(&c);
}

/* Two loaders at once on one thread, their tensors taken in turn. */
static void test_two_loaders_interleaved(void **state)
{
	(void)state;
	set_delay("50");
	ckpt a, b;
	write_random("two_a", 51, &big_gen, &a);
	write_random("two_b", 52, &small_gen, &b);
	ckpt_open(&a, a.dir);
	ckpt_open(&b, b.dir);
	long base = fsti_live_allocations();
	fst_load_opts oa, ob;
	cuda_opts(&oa, "cuda:0", FST_IO_PREAD, 2, 1 * MiB);
	cuda_opts(&ob, "cuda:1", uring_ok ? FST_IO_URING : FST_IO_PREAD, 3, 2 * MiB);
	fst_loader *la, *lb;
	fst_error err;
	if (fst_load_start(a.ck, &oa, &la, &err) || fst_load_start(b.ck, &ob, &lb, &err))
		fail_msg("%s", err.message);
	assert_int_equal(live_device() - device_base, 2);
	int ra = 1, rb = 1;
	size_t na = 0, nb = 0;
	while (ra == 1 || rb == 1) {
		fst_tensor_view v;
		if (ra == 1 && (ra = fst_loader_next(la, &v, &err)) == 1) {
			assert_view(&a, &v, 0);
			fst_view_release(&v);
			na++;
		}
		if (rb == 1 && (rb = fst_loader_next(lb, &v, &err)) == 1) {
			assert_view(&b, &v, 1);
			fst_view_release(&v);
			nb++;
		}
	}
	assert_int_equal(ra, 0);
	assert_int_equal(rb, 0);
	assert_int_equal(na, fst_checkpoint_tensor_count(a.ck));
	assert_int_equal(nb, fst_checkpoint_tensor_count(b.ck));
	fst_buffer *ba, *bb;
	assert_int_equal(fst_loader_finish(lb, &bb, &err), 0);
	assert_int_equal(fst_loader_finish(la, &ba, &err), 0);
	assert_buffer(&a, ba, 0);
	assert_buffer(&b, bb, 1);
	fst_buffer_release(ba);
	fst_buffer_release(bb);
	assert_clean("after two loaders", base);
	ckpt_close(&b);
	ckpt_close(&a);
}

struct job {
	const ckpt *c;
	int device, io;
	unsigned threads, rounds;
	int rc;
	char why[512];
};

static void *load_job(void *arg)
{
	struct job *j = arg;
	for (unsigned r = 0; r < j->rounds && !j->rc; r++) {
		fst_load_opts o;
		cuda_opts(&o, j->device ? "cuda:1" : "cuda:0", j->io, j->threads, (1 + r) * MiB);
		fst_buffer *buf = NULL;
		fst_error err;
		if ((j->rc = fst_load(j->c->ck, &o, &buf, &err))) {
			snprintf(j->why, sizeof j->why, "load: %.480s", err.message);
			break;
		}
		j->rc = buffer_check(j->c, buf, j->device, j->why, sizeof j->why);
		fst_buffer_release(buf);
	}
	return NULL;
}

/* Two threads loading at the same time, to one device and to two. */
static void test_two_threads(void **state)
{
	(void)state;
	set_delay("30");
	ckpt a, b;
	write_random("thr_a", 61, &big_gen, &a);
	write_random("thr_b", 62, &big_gen, &b);
	ckpt_open(&a, a.dir);
	ckpt_open(&b, b.dir);
	long base = fsti_live_allocations();
	for (int same = 0; same < 2; same++) {
		struct job ja = {&a, 0, FST_IO_PREAD, 3, 3, 0, ""};
		struct job jb = {&b, same ? 0 : 1, uring_ok ? FST_IO_URING : FST_IO_PREAD, 2, 3, 0,
				 ""};
		pthread_t ta, tb;
		assert_int_equal(pthread_create(&ta, NULL, load_job, &ja), 0);
		assert_int_equal(pthread_create(&tb, NULL, load_job, &jb), 0);
		pthread_join(ta, NULL);
		pthread_join(tb, NULL);
		if (ja.rc)
			fail_msg("thread a: %s", ja.why);
		if (jb.rc)
			fail_msg("thread b: %s", jb.why);
		assert_clean("after two threads", base);
	}
	ckpt_close(&b);
	ckpt_close(&a);
}

static void test_driver_queries(void **state)
{
	(void)state;
	int version = 0, count = 0;
	char lib[512];
	fst_error err;
	assert_int_equal(fst_cuda_driver(&version, &count, lib, sizeof lib, &err), 0);
	assert_int_equal(version, 13000);
	assert_int_equal(count, 2);
	assert_string_equal(lib, getenv("FST_CUDA_LIBRARY"));
	assert_int_equal(fst_cuda_driver(NULL, NULL, NULL, 0, &err), 0);
	for (int d = 0; d < 2; d++) {
		fst_cuda_device info;
		assert_int_equal(fst_cuda_device_info(d, &info, &err), 0);
		char want[64];
		snprintf(want, sizeof want, "fst test double %d", d);
		assert_string_equal(info.name, want);
		assert_int_equal(info.index, d);
		assert_int_equal(info.total_memory, 16ull << 30);
		assert_true(info.free_memory <= info.total_memory);
		assert_int_equal(info.compute_major, 9);
		assert_int_equal(info.integrated, 0);
		assert_int_equal(info.gpu_direct_rdma, 1);
		snprintf(want, sizeof want, "0000:%02x:00.0", 0x3b + d);
		assert_string_equal(info.pci_bus_id, want);
	}
	fst_cuda_device info;
	assert_int_equal(fst_cuda_device_info(2, &info, &err), FST_EUSAGE);
	assert_has(err.message, "device 2 out of range (2 devices)");
	assert_int_equal(fst_cuda_device_info(0, NULL, &err), FST_EUSAGE);

	set_delay("20");
	long base = fsti_live_allocations();
	double gbps = 0;
	assert_int_equal(fst_cuda_h2d_bandwidth(0, 4 * MiB, &gbps, &err), 0);
	assert_true(gbps > 0);
	gbps = 0;
	assert_int_equal(fst_cuda_h2d_bandwidth(1, 40 * MiB, &gbps, &err), 0); /* 3 pieces */
	assert_true(gbps > 0);
	assert_int_equal(fst_cuda_h2d_bandwidth(0, 1000, &gbps, &err), FST_EUSAGE);
	assert_int_equal(fst_cuda_h2d_bandwidth(0, 4 * MiB, NULL, &err), FST_EUSAGE);
	assert_int_equal(fst_cuda_h2d_bandwidth(7, 4 * MiB, &gbps, &err), FST_EUSAGE);
	assert_clean("after the bandwidth test", base);
	set_delay("50");
}

static void test_explain(void **state)
{
	(void)state;
	ckpt c;
	write_random("explain", 71, &small_gen, &c);
	ckpt_open(&c, c.dir);
	char text[512];
	fst_error err;
	fst_load_opts o;
	cuda_opts(&o, "cuda:1", FST_IO_PREAD, 2, 1 * MiB);
	assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), 0);
	assert_has(text, "pread");
	assert_has(text, "pinned staging");
	assert_has(text, "2 threads");
	if (uring_ok) {
		o.io = FST_IO_URING;
		assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), 0);
		assert_has(text, "uring");
		assert_has(text, "pinned staging");
	}
	o.device = "cpu";
	o.io = FST_IO_PREAD;
	assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), 0);
	assert_null(strstr(text, "pinned staging"));
	/* mmap cannot target a GPU */
	o.device = "cuda:0";
	o.io = FST_IO_MMAP;
	assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), FST_EUSAGE);
	assert_clean("after explaining", c.host_base);
	ckpt_close(&c);
}

/* The caller's current context is its own: a load to another device, a
 * copy back, a device query or the last release must not leave the
 * caller's thread on another device's context (PyTorch reads the current
 * device from it). Once a bug: libfst made the target's
 * primary context current on the calling thread and leaves it there
 * (fixed: public calls give the context back). */
static void test_caller_context_kept(void **state)
{
	(void)state;
	int (*cuDevicePrimaryCtxRetain)(void **, int) = NULL;
	int (*cuCtxSetCurrent)(void *) = NULL;
	int (*cuCtxGetCurrent)(void **) = NULL;
	*(void **)&cuDevicePrimaryCtxRetain = dsym("cuDevicePrimaryCtxRetain");
	*(void **)&cuCtxSetCurrent = dsym("cuCtxSetCurrent");
	*(void **)&cuCtxGetCurrent = dsym("cuCtxGetCurrent");
	ckpt c;
	write_random("context", 81, &small_gen, &c);
	ckpt_open(&c, c.dir);
	void *mine = NULL, *now = NULL;
	assert_int_equal(cuDevicePrimaryCtxRetain(&mine, 0), 0);
	assert_int_equal(cuCtxSetCurrent(mine), 0);
	const char *moved = NULL; /* the first call that moved the caller */
#define KEPT(what)                                                                          \
	do {                                                                               \
		assert_int_equal(cuCtxGetCurrent(&now), 0);                                \
		if (now != mine && !moved)                                                 \
			moved = what;                                                      \
		cuCtxSetCurrent(mine);                                                     \
	} while (0)
	fst_load_opts o;
	cuda_opts(&o, "cuda:1", FST_IO_PREAD, 2, 1 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	KEPT("fst_load to cuda:1");
	assert_buffer(&c, buf, 1);
	KEPT("fst_copy_to_host from cuda:1");
	fst_buffer_release(buf);
	KEPT("releasing a cuda:1 buffer");
	fst_cuda_device info;
	assert_int_equal(fst_cuda_device_info(1, &info, &err), 0);
	KEPT("fst_cuda_device_info(1)");
#undef KEPT
	if (moved)
		fail_msg("%s left the caller's thread on another device's context", moved);
	assert_clean("after the context checks", c.host_base);
	ckpt_close(&c);
}

/* ---- on_landed: the staged bytes, shown on their way to the device */

/* Tensors of up to 1.5 MiB: more than one block of every size below. */
static const gen landed_gen = {3, 16, 3u << 19, 20};

/* One load to cuda:dev with a recording on_landed, whole or streamed;
 * streamed, each tensor must have been reported in full when it is handed
 * out. */
static void landed_load(const ckpt *c, const fst_load_opts *o, int dev, lh_landed *l,
			bool stream, const char *ctx)
{
	fst_buffer *buf = NULL;
	fst_error err;
	if (!stream) {
		if (fst_load(c->ck, o, &buf, &err))
			fail_msg("%s: %s", ctx, err.message);
	} else {
		fst_loader *ld;
		if (fst_load_start(c->ck, o, &ld, &err))
			fail_msg("%s: start: %s", ctx, err.message);
		fst_tensor_view v;
		int rc;
		size_t n = 0;
		while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
			long entry = fst_checkpoint_find(c->ck, v.name);
			assert_true(entry >= 0);
			if (!lh_landed_complete(l, (size_t)entry))
				fail_msg("%s: %s handed out before all of it was reported%s%s", ctx,
					 v.name, l->problem[0] ? "; earlier: " : "", l->problem);
			fst_view_release(&v);
			n++;
		}
		if (rc)
			fail_msg("%s: next: %s", ctx, err.message);
		assert_int_equal(n, fst_checkpoint_tensor_count(c->ck));
		if (fst_loader_finish(ld, &buf, &err))
			fail_msg("%s: finish: %s", ctx, err.message);
	}
	lh_landed_check(l, ctx);
	assert_true(l->calls > 0);
	assert_buffer(c, buf, dev);
	fst_buffer_release(buf);
}

/* Every byte of every tensor is reported once, from host staging, equal to
 * the file, in pieces that stay inside one landed_block of their tensor;
 * streamed, a tensor is handed out only once all of it was reported. */
static void test_landed(void **state)
{
	(void)state;
	set_delay("20");
	ckpt c;
	write_random("landed", 91, &landed_gen, &c);
	ckpt_open(&c, c.dir);
	static const uint64_t blocks[] = {4096, 65536, 0};
	static const uint64_t staging[] = {1 * MiB, 4 * MiB};
	unsigned loads = 0;
	/* io x block x (device, threads, staging) */
	for (int i = 0; i < 12; i++) {
		int io = i < 6 ? FST_IO_PREAD : FST_IO_URING, b = i / 2 % 3, s = i % 2;
		if (io == FST_IO_URING && !uring_ok)
			continue;
		bool stream = (b + s) % 2;
		fst_load_opts o;
		cuda_opts(&o, s ? "cuda:1" : "cuda:0", io, 1 + 2 * (unsigned)s, staging[s]);
		o.landed_block = blocks[b];
		lh_landed l;
		lh_landed_init(&l, c.ck, c.bytes, NULL, blocks[b], false);
		l.sleep_every = stream ? 3 : 0;
		o.on_landed = lh_on_landed;
		o.on_landed_ctx = &l;
		char ctx[160];
		snprintf(ctx, sizeof ctx,
			 "%s %s %u threads, %" PRIu64 " MiB staging, landed_block %" PRIu64 "%s",
			 o.device, lh_io_name(io), o.threads, staging[s] >> 20, blocks[b],
			 stream ? ", streaming" : "");
		landed_load(&c, &o, s, &l, stream, ctx);
		lh_landed_free(&l);
		assert_clean(ctx, c.host_base);
		loads++;
	}
	assert_true(loads >= 6);
	ckpt_close(&c);
	set_delay("50");
}

/* A load whose on_landed returns code at call `at`: it fails with want,
 * naming the tensor of that call; no buffer, nothing left on the device or
 * pinned. */
static void landed_fail(const ckpt *c, fst_load_opts *o, unsigned long at, int code,
			bool stream, const char *ctx)
{
	int want = code > 0 ? FST_ECANCELED : code;
	lh_landed l;
	lh_landed_init(&l, c->ck, c->bytes, NULL, o->landed_block, false);
	l.fail_at = at;
	l.fail_rc = code;
	o->on_landed = lh_on_landed;
	o->on_landed_ctx = &l;
	fst_buffer *buf = (fst_buffer *)&l; /* must be cleared */
	fst_error err;
	int rc;
	if (!stream) {
		rc = fst_load(c->ck, o, &buf, &err);
	} else {
		fst_loader *ld;
		if (fst_load_start(c->ck, o, &ld, &err))
			fail_msg("%s: start: %s", ctx, err.message);
		fst_tensor_view v;
		while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
			assert_view(c, &v, 0); /* handed out: whole */
			fst_view_release(&v);
		}
		if (rc != want)
			fail_msg("%s: next gave %d (%s)", ctx, rc, err.message);
		rc = fst_loader_finish(ld, &buf, &err);
	}
	lh_landed_check_failed(&l, o, rc, want, &err, buf, ctx);
	assert_clean(ctx, c->host_base);
}

/* A callback that fails on its k-th call fails the load with its code
 * (FST_ECANCELED for a value that is none), naming the tensor: no buffer,
 * no device memory or pinned block left, and the next load works. */
static void test_landed_error(void **state)
{
	(void)state;
	set_delay("20");
	ckpt c;
	write_random("landed_err", 93, &small_gen, &c);
	ckpt_open(&c, c.dir);
	static const int codes[] = {FST_EMISMATCH, FST_ECANCELED, 7};
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
		if (io == FST_IO_URING && !uring_ok)
			continue;
		fst_load_opts o;
		cuda_opts(&o, "cuda:0", io, 2, 1 * MiB);
		o.landed_block = 8192;
		/* how many calls a whole load makes */
		lh_landed l;
		lh_landed_init(&l, c.ck, c.bytes, NULL, o.landed_block, false);
		o.on_landed = lh_on_landed;
		o.on_landed_ctx = &l;
		landed_load(&c, &o, 0, &l, false, lh_io_name(io));
		unsigned long calls = l.calls;
		lh_landed_free(&l);
		assert_clean("a counting load", c.host_base);
		assert_true(calls > 4);
		const unsigned long ats[] = {1, calls / 2, calls};
		for (int k = 0; k < 9; k++) {
			bool stream = (k / 3 + k % 3) % 2;
			char ctx[160];
			snprintf(ctx, sizeof ctx, "%s: on_landed returns %d at call %lu of %lu%s",
				 lh_io_name(io), codes[k / 3], ats[k % 3], calls,
				 stream ? ", streaming" : "");
			landed_fail(&c, &o, ats[k % 3], codes[k / 3], stream, ctx);
		}
		/* and the next load, without the callback, works */
		fst_buffer *buf = NULL;
		fst_error err;
		if (fst_load(c.ck, &o, &buf, &err))
			fail_msg("%s after the failures: %s", lh_io_name(io), err.message);
		assert_buffer(&c, buf, 0);
		fst_buffer_release(buf);
		assert_clean("after the failures", c.host_base);
	}
	ckpt_close(&c);
	set_delay("50");
}

/* ---- set-up */

static int setup(void **state)
{
	(void)state;
	const char *path = getenv("FST_CUDA_LIBRARY");
	dbl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!dbl) {
		fprintf(stderr, "cannot open the double %s: %s\n", path, dlerror());
		return -1;
	}
	*(void **)&live_device = dsym("fst_double_live_device");
	*(void **)&live_host = dsym("fst_double_live_host");
	/* Does this kernel allow io_uring? */
	int u = lh_uring_probe();
	if (u < 0)
		return -1;
	uring_ok = u > 0;
	return 0;
}

/* Each test starts with the double's defaults and no fault armed, whatever
 * a failed test before it left behind. */
static int reset(void **state)
{
	(void)state;
	unsetenv("FST_DOUBLE_MEM");
	unsetenv("FST_DOUBLE_DEVICES");
	set_delay("50");
	fst_fault_set(NULL, NULL);
	fst_trim();
	device_base = live_device();
	pinned_base = live_host();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fst_trim();
	long d = live_device(), h = live_host();
	dlclose(dbl);
	if (d || h) {
		fprintf(stderr, "at the end: %ld device allocations and %ld pinned blocks live\n", d,
			h);
		return -1;
	}
	return 0;
}

int main(void)
{
	const char *path = getenv("FST_CUDA_LIBRARY");
	if (!path || !*path) {
		fprintf(stderr, "FST_CUDA_LIBRARY is not set: run through ctest\n");
		return 77;
	}
	set_delay("50");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_double_catches_early_read, reset),
		cmocka_unit_test_setup(test_driver_queries, reset),
		cmocka_unit_test_setup(test_explain, reset),
		cmocka_unit_test_setup(test_load_matrix, reset),
		cmocka_unit_test_setup(test_edge_checkpoints, reset),
		cmocka_unit_test_setup(test_streaming_readiness, reset),
		cmocka_unit_test_setup(test_device_out_of_range, reset),
		cmocka_unit_test_setup(test_device_out_of_memory, reset),
		cmocka_unit_test_setup(test_faults, reset),
		cmocka_unit_test_setup(test_faults_streaming, reset),
		cmocka_unit_test_setup(test_pinned_pool, reset),
		cmocka_unit_test_setup(test_lifetime, reset),
		cmocka_unit_test_setup(test_two_loaders_interleaved, reset),
		cmocka_unit_test_setup(test_two_threads, reset),
		cmocka_unit_test_setup(test_caller_context_kept, reset),
		cmocka_unit_test_setup(test_landed, reset),
		cmocka_unit_test_setup(test_landed_error, reset),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
