/* Description: the dtype table: every dtype's name and bit size, and
 * round-tripping names. */
#include "helpers.h"

#include <string.h>

static void test_bits(void **state)
{
	(void)state;
	static const struct { const char *name; unsigned bits; } want[] = {
		{"BOOL", 8}, {"U8", 8}, {"I8", 8}, {"F8_E4M3", 8}, {"F8_E5M2", 8},
		{"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
		{"U16", 16}, {"F16", 16}, {"BF16", 16}, {"I32", 32}, {"U32", 32}, {"F32", 32},
		{"I64", 64}, {"U64", 64}, {"F64", 64}, {"C64", 64}, {"F4", 4}, {"F6_E2M3", 6},
		{"F6_E3M2", 6},
	};
	assert_int_equal(sizeof want / sizeof want[0], FST_DTYPE_COUNT - 1);
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		fst_dtype d = fst_dtype_from_name(want[i].name);
		assert_int_not_equal(d, FST_DTYPE_INVALID);
		assert_int_equal(fst_dtype_bits(d), want[i].bits);
		assert_string_equal(fst_dtype_name(d), want[i].name);
	}
}

static void test_unknown(void **state)
{
	(void)state;
	assert_int_equal(fst_dtype_from_name("f32"), FST_DTYPE_INVALID);
	assert_int_equal(fst_dtype_from_name(""), FST_DTYPE_INVALID);
	assert_int_equal(fst_dtype_from_name(NULL), FST_DTYPE_INVALID);
	assert_int_equal(fst_dtype_bits((fst_dtype)999), 0);
	assert_string_equal(fst_dtype_name((fst_dtype)999), "INVALID");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bits),
		cmocka_unit_test(test_unknown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
