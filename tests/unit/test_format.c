/* Description: every validation rule of the safetensors format, one test
 * each: the returned code and that the message names the file, the tensor
 * at fault and the rule; what the reference reader accepts (scalars, empty
 * tensors, padding spaces, unknown fields); and the fst_file accessors over
 * paths, descriptors and memory. */
#include "format.h"
#include "helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Name open_bytes gives its memory files, so messages can be checked for it. */
#define MEMNAME "t.safetensors"

/* Open raw bytes (length prefix, header, data all given) from memory. */
static int open_bytes(const void *buf, size_t len, fst_file **out, fst_error *err)
{
	fst_file *f = NULL;
	int rc = fst_file_open_memory(buf, len, MEMNAME, &f, err);
	if (out)
		*out = f;
	else
		fst_file_close(f);
	return rc;
}

/* Build 8-byte length + header (hlen bytes, may hold NULs) + dlen data bytes
 * (a counting pattern) in a malloc'd buffer. */
static unsigned char *image(const char *header, size_t hlen, size_t dlen, size_t *len)
{
	unsigned char *buf = malloc(8 + hlen + dlen + 1);
	assert_non_null(buf);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
	memcpy(buf + 8, header, hlen);
	for (size_t i = 0; i < dlen; i++)
		buf[8 + hlen + i] = (unsigned char)i;
	*len = 8 + hlen + dlen;
	return buf;
}

/* Open header text with dlen data bytes; the handle is closed. */
static int open_hdr(const char *header, size_t dlen, fst_error *err)
{
	size_t len;
	unsigned char *buf = image(header, strlen(header), dlen, &len);
	int rc = open_bytes(buf, len, NULL, err);
	free(buf);
	return rc;
}

/* The header must be rejected with FST_EFORMAT; the message must start with
 * the file's name and hold every string of subs (NULL-terminated). */
static void expect_format_error(const char *header, size_t dlen, const char *const *subs)
{
	fst_error err;
	int rc = open_hdr(header, dlen, &err);
	if (rc != FST_EFORMAT)
		fail_msg("header %s: got %d (%s), want FST_EFORMAT", header, rc, err.message);
	assert_int_equal(err.code, FST_EFORMAT);
	assert_has(err.message, MEMNAME ": ");
	for (size_t i = 0; subs[i]; i++)
		assert_has(err.message, subs[i]);
}

static void expect_ok(const char *header, size_t dlen)
{
	fst_error err;
	int rc = open_hdr(header, dlen, &err);
	if (rc != FST_OK)
		fail_msg("header %s: got %d (%s), want success", header, rc, err.message);
	assert_int_equal(err.code, 0);
}

/* ------------------------------------------------------------ lengths */

static void test_header_too_small(void **state)
{
	(void)state;
	/* A file is the natural subject here: a 5-byte download. */
	char *path = test_path("small.safetensors");
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	fwrite("\x02\0\0\0\0", 1, 5, fp);
	fclose(fp);
	fst_file *f = (fst_file *)1;
	fst_error err;
	assert_int_equal(fst_file_open(path, &f, &err), FST_EFORMAT);
	assert_null(f);
	assert_has(err.message, path);
	assert_has(err.message, "header too small");
	assert_has(err.message, "5 bytes");

	/* Memory: also an empty buffer (data may be NULL when size is 0). */
	assert_int_equal(fst_file_open_memory(NULL, 0, MEMNAME, &f, &err), FST_EFORMAT);
	assert_has(err.message, MEMNAME);
	assert_has(err.message, "header too small");
}

static void test_header_too_large(void **state)
{
	(void)state;
	unsigned char buf[16] = {0};
	uint64_t n = (uint64_t)FST_HEADER_MAX + 1;
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)(n >> (8 * i));
	fst_error err;
	assert_int_equal(open_bytes(buf, sizeof buf, NULL, &err), FST_EFORMAT);
	assert_has(err.message, MEMNAME);
	assert_has(err.message, "header too large");
	assert_has(err.message, "100000001");

	/* The largest u64 must not wrap the 8 + N check. */
	memset(buf, 0xff, 8);
	assert_int_equal(open_bytes(buf, sizeof buf, NULL, &err), FST_EFORMAT);
	assert_has(err.message, "header too large");
}

