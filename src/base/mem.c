/* mem.c - every host allocation of libfst goes through here, so tests can
 * inject allocation failures ("alloc" fault site) and count live blocks. */
#include "base.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_long live;

void *fsti_malloc(size_t size)
{
	if (fsti_fault("alloc"))
		return NULL;
	void *p = malloc(size ? size : 1);
	if (p)
		atomic_fetch_add(&live, 1);
	return p;
}

void *fsti_calloc(size_t n, size_t size)
{
	if (fsti_fault("alloc"))
		return NULL;
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (p)
		atomic_fetch_add(&live, 1);
	return p;
}

void *fsti_realloc(void *old, size_t size)
{
	if (fsti_fault("alloc"))
		return NULL;
	void *p = realloc(old, size ? size : 1);
	if (p && !old)
		atomic_fetch_add(&live, 1);
	return p;
}

void *fsti_aligned_alloc(size_t align, size_t size)
{
	if (fsti_fault("alloc"))
		return NULL;
	void *p = NULL;
	if (posix_memalign(&p, align, size ? size : 1))
		return NULL;
	atomic_fetch_add(&live, 1);
	return p;
}

char *fsti_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = fsti_malloc(n);
	if (p)
		memcpy(p, s, n);
	return p;
}

void fsti_free(void *p)
{
	if (!p)
		return;
	atomic_fetch_sub(&live, 1);
	free(p);
}

long fsti_live_allocations(void)
{
	return atomic_load(&live);
}
