/* Description: checkpoints over one file, a directory of shards (name
 * order), a directory with model.safetensors.index.json and an index path;
 * and every index rule: missing shard, mapped tensor absent from its shard,
 * a tensor in two shards, no shards at all, shard names leaving the
 * directory, malformed index JSON, an index that cannot be opened, an
 * empty weight_map, unmapped tensors kept and unlisted shards reported with
 * a warning; and "-K-of-N" shard sets that must be complete, with or
 * without an index. Shards are written with fst_writer. */
#include "helpers.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A fresh directory for one test; returns a static buffer. */
static const char *make_dir(const char *name)
{
	static char buf[700];
	snprintf(buf, sizeof buf, "%s", test_path(name));
	assert_int_equal(mkdir(buf, 0755), 0);
	return buf;
}

static char *join(const char *dir, const char *name)
{
	static char bufs[4][800];
	static int next;
	char *b = bufs[next++ % 4];
	snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
	return b;
}

/* Write a shard holding the tensors in names (a NULL-terminated list); each
 * is U8 of shape [k + 1] for the k-th name, filled with its first letter so
 * the bytes say which tensor they belong to. */
static void write_shard(const char *path, const char *const *names)
{
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	static uint8_t data[64][64];
	for (size_t k = 0; names[k]; k++) {
		uint64_t shape[1] = {k + 1};
		memset(data[k], names[k][0], sizeof data[k]);
		if (fst_writer_add(w, names[k], FST_DTYPE_U8, 1, shape, data[k], k + 1, &err))
			fail_msg("add: %s", err.message);
	}
	if (fst_writer_finish(w, path, &err))
		fail_msg("finish: %s", err.message);
	fst_writer_free(w);
}

/* Two shards and their index in dir: a,b in model-00001, c,d,e in 00002. */
static void write_two_shards(const char *dir, bool index)
{
	write_shard(join(dir, "model-00001-of-00002.safetensors"),
		    (const char *const[]){"a", "b", NULL});
	write_shard(join(dir, "model-00002-of-00002.safetensors"),
		    (const char *const[]){"c", "d", "e", NULL});
	if (index)
		write_text(join(dir, "model.safetensors.index.json"),
			   "{\"metadata\": {\"total_size\": 9},\n"
			   " \"weight_map\": {\"e\": \"model-00002-of-00002.safetensors\",\n"
			   "  \"a\": \"model-00001-of-00002.safetensors\",\n"
			   "  \"b\": \"model-00001-of-00002.safetensors\",\n"
			   "  \"c\": \"model-00002-of-00002.safetensors\",\n"
			   "  \"d\": \"model-00002-of-00002.safetensors\"}}\n");
}

/* Open path, expecting success and n tensors. */
static void expect_tensors(const char *path, size_t n)
{
	fst_checkpoint *c;
	fst_error err;
	if (fst_checkpoint_open(path, &c, &err))
		fail_msg("%s: %s", path, err.message);
	assert_int_equal(fst_checkpoint_tensor_count(c), n);
	fst_checkpoint_close(c);
}

/* Open path expecting failure with code; returns the message. */
static const char *expect_error(const char *path, int code)
{
	static fst_error err;
	fst_checkpoint *c = (fst_checkpoint *)1;
	int rc = fst_checkpoint_open(path, &c, &err);
	if (rc != code)
		fail_msg("%s: got %d (%s), want %d", path, rc, rc ? err.message : "ok", code);
	assert_null(c);
	assert_int_equal(err.code, code);
	return err.message;
}

/* Checks the two-shard table: files in name order, tensors file by file in
 * offset order, names found, bytes counted. */
