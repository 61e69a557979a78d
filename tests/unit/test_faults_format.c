/* Description: injected faults while opening files and checkpoints. For
 * "alloc:N", "read:N" and "open:N" with N = 1, 2, ... until the open
 * succeeds, every failure must be a clean error of the expected code with a
 * message, leave *out NULL, and leave no allocation behind
 * (fsti_live_allocations returns to its starting value). The writer gets
 * the same treatment for "alloc:N". */
#include "helpers.h"
#include "format.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* More steps than any of these opens takes; a loop reaching it means the
 * fault never stopped the open, which is a test bug. */
#define MAX_STEPS 1000

static char sample[700];  /* one file with several tensors and metadata */
static char ckdir[700];   /* two shards and an index */
static char plaindir[700]; /* two shards, no index */

static void write_file(const char *path, const char *const *names, int with_meta)
{
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	static uint8_t data[256];
	for (size_t k = 0; names[k]; k++) {
		uint64_t shape[2] = {2, k + 1};
		if (fst_writer_add(w, names[k], FST_DTYPE_BF16, 2, shape, data, 4 * (k + 1), &err))
			fail_msg("add: %s", err.message);
	}
	if (with_meta) {
		assert_int_equal(fst_writer_metadata(w, "format", "pt", &err), 0);
		assert_int_equal(fst_writer_metadata(w, "step", "100", &err), 0);
	}
	if (fst_writer_finish(w, path, &err))
		fail_msg("finish: %s", err.message);
	fst_writer_free(w);
}

static int setup(void **state)
{
	(void)state;
	snprintf(sample, sizeof sample, "%s", test_path("sample.safetensors"));
	write_file(sample, (const char *const[]){"embed", "layers.0.w", "layers.1.w", "head", NULL},
		   1);
	char p[800];
	snprintf(ckdir, sizeof ckdir, "%s", test_path("ckpt"));
	snprintf(plaindir, sizeof plaindir, "%s", test_path("plain"));
	const char *dirs[2] = {ckdir, plaindir};
	for (int d = 0; d < 2; d++) {
		if (mkdir(dirs[d], 0755))
			return -1;
		snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dirs[d]);
		write_file(p, (const char *const[]){"a", "b", NULL}, 1);
		snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dirs[d]);
		write_file(p, (const char *const[]){"c", "d", "e", NULL}, 0);
	}
	snprintf(p, sizeof p, "%s/model.safetensors.index.json", ckdir);
	/* "e" is left out of the map: the warning path runs too. */
	write_text(p, "{\"metadata\": {\"total_size\": 60}, \"weight_map\": {"
		      "\"a\": \"model-00001-of-00002.safetensors\","
		      "\"b\": \"model-00001-of-00002.safetensors\","
		      "\"c\": \"model-00002-of-00002.safetensors\","
		      "\"d\": \"model-00002-of-00002.safetensors\"}}");
	/* Warnings would only clutter the output. */
	fst_log_set_level(FST_LOG_ERROR);
	return 0;
}

static void arm(const char *site, int n)
{
	char spec[64];
	snprintf(spec, sizeof spec, "%s:%d", site, n);
	fst_error err;
	if (fst_fault_set(spec, &err))
		fail_msg("fst_fault_set(%s): %s", spec, err.message);
}

static void disarm(void)
{
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
}

/* Something that opens a handle and closes it again. */
typedef int (*open_fn)(const char *path, fst_error *err);

static int open_file(const char *path, fst_error *err)
{
	fst_file *f = (fst_file *)1;
	int rc = fst_file_open(path, &f, err);
	if (rc) {
		assert_null(f);
		return rc;
	}
	/* Walk it, so a half-built handle would show up here. */
	for (size_t i = 0; i < fst_file_tensor_count(f); i++) {
		fst_tensor_info ti;
		assert_int_equal(fst_file_tensor(f, i, &ti), 0);
		assert_int_equal(fst_file_find(f, ti.name), (long)i);
	}
	fst_file_close(f);
	return 0;
}

static int open_checkpoint(const char *path, fst_error *err)
{
	fst_checkpoint *c = (fst_checkpoint *)1;
	int rc = fst_checkpoint_open(path, &c, err);
	if (rc) {
		assert_null(c);
		return rc;
	}
	assert_int_equal(fst_checkpoint_tensor_count(c), 5);
	for (size_t i = 0; i < 5; i++) {
		fst_tensor_info ti;
		assert_int_equal(fst_checkpoint_tensor(c, i, &ti, NULL), 0);
		assert_int_equal(fst_checkpoint_find(c, ti.name), (long)i);
	}
	fst_checkpoint_close(c);
	return 0;
}

/* Fail the N-th call at site for N = 1, 2, ... until open succeeds; every
 * failure must return want with a message and leak nothing. Returns how
 * many calls failed. */
static int fault_loop(const char *site, open_fn fn, const char *path, int want)
{
	long base = fsti_live_allocations();
	for (int n = 1; n < MAX_STEPS; n++) {
		fst_error err;
		arm(site, n);
		int rc = fn(path, &err);
		disarm();
		long live = fsti_live_allocations();
		if (live != base)
			fail_msg("%s:%d on %s: %ld allocations left (rc %d: %s)", site, n, path,
				 live - base, rc, rc ? err.message : "ok");
		if (rc == 0)
			return n - 1;
		if (rc != want)
			fail_msg("%s:%d on %s: got %d (%s), want %d", site, n, path, rc,
				 err.message, want);
		assert_int_equal(err.code, rc);
		if (!err.message[0])
			fail_msg("%s:%d on %s: no message", site, n, path);
	}
	fail_msg("%s on %s: still failing after %d steps", site, path, MAX_STEPS);
	return -1;
}