static void test_invalid_header_length(void **state)
{
	(void)state;
	char *path = test_path("short.safetensors");
	/* Claims 100 header bytes, has 50. */
	unsigned char buf[58];
	memset(buf, ' ', sizeof buf);
	memset(buf, 0, 8);
	buf[0] = 100;
	buf[8] = '{';
	buf[9] = '}';
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	fwrite(buf, 1, sizeof buf, fp);
	fclose(fp);
	fst_error err;
	fst_file *f;
	assert_int_equal(fst_file_open(path, &f, &err), FST_EFORMAT);
	assert_has(err.message, path);
	assert_has(err.message, "invalid header length");
	assert_int_equal(open_bytes(buf, sizeof buf, NULL, &err), FST_EFORMAT);
	assert_has(err.message, "invalid header length");
}

/* ------------------------------------------------------------ JSON text */

static void test_invalid_utf8(void **state)
{
	(void)state;
	/* A lone continuation byte, an overlong '/', a surrogate, a code point
	 * past U+10FFFF and a sequence cut short by the end of the header. */
	static const char *const bad[] = {
		"{\"a\x80\":null}",
		"{\"a\xc0\xaf\":null}",
		"{\"a\xed\xa0\x80\":null}",
		"{\"a\xf4\x90\x80\x80\":null}",
		"{}  \xe2\x82",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		expect_format_error(bad[i], 0, (const char *const[]){"not valid UTF-8", NULL});
	/* Valid multi-byte names are fine. */
	expect_ok("{\"\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80\":{\"dtype\":\"U8\",\"shape\":[1],"
		  "\"data_offsets\":[0,1]}}",
		  1);
}

static void test_not_json(void **state)
{
	(void)state;
	expect_format_error("{\"a\":", 0, (const char *const[]){"not valid JSON", NULL});
	expect_format_error("", 0, (const char *const[]){"not valid JSON", NULL});
	expect_format_error("{'a': 1}", 0, (const char *const[]){"not valid JSON", NULL});
}

static void test_not_object(void **state)
{
	(void)state;
	static const char *const bad[] = {"[]", "1", "\"x\"", "null"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		fst_error err;
		int rc = open_hdr(bad[i], 0, &err);
		assert_int_equal(rc, FST_EFORMAT);
		assert_has(err.message, MEMNAME);
		/* jansson may refuse a bare scalar itself; either way it is no
		 * object. */
		if (!strstr(err.message, "not valid JSON"))
			assert_has(err.message, "must be a JSON object");
	}
	expect_format_error("[1, 2]", 0, (const char *const[]){"must be a JSON object", NULL});
}

static void test_trailing_garbage(void **state)
{
	(void)state;
	expect_format_error("{} x", 0,
			    (const char *const[]){"not valid JSON", "byte 3 of the header (0x78)",
						  "only whitespace", NULL});
	expect_format_error("{}  {}", 0,
			    (const char *const[]){"byte 4 of the header (0x7b)", NULL});
	/* A multi-byte character is reported at its first byte. */
	expect_format_error("{} \xc3\xa9", 0, (const char *const[]){"byte 3 of the header (0xc3)", NULL});
	/* NUL padding, which some writers use instead of spaces. */
	size_t len;
	unsigned char *buf = image("{}  \0\0\0\0", 8, 0, &len);
	fst_error err;
	assert_int_equal(open_bytes(buf, len, NULL, &err), FST_EFORMAT);
	assert_has(err.message, MEMNAME ": ");
	assert_has(err.message, "byte 4 of the header (0x00)");
	assert_has(err.message, "NUL padding");
	free(buf);
}

static void test_trailing_whitespace_accepted(void **state)
{
	(void)state;
	expect_ok("{}      ", 0);
	expect_ok("{}\n\n", 0);
	expect_ok("{} \t\r\n ", 0);
	expect_ok("{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}     ", 2);
}

static void test_leading_whitespace_accepted(void **state)
{
	(void)state;
	expect_ok("  {}", 0);
	expect_ok("\n\t {\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2);
}

static void test_duplicate_keys(void **state)
{
	(void)state;
	expect_format_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			    "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
			    2, (const char *const[]){"duplicate key \"w\"", NULL});
	/* The same name spelt with an escape is still the same key. */
	expect_format_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			    "\"\\u0077\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
			    2, (const char *const[]){"duplicate key", NULL});
	/* Inside a tensor's info too. */
	expect_format_error("{\"w\":{\"dtype\":\"U8\",\"dtype\":\"I8\",\"shape\":[1],"
			    "\"data_offsets\":[0,1]}}",
			    1, (const char *const[]){"duplicate key \"dtype\"", NULL});
	expect_format_error("{\"__metadata__\":{},\"__metadata__\":{}}", 0,
			    (const char *const[]){"duplicate key \"__metadata__\"", NULL});
}

