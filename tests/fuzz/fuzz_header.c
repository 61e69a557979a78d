/* Description: libFuzzer target for the header parser. Each input is a
 * whole safetensors file opened with fst_file_open_memory; when it opens,
 * every accessor is walked and the invariants the format promises are
 * checked (tensors tile the data section, sizes match dtype and shape,
 * every name is found), the file is written again with fst_writer and must
 * read back identical, and it goes through a one-file checkpoint that is
 * loaded onto the CPU (every tensor equal to the input's bytes, each byte
 * shown once to on_landed).
 * A failed open must be a clean status with a message. Built with
 * -fsanitize=fuzzer,address,undefined, and also without the fuzzer by
 * replay.c to run the corpus as a regression test. */
#include "fst.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant broke: say which, then crash so the fuzzer keeps the input. */
#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "fuzz_header: %s:%d: check failed: %s\n",      \
				__FILE__, __LINE__, #cond);                           \
			abort();                                                      \
		}                                                                     \
	} while (0)

static void check_error(int rc, const fst_error *err)
{
	CHECK(rc < 0);
	CHECK(err->code == rc);
	CHECK(err->message[0] != '\0');
	CHECK(strlen(err->message) < FST_ERROR_MSG_MAX);
	/* Only input rules and memory can fail an open from memory. */
	CHECK(rc == FST_EFORMAT || rc == FST_ENOMEM);
	/* Messages start with the file's name. */
	CHECK(!strncmp(err->message, "fuzz: ", 6));
}

/* Walk every accessor; returns a value derived from all the data bytes so
 * the reads cannot be optimised away (and ASan sees each one). */
static unsigned walk(const fst_file *f, const uint8_t *data, size_t size)
{
	unsigned sum = 0;
	CHECK(fst_file_size(f) == size);
	CHECK(fst_file_memory(f) == (const void *)data);
	CHECK(fst_file_fd(f) == -1);
	CHECK(!strcmp(fst_file_path(f), "fuzz"));
	uint64_t doff = fst_file_data_offset(f);
	CHECK(doff >= 8 && doff <= size);
	uint64_t dlen = size - doff;

	size_t n = fst_file_tensor_count(f);
	uint64_t expected = 0;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info ti;
		CHECK(fst_file_tensor(f, i, &ti) == 0);
		CHECK(ti.name != NULL);
		CHECK(strcmp(ti.name, "__metadata__") != 0);
		CHECK(ti.dtype > FST_DTYPE_INVALID && ti.dtype < FST_DTYPE_COUNT);
		CHECK((ti.ndim == 0) == (ti.shape == NULL));
		uint64_t numel = 1;
		for (uint32_t d = 0; d < ti.ndim; d++)
			numel *= ti.shape[d]; /* checked for overflow by the parser */
		CHECK(numel == ti.numel);
		unsigned bits = fst_dtype_bits(ti.dtype);
		CHECK(ti.nbytes == ti.end - ti.begin);
		/* Neither product can overflow: the parser checked numel * bits,
		 * and nbytes is at most the input's size. */
		CHECK(ti.numel * bits == ti.nbytes * 8);
		/* Sorted, back to back, inside the data section. */
		CHECK(ti.begin == expected);
		CHECK(ti.end <= dlen);
		CHECK(ti.file_offset == doff + ti.begin);
		expected = ti.end;
		for (uint64_t b = 0; b < ti.nbytes; b++)
			sum += data[ti.file_offset + b];
		long k = fst_file_find(f, ti.name);
		CHECK(k >= 0);
		fst_tensor_info tk;
		CHECK(fst_file_tensor(f, (size_t)k, &tk) == 0);
		CHECK(!strcmp(tk.name, ti.name));
		/* Names are unique, so the one found is this one. */
		CHECK((size_t)k == i);
		sum += (unsigned)strlen(ti.name);
	}
	CHECK(expected == dlen);
	fst_tensor_info ti;
	CHECK(fst_file_tensor(f, n, &ti) == FST_EUSAGE);
	CHECK(fst_file_find(f, NULL) == -1);

	size_t nm = fst_file_metadata_count(f);
	for (size_t i = 0; i < nm; i++) {
		const char *k = NULL, *v = NULL;
		CHECK(fst_file_metadata(f, i, &k, &v) == 0);
		CHECK(k && v);
		const char *got = fst_file_metadata_get(f, k);
		CHECK(got != NULL);
		/* Keys are unique: the first match is this entry. */
		CHECK(got == v);
		sum += (unsigned)strlen(k) + (unsigned)strlen(v);
	}
	CHECK(fst_file_metadata(f, nm, NULL, NULL) == FST_EUSAGE);
	return sum;
}

