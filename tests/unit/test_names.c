/* Description: the name table (base/names.c). Its hash is SipHash-1-3 under
 * a key drawn once per process; the SipHash code is checked against the
 * published SipHash-2-4 vectors (key 00..0f, messages 00.., of 0, 7, 8 and
 * 15 bytes). 4,000 names crafted so that FNV-1a (the table's former, fixed
 * hash) sends all of them to one slot still sit close to their own slots:
 * a header cannot make the table quadratic. Every name is found, a name
 * not in it is not, a duplicate is named by both its indices, and a table
 * grown one insert at a time finds what a built one finds. */
#include "helpers.h"
#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CRAFTED 4000

static const char *name_of(const void *ctx, size_t i) { return ((char *const *)ctx)[i]; }

static void test_siphash_vectors(void **state)
{
	(void)state;
	unsigned char key[16], msg[15];
	for (int i = 0; i < 16; i++)
		key[i] = (unsigned char)i;
	for (int i = 0; i < 15; i++)
		msg[i] = (unsigned char)i;
	uint64_t k0 = 0, k1 = 0;
	for (int b = 7; b >= 0; b--) {
		k0 = k0 << 8 | key[b];
		k1 = k1 << 8 | key[8 + b];
	}
	assert_true(fsti_siphash(2, 4, k0, k1, msg, 0) == 0x726fdb47dd0e0e31ull);
	assert_true(fsti_siphash(2, 4, k0, k1, msg, 7) == 0xab0200f58b01d137ull);
	assert_true(fsti_siphash(2, 4, k0, k1, msg, 8) == 0x93f5f5799a932462ull);
	assert_true(fsti_siphash(2, 4, k0, k1, msg, 15) == 0xa129ca6149be45e5ull);
}

/* The former hash: FNV-1a with a final shift. */
static uint64_t fnv(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h ^ (h >> 29);
}

/* count names that FNV-1a sends to slot 0 of a table of 2 * count slots. */
static char **crafted(size_t count)
{
	size_t slots = 16;
	while (slots < count * 2)
		slots *= 2;
	char **names = calloc(count, sizeof *names);
	char buf[64];
	for (size_t n = 0, k = 0; n < count; k++) {
		snprintf(buf, sizeof buf, "model.layers.%zu.weight", k);
		if (fnv(buf) & (slots - 1))
			continue;
		names[n++] = strdup(buf);
	}
	return names;
}

static void free_names(char **names, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(names[i]);
	free(names);
}

static void test_crafted_names(void **state)
{
	(void)state;
	char **names = crafted(CRAFTED);
	fsti_names t;
	size_t a = 0, b = 0;
	assert_int_equal(fsti_names_build(&t, CRAFTED, name_of, names, &a, &b), 0);
	size_t longest = fsti_names_longest_probe(&t, name_of, names);
	print_message("%d names FNV-1a puts in one slot: the longest probe is %zu slots\n",
		      CRAFTED, longest);
	/* random placement at half load: a few dozen at most; one slot for
	 * all of them: thousands */
	assert_true(longest < 100);
	for (size_t i = 0; i < CRAFTED; i++)
		assert_int_equal(fsti_names_find(&t, names[i], name_of, names), (long)i);
	assert_int_equal(fsti_names_find(&t, "model.layers.x.weight", name_of, names), -1);
	assert_int_equal(fsti_names_find(&t, NULL, name_of, names), -1);
	fsti_names_free(&t);

	/* a duplicate, named by both indices */
	char *kept = names[CRAFTED - 1];
	names[CRAFTED - 1] = names[17];
	assert_int_equal(fsti_names_build(&t, CRAFTED, name_of, names, &a, &b), 1);
	assert_int_equal(a, 17);
	assert_int_equal(b, CRAFTED - 1);
	fsti_names_free(&t);
	names[CRAFTED - 1] = kept;
	free_names(names, CRAFTED);
}

static void test_inserted_one_at_a_time(void **state)
{
	(void)state;
	char **names = crafted(CRAFTED);
	fsti_names t;
	memset(&t, 0, sizeof t);
	assert_int_equal(fsti_names_find(&t, names[0], name_of, names), -1);
	size_t dup = 0;
	for (size_t i = 0; i < CRAFTED; i++) {
		assert_int_equal(fsti_names_insert(&t, i, name_of, names, &dup), 0);
		assert_int_equal(t.count, i + 1);
		assert_true(t.mask + 1 >= 2 * t.count);
	}
	assert_true(fsti_names_longest_probe(&t, name_of, names) < 100);
	for (size_t i = 0; i < CRAFTED; i++)
		assert_int_equal(fsti_names_find(&t, names[i], name_of, names), (long)i);
	/* the same name again, under another index */
	names = realloc(names, (CRAFTED + 1) * sizeof *names);
	names[CRAFTED] = strdup(names[123]);
	assert_int_equal(fsti_names_insert(&t, CRAFTED, name_of, names, &dup), 1);
	assert_int_equal(dup, 123);
	assert_int_equal(t.count, CRAFTED);
	fsti_names_free(&t);
	free_names(names, CRAFTED + 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_siphash_vectors),
		cmocka_unit_test(test_crafted_names),
		cmocka_unit_test(test_inserted_one_at_a_time),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
