/* Description: fst_writer round trip as a property test (seeded random
 * tensor sets: every dtype incl. F4/F6, scalars, empty tensors, UTF-8 and
 * escaped names, metadata, both orders, many data_align/header_extra), read
 * back with fst_file_open; writer argument errors; FST_ORDER_ALIGNMENT
 * order; add_fill; that a failed finish leaves no file behind (nor a
 * temporary); that names added before a finish are still duplicates after
 * it; that tensors totalling past 2^63 - 1 bytes are refused when added
 * (their sum once wrapped); that 8 writers finishing one path at once all
 * succeed, the file one writer's whole; and that fst_writer_finish_memory
 * gives the file's bytes. Set
 * FST_TEST_SEED to replay another seed. */
#include "helpers.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

/* Files beside path whose names begin with path's and ".tmp": a writer's
 * temporaries left behind. */
static int leftovers(const char *path)
{
	char dir[800];
	snprintf(dir, sizeof dir, "%s", path);
	char *slash = strrchr(dir, '/');
	assert_non_null(slash);
	*slash = '\0';
	char prefix[300];
	snprintf(prefix, sizeof prefix, "%s.tmp", slash + 1);
	DIR *d = opendir(dir);
	assert_non_null(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += !strncmp(e->d_name, prefix, strlen(prefix));
	closedir(d);
	return n;
}

/* Whole file into a malloc'd buffer. */
static unsigned char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

/* ------------------------------------------------------------ PRNG */

static uint64_t rng_state;

/* xorshift64*: tiny, and the same sequence on every platform. */
static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

static size_t below(size_t n)
{
	return (size_t)(rnd() % n);
}

/* ------------------------------------------------------------ model */

#define MAX_TENSORS 10
#define MAX_META 4

struct tensor {
	char name[64];
	fst_dtype dtype;
	uint32_t ndim;
	uint64_t shape[4];
	uint64_t nbytes;
	unsigned char *data;
	bool use_fill;
};

struct case_ {
	fst_writer_opts opts;
	size_t n;
	struct tensor t[MAX_TENSORS];
	size_t nmeta;
	char meta_key[MAX_META][32], meta_value[MAX_META][64];
};

/* Pieces of names: plain ASCII, characters JSON must escape, and 2-, 3- and
 * 4-byte UTF-8. */
static const char *const name_pieces[] = {
	"a", "b", "z", "0", "9", ".", "_", "-", "layers", "weight", "\"", "\\", "/", " ",
	"\n", "\t", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80", "\x7f",
};

static void random_text(char *buf, size_t size, size_t max_pieces)
{
	size_t k = below(max_pieces + 1);
	buf[0] = '\0';
	for (size_t i = 0; i < k; i++) {
		const char *p = name_pieces[below(sizeof name_pieces / sizeof name_pieces[0])];
		if (strlen(buf) + strlen(p) + 1 > size)
			break;
		strcat(buf, p);
	}
}

static uint64_t numel_of(const struct tensor *t)
{
	uint64_t n = 1;
	for (uint32_t d = 0; d < t->ndim; d++)
		n *= t->shape[d];
	return n;
}

static void random_shape(struct tensor *t)
{
	for (;;) {
		t->ndim = (uint32_t)below(5);
		for (uint32_t d = 0; d < t->ndim; d++) {
			size_t r = below(20);
			/* Mostly small; sometimes empty; sometimes one long axis. */
			t->shape[d] = r == 0 ? 0 : r == 1 ? 100 + below(900) : 1 + below(5);
		}
		uint64_t bits = numel_of(t) * fst_dtype_bits(t->dtype);
		if (bits % 8 == 0 && bits / 8 <= (1u << 16)) {
			t->nbytes = bits / 8;
			return;
		}
	}
}

static void random_case(struct case_ *c)
{
	memset(c, 0, sizeof *c);
	fst_writer_opts_init(&c->opts);
	static const uint32_t aligns[] = {8, 8, 8, 16, 32, 64, 128, 512, 4096, 65536, 1u << 20};
	c->opts.data_align = aligns[below(sizeof aligns / sizeof aligns[0])];
	c->opts.header_extra = below(4) ? (uint32_t)(8 * below(4)) : 4096;
	c->opts.order = below(2) ? FST_ORDER_ALIGNMENT : FST_ORDER_GIVEN;
	c->n = below(MAX_TENSORS + 1);
	for (size_t i = 0; i < c->n; i++) {
		struct tensor *t = &c->t[i];
		for (;;) {
			random_text(t->name, sizeof t->name, 6);
			bool clash = !strcmp(t->name, "__metadata__");
			for (size_t j = 0; j < i && !clash; j++)
				clash = !strcmp(c->t[j].name, t->name);
			if (!clash)
				break;
		}
		t->dtype = (fst_dtype)(1 + below(FST_DTYPE_COUNT - 1));
		random_shape(t);
		t->data = malloc(t->nbytes + 1);
		assert_non_null(t->data);
		for (uint64_t b = 0; b < t->nbytes; b++)
			t->data[b] = (unsigned char)rnd();
		t->use_fill = below(4) == 0;
	}
	c->nmeta = below(MAX_META + 1);
	for (size_t i = 0; i < c->nmeta; i++) {
		for (;;) {
			random_text(c->meta_key[i], sizeof c->meta_key[i], 4);
			bool clash = false;
			for (size_t j = 0; j < i && !clash; j++)
				clash = !strcmp(c->meta_key[j], c->meta_key[i]);
			if (!clash)
				break;
		}
		random_text(c->meta_value[i], sizeof c->meta_value[i], 8);
	}
}

static void free_case(struct case_ *c)
{
	for (size_t i = 0; i < c->n; i++)
		free(c->t[i].data);
}

static int fill_from(void *ctx, void *buf, uint64_t off, size_t len)
{
	const struct tensor *t = ctx;
	if (off + len > t->nbytes)
		return FST_EUSAGE;
	memcpy(buf, t->data + off, len);
	return 0;
}

/* The writer's alignment key: the largest power of two dividing the size
 * (64 for empty tensors, which never misalign anything). */
static unsigned size_alignment(uint64_t nbytes)
{
	if (!nbytes)
		return 64;
	unsigned a = 0;
	while (!(nbytes & (1ull << a)))
		a++;
	return a;
}

static const struct case_ *sort_case;

static int cmp_alignment(const void *pa, const void *pb)
{
	const struct tensor *a = &sort_case->t[*(const size_t *)pa];
	const struct tensor *b = &sort_case->t[*(const size_t *)pb];
	unsigned x = size_alignment(a->nbytes), y = size_alignment(b->nbytes);
	if (x != y)
		return x > y ? -1 : 1;
	return strcmp(a->name, b->name);
}

/* The order tensors must be laid out in, as indices into c->t. */
static void expected_order(const struct case_ *c, size_t *order)
{
	for (size_t i = 0; i < c->n; i++)
		order[i] = i;
	if (c->opts.order == FST_ORDER_ALIGNMENT) {
		sort_case = c;
		qsort(order, c->n, sizeof *order, cmp_alignment);
	}
}

/* Writes the case to path; with mem, also into memory from the same writer,
 * *mem then holding the *mem_len bytes (malloc'd). */
static void write_case_both(const struct case_ *c, const char *path, unsigned char **mem,
			    size_t *mem_len)
{
	fst_writer *w;
	fst_error err;
	if (fst_writer_new(&c->opts, &w, &err))
		fail_msg("new: %s", err.message);
	for (size_t i = 0; i < c->n; i++) {
		const struct tensor *t = &c->t[i];
		int rc = t->use_fill
				 ? fst_writer_add_fill(w, t->name, t->dtype, t->ndim, t->shape,
						       fill_from, (void *)t, &err)
				 : fst_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data,
						  t->nbytes, &err);
		if (rc)
			fail_msg("add: %s", err.message);
	}
	for (size_t i = 0; i < c->nmeta; i++)
		if (fst_writer_metadata(w, c->meta_key[i], c->meta_value[i], &err))
			fail_msg("metadata: %s", err.message);
	if (fst_writer_finish(w, path, &err))
		fail_msg("finish: %s", err.message);
	if (mem) {
		uint64_t size = 0;
		if (fst_writer_size(w, &size, &err))
			fail_msg("size: %s", err.message);
		*mem = malloc(size ? size : 1);
		assert_non_null(*mem);
		/* one byte short and one too many are refused, nothing written */
		if (size)
			assert_int_equal(fst_writer_finish_memory(w, *mem, size - 1, &err), FST_EUSAGE);
		assert_int_equal(fst_writer_finish_memory(w, *mem, size + 1, &err), FST_EUSAGE);
		if (fst_writer_finish_memory(w, *mem, size, &err))
			fail_msg("finish_memory: %s", err.message);
		*mem_len = (size_t)size;
	}
	fst_writer_free(w);
}