static void check_two_shards(const fst_checkpoint *c)
{
	assert_int_equal(fst_checkpoint_file_count(c), 2);
	assert_int_equal(fst_checkpoint_tensor_count(c), 5);
	assert_int_equal(fst_checkpoint_total_bytes(c), 1 + 2 + 1 + 2 + 3);
	assert_non_null(strstr(fst_file_path(fst_checkpoint_file(c, 0)), "model-00001"));
	assert_non_null(strstr(fst_file_path(fst_checkpoint_file(c, 1)), "model-00002"));
	assert_null(fst_checkpoint_file(c, 2));
	static const char *const names[] = {"a", "b", "c", "d", "e"};
	static const size_t files[] = {0, 0, 1, 1, 1};
	for (size_t i = 0; i < 5; i++) {
		fst_tensor_info ti;
		size_t fi = 99;
		assert_int_equal(fst_checkpoint_tensor(c, i, &ti, &fi), 0);
		assert_string_equal(ti.name, names[i]);
		assert_int_equal(fi, files[i]);
		assert_int_equal(fst_checkpoint_find(c, names[i]), (long)i);
		/* file_index may be NULL. */
		assert_int_equal(fst_checkpoint_tensor(c, i, &ti, NULL), 0);
	}
	fst_tensor_info ti;
	assert_int_equal(fst_checkpoint_tensor(c, 5, &ti, NULL), FST_EUSAGE);
	assert_int_equal(fst_checkpoint_find(c, "f"), -1);
	assert_int_equal(fst_checkpoint_find(c, NULL), -1);
}

/* ------------------------------------------------------------ good inputs */

static void test_single_file(void **state)
{
	(void)state;
	const char *dir = make_dir("single");
	char path[800];
	snprintf(path, sizeof path, "%s", join(dir, "model.safetensors"));
	write_shard(path, (const char *const[]){"x", "y", NULL});
	fst_checkpoint *c;
	fst_error err;
	assert_int_equal(fst_checkpoint_open(path, &c, &err), 0);
	assert_string_equal(fst_checkpoint_path(c), path);
	assert_null(fst_checkpoint_index_path(c));
	assert_int_equal(fst_checkpoint_file_count(c), 1);
	assert_int_equal(fst_checkpoint_tensor_count(c), 2);
	assert_int_equal(fst_checkpoint_total_bytes(c), 3);
	assert_int_equal(fst_checkpoint_find(c, "y"), 1);
	fst_checkpoint_close(c);
	fst_checkpoint_close(NULL);
}

static void test_directory_without_index(void **state)
{
	(void)state;
	const char *dir = make_dir("noindex");
	write_two_shards(dir, false);
	/* Neither of these is a shard. */
	write_text(join(dir, "README.md"), "not a shard");
	write_text(join(dir, "config.json"), "{}");
	fst_checkpoint *c;
	fst_error err;
	assert_int_equal(fst_checkpoint_open(dir, &c, &err), 0);
	assert_string_equal(fst_checkpoint_path(c), dir);
	assert_null(fst_checkpoint_index_path(c));
	check_two_shards(c);
	fst_checkpoint_close(c);
}

static void test_directory_name_order(void **state)
{
	(void)state;
	/* Created out of order: the table follows the names, not readdir. */
	const char *dir = make_dir("order");
	write_shard(join(dir, "c.safetensors"), (const char *const[]){"t3", NULL});
	write_shard(join(dir, "a.safetensors"), (const char *const[]){"t1", NULL});
	write_shard(join(dir, "b.safetensors"), (const char *const[]){"t2", NULL});
	fst_checkpoint *c;
	fst_error err;
	assert_int_equal(fst_checkpoint_open(dir, &c, &err), 0);
	assert_int_equal(fst_checkpoint_file_count(c), 3);
	for (size_t i = 0; i < 3; i++) {
		fst_tensor_info ti;
		size_t fi;
		assert_int_equal(fst_checkpoint_tensor(c, i, &ti, &fi), 0);
		assert_int_equal(fi, i);
		char want[4] = {'t', (char)('1' + i), 0};
		assert_string_equal(ti.name, want);
	}
	fst_checkpoint_close(c);
}

static void test_directory_with_index(void **state)
{
	(void)state;
	const char *dir = make_dir("index");
	write_two_shards(dir, true);
	fst_checkpoint *c;
	fst_error err;
	assert_int_equal(fst_checkpoint_open(dir, &c, &err), 0);
	assert_non_null(fst_checkpoint_index_path(c));
	assert_has(fst_checkpoint_index_path(c), "model.safetensors.index.json");
	check_two_shards(c);
	fst_checkpoint_close(c);
}

static void test_index_path(void **state)
{
	(void)state;
	const char *dir = make_dir("index-path");
	write_two_shards(dir, true);
	char *index = join(dir, "model.safetensors.index.json");
	fst_checkpoint *c;
	fst_error err;
	assert_int_equal(fst_checkpoint_open(index, &c, &err), 0);
	assert_string_equal(fst_checkpoint_index_path(c), index);
	check_two_shards(c);
	fst_checkpoint_close(c);
}

