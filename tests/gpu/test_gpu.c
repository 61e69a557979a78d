/*
 * Description: the GPU suite. Loads checkpoints onto a real GPU (cuda:0, or
 * FST_GPU_DEVICE) and compares every tensor byte with the file: every dtype,
 * misaligned files (data section 8 bytes past a 16-byte boundary, odd-sized
 * U8 tensors), many shards, empty and scalar tensors, a tensor over 4 GiB,
 * both readers, streaming, two loads alive at once, two loaders on two
 * threads, every GPU fault-injection site (a clean error, nothing leaked,
 * and a byte-exact load afterwards), and device out-of-memory. Exits 77
 * where there is no GPU. Prints "N passed, M failed". FST_GPU_ONLY=TEXT
 * runs only the tests whose name contains TEXT.
 */
#include "fst.h"

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
#include <time.h>
#include <unistd.h>

static int passed, failed;
static const char *device = "cuda:0";
static char tmpdir[512];

#define CHECK(cond, ...)                                                           \
	do {                                                                       \
		if (!(cond)) {                                                     \
			fprintf(stderr, "  FAIL %s:%d: ", __func__, __LINE__);     \
			fprintf(stderr, __VA_ARGS__);                              \
			fputc('\n', stderr);                                       \
			return 1;                                                  \
		}                                                                  \
	} while (0)

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void fill_random(void *buf, size_t n)
{
	unsigned char *p = buf;
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)next_rand();
}

static char *path_in(const char *name)
{
	static char bufs[4][700];
	static int k;
	char *b = bufs[k++ % 4];
	snprintf(b, sizeof bufs[0], "%s/%s", tmpdir, name);
	return b;
}

/* Compare every loaded tensor of ckpt with the files' bytes. */
static int compare_all(const fst_checkpoint *ck, fst_buffer *buf)
{
	const size_t block = 64u << 20;
	char *a = malloc(block), *b = malloc(block);
	CHECK(a && b, "out of memory");
	size_t nt = fst_checkpoint_tensor_count(ck);
	CHECK(fst_buffer_tensor_count(buf) == nt, "tensor count %zu != %zu",
	      fst_buffer_tensor_count(buf), nt);
	for (size_t i = 0; i < nt; i++) {
		fst_tensor_info info;
		size_t fi;
		fst_checkpoint_tensor(ck, i, &info, &fi);
		long bi = fst_buffer_find(buf, info.name);
		CHECK(bi >= 0, "tensor %s missing", info.name);
		fst_tensor_view v;
		fst_buffer_tensor(buf, (size_t)bi, &v);
		CHECK(v.device_type == FST_DEVICE_CUDA, "not on the GPU");
		CHECK(((uintptr_t)v.data % 256) == 0, "tensor %s not 256-aligned", info.name);
		int fd = open(fst_file_path(fst_checkpoint_file(ck, fi)), O_RDONLY);
		for (uint64_t off = 0; off < info.nbytes; off += block) {
			size_t n = (size_t)(info.nbytes - off < block ? info.nbytes - off : block);
			fst_error err;
			CHECK(fst_copy_to_host(&v, off, a, n, &err) == 0, "%s", err.message);
			CHECK(pread(fd, b, n, (off_t)(info.file_offset + off)) == (ssize_t)n, "pread");
			CHECK(memcmp(a, b, n) == 0, "tensor %s differs in [%" PRIu64 ", +%zu)",
			      info.name, off, n);
		}
		close(fd);
		fst_view_release(&v);
	}
	free(a);
	free(b);
	return 0;
}

static int load_and_compare(const char *path, int io, unsigned threads, uint64_t staging)
{
	fst_checkpoint *ck;
	fst_error err;
	CHECK(fst_checkpoint_open(path, &ck, &err) == 0, "%s", err.message);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.device = device;
	o.io = io;
	o.threads = threads;
	o.staging_bytes = staging;
	fst_buffer *buf;
	CHECK(fst_load(ck, &o, &buf, &err) == 0, "%s", err.message);
	int rc = compare_all(ck, buf);
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
	return rc;
}

/* Write a file with the given writer options: a tensor per dtype. */
static int write_all_dtypes(const char *path, bool misaligned)
{
	fst_writer_opts wo;
	fst_writer_opts_init(&wo);
	if (misaligned) {
		wo.data_align = 16;
		wo.header_extra = 8;
	}
	fst_writer *w;
	fst_error err;
	CHECK(fst_writer_new(&wo, &w, &err) == 0, "%s", err.message);
	static unsigned char data[1 << 20];
	fill_random(data, sizeof data);
	char name[64];
	for (int d = 1; d < FST_DTYPE_COUNT; d++) {
		unsigned bits = fst_dtype_bits((fst_dtype)d);
		/* numel: a multiple of 8 so sub-byte dtypes fill whole bytes,
		 * odd for byte dtypes when misaligned */
		uint64_t numel = bits % 8 ? 1000 : (misaligned && bits == 8 ? 1001 : 777);
		uint64_t shape[2] = {numel, 1};
		snprintf(name, sizeof name, "t.%s", fst_dtype_name((fst_dtype)d));
		CHECK(fst_writer_add(w, name, (fst_dtype)d, 2, shape, data, numel * bits / 8, &err) == 0,
		      "%s", err.message);
		if (misaligned) {
			uint64_t odd[1] = {(next_rand() % 97) * 2 + 1};
			snprintf(name, sizeof name, "scales.%s", fst_dtype_name((fst_dtype)d));
			CHECK(fst_writer_add(w, name, FST_DTYPE_U8, 1, odd, data, odd[0], &err) == 0,
			      "%s", err.message);
		}
	}
	CHECK(fst_writer_add(w, "scalar", FST_DTYPE_F32, 0, NULL, data, 4, &err) == 0, "%s",
	      err.message);
	uint64_t empty[2] = {0, 16};
	CHECK(fst_writer_add(w, "empty", FST_DTYPE_BF16, 2, empty, data, 0, &err) == 0, "%s",
	      err.message);
	CHECK(fst_writer_finish(w, path, &err) == 0, "%s", err.message);
	fst_writer_free(w);
	return 0;
}

static int test_all_dtypes(void)
{
	const char *p = path_in("dtypes.safetensors");
	if (write_all_dtypes(p, false))
		return 1;
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++)
		if (load_and_compare(p, io, 4, 1u << 20))
			return 1;
	return 0;
}

