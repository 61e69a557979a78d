/* helpers.h - shared by the cmocka unit tests (helpers.c, in fst_testlib). */
#ifndef FST_TEST_HELPERS_H
#define FST_TEST_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fst.h"

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
