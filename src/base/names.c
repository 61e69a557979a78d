/* names.c - an open-addressing hash table from tensor name to index. The
 * table stores indices only; names stay where their owner keeps them. */
#include "base.h"

#include <string.h>

static uint64_t hash_name(const char *s)
{
	/* FNV-1a: short names, no adversary we must resist beyond linear
	 * probing's worst case on a 100 MB header. */
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h ^ (h >> 29);
}

int fsti_names_build(fsti_names *t, size_t count, fsti_name_of name_of, const void *ctx,
		     size_t *dup_a, size_t *dup_b)
{
	size_t slots = 16;
	while (slots < count * 2)
		slots *= 2;
	t->mask = slots - 1;
	t->slots = fsti_calloc(slots, sizeof *t->slots);
	if (!t->slots)
		return FST_ENOMEM;
	for (size_t i = 0; i < count; i++) {
		const char *name = name_of(ctx, i);
		size_t s = hash_name(name) & t->mask;
		while (t->slots[s]) {
			size_t j = t->slots[s] - 1;
			if (!strcmp(name_of(ctx, j), name)) {
				*dup_a = j;
				*dup_b = i;
				return 1;
			}
			s = (s + 1) & t->mask;
		}
		t->slots[s] = (uint32_t)(i + 1);
	}
	return 0;
}

long fsti_names_find(const fsti_names *t, const char *name, fsti_name_of name_of,
		     const void *ctx)
{
	if (!t->slots || !name)
		return -1;
	size_t s = hash_name(name) & t->mask;
	while (t->slots[s]) {
		size_t j = t->slots[s] - 1;
		if (!strcmp(name_of(ctx, j), name))
			return (long)j;
		s = (s + 1) & t->mask;
	}
	return -1;
}

void fsti_names_free(fsti_names *t)
{
	fsti_free(t->slots);
	t->slots = NULL;
}
