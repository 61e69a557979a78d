/* names.c - an open-addressing hash table from tensor name to index. The
 * table stores indices only; names stay where their owner keeps them.
 *
 * A header is input from anyone, and a table whose names all land in one
 * probe run costs a quadratic build (100,000 crafted names took 23 s with
 * a fixed hash): names are hashed with SipHash-1-3 under a key drawn at
 * random once per process, so nobody can choose colliding names. */
#include "base.h"

#include <pthread.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static uint64_t key0, key1;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void draw_key(void)
{
	uint64_t k[2];
	if (getrandom(k, sizeof k, GRND_NONBLOCK) != (ssize_t)sizeof k) {
		/* no entropy yet (early boot): what differs between processes */
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		k[0] = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
		k[1] = (uint64_t)getpid() * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)(uintptr_t)&ts;
	}
	key0 = k[0];
	key1 = k[1];
}

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND(v0, v1, v2, v3)                                                           \
	do {                                                                               \
		v0 += v1;                                                                  \
		v1 = ROTL(v1, 13);                                                         \
		v1 ^= v0;                                                                  \
		v0 = ROTL(v0, 32);                                                         \
		v2 += v3;                                                                  \
		v3 = ROTL(v3, 16);                                                         \
		v3 ^= v2;                                                                  \
		v0 += v3;                                                                  \
		v3 = ROTL(v3, 21);                                                         \
		v3 ^= v0;                                                                  \
		v2 += v1;                                                                  \
		v1 = ROTL(v1, 17);                                                         \
		v1 ^= v2;                                                                  \
		v2 = ROTL(v2, 32);                                                         \
	} while (0)

/* SipHash with c compression and d finalization rounds, over len bytes
 * under the key (k0, k1), its 8-byte words read little-endian. */
uint64_t fsti_siphash(int c, int d, uint64_t k0, uint64_t k1, const void *data, size_t len)
{
	const unsigned char *p = data;
	uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
	uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
	size_t whole = len - len % 8;
	for (size_t i = 0; i < whole; i += 8) {
		uint64_t m = 0;
		for (int b = 7; b >= 0; b--)
			m = m << 8 | p[i + (size_t)b];
		v3 ^= m;
		for (int r = 0; r < c; r++)
			SIPROUND(v0, v1, v2, v3);
		v0 ^= m;
	}
	uint64_t last = (uint64_t)len << 56;
	for (size_t b = 0; b < len % 8; b++)
		last |= (uint64_t)p[whole + b] << (8 * b);
	v3 ^= last;
	for (int r = 0; r < c; r++)
		SIPROUND(v0, v1, v2, v3);
	v0 ^= last;
	v2 ^= 0xff;
	for (int r = 0; r < d; r++)
		SIPROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

static size_t home(const fsti_names *t, const char *name)
{
	pthread_once(&key_once, draw_key);
	return (size_t)fsti_siphash(1, 3, key0, key1, name, strlen(name)) & t->mask;
}

/* Place index at name's first free slot; the table has room. Returns 1 with
 * *dup when a name equal to it is there already. */
static int place(fsti_names *t, size_t index, const char *name, fsti_name_of name_of,
		 const void *ctx, size_t *dup)
{
	size_t s = home(t, name);
	while (t->slots[s]) {
		size_t j = t->slots[s] - 1;
		if (!strcmp(name_of(ctx, j), name)) {
			*dup = j;
			return 1;
		}
		s = (s + 1) & t->mask;
	}
	t->slots[s] = (uint32_t)(index + 1);
	t->count++;
	return 0;
}

/* At least twice as many slots as want names, the names there moved over. */
static int reserve(fsti_names *t, size_t want, fsti_name_of name_of, const void *ctx)
{
	size_t slots = t->slots ? t->mask + 1 : 0;
	if (slots >= 16 && want <= slots / 2)
		return 0;
	size_t grown = slots ? slots : 16;
	while (grown < want * 2)
		grown *= 2;
	fsti_names next = {fsti_calloc(grown, sizeof *next.slots), grown - 1, 0};
	if (!next.slots)
		return FST_ENOMEM;
	size_t unused;
	for (size_t s = 0; s < slots; s++)
		if (t->slots[s])
			place(&next, t->slots[s] - 1, name_of(ctx, t->slots[s] - 1), name_of, ctx,
			      &unused);
	fsti_free(t->slots);
	*t = next;
	return 0;
}

int fsti_names_insert(fsti_names *t, size_t index, fsti_name_of name_of, const void *ctx,
		      size_t *dup)
{
	if (reserve(t, t->count + 1, name_of, ctx))
		return FST_ENOMEM;
	return place(t, index, name_of(ctx, index), name_of, ctx, dup);
}

int fsti_names_build(fsti_names *t, size_t count, fsti_name_of name_of, const void *ctx,
		     size_t *dup_a, size_t *dup_b)
{
	memset(t, 0, sizeof *t);
	if (reserve(t, count, name_of, ctx))
		return FST_ENOMEM;
	for (size_t i = 0; i < count; i++)
		if (place(t, i, name_of(ctx, i), name_of, ctx, dup_a)) {
			*dup_b = i;
			return 1;
		}
	return 0;
}

long fsti_names_find(const fsti_names *t, const char *name, fsti_name_of name_of,
		     const void *ctx)
{
	if (!t->slots || !name)
		return -1;
	size_t s = home(t, name);
	while (t->slots[s]) {
		size_t j = t->slots[s] - 1;
		if (!strcmp(name_of(ctx, j), name))
			return (long)j;
		s = (s + 1) & t->mask;
	}
	return -1;
}

size_t fsti_names_longest_probe(const fsti_names *t, fsti_name_of name_of, const void *ctx)
{
	size_t longest = 0;
	for (size_t s = 0; t->slots && s <= t->mask; s++)
		if (t->slots[s]) {
			size_t far = (s - home(t, name_of(ctx, t->slots[s] - 1))) & t->mask;
			longest = far > longest ? far : longest;
		}
	return longest;
}

void fsti_names_free(fsti_names *t)
{
	fsti_free(t->slots);
	memset(t, 0, sizeof *t);
}
