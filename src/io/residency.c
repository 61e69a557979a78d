/*
 * residency.c - how much of a checkpoint the page cache holds, sampled with
 * mincore, for the choice of read path and for messages.
 */
#include "io.h"

#include <sys/mman.h>
#include <unistd.h>

double fsti_cached_fraction(const fst_checkpoint *ck)
{
	/* Probe up to 64 windows of 16 pages per file with mincore. */
	const long page = sysconf(_SC_PAGESIZE);
	uint64_t resident = 0, probed = 0;
	for (size_t i = 0; i < fst_checkpoint_file_count(ck); i++) {
		const fst_file *f = fst_checkpoint_file(ck, i);
		uint64_t size = fst_file_size(f);
		if (fst_file_fd(f) < 0 || size == 0)
			continue;
		void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fst_file_fd(f), 0);
		if (map == MAP_FAILED)
			return -1;
		uint64_t pages = (size + (uint64_t)page - 1) / (uint64_t)page;
		unsigned windows = pages < 64 * 16 ? 1 : 64;
		uint64_t step = pages / windows;
		for (unsigned w = 0; w < windows; w++) {
			uint64_t first = w * step;
			uint64_t n = FSTI_MIN(pages - first, (uint64_t)(windows == 1 ? pages : 16));
			unsigned char vec[1024];
			for (uint64_t done = 0; done < n;) {
				uint64_t k = FSTI_MIN(n - done, (uint64_t)sizeof vec);
				if (mincore((char *)map + (first + done) * (uint64_t)page,
					    (size_t)(k * (uint64_t)page), vec)) {
					munmap(map, size);
					return -1;
				}
				for (uint64_t j = 0; j < k; j++)
					resident += vec[j] & 1;
				probed += k;
				done += k;
			}
		}
		munmap(map, size);
	}
	return probed ? (double)resident / (double)probed : 1.0;
}
