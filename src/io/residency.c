/*
 * residency.c - how much of a checkpoint the page cache holds, sampled, for
 * the choice of read path and for messages.
 *
 * mincore(2) on a mapping of the file tells it without touching the disk,
 * but Linux (since 5.2) answers it only for files the caller owns or could
 * open for writing, or with CAP_FOWNER, and reports every page resident for
 * the others: the usual case of a read-only model store shared by a
 * service user, whose cold files would then look warm. For those files the
 * sample is taken with preadv2(RWF_NOWAIT), which reads only what the page
 * cache holds and fails with EAGAIN where it would wait for the disk. A
 * miss starts the read of the pages asked for (on a descriptor of its own
 * advised POSIX_FADV_RANDOM, so no more than those: windows of 2 pages,
 * 512 KiB per file; a small file probed whole is read whole); the load that
 * follows reads them anyway. So that a later sample
 * does not find the pages an earlier one brought in, each window is put at
 * a random place in its stretch of the file.
 *
 * Dependencies: base, format (the files' descriptors), direct.c (a
 * descriptor of its own).
 */
#include "io.h"

#include <errno.h>
#include <stdatomic.h>
#include <time.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* Probe up to this many windows of WINDOW_PAGES pages per file; a file of
 * fewer than WINDOWS * WINDOW_PAGES pages is probed whole. */
#define WINDOWS 64u
#define WINDOW_PAGES 16u
#define NOWAIT_WINDOW_PAGES 2u
#define CAP_FOWNER_BIT 3 /* linux/capability.h's CAP_FOWNER */

/* Whether the calling thread has CAP_FOWNER in its effective set. */
static bool has_cap_fowner(void)
{
	FILE *s = fopen("/proc/self/status", "re");
	if (!s)
		return false;
	char line[256];
	unsigned long long caps = 0;
	bool found = false;
	while (!found && fgets(line, sizeof line, s))
		found = sscanf(line, "CapEff: %llx", &caps) == 1;
	fclose(s);
	return found && ((caps >> CAP_FOWNER_BIT) & 1);
}

/* Whether id, as this process sees it, is mapped in its user namespace
 * (map: /proc/self/uid_map or gid_map). An id the namespace does not map
 * shows as the overflow id (65534), which the map's ranges leave out. */
static bool id_mapped(const char *map, unsigned long long id)
{
	FILE *f = fopen(map, "re");
	if (!f)
		return true; /* no user namespaces: every id is the host's */
	unsigned long long inside, outside, count;
	bool mapped = false;
	while (!mapped && fscanf(f, "%llu %llu %llu", &inside, &outside, &count) == 3)
		mapped = id >= inside && id - inside < count;
	fclose(f);
	return mapped;
}

bool fsti_mincore_tells(int fd)
{
	struct stat st;
	if (fstat(fd, &st))
		return false;
	if (st.st_uid == geteuid())
		return true;
	/* CAP_FOWNER counts only for a file whose owner and group the caller's
	 * user namespace maps (root in a rootless container holds it, and a
	 * model store of an unmapped host user is not its to tell about) */
	if (has_cap_fowner() && id_mapped("/proc/self/uid_map", st.st_uid) &&
	    id_mapped("/proc/self/gid_map", st.st_gid))
		return true;
	/* the kernel's test: could this file be opened for writing (a
	 * read-only mount says no, as it does to the kernel) */
	char self[64];
	snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
	return faccessat(AT_FDCWD, self, W_OK, AT_EACCESS) == 0;
}

/* The pages to probe in each window of a file of `pages` pages: windows
 * windows of n pages from first = w * step. */
struct windows {
	unsigned count;
	uint64_t step, n;
};

static struct windows windows_of(uint64_t pages, uint64_t window_pages)
{
	if (pages < WINDOWS * WINDOW_PAGES)
		return (struct windows){1, pages, pages};
	return (struct windows){WINDOWS, pages / WINDOWS, window_pages};
}

/* A fresh 64-bit number for each call (splitmix64 of a counter and the
 * clock): where the windows of an RWF_NOWAIT sample go. */