static int test_misaligned(void)
{
	const char *p = path_in("misaligned.safetensors");
	if (write_all_dtypes(p, true))
		return 1;
	fst_file *f;
	fst_error err;
	CHECK(fst_file_open(p, &f, &err) == 0, "%s", err.message);
	CHECK(fst_file_data_offset(f) % 16 == 8, "data offset %" PRIu64 " not 8 mod 16",
	      fst_file_data_offset(f));
	fst_file_close(f);
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++)
		for (unsigned t = 1; t <= 16; t *= 4)
			if (load_and_compare(p, io, t, 1u << 20))
				return 1;
	return 0;
}

static int fill_pattern(void *ctx, void *buf, uint64_t off, size_t len)
{
	uint64_t seed = (uint64_t)(uintptr_t)ctx;
	uint64_t *w = buf;
	/* len and off are multiples of 8 here except at the very end */
	for (size_t i = 0; i < len / 8; i++)
		w[i] = (off / 8 + i) * 0x9E3779B97F4A7C15ull ^ seed;
	for (size_t i = len / 8 * 8; i < len; i++)
		((unsigned char *)buf)[i] = (unsigned char)(off + i);
	return 0;
}

static int test_many_shards(void)
{
	char *dir = path_in("shards");
	mkdir(dir, 0755);
	for (int s = 0; s < 24; s++) {
		fst_writer_opts wo;
		fst_writer_opts_init(&wo);
		wo.header_extra = (uint32_t)(s % 2) * 8;
		fst_writer *w;
		fst_error err;
		CHECK(fst_writer_new(&wo, &w, &err) == 0, "%s", err.message);
		for (int t = 0; t < 20; t++) {
			char name[64];
			snprintf(name, sizeof name, "s%d.t%d", s, t);
			uint64_t shape[1] = {next_rand() % 300000 + (t % 3 == 0 ? 1 : 0)};
			CHECK(fst_writer_add_fill(w, name, t % 2 ? FST_DTYPE_U8 : FST_DTYPE_BF16, 1,
						  shape, fill_pattern, (void *)(uintptr_t)(s * 100 + t),
						  &err) == 0,
			      "%s", err.message);
		}
		char p[800];
		snprintf(p, sizeof p, "%s/model-%05d.safetensors", dir, s);
		CHECK(fst_writer_finish(w, p, &err) == 0, "%s", err.message);
		fst_writer_free(w);
	}
	return load_and_compare(dir, FST_IO_AUTO, 0, 0) ||
	       load_and_compare(dir, FST_IO_URING, 8, 8u << 20);
}

static const char *big_path(void)
{
	static char p[700];
	if (p[0])
		return p;
	snprintf(p, sizeof p, "%s/big.safetensors", tmpdir);
	fst_writer_opts wo;
	fst_writer_opts_init(&wo);
	fst_writer *w;
	fst_error err;
	if (fst_writer_new(&wo, &w, &err))
		return NULL;
	uint64_t small[1] = {3};
	uint64_t shape[2] = {(4ull << 30) / 1024 + 12345, 1024};
	static unsigned char three[3] = {1, 2, 3};
	fst_writer_add(w, "head", FST_DTYPE_U8, 1, small, three, 3, &err);
	fst_writer_add_fill(w, "huge", FST_DTYPE_U8, 2, shape, fill_pattern, (void *)7, &err);
	if (fst_writer_finish(w, p, &err)) {
		fprintf(stderr, "  %s\n", err.message);
		p[0] = '\0';
	}
	fst_writer_free(w);
	return p[0] ? p : NULL;
}

static int test_over_4gib(void)
{
	const char *p = big_path();
	CHECK(p, "cannot write the big file");
	return load_and_compare(p, FST_IO_AUTO, 0, 0) || load_and_compare(p, FST_IO_URING, 0, 0);
}

static int test_streaming(void)
{
	fst_checkpoint *ck;
	fst_error err;
	CHECK(fst_checkpoint_open(path_in("misaligned.safetensors"), &ck, &err) == 0, "%s",
	      err.message);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.device = device;
	o.staging_bytes = 1u << 20;
	fst_loader *ld;
	CHECK(fst_load_start(ck, &o, &ld, &err) == 0, "%s", err.message);
	size_t seen = 0;
	fst_tensor_view v;
	int r;
	while ((r = fst_loader_next(ld, &v, &err)) == 1) {
		long i = fst_checkpoint_find(ck, v.name);
		fst_tensor_info info;
		size_t fi;
		fst_checkpoint_tensor(ck, (size_t)i, &info, &fi);
		char *a = malloc(info.nbytes + 1), *b = malloc(info.nbytes + 1);
		CHECK(fst_copy_to_host(&v, 0, a, v.nbytes, &err) == 0, "%s", err.message);
		int fd = open(fst_file_path(fst_checkpoint_file(ck, fi)), O_RDONLY);
		CHECK(pread(fd, b, info.nbytes, (off_t)info.file_offset) == (ssize_t)info.nbytes,
		      "pread");
		close(fd);
		CHECK(memcmp(a, b, info.nbytes) == 0, "%s handed out before its bytes landed",
		      v.name);
		free(a);
		free(b);
		fst_view_release(&v);
		seen++;
	}
	CHECK(r == 0, "next: %s", err.message);
	CHECK(seen == fst_checkpoint_tensor_count(ck), "%zu of %zu handed out", seen,
	      fst_checkpoint_tensor_count(ck));
	fst_buffer *buf;
	CHECK(fst_loader_finish(ld, &buf, &err) == 0, "%s", err.message);
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
	return 0;
}

static int test_two_loads_alive(void)
{
	fst_checkpoint *a, *b;
	fst_error err;
	CHECK(fst_checkpoint_open(path_in("misaligned.safetensors"), &a, &err) == 0, "%s",
	      err.message);
	CHECK(fst_checkpoint_open(path_in("shards"), &b, &err) == 0, "%s", err.message);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.device = device;
	fst_buffer *ba, *bb;
	CHECK(fst_load(a, &o, &ba, &err) == 0, "%s", err.message);
	CHECK(fst_load(b, &o, &bb, &err) == 0, "%s", err.message);
	int rc = compare_all(a, ba) || compare_all(b, bb);
	fst_buffer_release(ba);
	fst_buffer_release(bb);
	fst_checkpoint_close(a);
	fst_checkpoint_close(b);
	return rc;
}

static void *thread_load(void *arg)
{
	return (void *)(intptr_t)load_and_compare(arg, FST_IO_AUTO, 4, 16u << 20);
}