/* on_landed during the fuzz load: every piece must be the input's bytes. */
struct landed {
	const fst_checkpoint *c;
	const uint8_t *data;
	uint64_t bytes;
};

static int check_landed(void *ctx, size_t tensor, uint64_t offset, const void *bytes,
			uint64_t len)
{
	struct landed *l = ctx;
	fst_tensor_info ti;
	CHECK(fst_checkpoint_tensor(l->c, tensor, &ti, NULL) == 0);
	CHECK(len && offset + len <= ti.nbytes);
	CHECK(offset / 4096 == (offset + len - 1) / 4096); /* inside one block */
	CHECK(!memcmp(bytes, l->data + ti.file_offset + offset, (size_t)len));
	l->bytes += len;
	return 0;
}

/* Load the checkpoint onto the CPU, as a memory image: every tensor equals
 * its bytes in the input, and on_landed sees each byte once. */
static void load_checkpoint(const fst_checkpoint *c, const uint8_t *data)
{
	struct landed l = {c, data, 0};
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.threads = 1;
	o.chunk_bytes = 4096;
	o.landed_block = 4096;
	o.on_landed = check_landed;
	o.on_landed_ctx = &l;
	fst_buffer *b = (fst_buffer *)(uintptr_t)1;
	fst_error err;
	int rc = fst_load(c, &o, &b, &err);
	if (rc) {
		CHECK(rc == FST_ENOMEM && b == NULL);
		return;
	}
	CHECK(fst_buffer_tensor_count(b) == fst_checkpoint_tensor_count(c));
	for (size_t i = 0; i < fst_buffer_tensor_count(b); i++) {
		fst_tensor_view v;
		fst_tensor_info ti;
		CHECK(fst_buffer_tensor(b, i, &v) == 0);
		CHECK(fst_checkpoint_tensor(c, i, &ti, NULL) == 0);
		CHECK(v.nbytes == ti.nbytes && !strcmp(v.name, ti.name));
		CHECK(!v.nbytes || !memcmp(v.data, data + ti.file_offset, (size_t)v.nbytes));
		fst_view_release(&v);
	}
	CHECK(l.bytes == fst_checkpoint_total_bytes(c));
	fst_buffer_release(b);
}

/* The same table seen through a checkpoint of one file, then loaded. */
static void walk_checkpoint(fst_file *f, const uint8_t *data)
{
	size_t n = fst_file_tensor_count(f);
	fst_checkpoint *c;
	fst_error err;
	fst_file *files[1] = {f};
	int rc = fst_checkpoint_from_files(files, 1, &c, &err);
	if (rc) {
		CHECK(rc == FST_ENOMEM);
		return;
	}
	CHECK(fst_checkpoint_file_count(c) == 1);
	CHECK(fst_checkpoint_tensor_count(c) == n);
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info ti;
		size_t fi = 7;
		CHECK(fst_checkpoint_tensor(c, i, &ti, &fi) == 0);
		CHECK(fi == 0);
		CHECK(fst_checkpoint_find(c, ti.name) == (long)i);
		total += ti.nbytes;
	}
	CHECK(fst_checkpoint_total_bytes(c) == total);
	load_checkpoint(c, data);
	fst_checkpoint_close(c);
}

