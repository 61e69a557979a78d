/* Description: host memory for destinations and staging (base/host_mem.c).
 * fsti_host_populate faults every page of a fresh block in, on one thread
 * or many, for lengths that are and are not whole huge pages, and leaves
 * every byte zero; a thread count of 0 still populates. */
#include "base.h"
#include "helpers.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The share of [p, p+len)'s pages resident, in thousandths. */
static long resident(void *p, uint64_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	size_t pages = (size_t)((len + (uint64_t)page - 1) / (uint64_t)page);
	unsigned char *v = malloc(pages);
	assert_non_null(v);
	assert_int_equal(mincore(p, (size_t)len, v), 0);
	long in = 0;
	for (size_t i = 0; i < pages; i++)
		in += v[i] & 1;
	free(v);
	return in * 1000 / (long)pages;
}

static void test_populate(void **state)
{
	(void)state;
	static const uint64_t sizes[] = {4096, 2u << 20, (5u << 20) + 4096, 64u << 20};
	static const unsigned threads[] = {0, 1, 3, 16, 200};
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
		for (size_t k = 0; k < sizeof threads / sizeof *threads; k++) {
			void *p;
			uint64_t map_len;
			fst_error err;
			assert_int_equal(fsti_host_alloc(sizes[i], 0, false, &p, &map_len, &err), 0);
			assert_int_equal(resident(p, map_len), 0); /* nothing touched yet */
			/* the caller's length, not the mapping's: its last page counts */
			fsti_host_populate(p, sizes[i], threads[k]);
			uint64_t pages_len = (sizes[i] + 4095) & ~(uint64_t)4095;
			if (resident(p, pages_len) != 1000)
				fail_msg("%llu bytes on %u threads: %ld/1000 of the pages resident",
					 (unsigned long long)sizes[i], threads[k],
					 resident(p, pages_len));
			for (uint64_t at = 0; at < sizes[i]; at++)
				if (((const char *)p)[at])
					fail_msg("byte %llu is not zero", (unsigned long long)at);
			fsti_host_free(p, map_len);
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_populate),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
