/* helpers.h - shared by the cmocka unit tests (helpers.c, in fst_testlib). */
#ifndef FST_TEST_HELPERS_H
#define FST_TEST_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fst.h"

/* cmocka 1.1 prints a group teardown's failure (the leak checks at the end
 * of the cuda and gds tests) and still exits 0, so ctest passed programs
 * whose teardown found memory left. Every group run through these macros
 * exits nonzero then too. */
int test_run_group(const char *name, const struct CMUnitTest *tests, size_t n,
		   CMFixtureFunction setup, CMFixtureFunction teardown);
#undef cmocka_run_group_tests
#define cmocka_run_group_tests(tests, setup, teardown) \
	test_run_group(#tests, tests, sizeof(tests) / sizeof((tests)[0]), setup, teardown)
#undef cmocka_run_group_tests_name
#define cmocka_run_group_tests_name(name, tests, setup, teardown) \
	test_run_group(name, tests, sizeof(tests) / sizeof((tests)[0]), setup, teardown)

/* A fresh temporary directory for this test program (removed at exit). */
const char *test_tmpdir(void);
/* Path of a file inside test_tmpdir(); returns a static buffer per call slot. */
char *test_path(const char *name);
/* Write a safetensors file from a raw header text and data bytes. */
void write_raw(const char *path, const char *header, size_t hlen, const void *data, size_t dlen);
/* Open header+data from memory; returns the status and fills err. */
int open_raw(const char *header, const void *data, size_t dlen, fst_error *err);
/* Write text to path (a test failure if it cannot be opened). */
void write_text(const char *path, const char *text);
/* Fail the test unless msg contains sub. */
void assert_has(const char *msg, const char *sub);
/* Seconds on the monotonic clock. */
double test_now_s(void);

#endif