static void write_case(const struct case_ *c, const char *path)
{
	write_case_both(c, path, NULL, NULL);
}

static void check_case(const struct case_ *c, const char *path, size_t iter)
{
	fst_file *f;
	fst_error err;
	if (fst_file_open(path, &f, &err))
		fail_msg("iteration %zu: reopen: %s", iter, err.message);
	size_t len;
	unsigned char *bytes = slurp(path, &len);
	assert_int_equal(fst_file_size(f), len);

	/* The data section starts at a multiple of data_align, plus
	 * header_extra, and the header is padded with spaces. */
	uint64_t doff = fst_file_data_offset(f);
	assert_true(doff >= 8 + c->opts.header_extra);
	assert_int_equal((doff - c->opts.header_extra) % c->opts.data_align, 0);
	size_t end = (size_t)doff;
	while (end > 8 && bytes[end - 1] == ' ')
		end--;
	assert_int_equal(bytes[end - 1], '}');

	assert_int_equal(fst_file_tensor_count(f), c->n);
	size_t order[MAX_TENSORS];
	expected_order(c, order);
	uint64_t off = 0;
	for (size_t k = 0; k < c->n; k++) {
		const struct tensor *t = &c->t[order[k]];
		long i = fst_file_find(f, t->name);
		if (i < 0)
			fail_msg("iteration %zu: tensor \"%s\" not found", iter, t->name);
		fst_tensor_info ti;
		assert_int_equal(fst_file_tensor(f, (size_t)i, &ti), 0);
		assert_string_equal(ti.name, t->name);
		assert_int_equal(ti.dtype, t->dtype);
		assert_int_equal(ti.ndim, t->ndim);
		for (uint32_t d = 0; d < t->ndim; d++)
			assert_int_equal(ti.shape[d], t->shape[d]);
		assert_int_equal(ti.numel, numel_of(t));
		assert_int_equal(ti.nbytes, t->nbytes);
		/* Back to back, in the expected order. */
		assert_int_equal(ti.begin, off);
		off += t->nbytes;
		assert_int_equal(ti.file_offset, doff + ti.begin);
		assert_memory_equal(bytes + ti.file_offset, t->data, t->nbytes);
	}
	assert_int_equal(doff + off, len);

	assert_int_equal(fst_file_metadata_count(f), c->nmeta);
	for (size_t i = 0; i < c->nmeta; i++) {
		const char *v = fst_file_metadata_get(f, c->meta_key[i]);
		if (!v)
			fail_msg("iteration %zu: metadata \"%s\" missing", iter, c->meta_key[i]);
		assert_string_equal(v, c->meta_value[i]);
	}
	free(bytes);
	fst_file_close(f);
}