/* The index names only the shards it maps; other *.safetensors files in the
 * directory are not part of the checkpoint. */
struct log_capture {
	int warnings;
	char last[1024];
};

static void capture(void *ctx, int level, const char *message)
{
	struct log_capture *lc = ctx;
	if (level == FST_LOG_WARN) {
		lc->warnings++;
		snprintf(lc->last, sizeof lc->last, "%s", message);
	}
}

/* fst_checkpoint_open of path with the warnings it logs into lc. */
static int open_logged(const char *path, fst_checkpoint **c, fst_error *err,
		       struct log_capture *lc)
{
	int level = fst_log_get_level();
	fst_log_set_level(FST_LOG_WARN);
	fst_log_set_callback(capture, lc);
	int rc = fst_checkpoint_open(path, c, err);
	fst_log_set_callback(NULL, NULL);
	fst_log_set_level(level);
	return rc;
}

static void test_index_ignores_other_files(void **state)
{
	(void)state;
	const char *dir = make_dir("index-extra-file");
	write_two_shards(dir, true);
	write_shard(join(dir, "consolidated.safetensors"), (const char *const[]){"a", NULL});
	struct log_capture lc = {0};
	fst_checkpoint *c;
	fst_error err;
	assert_int_equal(open_logged(dir, &c, &err, &lc), 0);
	check_two_shards(c);
	/* the file the index leaves out is reported, not loaded */
	assert_int_equal(lc.warnings, 1);
	assert_has(lc.last, "consolidated.safetensors");
	assert_has(lc.last, "not in the index");
	fst_checkpoint_close(c);
}

static void test_unmapped_tensors_kept(void **state)
{
	(void)state;
	const char *dir = make_dir("unmapped");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", "b", NULL});
	write_shard(join(dir, "s2.safetensors"), (const char *const[]){"c", "extra", NULL});
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\","
		   " \"c\": \"s2.safetensors\"}}");
	struct log_capture lc = {0};
	fst_checkpoint *c;
	fst_error err;
	assert_int_equal(open_logged(dir, &c, &err, &lc), 0);
	assert_int_equal(fst_checkpoint_tensor_count(c), 4);
	assert_true(fst_checkpoint_find(c, "extra") >= 0);
	assert_int_equal(lc.warnings, 1);
	assert_has(lc.last, "\"extra\"");
	assert_has(lc.last, "s2.safetensors");
	assert_has(lc.last, "weight_map");
	fst_checkpoint_close(c);
}

/* An index that maps no tensor to a shard of its set that is there (stale
 * or hand-edited): the set is whole, the shard reported as not loaded, the
 * rest loads (with the shard absent, it is incomplete: below). Opened by the
 * folder and by the index's path, given with a trailing '/' too. */
static void test_index_leaves_a_present_shard_unmapped(void **state)
{
	(void)state;
	const char *dir = make_dir("index-unmapped-shard");
	write_two_shards(dir, false);
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
		   "\"b\": \"model-00001-of-00002.safetensors\"}}");
	char slashed[800];
	snprintf(slashed, sizeof slashed, "%s/", dir);
	const char *paths[] = {dir, join(dir, "model.safetensors.index.json"), slashed};
	for (int k = 0; k < 3; k++) {
		struct log_capture lc = {0};
		fst_checkpoint *c;
		fst_error err;
		if (open_logged(paths[k], &c, &err, &lc))
			fail_msg("%s: %s", paths[k], err.message);
		assert_int_equal(fst_checkpoint_tensor_count(c), 2);
		assert_int_equal(lc.warnings, 1);
		assert_has(lc.last, "model-00002-of-00002.safetensors");
		assert_has(lc.last, "not in the index");
		const char *f = fst_file_path(fst_checkpoint_file(c, 0));
		if (strstr(f, "//"))
			fail_msg("%s: a shard named %s", paths[k], f);
		fst_checkpoint_close(c);
	}
}

/* One shard spelled two ways ("./a", "sub//a" beside "a", "sub/a") is one
 * file, opened once. */
