/* Description: a plan claimed from both ends (load/ends.c), the queue the
 * workers and the disk helpers of a warm load share. Alone: no chunks gives
 * none from either end; one chunk goes to whichever end asks first; the
 * front hands out 0, 1, 2 ... and the back n-1, n-2 ... until they meet,
 * each chunk once, the count left shrinking by one a claim and the front's
 * count growing by one a front claim, then both ends
 * give none. At once: 4 threads at the front and 4 at the back, and 8 at
 * the back alone, over 200,000 chunks: every chunk claimed exactly once,
 * each front thread's chunks rising and each back thread's falling. */
#include "helpers.h"
#include "engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void test_alone(void **state)
{
	(void)state;
	fsti_ends e;
	fsti_ends_init(&e, 0);
	assert_int_equal(fsti_ends_left(&e), 0);
	assert_true(fsti_ends_front(&e) == SIZE_MAX);
	assert_true(fsti_ends_back(&e) == SIZE_MAX);

	fsti_ends_init(&e, 1);
	assert_int_equal(fsti_ends_back(&e), 0);
	assert_true(fsti_ends_front(&e) == SIZE_MAX);
	assert_true(fsti_ends_back(&e) == SIZE_MAX);

	/* every split of 7 chunks between the ends: front k, back the rest */
	for (size_t k = 0; k <= 7; k++) {
		fsti_ends_init(&e, 7);
		bool seen[7] = {0};
		for (size_t i = 0; i < k; i++) {
			assert_int_equal(fsti_ends_left(&e), 7 - i);
			assert_int_equal(fsti_ends_front_taken(&e), i);
			size_t c = fsti_ends_front(&e);
			assert_int_equal(c, i);
			seen[c] = true;
		}
		for (size_t i = 0; i < 7 - k; i++) {
			assert_int_equal(fsti_ends_left(&e), 7 - k - i);
			assert_int_equal(fsti_ends_front_taken(&e), k);
			size_t c = fsti_ends_back(&e);
			assert_int_equal(c, 6 - i);
			assert_false(seen[c]);
			seen[c] = true;
		}
		assert_int_equal(fsti_ends_left(&e), 0);
		assert_true(fsti_ends_front(&e) == SIZE_MAX);
		assert_true(fsti_ends_back(&e) == SIZE_MAX);
		for (size_t i = 0; i < 7; i++)
			assert_true(seen[i]);
	}

	/* alternating, the two meet in the middle */
	fsti_ends_init(&e, 5);
	assert_int_equal(fsti_ends_front(&e), 0);
	assert_int_equal(fsti_ends_back(&e), 4);
	assert_int_equal(fsti_ends_front(&e), 1);
	assert_int_equal(fsti_ends_back(&e), 3);
	assert_int_equal(fsti_ends_back(&e), 2);
	assert_true(fsti_ends_front(&e) == SIZE_MAX);

	/* the largest count the word holds */
	fsti_ends_init(&e, UINT32_MAX - 1);
	assert_int_equal(fsti_ends_back(&e), UINT32_MAX - 2);
	assert_int_equal(fsti_ends_front(&e), 0);
	assert_int_equal(fsti_ends_left(&e), UINT32_MAX - 3);
}

#define N 200000

struct claimer {
	fsti_ends *e;
	atomic_uint *taken;
	bool back;
	char problem[128];
};

static void *claim_all(void *arg)
{
	struct claimer *c = arg;
	size_t last = c->back ? SIZE_MAX : 0, n = 0;
	for (size_t i; (i = c->back ? fsti_ends_back(c->e) : fsti_ends_front(c->e)) != SIZE_MAX;
	     n++) {
		if (i >= N) {
			snprintf(c->problem, sizeof c->problem, "chunk %zu of %d", i, N);
			break;
		}
		if (n && (c->back ? i >= last : i <= last)) {
			snprintf(c->problem, sizeof c->problem, "%s: %zu after %zu",
				 c->back ? "back" : "front", i, last);
			break;
		}
		last = i;
		atomic_fetch_add(&c->taken[i], 1);
	}
	return NULL;
}

static void race(unsigned fronts, unsigned backs)
{
	fsti_ends e;
	fsti_ends_init(&e, N);
	atomic_uint *taken = calloc(N, sizeof *taken);
	assert_non_null(taken);
	unsigned n = fronts + backs;
	pthread_t t[16];
	struct claimer c[16];
	assert_true(n <= 16);
	for (unsigned k = 0; k < n; k++) {
		c[k] = (struct claimer){&e, taken, k >= fronts, ""};
		assert_int_equal(pthread_create(&t[k], NULL, claim_all, &c[k]), 0);
	}
	for (unsigned k = 0; k < n; k++) {
		pthread_join(t[k], NULL);
		if (c[k].problem[0])
			fail_msg("%u fronts, %u backs: %s", fronts, backs, c[k].problem);
	}
	for (size_t i = 0; i < N; i++)
		if (atomic_load(&taken[i]) != 1)
			fail_msg("%u fronts, %u backs: chunk %zu taken %u times", fronts, backs, i,
				 atomic_load(&taken[i]));
	assert_int_equal(fsti_ends_left(&e), 0);
	free(taken);
}

static void test_at_once(void **state)
{
	(void)state;
	race(4, 4);
	race(0, 8);
	race(8, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_alone),
		cmocka_unit_test(test_at_once),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
