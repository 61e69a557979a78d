/*
 * ends.c - a plan's chunks handed out from both ends: the workers of a load
 * take them from the front in order, disk helpers from the back, each chunk
 * exactly once, until the two meet (engine.c, "Disk helpers").
 *
 * Both ends live in one 64-bit word, so that one compare-and-swap claims a
 * chunk and sees the other end as it is: the next front chunk in the low 32
 * bits, one past the last unclaimed chunk in the high 32. A chunk is
 * claimed only while the front is below the back, and each claim moves one
 * end by one toward the other.
 */
#include "engine.h"

#include <stdint.h>

void fsti_ends_init(fsti_ends *e, size_t n)
{
	atomic_init(e, (uint64_t)n << 32);
}

/* The front's next chunk (moving the low half up by one) or the back's
 * (moving the high half down by one), while the two have not met. */
static size_t claim(fsti_ends *e, bool back)
{
	const uint64_t step = back ? UINT64_MAX << 32 : 1; /* -(1 << 32) or +1 */
	uint64_t v = atomic_load(e);
	for (;;) {
		uint64_t lo = v & UINT32_MAX, hi = v >> 32;
		if (lo >= hi)
			return SIZE_MAX;
		if (atomic_compare_exchange_weak(e, &v, v + step))
			return (size_t)(back ? hi - 1 : lo);
	}
}

size_t fsti_ends_front(fsti_ends *e)
{
	return claim(e, false);
}

size_t fsti_ends_back(fsti_ends *e)
{
	return claim(e, true);
}

size_t fsti_ends_left(fsti_ends *e)
{
	uint64_t v = atomic_load(e);
	uint64_t lo = v & UINT32_MAX, hi = v >> 32;
	return lo < hi ? (size_t)(hi - lo) : 0;
}

size_t fsti_ends_front_taken(fsti_ends *e)
{
	return (size_t)(atomic_load(e) & UINT32_MAX);
}
