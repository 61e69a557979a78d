/*
 * xxh3_kernel.c - XXH3-128 compiled for one instruction set.
 *
 * CMake builds this file once per kernel (KERNEL = generic, avx2, avx512),
 * each time with that kernel's -m flag, and xxhash picks its vector code from
 * the flags. hash.c chooses the fastest kernel the CPU runs, at run time:
 * AVX2 hashes cache-hot bytes about 2.7 times as fast as the SSE2 baseline
 * on the dev machine, which is what lets `fst load --check` keep up.
 * Everything xxhash-specific stays in here; callers see struct cli_xxh3.
 */
#include "xxh3.h"

#include <stdlib.h>

/* Header-only mode: the loops are compiled here, with this TU's flags. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#ifndef KERNEL
#error "build with -DKERNEL=generic|avx2|avx512"
#endif
/* On aarch64 only the generic kernel is built (CMakeLists.txt), no x86 flag
 * reaches it, and xxhash's baseline there is NEON: make sure it stays so. */
#if defined(__aarch64__) && XXH_VECTOR != XXH_NEON
#error "the aarch64 XXH3 build should use xxhash's NEON code"
#endif
#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define STR2(a) #a
#define STR(a) STR2(a)

static void canonical(XXH128_hash_t h, unsigned char out[16])
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, h);
	for (int i = 0; i < 16; i++)
		out[i] = c.digest[i];
}

static void hash128(const void *p, size_t n, uint64_t seed, unsigned char out[16])
{
	canonical(XXH3_128bits_withSeed(p, n, seed), out);
}

static void *stream_new(void)
{
	XXH3_state_t *st = XXH3_createState();
	if (st)
		XXH3_128bits_reset(st);
	return st;
}

static void stream_update(void *st, const void *p, size_t n)
{
	XXH3_128bits_update(st, p, n);
}

static void stream_digest(void *st, unsigned char out[16])
{
	canonical(XXH3_128bits_digest(st), out);
}

static void stream_free(void *st)
{
	XXH3_freeState(st);
}

const struct cli_xxh3 CAT(cli_xxh3, KERNEL) = {
	.name = STR(KERNEL),
	.hash128 = hash128,
	.stream_new = stream_new,
	.stream_update = stream_update,
	.stream_digest = stream_digest,
	.stream_free = stream_free,
};