static void test_index_one_shard_two_spellings(void **state)
{
	(void)state;
	const char *dir = make_dir("index-spellings");
	char sub[600];
	snprintf(sub, sizeof sub, "%s", join(dir, "sub"));
	assert_int_equal(mkdir(sub, 0755), 0);
	write_shard(join(dir, "a.safetensors"), (const char *const[]){"x", "y", NULL});
	write_shard(join(sub, "b.safetensors"), (const char *const[]){"z", "w", NULL});
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"./a.safetensors\","
		   " \"z\": \"sub/b.safetensors\", \"w\": \"sub//./b.safetensors\"}}");
	fst_checkpoint *c;
	fst_error err;
	if (fst_checkpoint_open(dir, &c, &err))
		fail_msg("%s", err.message);
	assert_int_equal(fst_checkpoint_file_count(c), 2);
	assert_int_equal(fst_checkpoint_tensor_count(c), 4);
	fst_checkpoint_close(c);
	/* a name made valid by the spelling is refused as written */
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"//a.safetensors\"}}");
	assert_has(expect_error(dir, FST_EFORMAT), "relative file name");
}

/* ------------------------------------------------------------ errors */

/* An index that is no regular file: a FIFO is refused, not opened (which
 * would wait for a writer forever); a directory is named as one. */
static void test_index_not_a_file(void **state)
{
	(void)state;
	const char *dir = make_dir("index-fifo");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", NULL});
	char *index = join(dir, "model.safetensors.index.json");
	assert_int_equal(mkfifo(index, 0600), 0);
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, index);
	assert_has(msg, "not a regular file");
	assert_has(expect_error(index, FST_EFORMAT), "not a regular file");
	const char *dir2 = make_dir("index-dir");
	write_shard(join(dir2, "s1.safetensors"), (const char *const[]){"a", NULL});
	assert_int_equal(mkdir(join(dir2, "model.safetensors.index.json"), 0755), 0);
	assert_has(expect_error(dir2, FST_EFORMAT), "is a directory, not an index file");
}

/* A folder's entry named *.safetensors that is a directory: the folder is
 * at fault (FST_EFORMAT), not the caller. */
static void test_directory_entry_is_a_directory(void **state)
{
	(void)state;
	const char *dir = make_dir("entry-dir");
	write_shard(join(dir, "a.safetensors"), (const char *const[]){"a", NULL});
	assert_int_equal(mkdir(join(dir, "b.safetensors"), 0755), 0);
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "b.safetensors");
	assert_has(msg, "is a directory");
}

static void test_missing_shard(void **state)
{
	(void)state;
	const char *dir = make_dir("missing-shard");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", NULL});
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"s1.safetensors\", \"lm_head.weight\": "
		   "\"s2.safetensors\"}}");
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "model.safetensors.index.json");
	assert_has(msg, "\"s2.safetensors\"");
	assert_has(msg, "\"lm_head.weight\"");
	assert_has(msg, "missing");
}

/* A directory holding some of a "-K-of-N" set and no index (an interrupted
 * copy, download or write) is refused, naming what is missing. */
static void test_incomplete_shard_set(void **state)
{
	(void)state;
	const char *dir = make_dir("incomplete-set");
	write_shard(join(dir, "model-00001-of-00004.safetensors"), (const char *const[]){"a", NULL});
	write_shard(join(dir, "model-00003-of-00004.safetensors"), (const char *const[]){"b", NULL});
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "incomplete checkpoint");
	assert_has(msg, "2 of the 4");
	assert_has(msg, "model-00002-of-00004.safetensors");
	assert_has(msg, "model-00004-of-00004.safetensors");
	/* whole again: it opens */
	write_shard(join(dir, "model-00002-of-00004.safetensors"), (const char *const[]){"c", NULL});
	write_shard(join(dir, "model-00004-of-00004.safetensors"), (const char *const[]){"d", NULL});
	expect_tensors(dir, 4);
}

/* Thousands missing: counted, three named, no time spent on the rest. */
static void test_incomplete_shard_set_large(void **state)
{
	(void)state;
	const char *dir = make_dir("incomplete-large");
	write_shard(join(dir, "w-07-of-999999999999.safetensors"), (const char *const[]){"a", NULL});
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "999999999998 of the 999999999999");
	assert_has(msg, "w-01-of-999999999999.safetensors, w-02-of-999999999999.safetensors, "
			"w-03-of-999999999999.safetensors, ...");
}