static int test_two_threads(void)
{
	pthread_t t1, t2;
	pthread_create(&t1, NULL, thread_load, path_in("shards"));
	pthread_create(&t2, NULL, thread_load, path_in("misaligned.safetensors"));
	void *r1, *r2;
	pthread_join(t1, &r1);
	pthread_join(t2, &r2);
	CHECK(!r1 && !r2, "a concurrent load failed");
	return 0;
}

static int test_out_of_memory(void)
{
	const char *p = big_path();
	CHECK(p, "cannot write the big file");
	fst_checkpoint *ck;
	fst_error err;
	CHECK(fst_checkpoint_open(p, &ck, &err) == 0, "%s", err.message);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.device = device;
	fst_buffer *held[256];
	int n = 0, rc = 0;
	for (; n < 256; n++) {
		rc = fst_load(ck, &o, &held[n], &err);
		if (rc)
			break;
	}
	CHECK(rc == FST_EDEVICE, "expected FST_EDEVICE after %d loads, got %d (%s)", n, rc,
	      err.message);
	CHECK(strstr(err.message, "out of memory") || strstr(err.message, "OUT_OF_MEMORY"),
	      "message does not say out of memory: %s", err.message);
	printf("  device memory ran out after %d loads of 4 GiB: %s\n", n, err.message);
	for (int i = 0; i < n; i++)
		fst_buffer_release(held[i]);
	/* and the device is usable again */
	fst_buffer *buf;
	CHECK(fst_load(ck, &o, &buf, &err) == 0, "load after OOM: %s", err.message);
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
	return 0;
}

/* ------------------------------------------------ fault injection on the GPU */

/* libfst's count of its own live host allocations (src/base/mem.c). The suite
 * links the static library, so this internal symbol is reachable. */
long fsti_live_allocations(void);

static const char *const gpu_sites[] = {"device_alloc",    "pin",         "h2d", "event",
					"cufile_register", "cufile_read", "nccl"};
#define NGPU_SITES (sizeof gpu_sites / sizeof gpu_sites[0])

static pthread_mutex_t fault_log_lock = PTHREAD_MUTEX_INITIALIZER;
static long fault_fired[NGPU_SITES]; /* "injected fault at site X" lines seen */
static long fault_warnings;          /* warnings and errors logged */
static int fault_dev;                /* the device index under test */
static unsigned fault_loads;         /* faulted loads run */
static bool fault_uring = true;      /* io_uring works here */
static uint64_t fault_dst_size;      /* what a load of the fault checkpoint allocates */

/* libfst logs "injected fault at site X" (debug level) each time a fault
 * fires: counting those lines proves the failure came from the site armed,
 * not from something else. Warnings and errors still reach stderr (the
 * first few). */
static void fault_log(void *ctx, int level, const char *msg)
{
	(void)ctx;
	static const char tag[] = "injected fault at site ";
	if (!strncmp(msg, tag, sizeof tag - 1)) {
		pthread_mutex_lock(&fault_log_lock);
		for (size_t i = 0; i < NGPU_SITES; i++)
			if (!strcmp(msg + sizeof tag - 1, gpu_sites[i]))
				fault_fired[i]++;
		pthread_mutex_unlock(&fault_log_lock);
		return;
	}
	if (level > FST_LOG_WARN)
		return;
	pthread_mutex_lock(&fault_log_lock);
	long n = ++fault_warnings;
	pthread_mutex_unlock(&fault_log_lock);
	if (n <= 8)
		fprintf(stderr, "  fst: %s: %s\n", level == FST_LOG_ERROR ? "error" : "warning",
			msg);
	else if (n == 9)
		fprintf(stderr, "  fst: (further warnings counted, not printed)\n");
}

static void fired_reset(void)
{
	pthread_mutex_lock(&fault_log_lock);
	memset(fault_fired, 0, sizeof fault_fired);
	pthread_mutex_unlock(&fault_log_lock);
}

static long fired(const char *site)
{
	long n = 0;
	pthread_mutex_lock(&fault_log_lock);
	for (size_t i = 0; i < NGPU_SITES; i++)
		if (!strcmp(site, gpu_sites[i]))
			n = fault_fired[i];
	pthread_mutex_unlock(&fault_log_lock);
	return n;
}

/*
 * Poisoned destinations. cuMemAlloc hands back the memory the previous load
 * of the same size just freed, still holding the file's bytes, so a chunk
 * whose copy never ran could go unseen. The suite takes a few entry points
 * from the driver libfst loaded (dlopen RTLD_NOLOAD): scrub_device fills and
 * frees a block of a load's size just before the load, so libfst's own
 * cuMemAlloc most likely gets 0xDB bytes (best effort), and poison_alloc,
 * an fst_allocator, always gives them. The libcuda double has no
 * cuMemsetD8; it poisons every queued copy's destination itself.
 */
typedef int drv_result;
typedef unsigned long long drv_ptr;
static struct {
	bool ok;
	void *ctx; /* the device's primary context, as libfst uses */
	drv_result (*device_get)(int *dev, int ordinal);
	drv_result (*retain)(void **ctx, int dev);
	drv_result (*get_current)(void **ctx);
	drv_result (*set_current)(void *ctx);
	drv_result (*alloc)(drv_ptr *p, size_t n);
	drv_result (*free)(drv_ptr p);
	drv_result (*memset8)(drv_ptr p, unsigned char v, size_t n);
	drv_result (*sync)(void);
	long live;   /* poison_alloc blocks not yet freed */
	char why[1600];
} drv;

static void poison_init(void)
{
	char lib[512];
	fst_error err;
	if (fst_cuda_driver(NULL, NULL, lib, sizeof lib, &err)) {
		snprintf(drv.why, sizeof drv.why, "%s", err.message);
		return;
	}
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	if (!h) {
		snprintf(drv.why, sizeof drv.why, "dlopen %s: %s", lib, dlerror());
		return;
	}
	*(void **)&drv.device_get = dlsym(h, "cuDeviceGet");
	*(void **)&drv.retain = dlsym(h, "cuDevicePrimaryCtxRetain");
	*(void **)&drv.get_current = dlsym(h, "cuCtxGetCurrent");
	*(void **)&drv.set_current = dlsym(h, "cuCtxSetCurrent");
	*(void **)&drv.alloc = dlsym(h, "cuMemAlloc_v2");
	*(void **)&drv.free = dlsym(h, "cuMemFree_v2");
	*(void **)&drv.memset8 = dlsym(h, "cuMemsetD8_v2");
	*(void **)&drv.sync = dlsym(h, "cuCtxSynchronize");
	dlclose(h); /* libfst still holds it */
	if (!drv.device_get || !drv.retain || !drv.get_current || !drv.set_current || !drv.alloc || !drv.free ||
	    !drv.memset8 || !drv.sync) {
		snprintf(drv.why, sizeof drv.why, "%s lacks cuMemsetD8_v2 or another entry", lib);
		return;
	}
	int d = 0, r = drv.device_get(&d, fault_dev);
	if (!r)
		r = drv.retain(&drv.ctx, d);
	if (r) {
		snprintf(drv.why, sizeof drv.why, "cuDevicePrimaryCtxRetain: %d", r);
		return;
	}
	drv.ok = true;
}