/* Where round_trip writes; per process, so parallel fuzzers do not clash. */
static const char *scratch_path(void)
{
	static char path[300];
	if (!path[0]) {
		const char *tmp = getenv("TMPDIR");
		if (tmp && *tmp)
			mkdir(tmp, 0755); /* best effort: the writer reports a failure */
		snprintf(path, sizeof path, "%s/fst-fuzz-header-%ld.safetensors",
			 tmp && *tmp ? tmp : "/tmp", (long)getpid());
	}
	return path;
}

/* Write what was read with fst_writer, in the same order, and read it back:
 * the table must come back identical (names of any UTF-8, escapes and
 * all), offsets included, and so must the bytes and the metadata. */
static void round_trip(const fst_file *f, const uint8_t *data)
{
	fst_writer *w;
	fst_error err;
	CHECK(fst_writer_new(NULL, &w, &err) == 0);
	size_t n = fst_file_tensor_count(f), nm = fst_file_metadata_count(f);
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info ti;
		CHECK(fst_file_tensor(f, i, &ti) == 0);
		int rc = fst_writer_add(w, ti.name, ti.dtype, ti.ndim, ti.shape,
					data + ti.file_offset, ti.nbytes, &err);
		if (rc) {
			fprintf(stderr, "fuzz_header: writer refused \"%s\": %s\n", ti.name,
				err.message);
			abort();
		}
	}
	for (size_t i = 0; i < nm; i++) {
		const char *k, *v;
		CHECK(fst_file_metadata(f, i, &k, &v) == 0);
		CHECK(fst_writer_metadata(w, k, v, &err) == 0);
	}
	const char *path = scratch_path();
	if (fst_writer_finish(w, path, &err)) {
		fprintf(stderr, "fuzz_header: %s\n", err.message);
		abort();
	}
	fst_writer_free(w);

	fst_file *g;
	if (fst_file_open(path, &g, &err)) {
		fprintf(stderr, "fuzz_header: the writer's file does not open: %s\n", err.message);
		abort();
	}
	unlink(path);
	CHECK(fst_file_tensor_count(g) == n);
	CHECK(fst_file_metadata_count(g) == nm);
	int fd = fst_file_fd(g);
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info a, b;
		CHECK(fst_file_tensor(f, i, &a) == 0);
		CHECK(fst_file_tensor(g, i, &b) == 0);
		CHECK(!strcmp(a.name, b.name));
		CHECK(a.dtype == b.dtype && a.ndim == b.ndim);
		CHECK(a.ndim == 0 || !memcmp(a.shape, b.shape, a.ndim * sizeof *a.shape));
		CHECK(a.begin == b.begin && a.end == b.end);
		uint8_t buf[256];
		for (uint64_t off = 0; off < b.nbytes; off += sizeof buf) {
			size_t len = (size_t)(b.nbytes - off < sizeof buf ? b.nbytes - off
									     : sizeof buf);
			CHECK(pread(fd, buf, len, (off_t)(b.file_offset + off)) == (ssize_t)len);
			CHECK(!memcmp(buf, data + a.file_offset + off, len));
		}
	}
	for (size_t i = 0; i < nm; i++) {
		const char *k, *v;
		CHECK(fst_file_metadata(f, i, &k, &v) == 0);
		const char *got = fst_file_metadata_get(g, k);
		CHECK(got && !strcmp(got, v));
	}
	fst_file_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fst_file *f = (fst_file *)(uintptr_t)1; /* must become NULL on failure */
	fst_error err;
	int rc = fst_file_open_memory(data, size, "fuzz", &f, &err);
	if (rc) {
		check_error(rc, &err);
		CHECK(f == NULL);
		return 0;
	}
	CHECK(f != NULL);
	CHECK(err.code == 0);
	volatile unsigned sink = walk(f, data, size);
	(void)sink;
	round_trip(f, data);
	walk_checkpoint(f, data); /* takes ownership of f */
	return 0;
}