static uint64_t fresh_random(void)
{
	static atomic_uint_fast64_t calls;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t x = atomic_fetch_add(&calls, 1) * 0x9e3779b97f4a7c15ull ^
		     ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static int sample_mincore(int fd, uint64_t size, uint64_t page, uint64_t *resident,
			  uint64_t *probed)
{
	void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return -1;
	uint64_t pages = (size + page - 1) / page;
	struct windows ws = windows_of(pages, WINDOW_PAGES);
	for (unsigned w = 0; w < ws.count; w++) {
		uint64_t first = w * ws.step;
		uint64_t n = FSTI_MIN(pages - first, ws.n);
		unsigned char vec[1024];
		for (uint64_t done = 0; done < n;) {
			uint64_t k = FSTI_MIN(n - done, (uint64_t)sizeof vec);
			if (mincore((char *)map + (first + done) * page, (size_t)(k * page), vec)) {
				munmap(map, size);
				return -1;
			}
			for (uint64_t j = 0; j < k; j++)
				*resident += vec[j] & 1;
			*probed += k;
			done += k;
		}
	}
	munmap(map, size);
	return 0;
}

static int sample_nowait(const fst_file *f, uint64_t size, uint64_t page, uint64_t *resident,
			 uint64_t *probed)
{
	char why[96];
	bool other;
	int own = fsti_reopen(f, 0, &other, why, sizeof why);
	if (own < 0)
		return -1;
	(void)posix_fadvise(own, 0, 0, POSIX_FADV_RANDOM);
	const uint64_t piece = (uint64_t)WINDOW_PAGES * page;
	char *buf = fsti_malloc(piece);
	int rc = buf ? 0 : -1;
	uint64_t pages = (size + page - 1) / page;
	struct windows ws = windows_of(pages, NOWAIT_WINDOW_PAGES);
	uint64_t r = fresh_random();
	for (unsigned w = 0; !rc && w < ws.count; w++) {
		/* anywhere in the window's stretch that holds it whole */
		uint64_t first = w * ws.step;
		if (ws.step > ws.n) {
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			first += (r >> 33) % (ws.step - ws.n + 1);
		}
		uint64_t n = FSTI_MIN(pages - first, ws.n);
		for (uint64_t done = 0; !rc && done < n;) {
			uint64_t k = FSTI_MIN(n - done, (uint64_t)WINDOW_PAGES);
			uint64_t off = (first + done) * page;
			uint64_t want = FSTI_MIN(k * page, size - off);
			struct iovec v = {buf, (size_t)want};
			ssize_t got = preadv2(own, &v, 1, (off_t)off, RWF_NOWAIT);
			if (got >= 0) /* what the cache holds from off on */
				*resident += FSTI_MIN(((uint64_t)got + page - 1) / page, k);
			else if (errno != EAGAIN)
				rc = -1; /* no RWF_NOWAIT here: cannot tell */
			*probed += k;
			done += k;
		}
	}
	fsti_free(buf);
	close(own);
	return rc;
}

double fsti_cached_fraction_by(const fst_checkpoint *ck, enum fsti_residency_probe how)
{
	const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	/* each file's sampled share weighted by its bytes: files are sampled
	 * with about as many pages whatever their size, and an 8 MiB file
	 * beside a 5 GB one must not decide for both */
	double cached = 0, total = 0;
	for (size_t i = 0; i < fst_checkpoint_file_count(ck); i++) {
		const fst_file *f = fst_checkpoint_file(ck, i);
		uint64_t size = fst_file_size(f);
		int fd = fst_file_fd(f);
		if (fd < 0 || size == 0)
			continue;
		bool mincore_ok = how == FSTI_RESIDENCY_MINCORE ||
				  (how == FSTI_RESIDENCY_AUTO && fsti_mincore_tells(fd));
		uint64_t resident = 0, probed = 0;
		int rc = mincore_ok ? sample_mincore(fd, size, page, &resident, &probed)
				    : sample_nowait(f, size, page, &resident, &probed);
		if (rc)
			return -1;
		if (probed) {
			cached += (double)size * (double)resident / (double)probed;
			total += (double)size;
		}
	}
	return total > 0 ? cached / total : 1.0;
}

double fsti_cached_fraction(const fst_checkpoint *ck)
{
	return fsti_cached_fraction_by(ck, FSTI_RESIDENCY_AUTO);
}