/* Fill n bytes of fresh device memory with 0xDB and free them again. */
static void scrub_device(uint64_t n)
{
	if (!drv.ok)
		return;
	void *saved = NULL;
	drv.get_current(&saved);
	drv.set_current(drv.ctx);
	drv_ptr p = 0;
	if (!drv.alloc(&p, (size_t)n)) {
		drv.memset8(p, 0xDB, (size_t)n);
		drv.sync();
		drv.free(p);
	}
	drv.set_current(saved);
}

/* fst_allocator: device memory filled with 0xDB (libfst made the context
 * current); counted, so a failed load must give it back. */
static void *poison_alloc(void *ctx, uint64_t size, uint32_t align, int device_type,
			  int device_id)
{
	(void)ctx;
	(void)align; /* cuMemAlloc aligns to 256 or more; libfst checks */
	if (device_type != FST_DEVICE_CUDA || device_id != fault_dev)
		return NULL;
	drv_ptr p = 0;
	if (drv.alloc(&p, (size_t)size))
		return NULL;
	drv.memset8(p, 0xDB, (size_t)size);
	drv.sync();
	__atomic_add_fetch(&drv.live, 1, __ATOMIC_SEQ_CST);
	return (void *)(uintptr_t)p;
}

static void poison_free(void *ctx, void *ptr, uint64_t size, int device_type, int device_id)
{
	(void)ctx;
	(void)size;
	(void)device_type;
	(void)device_id;
	/* the last reference may go on any thread, with no context current */
	void *saved = NULL;
	drv.get_current(&saved);
	drv.set_current(drv.ctx);
	drv.free((drv_ptr)(uintptr_t)ptr);
	drv.set_current(saved);
	__atomic_sub_fetch(&drv.live, 1, __ATOMIC_SEQ_CST);
}

static const fst_allocator poison_allocator = {poison_alloc, poison_free, NULL};

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int n = 0;
	for (struct dirent *de; (de = readdir(d));)
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own descriptor */
}

/* What a load must give back: libfst's host allocations, descriptors, and
 * device memory (cuMemGetInfo through fst_cuda_device_info). Taken with no
 * kept pinned block: the driver may hold a descriptor for each pinned
 * mapping, so a pinned block that is neither kept nor freed shows too. */
struct leak_snap {
	long allocs;
	int fds;
	uint64_t dev_free;
};

static int snap_take(struct leak_snap *s)
{
	fst_cuda_device info;
	fst_error err;
	fst_trim(); /* no load is running */
	s->allocs = fsti_live_allocations();
	s->fds = count_fds();
	CHECK(fst_cuda_device_info(fault_dev, &info, &err) == 0, "%s", err.message);
	s->dev_free = info.free_memory;
	return 0;
}

/* tol: device memory that may come and go without a leak (the driver's own
 * bookkeeping); less than the destination of one load, so a leaked
 * destination is seen. */
static int check_no_leak(const struct leak_snap *base, uint64_t tol, const char *what)
{
	struct leak_snap now;
	if (snap_take(&now))
		return 1;
	CHECK(now.allocs == base->allocs, "%s: %ld libfst allocations live, %ld before", what,
	      now.allocs, base->allocs);
	CHECK(now.fds == base->fds, "%s: %d descriptors open, %d before", what, now.fds,
	      base->fds);
	CHECK(__atomic_load_n(&drv.live, __ATOMIC_SEQ_CST) == 0,
	      "%s: %ld blocks of the caller's allocator not given back", what, drv.live);
	CHECK(now.dev_free + tol >= base->dev_free,
	      "%s: device free memory %" PRIu64 " bytes below the start (%" PRIu64 " -> %" PRIu64
	      ")",
	      what, base->dev_free - now.dev_free, base->dev_free, now.dev_free);
	return 0;
}

/* A directory of 4 shards, 12 tensors each (one an empty tensor), about
 * 12 MiB: U8 of odd sizes, BF16 and F32; shards 1 and 3 with their data
 * section 8 bytes past a 16-byte boundary. */
static int write_fault_ckpt(const char *dir)
{
	mkdir(dir, 0755);
	for (int s = 0; s < 4; s++) {
		fst_writer_opts wo;
		fst_writer_opts_init(&wo);
		if (s % 2) {
			wo.data_align = 16;
			wo.header_extra = 8;
		}
		fst_writer *w;
		fst_error err;
		CHECK(fst_writer_new(&wo, &w, &err) == 0, "%s", err.message);
		for (int t = 0; t < 12; t++) {
			static const fst_dtype dt[3] = {FST_DTYPE_U8, FST_DTYPE_BF16,
							FST_DTYPE_F32};
			char name[64];
			snprintf(name, sizeof name, "layer%d.w%d", s, t);
			uint64_t shape[1] = {t == 0    ? (1u << 20) + (next_rand() % 4096) * 2 + 1
					     : t == 7 && s == 2 ? 0
								: next_rand() % 150000 + 1};
			fst_dtype d = t == 0 ? FST_DTYPE_U8 : dt[t % 3];
			void *seed = (void *)(uintptr_t)(s * 1000 + t + 1);
			int r = fst_writer_add_fill(w, name, d, 1, shape, fill_pattern, seed, &err);
			CHECK(r == 0, "%s", err.message);
		}
		char p[800];
		snprintf(p, sizeof p, "%s/model-%05d-of-00004.safetensors", dir, s + 1);
		CHECK(fst_writer_finish(w, p, &err) == 0, "%s", err.message);
		fst_writer_free(w);
	}
	return 0;
}

static const char *io_name(int io)
{
	return io == FST_IO_PREAD ? "pread" : io == FST_IO_URING ? "uring" : "auto";
}

/* 1 MiB of staging: slots of about 112 KiB with 3 threads, so about a
 * hundred chunks and as many h2d and event calls. gds is explicit, so
 * FST_GDS and FST_GDS_TRY from the environment change nothing. */