static void test_round_trip(void **state)
{
	(void)state;
	uint64_t seed = 0x5afe7e45042024ull;
	const char *env = getenv("FST_TEST_SEED");
	if (env)
		seed = strtoull(env, NULL, 0);
	rng_state = seed ? seed : 1;
	printf("# seed 0x%llx\n", (unsigned long long)seed);
	char *path = test_path("round-trip.safetensors");
	size_t dtypes_seen[FST_DTYPE_COUNT] = {0}, scalars = 0, empties = 0;
	for (size_t iter = 0; iter < 200; iter++) {
		struct case_ c;
		random_case(&c);
		write_case(&c, path);
		check_case(&c, path, iter);
		for (size_t i = 0; i < c.n; i++) {
			dtypes_seen[c.t[i].dtype]++;
			scalars += c.t[i].ndim == 0;
			empties += c.t[i].nbytes == 0;
		}
		free_case(&c);
	}
	/* The generator must actually reach the interesting cases. */
	for (int d = 1; d < FST_DTYPE_COUNT; d++)
		if (!dtypes_seen[d])
			fail_msg("dtype %s never generated", fst_dtype_name((fst_dtype)d));
	assert_true(scalars > 0);
	assert_true(empties > 0);
}

/* Memory and file outputs of one writer are the same bytes, for the same
 * random cases as the round trip (fills included). */
static void test_memory_matches_file(void **state)
{
	(void)state;
	rng_state = 0x3e3041ull;
	char *path = test_path("memory.safetensors");
	for (size_t iter = 0; iter < 60; iter++) {
		struct case_ c;
		random_case(&c);
		unsigned char *mem = NULL;
		size_t mem_len = 0;
		write_case_both(&c, path, &mem, &mem_len);
		size_t len;
		unsigned char *bytes = slurp(path, &len);
		assert_int_equal(mem_len, len);
		assert_memory_equal(mem, bytes, len);
		free(bytes);
		free(mem);
		free_case(&c);
	}
}

/* ------------------------------------------------------------ errors */

