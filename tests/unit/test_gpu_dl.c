/* Description: the one dlopen helper of base/ (fsti_dl_load) on libc itself:
 * the override before the soname, required, optional and older-name entries,
 * the messages for a library that cannot be loaded and for a missing symbol
 * (with the table cleared); and base/env.c's reads (fresh every call, empty
 * as unset, FST_GDS_TRY=1 only). */
#include "helpers.h"
#include "base.h"
#include "dl.h"

#include <stdlib.h>
#include <string.h>

#define LIBC "libc.so.6"

struct table {
	long (*labs)(long v);
	size_t (*len)(const char *s);
	int (*absent)(void);
	size_t (*renamed)(const char *s);
};

static void test_required_optional_older(void **state)
{
	(void)state;
	const struct fsti_dl_sym syms[] = {
		FSTI_DL_SYM(struct table, labs),
		{"strlen", NULL, offsetof(struct table, len), false},
		{"fst_no_such_symbol", NULL, offsetof(struct table, absent), true},
		{"fst_no_such_strlen", "strlen", offsetof(struct table, renamed), false},
	};
	const struct fsti_dl_lib lib = {"C library", NULL, LIBC, FST_EUNSUPPORTED};
	struct table t;
	memset(&t, 0xff, sizeof t);
	void *h = NULL;
	char path[64];
	fst_error err;
	assert_int_equal(fsti_dl_load(&lib, syms, 4, &t, &h, path, sizeof path, &err), 0);
	assert_non_null(h);
	assert_string_equal(path, LIBC);
	assert_int_equal(t.labs(-7), 7);
	assert_int_equal(t.len("four"), 4);
	assert_null(t.absent);
	assert_int_equal(t.renamed("three"), 5);
}

static void test_override_wins(void **state)
{
	(void)state;
	const struct fsti_dl_sym syms[] = {FSTI_DL_SYM(struct table, labs)};
	const struct fsti_dl_lib lib = {"C library", "/nonexistent/libc-override.so", LIBC,
					FST_EDEVICE};
	struct table t;
	void *h = (void *)&t;
	char path[64];
	fst_error err;
	assert_int_equal(fsti_dl_load(&lib, syms, 1, &t, &h, path, sizeof path, &err),
			 FST_EDEVICE);
	assert_int_equal(err.code, FST_EDEVICE);
	assert_null(h);
	assert_string_equal(path, "/nonexistent/libc-override.so");
	assert_has(err.message, "no C library: cannot load /nonexistent/libc-override.so (");
	/* dlerror's own words follow */
	assert_has(err.message, "No such file");
}

static void test_missing_symbol(void **state)
{
	(void)state;
	const struct fsti_dl_sym syms[] = {
		FSTI_DL_SYM(struct table, labs),
		{"fst_no_such_symbol", NULL, offsetof(struct table, absent), false},
	};
	const struct fsti_dl_lib lib = {"C library", NULL, LIBC, FST_EUNSUPPORTED};
	struct table t;
	void *h = (void *)&t;
	fst_error err;
	assert_int_equal(fsti_dl_load(&lib, syms, 2, &t, &h, NULL, 0, &err), FST_EUNSUPPORTED);
	assert_null(h);
	assert_null(t.labs); /* nothing half-filled is left behind */
	assert_null(t.absent);
	assert_string_equal(err.message,
			    "C library " LIBC " lacks fst_no_such_symbol: too old, or another library");
	/* an entry with an older name names both; err may be NULL */
	const struct fsti_dl_sym both[] = {
		{"fst_no_such_v2", "fst_no_such", offsetof(struct table, renamed), false},
	};
	assert_int_equal(fsti_dl_load(&lib, both, 1, &t, &h, NULL, 0, &err), FST_EUNSUPPORTED);
	assert_has(err.message, "lacks both fst_no_such_v2 and fst_no_such");
	assert_int_equal(fsti_dl_load(&lib, both, 1, &t, &h, NULL, 0, NULL), FST_EUNSUPPORTED);
}

static void test_env(void **state)
{
	(void)state;
	assert_string_equal(fsti_env_name(FSTI_ENV_GDS_TRY), "FST_GDS_TRY");
	assert_string_equal(fsti_env_name(FSTI_ENV_CUFILE_JSON), "CUFILE_ENV_PATH_JSON");
	assert_null(fsti_env_name(FSTI_ENV_COUNT));
	for (int i = 0; i < FSTI_ENV_COUNT; i++)
		assert_non_null(fsti_env_name((enum fsti_env)i));
	unsetenv("FST_NVFS_DEVICES");
	assert_null(fsti_env(FSTI_ENV_NVFS_DEVICES));
	setenv("FST_NVFS_DEVICES", "", 1);
	assert_null(fsti_env(FSTI_ENV_NVFS_DEVICES)); /* empty reads as unset */
	setenv("FST_NVFS_DEVICES", "/a*", 1);
	assert_string_equal(fsti_env(FSTI_ENV_NVFS_DEVICES), "/a*");
	setenv("FST_NVFS_DEVICES", "/b*", 1); /* read again at every call */
	assert_string_equal(fsti_env(FSTI_ENV_NVFS_DEVICES), "/b*");
	unsetenv("FST_NVFS_DEVICES");
	unsetenv("FST_GDS_TRY");
	assert_false(fsti_env_gds_try());
	setenv("FST_GDS_TRY", "1", 1);
	assert_true(fsti_env_gds_try());
	setenv("FST_GDS_TRY", "yes", 1);
	assert_false(fsti_env_gds_try());
	unsetenv("FST_GDS_TRY");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_required_optional_older),
		cmocka_unit_test(test_override_wins),
		cmocka_unit_test(test_missing_symbol),
		cmocka_unit_test(test_env),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