static void fault_opts(fst_load_opts *o, int io, unsigned threads, int gds)
{
	fst_load_opts_init(o);
	o->device = device;
	o->io = io;
	o->threads = threads;
	o->staging_bytes = 1u << 20;
	o->gds = gds;
}

static int load_compare_opts(const fst_checkpoint *ck, const fst_load_opts *o, const char *what)
{
	fst_buffer *buf = NULL;
	fst_error err;
	scrub_device(fault_dst_size);
	CHECK(fst_load(ck, o, &buf, &err) == 0, "%s: %s", what, err.message);
	int rc = compare_all(ck, buf);
	fst_buffer_release(buf);
	if (rc)
		fprintf(stderr, "  (%s)\n", what);
	return rc;
}

/* The error of a failed load at a staging-path site: its code, CUresult and
 * words (src/load/cuda_sink.c), and the site's own "injected fault" log line. */
static int check_site_error(const char *site, const char *spec, int rc, const fst_error *err)
{
	char dev[32];
	snprintf(dev, sizeof dev, "cuda:%d", fault_dev);
	const char *m = err->message;
	CHECK(rc == FST_EDEVICE, "%s: status %d (%s), expected FST_EDEVICE", spec, rc, m);
	CHECK(err->code == rc, "%s: err.code %d, returned %d", spec, err->code, rc);
	CHECK(fired(site) >= 1, "%s: failed, but no fault fired at %s: %s", spec, site, m);
	if (!strcmp(site, "device_alloc")) {
		CHECK(strstr(m, dev) && strstr(m, "cannot allocate") && strstr(m, "tensors") &&
			      strstr(m, "CUDA_ERROR_OUT_OF_MEMORY"),
		      "%s: message: %s", spec, m);
		CHECK(err->backend_code == 2, "%s: backend_code %d", spec, err->backend_code);
	} else if (!strcmp(site, "pin")) {
		CHECK(strstr(m, "pinned staging memory") && strstr(m, "CUDA_ERROR_OUT_OF_MEMORY"),
		      "%s: message: %s", spec, m);
		CHECK(err->backend_code == 2, "%s: backend_code %d", spec, err->backend_code);
	} else if (!strcmp(site, "h2d")) {
		CHECK(strstr(m, dev) && strstr(m, "cannot queue the copy of") &&
			      strstr(m, ".safetensors") && strstr(m, "CUDA_ERROR_INVALID_VALUE"),
		      "%s: message: %s", spec, m);
		CHECK(err->backend_code == 1, "%s: backend_code %d", spec, err->backend_code);
	} else if (!strcmp(site, "event")) {
		/* cuEventRecord after a slot's copies, or cuEventSynchronize
		 * when a slot is waited for */
		CHECK(strstr(m, dev) && strstr(m, "CUDA_ERROR_UNKNOWN") &&
			      (strstr(m, "cannot record an event") ||
			       (strstr(m, ".safetensors: copy of") && strstr(m, "failed"))),
		      "%s: message: %s", spec, m);
		CHECK(err->backend_code == 999, "%s: backend_code %d", spec, err->backend_code);
	}
	return 0;
}

/* Arm spec and load with fst_load. *load_failed says whether it failed; a
 * failure must be the site's clean error with nothing left behind, and a
 * load without the fault must then give the file's bytes; a success (the
 * site was called fewer than N times) must give them too. */
static int faulted_load(const fst_checkpoint *ck, const char *site, const char *spec, int io,
			unsigned threads, bool trim, const struct leak_snap *base, uint64_t tol,
			bool *load_failed)
{
	if (trim)
		fst_trim(); /* no kept pinned block: the pin site is reached */
	fired_reset();
	fst_error err;
	CHECK(fst_fault_set(spec, &err) == 0, "%s: %s", spec, err.message);
	fst_load_opts o;
	fault_opts(&o, io, threads, FST_GDS_OFF);
	fst_buffer *buf = (fst_buffer *)&o; /* must come back NULL on failure */
	scrub_device(fault_dst_size);
	int rc = fst_load(ck, &o, &buf, &err);
	fst_fault_set(NULL, NULL);
	fault_loads++;
	*load_failed = rc != 0;
	if (!rc) {
		CHECK(buf && buf != (fst_buffer *)&o, "%s: success without a buffer", spec);
		long n = fired(site);
		int r = compare_all(ck, buf);
		fst_buffer_release(buf);
		CHECK(!r, "%s: the load that succeeded differs from the files", spec);
		CHECK(n == 0, "%s: the fault fired %ld times, yet the load succeeded", spec, n);
		return check_no_leak(base, tol, spec);
	}
	CHECK(buf == NULL, "%s: *out not NULL after a failed load", spec);
	if (check_site_error(site, spec, rc, &err) || check_no_leak(base, tol, spec))
		return 1;
	/* the process loads again, byte for byte */
	char what[96];
	snprintf(what, sizeof what, "the load after %s", spec);
	if (load_compare_opts(ck, &o, what))
		return 1;
	return check_no_leak(base, tol, what);
}

/* Calls at which faults are tried: early, middle and late ones, until the
 * first N the load does not reach. */
static const long fault_ns[] = {1, 2, 3, 5, 8, 13, 30, 80, 200, 500, 1500, 5000};
#define NFAULT_NS (sizeof fault_ns / sizeof fault_ns[0])

static int fault_loop(const fst_checkpoint *ck, const char *site, int io, unsigned threads,
		      const struct leak_snap *base, uint64_t tol)
{
	char line[400];
	int len = snprintf(line, sizeof line, "  %-12s %s, %u threads: failed cleanly at call",
			   site, io_name(io), threads);
	size_t i = 0;
	for (;; i++) {
		CHECK(i < NFAULT_NS, "%s: still failing at call %ld", site,
		      fault_ns[NFAULT_NS - 1]);
		char spec[64];
		snprintf(spec, sizeof spec, "%s:%ld", site, fault_ns[i]);
		bool load_failed;
		if (faulted_load(ck, site, spec, io, threads, true, base, tol, &load_failed))
			return 1;
		if (!load_failed)
			break;
		if (len < (int)sizeof line - 16)
			len += snprintf(line + len, sizeof line - (size_t)len, " %ld", fault_ns[i]);
	}
	CHECK(i > 0, "%s:1 did not fail: the site was never reached", site);
	printf("%s; call %ld not reached, loaded\n", line, fault_ns[i]);
	return 0;
}