static void test_wrong_nbytes(void **state)
{
	(void)state;
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	uint64_t shape[2] = {3, 4};
	float data[12] = {0};
	assert_int_equal(fst_writer_add(w, "w", FST_DTYPE_F32, 2, shape, data, 40, &err),
			 FST_EUSAGE);
	assert_has(err.message, "tensor \"w\"");
	assert_has(err.message, "40 bytes given");
	assert_has(err.message, "[3, 4] of F32 needs 48");
	assert_int_equal(fst_writer_add(w, "w", FST_DTYPE_F32, 2, shape, NULL, 48, &err),
			 FST_EUSAGE);
	assert_has(err.message, "NULL");
	/* Sub-byte dtypes must fill whole bytes. */
	uint64_t odd[1] = {3};
	assert_int_equal(fst_writer_add(w, "q", FST_DTYPE_F4, 1, odd, data, 2, &err), FST_EUSAGE);
	assert_has(err.message, "not a whole number of bytes");
	assert_int_equal(fst_writer_add(w, "q", (fst_dtype)999, 1, odd, data, 3, &err),
			 FST_EUSAGE);
	assert_has(err.message, "unknown dtype");
	assert_int_equal(fst_writer_add(w, "q", FST_DTYPE_INVALID, 1, odd, data, 3, &err),
			 FST_EUSAGE);
	uint64_t huge[2] = {1ull << 40, 1ull << 40};
	assert_int_equal(fst_writer_add(w, "h", FST_DTYPE_U8, 2, huge, data, 1, &err),
			 FST_EUSAGE);
	assert_has(err.message, "too large");
	assert_int_equal(fst_writer_add(w, "s", FST_DTYPE_U8, 1, NULL, data, 1, &err),
			 FST_EUSAGE);
	assert_int_equal(fst_writer_add(w, NULL, FST_DTYPE_U8, 0, NULL, data, 1, &err),
			 FST_EUSAGE);
	/* Nothing failed was added: the file is empty. */
	char *path = test_path("after-errors.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	fst_file *f;
	assert_int_equal(fst_file_open(path, &f, &err), 0);
	assert_int_equal(fst_file_tensor_count(f), 0);
	fst_file_close(f);
}

static void test_duplicate_name(void **state)
{
	(void)state;
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	uint8_t b = 1;
	assert_int_equal(fst_writer_add(w, "x", FST_DTYPE_U8, 0, NULL, &b, 1, &err), 0);
	assert_int_equal(fst_writer_add(w, "x", FST_DTYPE_U8, 0, NULL, &b, 1, &err), FST_EUSAGE);
	assert_has(err.message, "tensor \"x\" added twice");
	assert_int_equal(fst_writer_add_fill(w, "x", FST_DTYPE_U8, 0, NULL, fill_from, NULL, &err),
			 FST_EUSAGE);
	fst_writer_free(w);
}

static void test_metadata_name(void **state)
{
	(void)state;
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	uint8_t b = 1;
	assert_int_equal(fst_writer_add(w, "__metadata__", FST_DTYPE_U8, 0, NULL, &b, 1, &err),
			 FST_EUSAGE);
	assert_has(err.message, "\"__metadata__\"");
	/* Invalid UTF-8 metadata is refused when given. */
	assert_int_equal(fst_writer_metadata(w, "k", "\xff", &err), FST_EUSAGE);
	assert_has(err.message, "UTF-8");
	assert_int_equal(fst_writer_metadata(w, "\xc0", "v", &err), FST_EUSAGE);
	assert_int_equal(fst_writer_metadata(w, NULL, "v", &err), FST_EUSAGE);
	fst_writer_free(w);
}

/* __metadata__ of no entries: left out unless asked for (key and value
 * NULL), then written as {}, as the reference writes metadata={}; a reader
 * tells {} apart from none (fst_file_has_metadata). */
static void test_empty_metadata(void **state)
{
	(void)state;
	for (int asked = 0; asked < 2; asked++) {
		fst_writer *w;
		fst_error err;
		assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
		uint8_t b = 7;
		assert_int_equal(fst_writer_add(w, "t", FST_DTYPE_U8, 0, NULL, &b, 1, &err), 0);
		if (asked)
			assert_int_equal(fst_writer_metadata(w, NULL, NULL, &err), 0);
		const char *path = test_path(asked ? "meta_empty.safetensors" : "meta_none.safetensors");
		assert_int_equal(fst_writer_finish(w, path, &err), 0);
		fst_writer_free(w);
		FILE *f = fopen(path, "rb");
		assert_non_null(f);
		char buf[256] = {0};
		size_t n = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		assert_true(n > 8);
		assert_true((strstr(buf + 8, "\"__metadata__\":{}") != NULL) == asked);
		fst_file *ff;
		assert_int_equal(fst_file_open(path, &ff, &err), 0);
		assert_int_equal(fst_file_has_metadata(ff), asked);
		assert_int_equal(fst_file_metadata_count(ff), 0);
		fst_file_close(ff);
	}
}

static void test_bad_name_utf8(void **state)
{
	(void)state;
	/* Names are checked when added, the tensor and the byte named; the
	 * status must be right with and without an fst_error, and the writer
	 * goes on without it. */
	for (int with_err = 0; with_err < 2; with_err++) {
		fst_writer *w;
		fst_error err;
		assert_int_equal(fst_writer_new(NULL, &w, NULL), 0);
		uint8_t b = 1;
		assert_int_equal(fst_writer_add(w, "bad\xff", FST_DTYPE_U8, 0, NULL, &b, 1,
						with_err ? &err : NULL),
				 FST_EUSAGE);
		if (with_err)
			assert_has(err.message, "tensor \"bad\xff\": name is not valid UTF-8 (byte 3");
		char *path = test_path("bad-utf8.safetensors");
		assert_int_equal(fst_writer_finish(w, path, NULL), 0);
		fst_file *f;
		assert_int_equal(fst_file_open(path, &f, NULL), 0);
		assert_int_equal(fst_file_tensor_count(f), 0);
		fst_file_close(f);
		fst_writer_free(w);
	}
}

static void test_bad_opts(void **state)
{
	(void)state;
	static const uint32_t bad_align[] = {0, 1, 4, 12, 24, 3, 1u << 21, 0x80000000u};
	for (size_t i = 0; i < sizeof bad_align / sizeof bad_align[0]; i++) {
		fst_writer_opts o;
		fst_writer_opts_init(&o);
		o.data_align = bad_align[i];
		fst_writer *w = (fst_writer *)1;
		fst_error err;
		assert_int_equal(fst_writer_new(&o, &w, &err), FST_EUSAGE);
		assert_has(err.message, "data_align");
	}
	fst_writer_opts o;
	fst_writer_opts_init(&o);
	o.header_extra = 12;
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(&o, &w, &err), FST_EUSAGE);
	assert_has(err.message, "header_extra");
	fst_writer_opts_init(&o);
	o.order = 7;
	assert_int_equal(fst_writer_new(&o, &w, &err), FST_EUSAGE);
	assert_has(err.message, "order");
	/* Options not set up by fst_writer_opts_init. */
	memset(&o, 0, sizeof o);
	assert_int_equal(fst_writer_new(&o, &w, &err), FST_EUSAGE);
	/* a size no release gave the struct, ending inside a field */
	fst_writer_opts_init(&o);
	o.struct_size = sizeof o - 1;
	assert_int_equal(fst_writer_new(&o, &w, &err), FST_EUSAGE);
	assert_has(err.message, "fst_writer_opts_init");
	assert_int_equal(fst_writer_new(NULL, NULL, &err), FST_EUSAGE);
	/* The extremes are allowed. */
	fst_writer_opts_init(&o);
	o.data_align = 1u << 20;
	assert_int_equal(fst_writer_new(&o, &w, &err), 0);
	fst_writer_free(w);
	fst_writer_free(NULL);
}