static void test_file_alloc(void **state)
{
	(void)state;
	int failures = fault_loop("alloc", open_file, sample, FST_ENOMEM);
	/* The path, the handle, tensors, arena, metadata, name table...: a
	 * loop that never failed anything would prove nothing. */
	assert_true(failures >= 6);
	printf("# fst_file_open: %d allocation sites\n", failures);
}

static void test_file_read(void **state)
{
	(void)state;
	int failures = fault_loop("read", open_file, sample, FST_EIO);
	assert_true(failures >= 2); /* the length prefix and the header */
}

static void test_file_open(void **state)
{
	(void)state;
	assert_int_equal(fault_loop("open", open_file, sample, FST_EIO), 1);
	/* The message names the file and the system error. */
	fst_error err;
	arm("open", 1);
	fst_file *f;
	assert_int_equal(fst_file_open(sample, &f, &err), FST_EIO);
	disarm();
	assert_non_null(strstr(err.message, sample));
	assert_int_not_equal(err.sys_errno, 0);
}

static void test_file_errno(void **state)
{
	(void)state;
	/* A given errno comes through in sys_errno. */
	fst_error err;
	assert_int_equal(fst_fault_set("read:2:ENOSPC", &err), 0);
	fst_file *f;
	assert_int_equal(fst_file_open(sample, &f, &err), FST_EIO);
	disarm();
	assert_int_equal(err.sys_errno, 28 /* ENOSPC */);
	assert_non_null(strstr(err.message, sample));
}

static void test_checkpoint_index_alloc(void **state)
{
	(void)state;
	int failures = fault_loop("alloc", open_checkpoint, ckdir, FST_ENOMEM);
	assert_true(failures >= 12);
	printf("# fst_checkpoint_open (index): %d allocation sites\n", failures);
}

static void test_checkpoint_index_read_open(void **state)
{
	(void)state;
	assert_true(fault_loop("read", open_checkpoint, ckdir, FST_EIO) >= 5);
	/* the index and both shards */
	assert_int_equal(fault_loop("open", open_checkpoint, ckdir, FST_EIO), 3);
}

static void test_checkpoint_directory(void **state)
{
	(void)state;
	assert_true(fault_loop("alloc", open_checkpoint, plaindir, FST_ENOMEM) >= 12);
	assert_true(fault_loop("read", open_checkpoint, plaindir, FST_EIO) >= 4);
	assert_int_equal(fault_loop("open", open_checkpoint, plaindir, FST_EIO), 2);
}

/* The writer under allocation failures: every failure is FST_ENOMEM, frees
 * everything, and a failed finish leaves no file. */
static void test_writer_alloc(void **state)
{
	(void)state;
	char path[800], tmp[820];
	snprintf(path, sizeof path, "%s", test_path("w.safetensors"));
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	long base = fsti_live_allocations();
	static uint8_t data[64];
	int n;
	for (n = 1; n < MAX_STEPS; n++) {
		unlink(path);
		fst_error err;
		arm("alloc", n);
		fst_writer *w = NULL;
		int rc = fst_writer_new(NULL, &w, &err);
		for (int k = 0; k < 70 && !rc; k++) {
			/* 70 tensors: the table grows past its first 64 slots. */
			char name[16];
			snprintf(name, sizeof name, "t%d", k);
			uint64_t shape[1] = {(uint64_t)(k % 5)};
			rc = fst_writer_add(w, name, FST_DTYPE_U8, 1, shape, data, shape[0], &err);
		}
		if (!rc)
			rc = fst_writer_metadata(w, "k", "v", &err);
		int finish_rc = 1;
		if (!rc)
			rc = finish_rc = fst_writer_finish(w, path, &err);
		fst_writer_free(w);
		disarm();
		if (fsti_live_allocations() != base)
			fail_msg("alloc:%d: %ld allocations left", n, fsti_live_allocations() - base);
		if (!rc)
			break;
		if (rc != FST_ENOMEM)
			fail_msg("alloc:%d: got %d (%s)", n, rc, err.message);
		if (finish_rc != 1) {
			struct stat st;
			assert_int_not_equal(stat(path, &st), 0);
			assert_int_not_equal(stat(tmp, &st), 0);
		}
	}
	assert_true(n > 70);
	fst_file *f;
	fst_error err;
	assert_int_equal(fst_file_open(path, &f, &err), 0);
	assert_int_equal(fst_file_tensor_count(f), 70);
	fst_file_close(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_file_alloc),
		cmocka_unit_test(test_file_read),
		cmocka_unit_test(test_file_open),
		cmocka_unit_test(test_file_errno),
		cmocka_unit_test(test_checkpoint_index_alloc),
		cmocka_unit_test(test_checkpoint_index_read_open),
		cmocka_unit_test(test_checkpoint_directory),
		cmocka_unit_test(test_writer_alloc),
	};
	return cmocka_run_group_tests(tests, setup, NULL);
}