/* "SITE:N+": every call from the N-th fails; the load must fail. */
static int persistent_fault(const fst_checkpoint *ck, const char *site, long from, int io,
			    unsigned threads, const struct leak_snap *base, uint64_t tol)
{
	char spec[64];
	snprintf(spec, sizeof spec, "%s:%ld+", site, from);
	bool load_failed;
	if (faulted_load(ck, site, spec, io, threads, true, base, tol, &load_failed))
		return 1;
	CHECK(load_failed, "%s: the load succeeded", spec);
	printf("  %-12s %s, %u threads: %s failed cleanly\n", site, io_name(io), threads, spec);
	return 0;
}

/* Tensor v, handed out by fst_loader_next, must already hold the file's
 * bytes: a tensor is handed out only once all its copies are over. */
static int view_matches_file(const fst_checkpoint *ck, const fst_tensor_view *v)
{
	long i = fst_checkpoint_find(ck, v->name);
	CHECK(i >= 0, "handed out an unknown tensor %s", v->name);
	fst_tensor_info info;
	size_t fi;
	fst_checkpoint_tensor(ck, (size_t)i, &info, &fi);
	CHECK(v->nbytes == info.nbytes, "%s: %" PRIu64 " bytes, file has %" PRIu64, v->name,
	      v->nbytes, info.nbytes);
	char *a = malloc(info.nbytes + 1), *b = malloc(info.nbytes + 1);
	CHECK(a && b, "out of memory");
	fst_error err;
	int fd = open(fst_file_path(fst_checkpoint_file(ck, fi)), O_RDONLY);
	CHECK(fd >= 0, "open: %s", strerror(errno));
	ssize_t got = pread(fd, b, info.nbytes, (off_t)info.file_offset);
	close(fd);
	CHECK(got == (ssize_t)info.nbytes, "pread");
	CHECK(fst_copy_to_host(v, 0, a, v->nbytes, &err) == 0, "%s", err.message);
	CHECK(memcmp(a, b, info.nbytes) == 0, "%s was handed out before all its bytes landed",
	      v->name);
	free(a);
	free(b);
	return 0;
}

/* h2d in the streaming form: each view handed out is a complete tensor
 * with the file's bytes; after the error, fst_loader_next hands out
 * nothing more and returns the error again, and fst_loader_finish returns
 * it with no buffer. */
static int stream_h2d(const fst_checkpoint *ck, int io, unsigned threads, bool poisoned,
		      const struct leak_snap *base, uint64_t tol)
{
	size_t nt = fst_checkpoint_tensor_count(ck);
	char line[400];
	int len = snprintf(line, sizeof line,
			   "  h2d stream   %s, %u threads, %s: failed cleanly at call", io_name(io),
			   threads, poisoned ? "poisoned allocator" : "own cuMemAlloc");
	size_t i = 0;
	for (;; i++) {
		CHECK(i < NFAULT_NS, "h2d stream: still failing at call %ld",
		      fault_ns[NFAULT_NS - 1]);
		char spec[64];
		snprintf(spec, sizeof spec, "h2d:%ld", fault_ns[i]);
		fst_trim();
		fired_reset();
		fst_error err;
		CHECK(fst_fault_set(spec, &err) == 0, "%s", err.message);
		fst_load_opts o;
		fault_opts(&o, io, threads, FST_GDS_OFF);
		if (poisoned)
			o.allocator = &poison_allocator;
		else
			scrub_device(fault_dst_size);
		fst_loader *ld = NULL;
		CHECK(fst_load_start(ck, &o, &ld, &err) == 0, "%s: start: %s", spec, err.message);
		fault_loads++;
		size_t handed = 0;
		fst_tensor_view v;
		int r;
		while ((r = fst_loader_next(ld, &v, &err)) == 1) {
			int bad = view_matches_file(ck, &v);
			fst_view_release(&v);
			if (bad) {
				fst_loader_free(ld);
				fprintf(stderr, "  (%s, streaming, tensor %zu)\n", spec, handed);
				return 1;
			}
			handed++;
		}
		if (r < 0) {
			fst_error again;
			memset(&v, 0, sizeof v);
			int r2 = fst_loader_next(ld, &v, &again);
			if (r2 != r || v.buffer) {
				if (r2 == 1)
					fst_view_release(&v);
				fst_loader_free(ld);
				CHECK(0, "%s: next gave %d after error %d", spec, r2, r);
			}
		}
		fst_buffer *buf = (fst_buffer *)&o;
		fst_error ferr;
		int frc = fst_loader_finish(ld, &buf, &ferr);
		fst_fault_set(NULL, NULL);
		if (r == 0) {
			CHECK(frc == 0, "%s: every tensor handed out, then finish: %s", spec,
			      ferr.message);
			CHECK(handed == nt, "%s: %zu of %zu tensors handed out", spec, handed, nt);
			CHECK(fired("h2d") == 0, "%s: the fault fired, yet the load succeeded",
			      spec);
			int bad = compare_all(ck, buf);
			fst_buffer_release(buf);
			if (bad || check_no_leak(base, tol, spec))
				return 1;
			break;
		}
		CHECK(frc == r, "%s: finish returned %d, next %d", spec, frc, r);
		CHECK(buf == NULL, "%s: finish gave a buffer after an error", spec);
		/* the chunk whose copy failed is never counted: its tensor
		 * cannot have been handed out */
		CHECK(handed < nt, "%s: all %zu tensors handed out despite the error", spec, nt);
		if (check_site_error("h2d", spec, frc, &ferr) || check_no_leak(base, tol, spec))
			return 1;
		if (load_compare_opts(ck, &o, "the load after a streaming h2d fault") ||
		    check_no_leak(base, tol, spec))
			return 1;
		if (len < (int)sizeof line - 24)
			len += snprintf(line + len, sizeof line - (size_t)len,
					" %ld (%zu handed out)", fault_ns[i], handed);
	}
	CHECK(i > 0, "h2d:1 did not fail while streaming");
	printf("%s; call %ld not reached, loaded\n", line, fault_ns[i]);
	return 0;
}

/* "GPUDirect Storage for K of N files" from a buffer's description. */
static long gds_files_used(const fst_buffer *buf)
{
	const char *d = strstr(fst_buffer_describe(buf), "GPUDirect Storage for ");
	return d ? strtol(d + strlen("GPUDirect Storage for "), NULL, 10) : 0;
}

/* One load with spec armed and the given gds policy: returns its status
 * (and the error), after checking *out, leaks and, on success, the bytes. */
