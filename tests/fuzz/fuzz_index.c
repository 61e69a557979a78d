/* Description: libFuzzer target for sharded checkpoints. Each input is
 * written as model.safetensors.index.json into a scratch directory that
 * also holds small valid shards (made once with fst_writer), an invalid
 * shard, a shard duplicating a tensor and a subdirectory; then
 * fst_checkpoint_open runs on the directory and on the index path. A
 * success is walked and checked; a failure must be a clean status with a
 * message. Built with -fsanitize=fuzzer,address,undefined, and also without
 * the fuzzer by replay.c to run the corpus as a regression test. */
#include "fst.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "fuzz_index: %s:%d: check failed: %s\n",       \
				__FILE__, __LINE__, #cond);                           \
			abort();                                                      \
		}                                                                     \
	} while (0)

static char dir[256];
static char index_path[320];

/* Files made in dir, removed at exit (subdirectory last). */
static const char *const made[] = {
	"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
	"dup.safetensors", "bad.safetensors", "sub/x.safetensors",
	"model.safetensors.index.json",
};

static void cleanup(void)
{
	char p[400];
	for (size_t i = 0; i < sizeof made / sizeof made[0]; i++) {
		snprintf(p, sizeof p, "%s/%s", dir, made[i]);
		unlink(p);
	}
	snprintf(p, sizeof p, "%s/sub", dir);
	rmdir(p);
	rmdir(dir);
}

static void shard(const char *name, const char *const *tensors, fst_dtype dtype)
{
	fst_writer *w;
	fst_error err;
	CHECK(fst_writer_new(NULL, &w, &err) == 0);
	static const uint8_t bytes[64];
	for (size_t i = 0; tensors[i]; i++) {
		uint64_t shape[2] = {2, i + 2}; /* even numel: fine for F4 too */
		uint64_t nbytes = 2 * (i + 2) * fst_dtype_bits(dtype) / 8;
		CHECK(fst_writer_add(w, tensors[i], dtype, 2, shape, bytes, nbytes, &err) == 0);
	}
	CHECK(fst_writer_metadata(w, "format", "pt", &err) == 0);
	char p[400];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	if (fst_writer_finish(w, p, &err)) {
		fprintf(stderr, "fuzz_index: %s\n", err.message);
		abort();
	}
	fst_writer_free(w);
}

static void setup(void)
{
	const char *tmp = getenv("TMPDIR");
	if (tmp && *tmp)
		mkdir(tmp, 0755); /* best effort: mkdtemp reports the failure */
	snprintf(dir, sizeof dir, "%s/fst-fuzz-index-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	CHECK(mkdtemp(dir) != NULL);
	atexit(cleanup);
	snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
	char p[400];
	snprintf(p, sizeof p, "%s/sub", dir);
	CHECK(mkdir(p, 0755) == 0);
	shard("model-00001-of-00002.safetensors",
	      (const char *const[]){"model.embed.weight", "a", "b", NULL}, FST_DTYPE_BF16);
	shard("model-00002-of-00002.safetensors", (const char *const[]){"c", "d", "lm_head", NULL},
	      FST_DTYPE_F4);
	shard("dup.safetensors", (const char *const[]){"a", "z", NULL}, FST_DTYPE_U8);
	shard("sub/x.safetensors", (const char *const[]){"x", NULL}, FST_DTYPE_F32);
	snprintf(p, sizeof p, "%s/bad.safetensors", dir);
	FILE *f = fopen(p, "wb");
	CHECK(f != NULL);
	fwrite("\x04\0\0\0\0\0\0\0{[]}", 1, 12, f);
	fclose(f);
}

static void check_error(int rc, const fst_error *err)
{
	CHECK(rc < 0);
	CHECK(err->code == rc);
	CHECK(err->message[0] != '\0');
	CHECK(strlen(err->message) < FST_ERROR_MSG_MAX);
	CHECK(rc == FST_EFORMAT || rc == FST_EIO || rc == FST_ENOMEM);
}

static void walk(const fst_checkpoint *c)
{
	size_t nf = fst_checkpoint_file_count(c), n = fst_checkpoint_tensor_count(c);
	CHECK(fst_checkpoint_index_path(c) != NULL);
	size_t sum = 0;
	for (size_t i = 0; i < nf; i++) {
		const fst_file *f = fst_checkpoint_file(c, i);
		CHECK(f != NULL);
		sum += fst_file_tensor_count(f);
	}
	CHECK(fst_checkpoint_file(c, nf) == NULL);
	CHECK(sum == n);
	uint64_t total = 0;
	size_t last_file = 0;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info ti;
		size_t fi = nf;
		CHECK(fst_checkpoint_tensor(c, i, &ti, &fi) == 0);
		CHECK(fi < nf && fi >= last_file);
		last_file = fi;
		CHECK(fst_checkpoint_find(c, ti.name) == (long)i);
		total += ti.nbytes;
	}
	CHECK(fst_checkpoint_total_bytes(c) == total);
	fst_tensor_info ti;
	CHECK(fst_checkpoint_tensor(c, n, &ti, NULL) == FST_EUSAGE);
}

static int open_walk(const char *path)
{
	fst_checkpoint *c = (fst_checkpoint *)(uintptr_t)1; /* must become NULL on failure */
	fst_error err;
	int rc = fst_checkpoint_open(path, &c, &err);
	if (rc) {
		check_error(rc, &err);
		CHECK(c == NULL);
		return rc;
	}
	walk(c);
	fst_checkpoint_close(c);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int ready;
	if (!ready) {
		/* Unmapped tensors are logged as warnings: keep the output quiet. */
		fst_log_set_level(FST_LOG_ERROR);
		setup();
		ready = 1;
	}
	int fd = open(index_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECK(fd >= 0);
	size_t done = 0;
	while (done < size) {
		ssize_t n = write(fd, data + done, size - done);
		CHECK(n > 0);
		done += (size_t)n;
	}
	CHECK(close(fd) == 0);
	int a = open_walk(dir), b = open_walk(index_path);
	/* The directory's only index is this file: both ways agree. */
	CHECK(a == b);
	return 0;
}