/* ------------------------------------------------------------ __metadata__ */

static void test_metadata_non_string(void **state)
{
	(void)state;
	expect_format_error("{\"__metadata__\":{\"format\":\"pt\",\"step\":5}}", 0,
			    (const char *const[]){"__metadata__", "\"step\"",
						  "value must be a string", NULL});
	expect_format_error("{\"__metadata__\":{\"k\":null}}", 0,
			    (const char *const[]){"\"k\"", "must be a string", NULL});
	expect_format_error("{\"__metadata__\":[\"a\"]}", 0,
			    (const char *const[]){"__metadata__", "must be an object", NULL});
	expect_format_error("{\"__metadata__\":\"pt\"}", 0,
			    (const char *const[]){"__metadata__", "must be an object", NULL});
}

static void test_metadata_null_accepted(void **state)
{
	(void)state;
	static const char h[] = "{\"__metadata__\":null,\"x\":{\"dtype\":\"U8\",\"shape\":[1],"
				"\"data_offsets\":[0,1]}}";
	size_t len;
	unsigned char *buf = image(h, strlen(h), 1, &len);
	fst_file *f;
	fst_error err;
	assert_int_equal(open_bytes(buf, len, &f, &err), FST_OK);
	assert_int_equal(fst_file_metadata_count(f), 0);
	assert_int_equal(fst_file_tensor_count(f), 1);
	assert_null(fst_file_metadata_get(f, "format"));
	fst_file_close(f);
	free(buf);
	expect_ok("{\"__metadata__\":{}}", 0);
}

/* ------------------------------------------------------------ tensor entries */

static void test_tensor_not_object(void **state)
{
	(void)state;
	static const char *const bad[] = {"{\"emb\":5}", "{\"emb\":[\"F32\",[1],[0,4]]}",
					  "{\"emb\":null}", "{\"emb\":\"F32\"}"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		expect_format_error(bad[i], 0,
				    (const char *const[]){"tensor \"emb\"", "expected an object",
							  NULL});
}

static void test_missing_fields(void **state)
{
	(void)state;
	expect_format_error("{\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
			    (const char *const[]){"tensor \"w\"", "missing \"dtype\"", NULL});
	expect_format_error("{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1,
			    (const char *const[]){"tensor \"w\"", "missing \"shape\"", NULL});
	expect_format_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1,
			    (const char *const[]){"tensor \"w\"", "missing \"data_offsets\"",
						  NULL});
	/* Present but of the wrong JSON type. */
	expect_format_error("{\"w\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
			    (const char *const[]){"tensor \"w\"", "dtype must be a string",
						  NULL});
	expect_format_error("{\"w\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1,
			    (const char *const[]){"tensor \"w\"", "shape must be an array",
						  NULL});
}

static void test_unknown_dtype(void **state)
{
	(void)state;
	expect_format_error("{\"w\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
			    (const char *const[]){"tensor \"w\"", "unknown dtype \"F17\"", NULL});
	/* Spellings are case-sensitive, as in the reference reader. */
	expect_format_error("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
			    (const char *const[]){"tensor \"w\"", "unknown dtype \"f32\"", NULL});
}

static void test_shape_element(void **state)
{
	(void)state;
	static const char *const bad[] = {"-1", "1.0", "2.5", "\"2\"", "null", "true", "[1]"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char h[200];
		snprintf(h, sizeof h,
			 "{\"w\":{\"dtype\":\"U8\",\"shape\":[2, %s],\"data_offsets\":[0,2]}}",
			 bad[i]);
		expect_format_error(h, 2,
				    (const char *const[]){"tensor \"w\"",
							  "shape[1] must be a non-negative integer",
							  NULL});
	}
	/* Beyond INT64_MAX: jansson refuses the number while parsing. */
	expect_format_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[18446744073709551615],"
			    "\"data_offsets\":[0,2]}}",
			    2, (const char *const[]){NULL});
}

static void test_data_offsets_arity(void **state)
{
	(void)state;
	static const char *const bad[] = {"[0]", "[0, 4, 8]", "[]", "[0, -4]", "[0.0, 4]",
					  "[\"0\", 4]", "{\"begin\":0,\"end\":4}", "4"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char h[200];
		snprintf(h, sizeof h,
			 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":%s}}", bad[i]);
		expect_format_error(h, 4,
				    (const char *const[]){"tensor \"w\"",
							  "data_offsets must be [begin, end]",
							  NULL});
	}
}

