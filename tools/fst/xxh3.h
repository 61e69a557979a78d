/*
 * xxh3.h - XXH3-128 for the CLI, in the fastest form this CPU runs
 * (xxh3_kernel.c), and the block tree fst uses to check loads on the fly.
 */
#ifndef FST_CLI_XXH3_H
#define FST_CLI_XXH3_H

#include <stddef.h>
#include <stdint.h>

/* One build of XXH3-128. Digests are 16 bytes, canonical (big-endian). */
struct cli_xxh3 {
	const char *name; /* generic, avx2 or avx512 */
	void (*hash128)(const void *p, size_t n, uint64_t seed, unsigned char out[16]);
	void *(*stream_new)(void); /* NULL when out of memory */
	void (*stream_update)(void *st, const void *p, size_t n);
	void (*stream_digest)(void *st, unsigned char out[16]);
	void (*stream_free)(void *st);
};

extern const struct cli_xxh3 cli_xxh3_generic;
#ifdef FST_XXH3_X86
extern const struct cli_xxh3 cli_xxh3_avx2, cli_xxh3_avx512;
#endif

/* The fastest kernel the CPU runs, or the one FST_HASH_KERNEL names
 * (generic, avx2, avx512; NULL with *why set when it cannot run here). */
const struct cli_xxh3 *cli_xxh3(const char **why);

/*
 * The tree digest of a tensor, "xxh3-128-tree" with blocks of B bytes: each
 * block (the last may be shorter) is hashed with XXH3-128; a tensor of at
 * most one block has that block's digest (its plain XXH3-128), a longer one
 * the XXH3-128, seeded with its byte count, of its block digests in order.
 * Blocks can be hashed in any order, by any thread, while they are still
 * in the CPU's caches.
 */
#define CLI_TREE_BLOCK (256u << 10) /* the engine's default landed_block */
static inline uint64_t cli_tree_blocks(uint64_t nbytes, uint64_t block)
{
	return nbytes ? (nbytes + block - 1) / block : 1;
}
void cli_tree_root(const struct cli_xxh3 *x, const unsigned char (*blocks)[16], uint64_t nblocks,
		   uint64_t nbytes, unsigned char out[16]);

#endif