static void test_shard_number_out_of_range(void **state)
{
	(void)state;
	const char *dir = make_dir("shard-number");
	write_shard(join(dir, "model-00001-of-00002.safetensors"), (const char *const[]){"a", NULL});
	write_shard(join(dir, "model-00002-of-00002.safetensors"), (const char *const[]){"b", NULL});
	write_shard(join(dir, "model-00003-of-00002.safetensors"), (const char *const[]){"c", NULL});
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "model-00003-of-00002.safetensors");
	assert_has(msg, "number 3 of 2");
	const char *zero = make_dir("shard-number-zero");
	write_shard(join(zero, "x-0-of-1.safetensors"), (const char *const[]){"a", NULL});
	write_shard(join(zero, "x-1-of-1.safetensors"), (const char *const[]){"b", NULL});
	assert_has(expect_error(zero, FST_EFORMAT), "number 0 of 1");
}

/* Two complete sets side by side, and names that only look alike, open. */
static void test_shard_sets_complete(void **state)
{
	(void)state;
	const char *dir = make_dir("shard-sets");
	write_shard(join(dir, "a-1-of-2.safetensors"), (const char *const[]){"a", NULL});
	write_shard(join(dir, "a-2-of-2.safetensors"), (const char *const[]){"b", NULL});
	write_shard(join(dir, "b-00001-of-00001.safetensors"), (const char *const[]){"c", NULL});
	write_shard(join(dir, "x-of-3.safetensors"), (const char *const[]){"d", NULL});
	write_shard(join(dir, "1-of-3.safetensors"), (const char *const[]){"e", NULL});
	expect_tensors(dir, 5);
}

/* An index whose shards say "of 3" but names only two of them. */
static void test_index_incomplete_shard_set(void **state)
{
	(void)state;
	const char *dir = make_dir("index-incomplete");
	write_shard(join(dir, "model-00001-of-00003.safetensors"), (const char *const[]){"a", NULL});
	write_shard(join(dir, "model-00002-of-00003.safetensors"), (const char *const[]){"b", NULL});
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"model-00001-of-00003.safetensors\", "
		   "\"b\": \"model-00002-of-00003.safetensors\"}}");
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "model.safetensors.index.json");
	assert_has(msg, "model-00003-of-00003.safetensors");
}

static void test_index_empty_weight_map(void **state)
{
	(void)state;
	const char *dir = make_dir("index-empty");
	write_two_shards(dir, false);
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {}}");
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "model.safetensors.index.json");
	assert_has(msg, "\"weight_map\" is empty");
}

static void test_mapped_tensor_not_in_shard(void **state)
{
	(void)state;
	const char *dir = make_dir("mapped-missing");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", NULL});
	write_shard(join(dir, "s2.safetensors"), (const char *const[]){"b", NULL});
	/* "b" is real but in the other shard; "ghost" is nowhere. */
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\"}}");
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "tensor \"b\"");
	assert_has(msg, "\"s1.safetensors\"");
	assert_has(msg, "no such tensor");

	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\","
		   " \"ghost\": \"s2.safetensors\"}}");
	msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "tensor \"ghost\"");
	assert_has(msg, "\"s2.safetensors\"");
}

static void test_tensor_in_two_shards(void **state)
{
	(void)state;
	/* Without an index... */
	const char *dir = make_dir("dup-noindex");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", "shared.w", NULL});
	write_shard(join(dir, "s2.safetensors"), (const char *const[]){"shared.w", "b", NULL});
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "tensor \"shared.w\"");
	assert_has(msg, "s1.safetensors");
	assert_has(msg, "s2.safetensors");
	assert_has(msg, "two files");

	/* ...and with one that maps it to one of them. */
	dir = make_dir("dup-index");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", "shared.w", NULL});
	write_shard(join(dir, "s2.safetensors"), (const char *const[]){"shared.w", "b", NULL});
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"s1.safetensors\", \"shared.w\": \"s1.safetensors\","
		   " \"b\": \"s2.safetensors\"}}");
	msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "tensor \"shared.w\"");
	assert_has(msg, "s1.safetensors");
	assert_has(msg, "s2.safetensors");
}