static void test_end_before_begin(void **state)
{
	(void)state;
	expect_format_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}", 4,
			    (const char *const[]){"tensor \"w\"", "[4, 2]", "end before begin",
						  NULL});
}

static void test_byte_count_mismatch(void **state)
{
	(void)state;
	fst_error err;
	assert_int_equal(open_hdr("{\"x\":{\"dtype\":\"F32\",\"shape\":[3,4],"
				  "\"data_offsets\":[0,96]}}",
				  96, &err),
			 FST_EFORMAT);
	/* The exact sentence the public header promises. */
	assert_string_equal(err.message, MEMNAME ": tensor \"x\": data_offsets [0, 96] but "
					     "shape [3, 4] of F32 needs 48 bytes");
	/* Too few bytes is the same rule. */
	expect_format_error("{\"x\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[0,8]}}", 8,
			    (const char *const[]){"tensor \"x\"", "shape [5] of BF16 needs 10 bytes",
						  NULL});
	/* A scalar needs one element's bytes. */
	expect_format_error("{\"x\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
			    (const char *const[]){"tensor \"x\"", "shape [] of I64 needs 8 bytes",
						  NULL});
}

static void test_numel_overflow(void **state)
{
	(void)state;
	/* 2^32 * 2^32 elements overflow the element count... */
	expect_format_error("{\"big\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
			    "\"data_offsets\":[0,1]}}",
			    1, (const char *const[]){"tensor \"big\"", "64 bits", NULL});
	/* ...and 2^61 F64 elements overflow the bit count. */
	expect_format_error("{\"big\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],"
			    "\"data_offsets\":[0,1]}}",
			    1, (const char *const[]){"tensor \"big\"", "64 bits", NULL});
	/* A zero anywhere makes it empty whatever else the shape says. */
	expect_ok("{\"e\":{\"dtype\":\"F64\",\"shape\":[4294967296,0,4294967296],"
		  "\"data_offsets\":[0,0]}}",
		  0);
}

static void test_sub_byte_not_whole(void **state)
{
	(void)state;
	expect_format_error("{\"q\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
			    (const char *const[]){"tensor \"q\"", "shape [3] of F4",
						  "not a whole number of bytes", NULL});
	expect_format_error("{\"q\":{\"dtype\":\"F6_E2M3\",\"shape\":[2],\"data_offsets\":[0,2]}}",
			    2, (const char *const[]){"tensor \"q\"", "12 bits",
						     "not a whole number of bytes", NULL});
	/* Whole bytes are fine: 4 F4 = 2 bytes, 4 F6 = 3 bytes. */
	expect_ok("{\"q\":{\"dtype\":\"F4\",\"shape\":[2,2],\"data_offsets\":[0,2]}}", 2);
	expect_ok("{\"q\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[0,3]}}", 3);
}

/* ------------------------------------------------------------ coverage */

static void test_gap(void **state)
{
	(void)state;
	expect_format_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
			    "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
			    12, (const char *const[]){"tensor \"b\"", "gap", "[4, 8)", NULL});
	/* A data section that does not start at the first tensor is a gap too. */
	expect_format_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6,
			    (const char *const[]){"tensor \"a\"", "gap", NULL});
}

static void test_overlap(void **state)
{
	(void)state;
	expect_format_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
			    "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
			    12, (const char *const[]){"tensor \"b\"", "overlap", "\"a\"", NULL});
	/* Two tensors on the same bytes. */
	expect_format_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
			    "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
			    4, (const char *const[]){"overlap", NULL});
	/* An empty tensor inside another one's bytes, as the reference reader
	 * rejects it. */
	expect_format_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
			    "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}",
			    4, (const char *const[]){"tensor \"e\"", "overlap", NULL});
}

static void test_trailing_bytes(void **state)
{
	(void)state;
	expect_format_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 6,
			    (const char *const[]){"2 trailing bytes", "not fully covered", NULL});
	expect_format_error("{}", 3, (const char *const[]){"3 trailing bytes", NULL});
	expect_format_error("{\"__metadata__\":{\"a\":\"b\"}}", 1,
			    (const char *const[]){"trailing bytes", NULL});
}