/* A writer that orders by alignment, largest first. */
static fst_writer *alignment_writer(void)
{
	fst_writer_opts o;
	fst_writer_opts_init(&o);
	o.order = FST_ORDER_ALIGNMENT;
	fst_writer *w;
	fst_error err;
	if (fst_writer_new(&o, &w, &err))
		fail_msg("fst_writer_new: %s", err.message);
	return w;
}

static void test_order_alignment(void **state)
{
	(void)state;
	fst_writer *w = alignment_writer();
	fst_error err;
	static uint8_t buf[64];
	/* name, bytes: added smallest divisor first. */
	static const struct {
		const char *name;
		uint64_t n;
	} add[] = {{"odd", 3}, {"four", 4}, {"b16", 16}, {"eight", 8}, {"a16", 48},
		   {"empty", 0}, {"two", 6}, {"one", 1}};
	for (size_t i = 0; i < sizeof add / sizeof add[0]; i++) {
		uint64_t shape[1] = {add[i].n};
		assert_int_equal(fst_writer_add(w, add[i].name, FST_DTYPE_U8, 1, shape, buf,
						add[i].n, &err),
				 0);
	}
	char *path = test_path("order.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	/* Empty first (never misaligns), then 16 | size (ties by name), 8, 4, 2,
	 * then the odd ones by name. */
	static const char *const want[] = {"empty", "a16", "b16", "eight", "four", "two",
					   "odd", "one"};
	fst_file *f;
	assert_int_equal(fst_file_open(path, &f, &err), 0);
	assert_int_equal(fst_file_tensor_count(f), 8);
	for (size_t i = 0; i < 8; i++) {
		fst_tensor_info ti;
		assert_int_equal(fst_file_tensor(f, i, &ti), 0);
		assert_string_equal(ti.name, want[i]);
		/* Each tensor starts aligned to its own size's power-of-two
		 * divisor (capped at 16, the largest here): what the order is for. */
		unsigned a = size_alignment(ti.nbytes);
		assert_int_equal(ti.begin % (1u << (a > 4 ? 4 : a)), 0);
	}
	fst_file_close(f);
}

struct fill_log {
	uint64_t calls, next_off, max_len;
	int fail_at; /* fail on this call number (1-based), 0 never */
	int fail_code;
};

static int fill_pattern(void *ctx, void *buf, uint64_t off, size_t len)
{
	struct fill_log *l = ctx;
	l->calls++;
	if (l->fail_at && l->calls == (uint64_t)l->fail_at)
		return l->fail_code;
	/* Called in order, each chunk where the last one ended. */
	if (off != l->next_off)
		return FST_EUSAGE;
	l->next_off = off + len;
	if (len > l->max_len)
		l->max_len = len;
	unsigned char *p = buf;
	for (size_t i = 0; i < len; i++)
		p[i] = (unsigned char)((off + i) * 7 % 251);
	return 0;
}

static void test_add_fill(void **state)
{
	(void)state;
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	/* More than one 4 MiB chunk, and not a multiple of it. */
	const uint64_t big = (9u << 20) + 3;
	uint64_t shape[1] = {big};
	struct fill_log l1 = {0}, l2 = {0};
	assert_int_equal(fst_writer_add_fill(w, "big", FST_DTYPE_U8, 1, shape, fill_pattern, &l1,
					     &err),
			 0);
	uint64_t shape2[2] = {3, 5};
	assert_int_equal(fst_writer_add_fill(w, "small", FST_DTYPE_I16, 2, shape2, fill_pattern,
					     &l2, &err),
			 0);
	assert_int_equal(fst_writer_add_fill(w, "nofill", FST_DTYPE_U8, 0, NULL, NULL, NULL, &err),
			 FST_EUSAGE);
	char *path = test_path("fill.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	assert_int_equal(l1.next_off, big);
	assert_true(l1.calls >= 3);
	assert_true(l1.max_len <= (4u << 20));
	assert_int_equal(l2.next_off, 30);

	fst_file *f;
	assert_int_equal(fst_file_open(path, &f, &err), 0);
	size_t len;
	unsigned char *bytes = slurp(path, &len);
	static const char *const names[] = {"big", "small"};
	for (size_t k = 0; k < 2; k++) {
		fst_tensor_info ti;
		assert_int_equal(fst_file_tensor(f, (size_t)fst_file_find(f, names[k]), &ti), 0);
		for (uint64_t i = 0; i < ti.nbytes; i++)
			if (bytes[ti.file_offset + i] != (unsigned char)(i * 7 % 251))
				fail_msg("%s byte %llu wrong", names[k], (unsigned long long)i);
	}
	free(bytes);
	fst_file_close(f);
}

static void test_failed_finish_leaves_nothing(void **state)
{
	(void)state;
	fst_error err;
	uint8_t b[4] = {1, 2, 3, 4};
	uint64_t shape[1] = {4};

	/* A directory that does not exist: the temporary cannot be created. */
	fst_writer *w;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	assert_int_equal(fst_writer_add(w, "x", FST_DTYPE_U8, 1, shape, b, 4, &err), 0);
	char *path = test_path("no-such-dir/out.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), FST_EIO);
	assert_int_equal(err.sys_errno, ENOENT);
	assert_has(err.message, "no-such-dir/out.safetensors");
	assert_false(exists(path));

	/* A fill that fails halfway through the data: its code comes back, and
	 * neither the file nor the temporary is left. */
	struct fill_log l = {.fail_at = 2, .fail_code = FST_ECANCELED};
	uint64_t big[1] = {(8u << 20) + 1};
	assert_int_equal(fst_writer_add_fill(w, "y", FST_DTYPE_U8, 1, big, fill_pattern, &l, &err),
			 0);
	path = test_path("failed.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), FST_ECANCELED);
	assert_has(err.message, "tensor \"y\"");
	assert_has(err.message, "fill failed");
	assert_false(exists(path));
	assert_int_equal(leftovers(path), 0);

	/* An existing file is left as it was. */
	write_raw(path, "{}", 2, NULL, 0);
	l = (struct fill_log){.fail_at = 1, .fail_code = FST_EIO};
	assert_int_equal(fst_writer_finish(w, path, &err), FST_EIO);
	size_t len;
	unsigned char *bytes = slurp(path, &len);
	assert_int_equal(len, 10);
	assert_memory_equal(bytes + 8, "{}", 2);
	free(bytes);
	assert_int_equal(leftovers(path), 0);

	/* The same writer can still finish once the fill works. */
	l = (struct fill_log){0};
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_file *f;
	assert_int_equal(fst_file_open(path, &f, &err), 0);
	assert_int_equal(fst_file_tensor_count(f), 2);
	fst_file_close(f);
	fst_writer_free(w);
}

static void test_duplicate_after_finish(void **state)
{
	(void)state;
	/* finishing sorts the tensors (largest alignment first): names added
	 * before it are still known after it */
	fst_writer *w = alignment_writer();
	fst_error err;
	uint8_t b[8] = {0};
	uint64_t one = 1, eight = 8;
	assert_int_equal(fst_writer_add(w, "a", FST_DTYPE_U8, 1, &one, b, 1, &err), 0);
	assert_int_equal(fst_writer_add(w, "b", FST_DTYPE_U8, 1, &eight, b, 8, &err), 0);
	uint64_t size;
	assert_int_equal(fst_writer_size(w, &size, &err), 0);
	assert_int_equal(fst_writer_add(w, "a", FST_DTYPE_U8, 1, &one, b, 1, &err), FST_EUSAGE);
	assert_has(err.message, "tensor \"a\" added twice");
	assert_int_equal(fst_writer_add(w, "b", FST_DTYPE_U8, 1, &one, b, 1, &err), FST_EUSAGE);
	assert_int_equal(fst_writer_add(w, "c", FST_DTYPE_U8, 1, &one, b, 1, &err), 0);
	char *path = test_path("after-finish.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	assert_int_equal(fst_writer_add(w, "c", FST_DTYPE_U8, 1, &one, b, 1, &err), FST_EUSAGE);
	fst_writer_free(w);
	fst_file *f;
	assert_int_equal(fst_file_open(path, &f, &err), 0);
	assert_int_equal(fst_file_tensor_count(f), 3);
	fst_file_close(f);
}

static int fill_nothing(void *ctx, void *buf, uint64_t off, size_t len)
{
	(void)ctx, (void)buf, (void)off, (void)len;
	return FST_EIO; /* never asked: no file of this size is written */
}

static void test_total_past_int64(void **state)
{
	(void)state;
	/* eight tensors of 2^61 - 8 bytes and one of 64 add up to 2^64, which
	 * wrapped to 0: a file "of the header's size" and a heap overflow in
	 * finish_memory */
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	uint64_t huge = (1ull << 58) - 1, small = 16;
	int k = 0;
	for (; k < 8; k++) {
		char name[16];
		snprintf(name, sizeof name, "t%d", k);
		int rc = fst_writer_add_fill(w, name, FST_DTYPE_F64, 1, &huge, fill_nothing, NULL,
					     &err);
		if (rc) {
			assert_int_equal(rc, FST_EUSAGE);
			assert_has(err.message, "would total more than 2^63 - 1 bytes");
			assert_has(err.message, name);
			break;
		}
	}
	assert_int_equal(k, 4); /* four fit in 2^63 - 1 bytes (2^63 - 32), a fifth does not */
	assert_int_equal(fst_writer_add_fill(w, "u", FST_DTYPE_U8, 1, &small, fill_nothing, NULL,
					     &err),
			 0);
	uint64_t size = 0;
	assert_int_equal(fst_writer_size(w, &size, &err), 0);
	assert_true(size > 4 * (huge * 8) + 16);
	fst_writer_free(w);
}

/* A file name the file system takes (up to NAME_MAX bytes) is saved, though
 * NAME.tmp.XXXXXXXX would be longer: the temporary's name is cut to fit, and
 * none is left. One over NAME_MAX is the file system's refusal. */
static void test_longest_file_name(void **state)
{
	(void)state;
	uint8_t b[3] = {7, 8, 9};
	uint64_t shape[1] = {3};
	for (size_t len = NAME_MAX - 14; len <= NAME_MAX + 1; len++) {
		char name[NAME_MAX + 2];
		memset(name, 'n', len);
		memcpy(name + len - 12, ".safetensors", 13);
		char *path = test_path(name);
		fst_writer *w;
		fst_error err;
		assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
		assert_int_equal(fst_writer_add(w, "x", FST_DTYPE_U8, 1, shape, b, 3, &err), 0);
		int rc = fst_writer_finish(w, path, &err);
		fst_writer_free(w);
		if (len > NAME_MAX) {
			assert_int_equal(rc, FST_EIO);
			assert_int_equal(err.sys_errno, ENAMETOOLONG);
			continue;
		}
		if (rc)
			fail_msg("a name of %zu bytes: %s", len, err.message);
		size_t got;
		unsigned char *bytes = slurp(path, &got);
		assert_memory_equal(bytes + got - 3, b, 3);
		free(bytes);
		char dir[800];
		snprintf(dir, sizeof dir, "%s", path);
		*strrchr(dir, '/') = '\0';
		DIR *d = opendir(dir);
		assert_non_null(d);
		for (struct dirent *e; (e = readdir(d));)
			if (strstr(e->d_name, ".tmp."))
				fail_msg("left behind: %s", e->d_name);
		closedir(d);
		unlink(path);
	}
}

/* An empty tensor whose other dimensions multiply past 2^64 / 64 is written,
 * as the reference writes it, and reads back; one whose count overflows
 * before its 0 is refused, as the reader refuses it. */
static void test_empty_tensor_of_huge_dimensions(void **state)
{
	(void)state;
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	uint64_t a[2] = {1ull << 59, 0}, c[3] = {1ull << 58, 1, 0};
	uint64_t over[3] = {1ull << 32, 1ull << 32, 0}, bits[1] = {1ull << 61};
	assert_int_equal(fst_writer_add(w, "a", FST_DTYPE_U8, 2, a, NULL, 0, &err), 0);
	assert_int_equal(fst_writer_add(w, "c", FST_DTYPE_F64, 3, c, NULL, 0, &err), 0);
	assert_int_equal(fst_writer_add(w, "o", FST_DTYPE_U8, 3, over, NULL, 0, &err),
			 FST_EUSAGE);
	assert_has(err.message, "tensor \"o\": shape too large");
	/* 2^61 elements of 64 bits: 2^67 bits */
	assert_int_equal(fst_writer_add_fill(w, "b", FST_DTYPE_F64, 1, bits, fill_nothing, NULL,
					     &err),
			 FST_EUSAGE);
	assert_has(err.message, "tensor \"b\": shape too large");
	char *path = test_path("empty-huge.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	fst_file *f;
	assert_int_equal(fst_file_open(path, &f, &err), 0);
	assert_int_equal(fst_file_tensor_count(f), 2);
	fst_tensor_info ti;
	long at = fst_file_find(f, "c");
	assert_true(at >= 0);
	assert_int_equal(fst_file_tensor(f, (size_t)at, &ti), 0);
	assert_int_equal(ti.ndim, 3);
	assert_true(ti.shape[0] == 1ull << 58 && ti.shape[2] == 0 && ti.nbytes == 0);
	fst_file_close(f);
}

/* ---- several writers finishing one path at once, as every rank of a job
 * saving the same file does */

#define SAVERS 8

struct saver {
	const char *path;
	int rc;
	fst_error err;
	uint8_t bytes[4096];
};

static void *save_one(void *arg)
{
	struct saver *s = arg;
	fst_writer *w;
	uint64_t shape = sizeof s->bytes;
	s->rc = fst_writer_new(NULL, &w, &s->err);
	if (!s->rc)
		s->rc = fst_writer_add(w, "x", FST_DTYPE_U8, 1, &shape, s->bytes, shape, &s->err);
	for (int k = 0; k < 20 && !s->rc; k++)
		s->rc = fst_writer_finish(w, s->path, &s->err);
	fst_writer_free(w);
	return NULL;
}

static void test_concurrent_finish(void **state)
{
	(void)state;
	char *path = test_path("shared.safetensors");
	struct saver s[SAVERS];
	pthread_t t[SAVERS];
	for (int i = 0; i < SAVERS; i++) {
		s[i].path = path;
		memset(s[i].bytes, 'a' + i, sizeof s[i].bytes);
		assert_int_equal(pthread_create(&t[i], NULL, save_one, &s[i]), 0);
	}
	for (int i = 0; i < SAVERS; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < SAVERS; i++)
		if (s[i].rc)
			fail_msg("writer %d: %s", i, s[i].err.message);
	/* the file is one writer's, whole */
	fst_file *f;
	fst_error err;
	assert_int_equal(fst_file_open(path, &f, &err), 0);
	fst_tensor_info ti;
	assert_int_equal(fst_file_tensor(f, 0, &ti), 0);
	size_t len;
	unsigned char *bytes = slurp(path, &len);
	int whose = bytes[ti.file_offset] - 'a';
	assert_true(whose >= 0 && whose < SAVERS);
	assert_memory_equal(bytes + ti.file_offset, s[whose].bytes, sizeof s[whose].bytes);
	free(bytes);
	fst_file_close(f);
	assert_int_equal(leftovers(path), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_memory_matches_file),
		cmocka_unit_test(test_wrong_nbytes),
		cmocka_unit_test(test_duplicate_name),
		cmocka_unit_test(test_metadata_name),
		cmocka_unit_test(test_empty_metadata),
		cmocka_unit_test(test_bad_name_utf8),
		cmocka_unit_test(test_bad_opts),
		cmocka_unit_test(test_order_alignment),
		cmocka_unit_test(test_add_fill),
		cmocka_unit_test(test_failed_finish_leaves_nothing),
		cmocka_unit_test(test_duplicate_after_finish),
		cmocka_unit_test(test_total_past_int64),
		cmocka_unit_test(test_longest_file_name),
		cmocka_unit_test(test_empty_tensor_of_huge_dimensions),
		cmocka_unit_test(test_concurrent_finish),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
