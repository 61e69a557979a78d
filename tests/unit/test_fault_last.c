/* Description: fst_fault_last, the record of injected failures: none before
 * any, the site and call of the most recent, the count (persistent rules
 * too), a reset by every fst_fault_set, a cut buffer, and a count that
 * stays exact with many threads injecting at once. */
#include "helpers.h"
#include "format.h"

#include <pthread.h>
#include <string.h>

static void test_none_until_one_is_injected(void **state)
{
	(void)state;
	char buf[64] = "junk";
	assert_int_equal(fst_fault_set("read:3", NULL), 0);
	assert_int_equal(fst_fault_last(buf, sizeof buf), 0);
	assert_string_equal(buf, "");
	assert_int_equal(fsti_fault("read"), 0);
	assert_int_equal(fsti_fault("alloc"), 0); /* not armed: not counted */
	assert_int_equal(fsti_fault("read"), 0);
	assert_int_equal(fst_fault_last(NULL, 0), 0);
	assert_int_not_equal(fsti_fault("read"), 0);
	assert_int_equal(fst_fault_last(buf, sizeof buf), 1);
	assert_string_equal(buf, "site read, call 3");
	assert_int_equal(fsti_fault("read"), 0); /* only the third */
	assert_int_equal(fst_fault_last(buf, sizeof buf), 1);
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
}

static void test_the_last_of_several(void **state)
{
	(void)state;
	char buf[64];
	assert_int_equal(fst_fault_set("open:1,alloc:2+", NULL), 0);
	assert_int_not_equal(fsti_fault("open"), 0);
	assert_int_equal(fst_fault_last(buf, sizeof buf), 1);
	assert_string_equal(buf, "site open, call 1");
	assert_int_equal(fsti_fault("alloc"), 0);
	for (int i = 0; i < 5; i++)
		assert_int_not_equal(fsti_fault("alloc"), 0);
	assert_int_equal(fst_fault_last(buf, sizeof buf), 6);
	assert_string_equal(buf, "site alloc, call 6");
	/* a cut buffer is still a string */
	char tiny[8];
	assert_int_equal(fst_fault_last(tiny, sizeof tiny), 6);
	assert_string_equal(tiny, "site al");
	/* every fst_fault_set starts again */
	assert_int_equal(fst_fault_set("alloc:1", NULL), 0);
	assert_int_equal(fst_fault_last(buf, sizeof buf), 0);
	assert_string_equal(buf, "");
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
	assert_int_equal(fst_fault_last(NULL, 0), 0);
}

static void *hammer(void *arg)
{
	(void)arg;
	for (int i = 0; i < 10000; i++)
		fsti_fault("h2d");
	return NULL;
}

static void test_threads(void **state)
{
	(void)state;
	assert_int_equal(fst_fault_set("h2d:100+", NULL), 0);
	pthread_t t[8];
	for (int i = 0; i < 8; i++)
		assert_int_equal(pthread_create(&t[i], NULL, hammer, NULL), 0);
	for (int i = 0; i < 8; i++)
		pthread_join(t[i], NULL);
	char buf[64];
	assert_int_equal(fst_fault_last(buf, sizeof buf), 8 * 10000 - 99);
	assert_string_equal(buf, "site h2d, call 80000");
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_none_until_one_is_injected),
		cmocka_unit_test(test_the_last_of_several),
		cmocka_unit_test(test_threads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
