/* Description: the CLI's helpers (tools/fst/util.c) apart from the command:
 * JSON strings that keep every path (UTF-8 checked exactly as jansson does,
 * invalid bytes as U+FFFD plus a hex copy), checked JSON building, the
 * progress bar's line, integers of digits only, sizes of digits, a
 * fraction and a unit only, and text made safe for a terminal (control
 * characters as \xNN). */
#include "helpers.h"
#include "cli.h"

#include <stdlib.h>
#include <string.h>

/* jansson's own answer: does it take s as a string? */
static bool jansson_takes(const char *s)
{
	json_t *j = json_string(s);
	json_decref(j);
	return j != NULL;
}

static void test_utf8_agrees_with_jansson(void **state)
{
	(void)state;
	static const char *const cases[] = {
		"", "plain", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "x\xff",
		"\xc0\x80",          /* overlong NUL */
		"\xc1\xbf",          /* overlong */
		"\xe0\x80\xaf",      /* overlong */
		"\xed\xa0\x80",      /* surrogate U+D800 */
		"\xed\xbf\xbf",      /* surrogate U+DFFF */
		"\xef\xbf\xbf",      /* U+FFFF: allowed */
		"\xf4\x8f\xbf\xbf",  /* U+10FFFF */
		"\xf4\x90\x80\x80",  /* above U+10FFFF */
		"\xf5\x80\x80\x80", "\xe2\x82", "\x80", "a\xc3", "\xf0\x9f\x98",
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		assert_int_equal(cli_utf8_valid(cases[i]), jansson_takes(cases[i]));
	/* random short strings, biased to the bytes that matter */
	static const unsigned char pick[] = {0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf,
					     0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xed, 0xef, 0xf0,
					     0xf4, 0xf5, 0xff};
	srand(20240611);
	for (int n = 0; n < 200000; n++) {
		char s[8];
		size_t len = (size_t)(rand() % 7);
		for (size_t k = 0; k < len; k++)
			s[k] = (char)pick[rand() % sizeof pick];
		s[len] = '\0';
		if (cli_utf8_valid(s) != jansson_takes(s))
			fail_msg("disagree on case %d", n);
	}
}

static void test_text_replaces_each_bad_byte(void **state)
{
	(void)state;
	json_t *j = cli_json_text("a\xff" "b\xc3\xa9\xed\xa0\x80");
	assert_non_null(j);
	/* three bad bytes of the surrogate, each one U+FFFD */
	assert_string_equal(json_string_value(j),
			    "a\xef\xbf\xbd" "b\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
	json_decref(j);
	j = cli_json_text("ok");
	assert_string_equal(json_string_value(j), "ok");
	json_decref(j);
	assert_null(cli_json_text(NULL));
}

static void test_put_path(void **state)
{
	(void)state;
	json_t *o = json_object();
	assert_true(cli_json_put_path(o, "path", "d/x\xff.st"));
	assert_string_equal(json_string_value(json_object_get(o, "path")), "d/x\xef\xbf\xbd.st");
	assert_string_equal(json_string_value(json_object_get(o, "path_bytes")),
			    "642f78ff2e7374");
	assert_true(cli_json_put_path(o, "other", "fine"));
	assert_null(json_object_get(o, "other_bytes"));
	assert_int_equal(json_object_size(o), 3);
	json_decref(o);
}

static void test_put_and_push_report_failure(void **state)
{
	(void)state;
	json_t *o = json_object(), *a = json_array();
	assert_false(cli_json_put(o, "k", NULL));
	assert_false(cli_json_put(o, "bad\xff", json_true())); /* key not UTF-8 */
	assert_false(cli_json_put(NULL, "k", json_true()));
	assert_false(cli_json_push(a, NULL));
	assert_false(cli_json_push(NULL, json_true()));
	assert_true(cli_json_put(o, "k", json_true()));
	assert_true(cli_json_push(a, json_true()));
	assert_int_equal(json_object_size(o), 1);
	assert_int_equal(json_array_size(a), 1);
	json_decref(o);
	json_decref(a);
}

/* The visible part of a bar line: after its leading "\r". */
static size_t visible(const char *line)
{
	assert_int_equal(line[0], '\r');
	return strlen(line) - 1;
}

static void test_progress_line_covers_a_longer_one(void **state)
{
	(void)state;
	size_t width = 0;
	char a[256], b[256], c[256];
	/* 1000 KiB of 4 MiB in 10 s: "1000.00 KiB", 31.0 s left */
	cli_progress_line(a, sizeof a, 1000 << 10, 4 << 20, 10.0, &width);
	assert_non_null(strstr(a, "] 1000.00 KiB / 4.00 MiB  0.00 GB/s  31.0 s left"));
	assert_int_equal(width, visible(a));
	/* then 2 MiB, fast: a shorter text, padded to cover the first */
	cli_progress_line(b, sizeof b, 2 << 20, 4 << 20, 0.001, &width);
	assert_non_null(strstr(b, "] 2.00 MiB / 4.00 MiB  2.10 GB/s  0.0 s left"));
	assert_int_equal(visible(b), visible(a));
	assert_int_equal(b[strlen(b) - 1], ' ');
	/* the widest line so far is remembered, not the last one */
	cli_progress_line(c, sizeof c, 3 << 20, 4 << 20, 0.001, &width);
	assert_int_equal(visible(c), visible(a));
	/* a longer line grows the width */
	size_t before = width;
	cli_progress_line(c, sizeof c, 1000 << 10, 1ull << 40, 100000.0, &width);
	assert_true(width > before);
	assert_int_equal(visible(c), width);
	/* the bar itself: 30 cells, filled in proportion */
	width = 0;
	cli_progress_line(c, sizeof c, 1, 2, 1.0, &width);
	assert_memory_equal(c, "\r[###############               ]", 33);
	/* a small buffer is cut, never overrun */
	char tiny[8];
	width = 100;
	assert_int_equal(cli_progress_line(tiny, sizeof tiny, 1, 2, 1.0, &width), 7);
	assert_int_equal(strlen(tiny), 7);
}

static void test_parse_uint_takes_digits_only(void **state)
{
	(void)state;
	uint64_t v = 7;
	assert_true(cli_parse_uint("0", 10, &v) && v == 0);
	assert_true(cli_parse_uint("18446744073709551615", UINT64_MAX, &v) && v == UINT64_MAX);
	/* strtoull skips the space and negates: " -1" was 2^64 - 1 */
	static const char *const bad[] = {"", " -1", "-1", "+1", " 5", "\t7", "5x", "0x10",
					  "18446744073709551616", "11"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		v = 7;
		if (cli_parse_uint(bad[i], 10, &v))
			fail_msg("\"%s\" taken as %llu", bad[i], (unsigned long long)v);
		assert_int_equal(v, 7);
	}
	assert_false(cli_parse_uint(NULL, 10, &v));
}

/* SIZE is digits, a fraction at most and a unit (cli.md): strtod's other
 * forms (spaces, signs, exponents, hex, inf, nan) were once taken. */
static void test_parse_size_grammar(void **state)
{
	(void)state;
	static const struct {
		const char *s;
		uint64_t want;
	} good[] = {
		{"4096", 4096},          {"64K", 65536},        {"64k", 65536},
		{"1.5G", 3ull << 29},    {"100MB", 100000000},  {"512MiB", 512ull << 20},
		{"7B", 7},               {"0", 0},              {"2TB", 2000000000000ull},
	};
	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
		uint64_t v = 1;
		if (!cli_parse_size(good[i].s, &v) || v != good[i].want)
			fail_msg("\"%s\": %llu", good[i].s, (unsigned long long)v);
	}
	static const char *const bad[] = {
		"", " 64K", "64K ", "+64K", "-1", "1e6", "0x1p20", "0x10", "inf", "nan", "1.",
		".5G", "1..5", "1.5.5", "1.3B", "64KIB", "64 K", "1_000", "9223372036854775808",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		uint64_t v = 1;
		if (cli_parse_size(bad[i], &v))
			fail_msg("\"%s\" taken as %llu", bad[i], (unsigned long long)v);
	}
}

static void test_printable_escapes_controls(void **state)
{
	(void)state;
	static const char *const cases[][2] = {
		{"model.layers.0.weight", "model.layers.0.weight"},
		{"", ""},
		{"\x1b[2J\x1b[1;31mFAKE\nline\x7f", "\\x1b[2J\\x1b[1;31mFAKE\\x0aline\\x7f"},
		{"\x01\x1f ~", "\\x01\\x1f ~"},
		{"caf\xc3\xa9 \xff", "caf\xc3\xa9 \xff"}, /* not ASCII: as it is */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *got = cli_printable(cases[i][0]);
		assert_non_null(got);
		assert_string_equal(got, cases[i][1]);
		free(got);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_utf8_agrees_with_jansson),
		cmocka_unit_test(test_text_replaces_each_bad_byte),
		cmocka_unit_test(test_put_path),
		cmocka_unit_test(test_put_and_push_report_failure),
		cmocka_unit_test(test_progress_line_covers_a_longer_one),
		cmocka_unit_test(test_parse_uint_takes_digits_only),
		cmocka_unit_test(test_parse_size_grammar),
		cmocka_unit_test(test_printable_escapes_controls),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