static int gds_faulted(const fst_checkpoint *ck, const char *spec, int gds,
		       const struct leak_snap *base, uint64_t tol, int *status, fst_error *err)
{
	fired_reset();
	CHECK(fst_fault_set(spec, err) == 0, "%s: %s", spec, err->message);
	fst_load_opts o;
	fault_opts(&o, FST_IO_PREAD, 3, gds);
	fst_buffer *buf = (fst_buffer *)&o;
	int rc = fst_load(ck, &o, &buf, err);
	fst_fault_set(NULL, NULL);
	fault_loads++;
	*status = rc;
	if (rc) {
		CHECK(buf == NULL, "%s: *out not NULL after a failed load", spec);
		CHECK(err->code == rc, "%s: err.code %d, returned %d", spec, err->code, rc);
	} else {
		int bad = compare_all(ck, buf);
		fst_buffer_release(buf);
		CHECK(!bad, "%s, gds=%s: bytes differ", spec, gds == FST_GDS_ON ? "on" : "auto");
	}
	return check_no_leak(base, tol, spec);
}

/* cufile_register and cufile_read: reached only where the cuFile driver
 * opens, that is where GDS is usable or FST_GDS_TRY=1 opens it anyway (on
 * the H200 test machine, without /dev/nvidia-fs, the driver opens in
 * compatibility mode and every real cuFileHandleRegister fails with 5027,
 * so cuFileRead is never called there). */
static int cufile_sites(const fst_checkpoint *ck, uint64_t tol)
{
	const char *try_env = getenv("FST_GDS_TRY");
	bool try_anyway = try_env && !strcmp(try_env, "1");
	fst_gds_report rep;
	fst_error err;
	CHECK(fst_gds_probe(fault_dev, &rep, &err) == 0, "%s", err.message);
	if (!try_anyway && !rep.usable) {
		printf("  skip cufile sites: FST_GDS_TRY=1 is not set and gds=auto does not use "
		       "cuFile here (%s)\n",
		       rep.reason);
		return 0;
	}
	if (!rep.library || !rep.driver_opened) {
		printf("  skip cufile sites: the cuFile driver is not open (%s)\n", rep.reason);
		return 0;
	}
	size_t nf = fst_checkpoint_file_count(ck);
	/* a load without faults first: the driver's own descriptors and
	 * memory are in the baseline */
	fst_load_opts o;
	fault_opts(&o, FST_IO_PREAD, 3, FST_GDS_AUTO);
	fst_buffer *buf = NULL;
	CHECK(fst_load(ck, &o, &buf, &err) == 0, "gds=auto: %s", err.message);
	long registered = gds_files_used(buf);
	printf("  cuFile: %s; %s\n", rep.reason, fst_buffer_describe(buf));
	fst_buffer_release(buf);
	struct leak_snap base;
	if (snap_take(&base))
		return 1;
	int rc;
	/* cufile_register, gds=on: the first file's registration fails */
	if (gds_faulted(ck, "cufile_register:1", FST_GDS_ON, &base, tol, &rc, &err))
		return 1;
	const char *first = fst_file_path(fst_checkpoint_file(ck, 0));
	CHECK(rc == FST_EUNSUPPORTED, "cufile_register:1, gds=on: status %d (%s)", rc,
	      err.message);
	CHECK(fired("cufile_register") == 1, "cufile_register:1 fired %ld times",
	      fired("cufile_register"));
	CHECK(strstr(err.message, first) && strstr(err.message, "cuFileHandleRegister failed") &&
		      strstr(err.message, "5027") && err.backend_code == 5027,
	      "cufile_register:1, gds=on: message: %s (backend %d)", err.message, err.backend_code);
	printf("  cufile_register:1, gds=on: failed cleanly: %s\n", err.message);
	if (registered == (long)nf) {
		/* every file registers for real: the second one fails */
		if (gds_faulted(ck, "cufile_register:2", FST_GDS_ON, &base, tol, &rc, &err))
			return 1;
		const char *second = fst_file_path(fst_checkpoint_file(ck, 1));
		CHECK(rc == FST_EUNSUPPORTED && strstr(err.message, second),
		      "cufile_register:2, gds=on: status %d: %s", rc, err.message);
	}
	/* cufile_register, gds=auto: the file is staged instead, with a
	 * warning; the bytes are the same */
	static const char *const auto_specs[] = {"cufile_register:1", "cufile_register:3",
						 "cufile_register:1+"};
	for (size_t k = 0; k < 3; k++) {
		if (gds_faulted(ck, auto_specs[k], FST_GDS_AUTO, &base, tol, &rc, &err))
			return 1;
		CHECK(rc == 0, "%s, gds=auto: %s", auto_specs[k], err.message);
		CHECK(fired("cufile_register") >= 1, "%s, gds=auto: the fault never fired",
		      auto_specs[k]);
	}
	printf("  cufile_register:1, :3, :1+, gds=auto: fell back to staging, bytes equal\n");
	if (registered == 0) {
		printf("  skip cufile_read: no file registers with cuFile here (GPUDirect Storage "
		       "for 0 of %zu files), so cuFileRead is never called\n",
		       nf);
		return 0;
	}
	static const char *const read_specs[] = {"cufile_read:1", "cufile_read:3",
						 "cufile_read:1+"};
	for (size_t k = 0; k < 3; k++) {
		if (gds_faulted(ck, read_specs[k], FST_GDS_AUTO, &base, tol, &rc, &err))
			return 1;
		CHECK(rc == 0, "%s, gds=auto: %s", read_specs[k], err.message);
		CHECK(k == 1 || fired("cufile_read") >= 1, "%s, gds=auto: the fault never fired",
		      read_specs[k]);
	}
	printf("  cufile_read:1, :3, :1+, gds=auto: fell back to staging, bytes equal\n");
	if (registered < (long)nf) {
		printf("  skip cufile_read with gds=on: only %ld of %zu files register with "
		       "cuFile, so gds=on fails before reading\n",
		       registered, nf);
		return 0;
	}
	if (gds_faulted(ck, "cufile_read:1", FST_GDS_ON, &base, tol, &rc, &err))
		return 1;
	CHECK(rc == FST_EIO && strstr(err.message, "cuFileRead of") &&
		      fired("cufile_read") == 1,
	      "cufile_read:1, gds=on: status %d: %s", rc, err.message);
	printf("  cufile_read:1, gds=on: failed cleanly: %s\n", err.message);
	return 0;
}