static void test_no_shards(void **state)
{
	(void)state;
	const char *dir = make_dir("empty");
	write_text(join(dir, "config.json"), "{}");
	/* Hidden files do not count either. */
	write_shard(join(dir, ".hidden.safetensors"), (const char *const[]){"a", NULL});
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, dir);
	assert_has(msg, "no *.safetensors files");
}

static void test_missing_path(void **state)
{
	(void)state;
	char *path = test_path("no-such-checkpoint");
	const char *msg = expect_error(path, FST_EIO);
	assert_has(msg, path);
}

static void test_shard_outside_directory(void **state)
{
	(void)state;
	const char *dir = make_dir("escape");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", NULL});
	/* A valid shard one level up, so only the name check can stop it. */
	write_shard(test_path("outside.safetensors"), (const char *const[]){"b", NULL});
	static const char *const bad[] = {
		"../outside.safetensors", "sub/../../outside.safetensors", "..", "/etc/passwd",
		"", "sub/..",
	};
	char abs[800];
	snprintf(abs, sizeof abs, "%s", test_path("outside.safetensors"));
	for (size_t i = 0; i <= sizeof bad / sizeof bad[0]; i++) {
		const char *shard = i < sizeof bad / sizeof bad[0] ? bad[i] : abs;
		char text[1200];
		snprintf(text, sizeof text,
			 "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"%s\"}}", shard);
		write_text(join(dir, "model.safetensors.index.json"), text);
		const char *msg = expect_error(dir, FST_EFORMAT);
		assert_has(msg, "model.safetensors.index.json");
		assert_has(msg, "\"b\"");
		assert_has(msg, "relative file name inside");
	}
	/* Dots that are not a ".." component are fine. */
	write_shard(join(dir, "..s2.safetensors"), (const char *const[]){"b", NULL});
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"./s1.safetensors\", \"b\": \"..s2.safetensors\"}}");
	expect_tensors(dir, 2);
}

static void test_shard_is_directory(void **state)
{
	(void)state;
	/* The index is at fault, so FST_EFORMAT, naming the shard. */
	const char *dir = make_dir("shard-dir");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", NULL});
	assert_int_equal(mkdir(join(dir, "sub.safetensors"), 0755), 0);
	static const char *const bad[] = {".", "sub.safetensors", "./", "sub.safetensors/"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char text[300];
		snprintf(text, sizeof text,
			 "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"%s\"}}", bad[i]);
		write_text(join(dir, "model.safetensors.index.json"), text);
		const char *msg = expect_error(dir, FST_EFORMAT);
		char want[64];
		snprintf(want, sizeof want, "shard \"%s\"", bad[i]);
		assert_has(msg, want);
		assert_has(msg, "is a directory");
	}
}

/* "x/." names a folder x, so never the file x: its spelling is not made
 * plain ("x/." is not "x"), and the file beneath is not a folder. */
static void test_shard_dot_after_a_file(void **state)
{
	(void)state;
	const char *dir = make_dir("shard-dot");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", NULL});
	write_shard(join(dir, "s2.safetensors"), (const char *const[]){"b", NULL});
	write_text(join(dir, "model.safetensors.index.json"),
		   "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors/.\"}}");
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "shard \"s2.safetensors/.\"");
}

