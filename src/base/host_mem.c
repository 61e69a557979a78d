/*
 * host_mem.c - destination memory on the CPU.
 *
 * One anonymous mapping per load, aligned to 2 MiB and advised for
 * transparent huge pages: untouched 4 KiB pages cost a fault each (about
 * 0.3 GB/s to fill on the development VM), huge pages about 6 GB/s. The
 * memory is not touched here: the reader threads fault it in, in parallel,
 * as their reads land.
 */
#include "base.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sys/mman.h>

int fsti_host_alloc(uint64_t size, uint64_t align, bool pinned, void **out, uint64_t *map_len,
		    fst_error *err)
{
	*out = NULL;
	*map_len = 0;
	if (!size)
		size = 1;
	if (fsti_fault("host_alloc"))
		return fsti_err(err, FST_ENOMEM, "cannot allocate %" PRIu64
						 " bytes of host memory (injected fault)", size);
	/* the base at a multiple of the caller's alignment too: a load's plan
	 * aligns tensors from the base, so a larger opts.align needs a base
	 * aligned to it */
	uint64_t base_align = FSTI_MAX(align, (uint64_t)FSTI_HUGE_PAGE);
	uint64_t len = (size + FSTI_HUGE_PAGE - 1) & ~(FSTI_HUGE_PAGE - 1);
	uint64_t want = len + base_align;
	char *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		       -1, 0);
	if (p == MAP_FAILED)
		return fsti_err_sys(err, FST_ENOMEM, errno,
				    "cannot allocate %" PRIu64 " bytes of host memory", size);
	/* Trim to an aligned window (2 MiB at least, so huge pages can back
	 * all of it). */
	uintptr_t a = ((uintptr_t)p + base_align - 1) & ~(uintptr_t)(base_align - 1);
	if (a > (uintptr_t)p)
		munmap(p, a - (uintptr_t)p);
	uint64_t tail = (uint64_t)((uintptr_t)p + want - (a + len));
	if (tail)
		munmap((char *)a + len, tail);
	madvise((void *)a, len, MADV_HUGEPAGE);
	if (pinned) {
		int fault = fsti_fault("pin");
		if (fault || mlock((void *)a, len)) {
			int e = fault ? fault : errno;
			munmap((void *)a, len);
			return fsti_err_sys(err, FST_ENOMEM, e,
					    "cannot page-lock %" PRIu64 " bytes of host memory "
					    "(see ulimit -l)",
					    size);
		}
	}
	*out = (void *)a;
	*map_len = len;
	return 0;
}

void fsti_host_free(void *p, uint64_t map_len)
{
	if (p)
		munmap(p, map_len);
}

/*
 * Faulting pages in is the kernel zeroing them, one page at a time on the
 * thread that touches them. A registration with the GPU driver faults an
 * untouched block in on the caller's thread; touched on several threads
 * first, the block leaves the driver only its pinning.
 */
struct populate_slice {
	char *p;
	uint64_t len;
};

static void *populate_slice(void *arg)
{
	const struct populate_slice *s = arg;
	/* the memory is fresh and zero: writing a zero changes no byte */
	for (uint64_t off = 0; off < s->len; off += 4096)
		((volatile char *)s->p)[off] = 0;
	return NULL;
}

void fsti_host_populate(void *p, uint64_t len, unsigned threads)
{
	enum { MAX_THREADS = 64 };
	uint64_t slices = len / FSTI_HUGE_PAGE;
	unsigned want = FSTI_MAX(FSTI_MIN(threads, (unsigned)MAX_THREADS), 1u);
	unsigned n = (unsigned)FSTI_MIN((uint64_t)want,
					FSTI_MAX(slices, (uint64_t)1));
	/* whole huge pages per slice, so no page is faulted by two threads */
	uint64_t per = n > 1 ? (slices + n - 1) / n * FSTI_HUGE_PAGE : len;
	struct populate_slice s[MAX_THREADS];
	pthread_t t[MAX_THREADS];
	bool started[MAX_THREADS] = {false};
	unsigned k = 0;
	for (uint64_t at = 0; at < len && k < n; at += per, k++) {
		bool last = k + 1 == n || at + per >= len;
		s[k] = (struct populate_slice){(char *)p + at, last ? len - at : per};
		/* the last slice, and any a thread cannot be had for, here */
		if (!last)
			started[k] = pthread_create(&t[k], NULL, populate_slice, &s[k]) == 0;
		if (!started[k])
			populate_slice(&s[k]);
	}
	for (unsigned i = 0; i < k; i++)
		if (started[i])
			pthread_join(t[i], NULL);
}