static int fault_sites_body(void)
{
	const char *dir = path_in("faults");
	if (write_fault_ckpt(dir))
		return 1;
	fst_checkpoint *ck;
	fst_error err;
	CHECK(fst_checkpoint_open(dir, &ck, &err) == 0, "%s", err.message);
	uint64_t total = fst_checkpoint_total_bytes(ck);
	/* device memory that may move without a leak: under half of one
	 * destination */
	uint64_t tol = total / 2;
	/* warm up: the driver's lazily made state (context, streams, the
	 * first pinned blocks) is in the baseline */
	fst_load_opts o;
	fault_opts(&o, FST_IO_PREAD, 3, FST_GDS_OFF);
	fst_buffer *buf = NULL;
	CHECK(fst_load(ck, &o, &buf, &err) == 0, "warm-up: %s", err.message);
	fault_dst_size = fst_buffer_size(buf);
	int rc = compare_all(ck, buf);
	fst_buffer_release(buf);
	buf = NULL;
	poison_init();
	scrub_device(fault_dst_size); /* the driver's memset code is loaded now */
	if (drv.ok)
		printf("  destinations poisoned with 0xDB (%" PRIu64 " bytes a load)\n",
		       fault_dst_size);
	else
		printf("  destinations not poisoned by the suite: %s\n", drv.why);
	fst_trim();
	fault_opts(&o, FST_IO_URING, 3, FST_GDS_OFF);
	if (!rc && fst_load(ck, &o, &buf, &err)) {
		printf("  io_uring not usable here (%s): pread only\n", err.message);
		fault_uring = false;
	}
	fst_buffer_release(buf);
	fst_trim();
	struct leak_snap base;
	if (rc || snap_take(&base)) {
		fst_checkpoint_close(ck);
		return 1;
	}
	for (int s = 0; !rc && s < 4; s++)
		for (int io = FST_IO_PREAD; !rc && io <= FST_IO_URING; io++)
			if (io == FST_IO_PREAD || fault_uring)
				rc = fault_loop(ck, gpu_sites[s], io, io == FST_IO_PREAD ? 3 : 2,
						&base, tol);
	/* every call from the N-th, with several workers */
	static const struct {
		const char *site;
		long from;
	} persistent[] = {{"device_alloc", 1}, {"pin", 1},   {"h2d", 1},
			  {"h2d", 3},          {"event", 1}, {"event", 3}}; /* one pin a load */
	for (size_t k = 0; !rc && k < sizeof persistent / sizeof persistent[0]; k++)
		rc = persistent_fault(ck, persistent[k].site, persistent[k].from,
				      k % 2 && fault_uring ? FST_IO_URING : FST_IO_PREAD, 3, &base,
				      tol);
	/* the kept pinned blocks serve a load without pinning: pin:1+ is not
	 * reached then (which is why the loops above trim first) */
	if (!rc) {
		fault_opts(&o, FST_IO_PREAD, 3, FST_GDS_OFF);
		rc = load_compare_opts(ck, &o, "filling the pinned pool");
		fired_reset();
		fst_fault_set("pin:1+", NULL);
		if (!rc)
			rc = load_compare_opts(ck, &o, "pin:1+ with kept blocks");
		fst_fault_set(NULL, NULL);
		if (!rc && fired("pin")) {
			fprintf(stderr, "  FAIL pin:1+ fired %ld times with kept blocks\n",
				fired("pin"));
			rc = 1;
		}
		if (!rc)
			printf("  pin:1+ with kept pinned blocks: not reached, loaded\n");
		fst_trim();
	}
	/* with pread onto poisoned memory (where the driver can memset), with
	 * io_uring onto libfst's own allocation */
	for (int io = FST_IO_PREAD; !rc && io <= FST_IO_URING; io++)
		if (io == FST_IO_PREAD || fault_uring)
			rc = stream_h2d(ck, io, io == FST_IO_PREAD ? 3 : 2,
					io == FST_IO_PREAD && drv.ok, &base, tol);
	if (!rc) {
		struct leak_snap now;
		if (!snap_take(&now))
			printf("  %u faulted loads; device free memory %+" PRId64 " bytes, libfst "
			       "allocations %+ld, descriptors %+d since the start\n",
			       fault_loads, (int64_t)(now.dev_free - base.dev_free),
			       now.allocs - base.allocs, now.fds - base.fds);
	}
	/* last: opening the cuFile driver (FST_GDS_TRY=1) changes the
	 * process for good (descriptors, a context on every GPU) */
	if (!rc)
		rc = cufile_sites(ck, tol);
	fst_checkpoint_close(ck);
	return rc;
}

/* Every GPU fault-injection site on the real device: the load fails with
 * the site's own error, *out stays NULL, nothing is left allocated or
 * open, and the next load is byte-exact. */
static int test_fault_sites(void)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int saved_level = fst_log_get_level();
	fst_log_set_callback(fault_log, NULL);
	fst_log_set_level(FST_LOG_DEBUG);
	fault_loads = 0;
	fault_warnings = 0;
	int rc = fault_sites_body();
	fst_fault_set(NULL, NULL);
	fst_log_set_level(saved_level);
	fst_log_set_callback(NULL, NULL);
	fst_trim();
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("  fault sites took %.1f s (%ld warnings logged)\n",
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9,
	       fault_warnings);
	return rc;
}

int main(void)
{
	const char *dev = getenv("FST_GPU_DEVICE");
	if (dev && *dev)
		device = dev;
	if (!strncmp(device, "cuda:", 5))
		fault_dev = atoi(device + 5);
	const char *only = getenv("FST_GPU_ONLY");
	int count = 0;
	fst_error err;
	if (fst_cuda_driver(NULL, &count, NULL, 0, &err) || count == 0) {
		printf("skipped: no GPU (%s)\n", count ? err.message : "no device");
		return 77;
	}
	const char *base = getenv("FST_GPU_TMP");
	snprintf(tmpdir, sizeof tmpdir, "%s/fst-gpu-XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	static const struct {
		const char *name;
		int (*fn)(void);
	} tests[] = {
		{"all dtypes", test_all_dtypes},
		{"misaligned", test_misaligned},
		{"many shards", test_many_shards},
		{"tensor over 4 GiB", test_over_4gib},
		{"streaming", test_streaming},
		{"two loads alive", test_two_loads_alive},
		{"two loaders on two threads", test_two_threads},
		{"fault sites", test_fault_sites},
		{"device out of memory", test_out_of_memory},
	};
	for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
		if (only && *only && !strstr(tests[i].name, only))
			continue;
		printf("[ RUN  ] %s\n", tests[i].name);
		fflush(stdout);
		if (tests[i].fn()) {
			failed++;
			printf("[ FAIL ] %s\n", tests[i].name);
		} else {
			passed++;
			printf("[  OK  ] %s\n", tests[i].name);
		}
	}
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	if (system(cmd)) {
		/* best effort */
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