static void test_malformed_index(void **state)
{
	(void)state;
	const char *dir = make_dir("malformed");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", NULL});
	char *index = join(dir, "model.safetensors.index.json");
	static const struct {
		const char *text;
		const char *rule;
	} cases[] = {
		{"{\"weight_map\": {\"a\": \"s1.safetensors\"", "not valid JSON"},
		{"", "not valid JSON"},
		{"{\"weight_map\": {\"a\": \"s1.safetensors\", \"a\": \"s1.safetensors\"}}",
		 "not valid JSON"},
		{"[]", "\"weight_map\""},
		{"{}", "\"weight_map\""},
		{"{\"weight_map\": [\"s1.safetensors\"]}", "\"weight_map\""},
		{"{\"weight_map\": {\"a\": 1}}", "a file name (a JSON string)"},
		{"{\"weight_map\": {\"a\": null}}", "a file name (a JSON string)"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		write_text(index, cases[i].text);
		const char *msg = expect_error(dir, FST_EFORMAT);
		assert_has(msg, index);
		assert_has(msg, cases[i].rule);
	}
}

static void test_index_cannot_open(void **state)
{
	(void)state;
	/* A dangling link: listed by the directory, refused by open, even to
	 * root (whom a mode of 000 would not stop). */
	const char *dir = make_dir("index-dangling");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", NULL});
	char *index = join(dir, "model.safetensors.index.json");
	assert_int_equal(symlink("no-such-index.json", index), 0);
	fst_checkpoint *c = (fst_checkpoint *)1;
	fst_error err;
	assert_int_equal(fst_checkpoint_open(dir, &c, &err), FST_EIO);
	assert_null(c);
	assert_int_equal(err.sys_errno, ENOENT);
	assert_has(err.message, index);
	assert_has(err.message, "cannot open");
}

static void test_bad_shard_file(void **state)
{
	(void)state;
	/* A shard that breaks the format: the message is the file's own. */
	const char *dir = make_dir("bad-shard");
	write_shard(join(dir, "s1.safetensors"), (const char *const[]){"a", NULL});
	write_raw(join(dir, "s2.safetensors"), "{\"b\":{}}", 8, NULL, 0);
	const char *msg = expect_error(dir, FST_EFORMAT);
	assert_has(msg, "s2.safetensors");
	assert_has(msg, "tensor \"b\"");
}

static void test_from_files(void **state)
{
	(void)state;
	const char *dir = make_dir("from-files");
	write_two_shards(dir, false);
	fst_file *files[2];
	fst_error err;
	assert_int_equal(fst_file_open(join(dir, "model-00001-of-00002.safetensors"), &files[0],
				       &err),
			 0);
	assert_int_equal(fst_file_open(join(dir, "model-00002-of-00002.safetensors"), &files[1],
				       &err),
			 0);
	fst_checkpoint *c;
	assert_int_equal(fst_checkpoint_from_files(files, 2, &c, &err), 0);
	check_two_shards(c);
	fst_checkpoint_close(c);

	/* Ownership passes also on failure: the same file twice is a duplicate;
	 * the sanitizer build would see a leak or a double close. */
	assert_int_equal(fst_file_open(join(dir, "model-00001-of-00002.safetensors"), &files[0],
				       &err),
			 0);
	assert_int_equal(fst_file_open(join(dir, "model-00001-of-00002.safetensors"), &files[1],
				       &err),
			 0);
	assert_int_equal(fst_checkpoint_from_files(files, 2, &c, &err), FST_EFORMAT);
	assert_has(err.message, "two files");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_single_file),
		cmocka_unit_test(test_directory_without_index),
		cmocka_unit_test(test_directory_name_order),
		cmocka_unit_test(test_directory_with_index),
		cmocka_unit_test(test_index_path),
		cmocka_unit_test(test_index_ignores_other_files),
		cmocka_unit_test(test_index_leaves_a_present_shard_unmapped),
		cmocka_unit_test(test_index_one_shard_two_spellings),
		cmocka_unit_test(test_index_not_a_file),
		cmocka_unit_test(test_directory_entry_is_a_directory),
		cmocka_unit_test(test_unmapped_tensors_kept),
		cmocka_unit_test(test_missing_shard),
		cmocka_unit_test(test_incomplete_shard_set),
		cmocka_unit_test(test_incomplete_shard_set_large),
		cmocka_unit_test(test_shard_number_out_of_range),
		cmocka_unit_test(test_shard_sets_complete),
		cmocka_unit_test(test_index_incomplete_shard_set),
		cmocka_unit_test(test_index_empty_weight_map),
		cmocka_unit_test(test_mapped_tensor_not_in_shard),
		cmocka_unit_test(test_tensor_in_two_shards),
		cmocka_unit_test(test_no_shards),
		cmocka_unit_test(test_missing_path),
		cmocka_unit_test(test_shard_outside_directory),
		cmocka_unit_test(test_shard_is_directory),
		cmocka_unit_test(test_shard_dot_after_a_file),
		cmocka_unit_test(test_malformed_index),
		cmocka_unit_test(test_index_cannot_open),
		cmocka_unit_test(test_bad_shard_file),
		cmocka_unit_test(test_from_files),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
