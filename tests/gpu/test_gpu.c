/*
 * Description: the GPU suite. Loads checkpoints onto a real GPU (cuda:0, or
 * FST_GPU_DEVICE) and compares every tensor byte with the file: every dtype,
 * misaligned files (data section 8 bytes past a 16-byte boundary, odd-sized
 * U8 tensors), many shards, empty and scalar tensors, a tensor over 4 GiB,
 * both readers, streaming, two loads alive at once, two loaders on two
 * threads, and device out-of-memory. Exits 77 where there is no GPU.
 * Prints "N passed, M failed".
 */
#include "fst.h"

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

int main(void)
{
	const char *dev = getenv("FST_GPU_DEVICE");
	if (dev && *dev)
		device = dev;
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
		{"device out of memory", test_out_of_memory},
	};
	for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
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