static void test_truncated(void **state)
{
	(void)state;
	expect_format_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
			    "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[4,20]}}",
			    12,
			    (const char *const[]){"tensor \"b\"", "[4, 20]", "12 bytes",
						  "truncated", NULL});
}

/* ------------------------------------------------------------ accepted */

static void test_scalar_and_empty(void **state)
{
	(void)state;
	static const char h[] =
		"{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
		"\"e\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
		"\"z\":{\"dtype\":\"F4\",\"shape\":[0],\"data_offsets\":[4,4]},"
		"\"t\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}";
	size_t len;
	unsigned char *buf = image(h, strlen(h), 6, &len);
	fst_file *f;
	fst_error err;
	assert_int_equal(open_bytes(buf, len, &f, &err), FST_OK);
	assert_int_equal(fst_file_tensor_count(f), 4);
	fst_tensor_info ti;
	long i = fst_file_find(f, "s");
	assert_true(i >= 0);
	assert_int_equal(fst_file_tensor(f, (size_t)i, &ti), 0);
	assert_int_equal(ti.ndim, 0);
	assert_null(ti.shape);
	assert_int_equal(ti.numel, 1);
	assert_int_equal(ti.nbytes, 4);
	assert_int_equal(fst_file_tensor(f, (size_t)fst_file_find(f, "e"), &ti), 0);
	assert_int_equal(ti.ndim, 2);
	assert_int_equal(ti.shape[0], 0);
	assert_int_equal(ti.shape[1], 3);
	assert_int_equal(ti.numel, 0);
	assert_int_equal(ti.nbytes, 0);
	assert_int_equal(ti.begin, 4);
	assert_int_equal(fst_file_tensor(f, (size_t)fst_file_find(f, "z"), &ti), 0);
	assert_int_equal(ti.dtype, FST_DTYPE_F4);
	assert_int_equal(ti.nbytes, 0);
	fst_file_close(f);
	free(buf);
	/* Only empty tensors: no data at all. */
	expect_ok("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0);
}

static void test_unknown_fields_accepted(void **state)
{
	(void)state;
	/* The reference reader ignores fields it does not know. */
	static const char h[] = "{\"w\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4],"
				"\"quant\":{\"bits\":4},\"note\":[1,2,null]}}";
	size_t len;
	unsigned char *buf = image(h, strlen(h), 4, &len);
	fst_file *f;
	fst_error err;
	assert_int_equal(open_bytes(buf, len, &f, &err), FST_OK);
	fst_tensor_info ti;
	assert_int_equal(fst_file_tensor(f, 0, &ti), 0);
	assert_string_equal(ti.name, "w");
	assert_int_equal(ti.dtype, FST_DTYPE_U16);
	assert_int_equal(ti.nbytes, 4);
	fst_file_close(f);
	free(buf);
}

static void test_empty_header(void **state)
{
	(void)state;
	size_t len;
	unsigned char *buf = image("{}", 2, 0, &len);
	fst_file *f;
	fst_error err;
	assert_int_equal(open_bytes(buf, len, &f, &err), FST_OK);
	assert_int_equal(fst_file_tensor_count(f), 0);
	assert_int_equal(fst_file_metadata_count(f), 0);
	assert_int_equal(fst_file_data_offset(f), 10);
	assert_int_equal(fst_file_size(f), 10);
	assert_int_equal(fst_file_find(f, "x"), -1);
	fst_tensor_info ti;
	assert_int_equal(fst_file_tensor(f, 0, &ti), FST_EUSAGE);
	fst_file_close(f);
	free(buf);
}

/* ------------------------------------------------------------ accessors */

static void test_sorted_by_offset(void **state)
{
	(void)state;
	/* JSON order differs from offset order. */
	static const char h[] =
		"{\"c\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[10,18]},"
		"\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[7,1],\"data_offsets\":[3,10]}}";
	size_t len;
	unsigned char *buf = image(h, strlen(h), 18, &len);
	fst_file *f;
	fst_error err;
	assert_int_equal(open_bytes(buf, len, &f, &err), FST_OK);
	assert_int_equal(fst_file_tensor_count(f), 3);
	static const char *const want[] = {"a", "b", "c"};
	uint64_t prev_end = 0;
	for (size_t i = 0; i < 3; i++) {
		fst_tensor_info ti;
		assert_int_equal(fst_file_tensor(f, i, &ti), 0);
		assert_string_equal(ti.name, want[i]);
		assert_int_equal(ti.begin, prev_end);
		assert_int_equal(ti.nbytes, ti.end - ti.begin);
		assert_int_equal(ti.file_offset, fst_file_data_offset(f) + ti.begin);
		prev_end = ti.end;
	}
	fst_tensor_info ti;
	assert_int_equal(fst_file_tensor(f, 3, &ti), FST_EUSAGE);
	assert_int_equal(fst_file_tensor(f, (size_t)-1, &ti), FST_EUSAGE);
	assert_int_equal(fst_file_tensor(f, 0, NULL), FST_EUSAGE);
	fst_file_close(f);
	free(buf);
}

static void test_find(void **state)
{
	(void)state;
	/* Enough names to force probing in the name table. */
	char h[8192];
	size_t n = 0;
	n += (size_t)snprintf(h + n, sizeof h - n, "{");
	for (int i = 0; i < 60; i++)
		n += (size_t)snprintf(h + n, sizeof h - n,
				      "%s\"layer.%d\":{\"dtype\":\"U8\",\"shape\":[1],"
				      "\"data_offsets\":[%d,%d]}",
				      i ? "," : "", i, 59 - i, 60 - i);
	snprintf(h + n, sizeof h - n, "}");
	size_t len;
	unsigned char *buf = image(h, strlen(h), 60, &len);
	fst_file *f;
	fst_error err;
	assert_int_equal(open_bytes(buf, len, &f, &err), FST_OK);
	for (int i = 0; i < 60; i++) {
		char name[32];
		snprintf(name, sizeof name, "layer.%d", i);
		long k = fst_file_find(f, name);
		assert_true(k >= 0);
		fst_tensor_info ti;
		assert_int_equal(fst_file_tensor(f, (size_t)k, &ti), 0);
		assert_string_equal(ti.name, name);
		assert_int_equal(ti.begin, (uint64_t)(59 - i));
		/* Offset order is the reverse of JSON order here. */
		assert_int_equal(k, 59 - i);
	}
	assert_int_equal(fst_file_find(f, "layer.60"), -1);
	assert_int_equal(fst_file_find(f, ""), -1);
	assert_int_equal(fst_file_find(f, "layer"), -1);
	assert_int_equal(fst_file_find(f, NULL), -1);
	fst_file_close(f);
	free(buf);
}

static void test_metadata_accessors(void **state)
{
	(void)state;
	static const char h[] = "{\"__metadata__\":{\"z\":\"last\",\"format\":\"pt\",\"a\":\"\","
				"\"\xc3\xa9t\xc3\xa9\":\"\xe6\x97\xa5\"}}";
	size_t len;
	unsigned char *buf = image(h, strlen(h), 0, &len);
	fst_file *f;
	fst_error err;
	assert_int_equal(open_bytes(buf, len, &f, &err), FST_OK);
	assert_int_equal(fst_file_metadata_count(f), 4);
	static const char *const keys[] = {"z", "format", "a", "\xc3\xa9t\xc3\xa9"};
	static const char *const values[] = {"last", "pt", "", "\xe6\x97\xa5"};
	for (size_t i = 0; i < 4; i++) {
		const char *k = NULL, *v = NULL;
		assert_int_equal(fst_file_metadata(f, i, &k, &v), 0);
		assert_string_equal(k, keys[i]);
		assert_string_equal(v, values[i]);
		assert_string_equal(fst_file_metadata_get(f, keys[i]), values[i]);
	}
	const char *k = NULL;
	assert_int_equal(fst_file_metadata(f, 1, &k, NULL), 0);
	assert_string_equal(k, "format");
	assert_int_equal(fst_file_metadata(f, 4, &k, NULL), FST_EUSAGE);
	assert_null(fst_file_metadata_get(f, "missing"));
	assert_null(fst_file_metadata_get(f, NULL));
	fst_file_close(f);
	free(buf);
}

/* Writes the small file the open tests share; returns its path. */
static char *write_sample(const char *name)
{
	static const char h[] =
		"{\"__metadata__\":{\"format\":\"pt\"},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[3,8]},"
		"\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
	char *path = test_path(name);
	write_raw(path, h, strlen(h), "01234567", 8);
	return path;
}

static void check_sample(const fst_file *f, const char *name)
{
	size_t hlen = strlen("{\"__metadata__\":{\"format\":\"pt\"},"
			     "\"b\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[3,8]},"
			     "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}");
	assert_string_equal(fst_file_path(f), name);
	assert_int_equal(fst_file_size(f), 8 + hlen + 8);
	assert_int_equal(fst_file_data_offset(f), 8 + hlen);
	assert_int_equal(fst_file_tensor_count(f), 2);
	assert_int_equal(fst_file_find(f, "a"), 0);
	assert_int_equal(fst_file_find(f, "b"), 1);
	assert_string_equal(fst_file_metadata_get(f, "format"), "pt");
}

static void test_open_path(void **state)
{
	(void)state;
	char *path = write_sample("sample.safetensors");
	fst_file *f;
	fst_error err;
	assert_int_equal(fst_file_open(path, &f, &err), FST_OK);
	assert_int_equal(err.code, 0);
	check_sample(f, path);
	assert_true(fst_file_fd(f) >= 0);
	assert_null(fst_file_memory(f));
	fst_file_close(f);
	fst_file_close(NULL);
	/* err may be NULL. */
	assert_int_equal(fst_file_open(path, &f, NULL), FST_OK);
	fst_file_close(f);
	assert_int_equal(fst_file_open(NULL, &f, &err), FST_EUSAGE);
	assert_int_equal(fst_file_open(path, NULL, &err), FST_EUSAGE);
}

static void test_open_fd(void **state)
{
	(void)state;
	char *path = write_sample("sample-fd.safetensors");
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	fst_file *f;
	fst_error err;
	assert_int_equal(fst_file_open_fd(fd, "given-name", &f, &err), FST_OK);
	check_sample(f, "given-name");
	/* The handle has its own descriptor... */
	assert_true(fst_file_fd(f) >= 0);
	assert_int_not_equal(fst_file_fd(f), fd);
	fst_file_close(f);
	/* ...so the caller's is still open after close. */
	assert_int_not_equal(fcntl(fd, F_GETFD), -1);
	char c;
	assert_int_equal(pread(fd, &c, 1, 0), 1);

	/* Without a name, messages say "<fd N>". */
	int bad = open(test_path("bad-fd.safetensors"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	assert_true(bad >= 0);
	assert_int_equal(write(bad, "abc", 3), 3);
	assert_int_equal(fst_file_open_fd(bad, NULL, &f, &err), FST_EFORMAT);
	char want[32];
	snprintf(want, sizeof want, "<fd %d>", bad);
	assert_has(err.message, want);
	assert_has(err.message, "header too small");
	assert_int_not_equal(fcntl(bad, F_GETFD), -1);
	close(bad);
	close(fd);
	assert_int_equal(fst_file_open_fd(-1, NULL, &f, &err), FST_EUSAGE);
	/* A closed descriptor is an I/O error, not a crash. */
	assert_int_equal(fst_file_open_fd(fd, "closed", &f, &err), FST_EIO);
	assert_has(err.message, "closed");
}

static void test_open_memory(void **state)
{
	(void)state;
	static const char h[] =
		"{\"__metadata__\":{\"format\":\"pt\"},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[3,8]},"
		"\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}";
	size_t len;
	unsigned char *buf = image(h, strlen(h), 8, &len);
	fst_file *f;
	fst_error err;
	assert_int_equal(fst_file_open_memory(buf, len, "mem", &f, &err), FST_OK);
	check_sample(f, "mem");
	assert_int_equal(fst_file_fd(f), -1);
	assert_ptr_equal(fst_file_memory(f), buf);
	fst_file_close(f);
	/* Default name. */
	assert_int_equal(fst_file_open_memory(buf, len, NULL, &f, &err), FST_OK);
	assert_string_equal(fst_file_path(f), "<memory>");
	fst_file_close(f);
	buf[8] = '[';
	assert_int_equal(fst_file_open_memory(buf, len, NULL, &f, &err), FST_EFORMAT);
	assert_has(err.message, "<memory>: ");
	assert_null(f);
	free(buf);
	assert_int_equal(fst_file_open_memory(NULL, 10, NULL, &f, &err), FST_EUSAGE);
}

static void test_open_missing(void **state)
{
	(void)state;
	char *path = test_path("no-such-file.safetensors");
	fst_file *f = (fst_file *)1;
	fst_error err;
	assert_int_equal(fst_file_open(path, &f, &err), FST_EIO);
	assert_null(f);
	assert_int_equal(err.code, FST_EIO);
	assert_int_equal(err.sys_errno, ENOENT);
	assert_has(err.message, path);
	assert_has(err.message, "cannot open");
}

static void test_open_directory(void **state)
{
	(void)state;
	char *dir = test_path("a-directory.safetensors");
	assert_int_equal(mkdir(dir, 0755), 0);
	fst_file *f = (fst_file *)1;
	fst_error err;
	int rc = fst_file_open(dir, &f, &err);
	assert_true(rc < 0);
	assert_int_equal(rc, err.code);
	assert_null(f);
	assert_has(err.message, dir);
	assert_has(err.message, "directory");
}

/* A FIFO (opened without waiting for a writer) and a block device (where
 * one can be opened: stat gives it no size, so it was refused as "0 bytes,
 * header too small") are refused as not regular files. */
static void test_open_not_regular(void **state)
{
	(void)state;
	char *fifo = test_path("a-fifo.safetensors");
	assert_int_equal(mkfifo(fifo, 0600), 0);
	const char *paths[2] = {fifo, NULL};
	static const char *const devices[] = {"/dev/loop0", "/dev/vda", "/dev/sda",
					      "/dev/nvme0n1", "/dev/zram0"};
	for (size_t i = 0; i < sizeof devices / sizeof devices[0] && !paths[1]; i++) {
		struct stat st;
		int fd = open(devices[i], O_RDONLY | O_NONBLOCK);
		if (fd >= 0 && !fstat(fd, &st) && S_ISBLK(st.st_mode))
			paths[1] = devices[i];
		if (fd >= 0)
			close(fd);
	}
	if (!paths[1])
		print_message("no block device can be opened here: the FIFO only\n");
	for (int k = 0; k < 2 && paths[k]; k++) {
		fst_file *f = (fst_file *)1;
		fst_error err;
		assert_int_equal(fst_file_open(paths[k], &f, &err), FST_EFORMAT);
		assert_null(f);
		assert_has(err.message, paths[k]);
		assert_has(err.message, "not a regular file");
	}
}

/* An open waits for the clock to pass a status change a few ticks ahead
 * (a file written this instant), never for one far ahead (a file server's
 * clock ahead of this one): 20 ms waited per file then. */
static void test_settle_waits_only_for_ticks(void **state)
{
	(void)state;
	const uint64_t now = 1700000000ull * 1000000000ull, ms = 1000000;
	assert_true(fsti_ctime_unsettled(now, now));
	assert_true(fsti_ctime_unsettled(now + 5 * ms, now));
	assert_true(fsti_ctime_unsettled(now + 20 * ms, now));
	assert_false(fsti_ctime_unsettled(now - 1, now));
	assert_false(fsti_ctime_unsettled(now + 21 * ms, now));
	assert_false(fsti_ctime_unsettled(now + 3600000 * ms, now));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_header_too_small),
		cmocka_unit_test(test_header_too_large),
		cmocka_unit_test(test_invalid_header_length),
		cmocka_unit_test(test_invalid_utf8),
		cmocka_unit_test(test_not_json),
		cmocka_unit_test(test_not_object),
		cmocka_unit_test(test_trailing_garbage),
		cmocka_unit_test(test_trailing_whitespace_accepted),
		cmocka_unit_test(test_leading_whitespace_accepted),
		cmocka_unit_test(test_duplicate_keys),
		cmocka_unit_test(test_metadata_non_string),
		cmocka_unit_test(test_metadata_null_accepted),
		cmocka_unit_test(test_tensor_not_object),
		cmocka_unit_test(test_missing_fields),
		cmocka_unit_test(test_unknown_dtype),
		cmocka_unit_test(test_shape_element),
		cmocka_unit_test(test_data_offsets_arity),
		cmocka_unit_test(test_end_before_begin),
		cmocka_unit_test(test_byte_count_mismatch),
		cmocka_unit_test(test_numel_overflow),
		cmocka_unit_test(test_sub_byte_not_whole),
		cmocka_unit_test(test_gap),
		cmocka_unit_test(test_overlap),
		cmocka_unit_test(test_trailing_bytes),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_scalar_and_empty),
		cmocka_unit_test(test_unknown_fields_accepted),
		cmocka_unit_test(test_empty_header),
		cmocka_unit_test(test_sorted_by_offset),
		cmocka_unit_test(test_find),
		cmocka_unit_test(test_metadata_accessors),
		cmocka_unit_test(test_open_path),
		cmocka_unit_test(test_open_fd),
		cmocka_unit_test(test_open_memory),
		cmocka_unit_test(test_open_missing),
		cmocka_unit_test(test_open_directory),
		cmocka_unit_test(test_open_not_regular),
		cmocka_unit_test(test_settle_waits_only_for_ticks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
