/*
 * io.h - reading file bytes: pread and io_uring readers, O_DIRECT, page
 * cache residency (io/). Never knows loads or GPUs; depends on base/ and
 * format/.
 */
#ifndef FST_IO_H
#define FST_IO_H

#include "format.h"

#include <pthread.h>
#include <stdatomic.h>

/* ---- readers (pread.c, uring.c) */

/*
 * What a reader reads: the checkpoint's files, and O_DIRECT descriptors for
 * them opened on first use (NULL: never O_DIRECT). A reader gets this and
 * its own state, never the load that drives it.
 */
struct fsti_direct_fds;
struct fsti_source {
	const fst_checkpoint *ck;
	struct fsti_direct_fds *direct;
	/* nonzero once the load stops (an error, a cancel): readers that wait
	 * on a network abort what is in flight */
	const atomic_int *stop;
};

/*
 * Readers. A worker reads a chunk either straight into the destination
 * (read_exact) or into one of its landing slots (start, then wait): slot
 * buffers are FSTI_DIRECT_ALIGN-aligned with room for len + 2 * FSTI_DIRECT_ALIGN
 * bytes, and the reader says where in the slot the chunk's first byte is
 * (O_DIRECT reads land at the block-aligned offset below it). start may
 * return before the bytes arrive; wait returns once they are all there.
 */
#define FSTI_DIRECT_ALIGN 4096u
/* Default staging budgets: modest for page-cache reads (pinning memory costs
 * about as much as reading it; 128 MiB, faulted in on the workers before it
 * is registered, loaded fastest on the H200's host kind, 256 MiB slower),
 * large for O_DIRECT, which wants big requests in flight and whose time
 * dwarfs the pinning (docs/design.md, "Defaults"). */
#define FSTI_STAGING_CACHED (128ull << 20)
#define FSTI_STAGING_DIRECT (256ull << 20)
/* ... but where the CPU's last-level cache holds less than
 * FSTI_STAGING_CACHED_L3, page-cache loads onto a GPU stage through
 * FSTI_STAGING_CACHED_SMALL_L3: on an H100 machine with a 105 MiB L3, 64 MiB
 * loaded 1.011-1.075x as fast as 128 in all six rounds, 96 MiB 1.021-1.042x
 * in four, 32 MiB 0.955-0.965x; on the machines with a 300 MiB L3, 128 MiB
 * led 64 in 14 rounds of 18 and 256 MiB trailed (docs/design.md, "Past the
 * copy limit"). The copy engine reads the staging soon after the workers
 * wrote it, while the cache may still hold it. */
#define FSTI_STAGING_CACHED_L3 (256ull << 20)
#define FSTI_STAGING_CACHED_SMALL_L3 (64ull << 20)
/* Cold files read through the page cache with readahead: bigger copies out
 * of the cache than the cached default, measured best on the H200's disk. */
#define FSTI_STAGING_COLD (256ull << 20)
/* Workers of a load of cold files read with readahead when the caller
 * left the count to fst: at least this many, even on fewer cores (on the
 * 2-core development VM 16 read 1.1-1.8x faster than 2; docs/design.md,
 * "Defaults"). */
#define FSTI_COLD_THREADS 16u
/* Readahead of cold files read through the page cache, by default
 * (docs/design.md, "Readers and io=auto"). */
#define FSTI_READAHEAD (1ull << 30)
/* Request size of cold files that io=auto reads with O_DIRECT onto a GPU:
 * fastsafetensors' 516 KiB, rounded to the block size; the steadiest and
 * fastest cold pattern measured on the H200's disk (docs/design.md, "Cold
 * reads"). */
#define FSTI_COLD_DIRECT_CHUNK (512ull << 10)
/* Workers of that read when the caller left the count to fst, whatever the
 * core count: two chunks in flight each, 16 requests in all, as many as
 * fastsafetensors keeps; 16 workers (32 requests) read 0.6-1.0x of 8 on
 * the H200's disk (docs/design.md, "Cold reads"). */
#define FSTI_COLD_DIRECT_THREADS 8u
/* Workers of a load from the page cache onto a GPU when the caller left
 * the count to fst: one per CPU, at most 12. Their copies out of the page
 * cache share the memory with the copy engine's reads of the staging: on
 * 16 cores 12 workers loaded 1.004-1.090x as fast as 16 in all eight
 * rounds on one H100 machine of the H200's host kind, 10 workers
 * 1.025-1.057x in four (docs/design.md, "Past the copy limit"). */
#define FSTI_CACHED_GPU_THREADS 12u
/* Landing slots per worker: up to two reads in flight while the third
 * slot's bytes are still being copied out (to a GPU, asynchronously). */
#define FSTI_SLOTS 3

struct fsti_reader {
	const char *name;
	/* Whether it reads straight into the destination (read_exact) and so
	 * wants a plan whose extents are contiguous there too. */
	bool exact_reads;
	/* The host staging budget it works best with by default. */
	uint64_t default_staging;
	/* Whether start returns with the read done (pread, ranged GETs). Slots
	 * are then delivered as soon as they are read: a done read held back
	 * for the worker's next one only delays its copy to the GPU, and
	 * leaves the copy engine one read's time instead of two before the
	 * worker waits for the slot again (docs/design.md, "Past the copy
	 * limit"). */
	bool reads_at_start;
	/* Whether start reads into a buffer at any address (pread, ranged
	 * GETs), not only at a block boundary (O_DIRECT): then a sink may
	 * place a chunk within its slot (fsti_sink.landing_skew). */
	bool any_buffer;
	int (*worker_init)(const struct fsti_source *src, void **state, fst_error *err);
	int (*read_exact)(const struct fsti_source *src, void *state, uint32_t file, uint64_t off,
			  uint64_t len, void *dst, fst_error *err);
	int (*start)(const struct fsti_source *src, void *state, int slot, uint32_t file, uint64_t off,
		     uint64_t len, char *buf, fst_error *err);
	int (*wait)(const struct fsti_source *src, void *state, int slot, const char **where,
		    fst_error *err);
	void (*worker_fini)(void *state);
	/* Optional: ask the kernel to start fetching [off, off + len) of a file
	 * that will be read soon; returns at once. */
	void (*prefetch)(const struct fsti_source *src, uint32_t file, uint64_t off, uint64_t len);
};

extern const struct fsti_reader fsti_reader_pread;
extern const struct fsti_reader fsti_reader_uring;
/* Ranged GETs, one connection per worker, for checkpoints with remote files
 * (remote.c); local files among them are read with pread. */
extern const struct fsti_reader fsti_reader_remote;
/* wait of readers whose start reads at once (pread, remote): where the
 * slot's read put its bytes; their state begins with const char
 * *where[FSTI_SLOTS], which start fills. */
int fsti_sync_wait(const struct fsti_source *src, void *state, int slot, const char **where,
		   fst_error *err);
/* Whether any file of ck is remote. */
bool fsti_checkpoint_is_remote(const fst_checkpoint *ck);
/* The remote reader's defaults (docs/remote.md, "Measured"). */
#define FSTI_REMOTE_THREADS 16u
#define FSTI_REMOTE_CHUNK (8ull << 20)
/* Whether io_uring can be set up here (some sandboxes forbid it); cached. */
bool fsti_uring_available(void);

/* The bytes of a memory image (fst_file_open_memory), which has no
 * descriptor: they are already in memory and were validated at open. */
int fsti_copy_from_image(const fst_file *f, uint64_t off, uint64_t len, void *dst,
			 fst_error *err);

/* pread until len bytes; a short file is FST_ECHANGED. */
int fsti_pread_exact(int fd, const char *path, void *dst, uint64_t len, uint64_t off,
		     fst_error *err);

/* ---- O_DIRECT descriptors (direct.c) */

/* A new O_DIRECT descriptor for the opened file f, through /proc/self/fd
 * (the path may name another file by now, or none), else its path; never
 * one that names another file than the one opened (same device and inode).
 * Returns it, or -1 with the reason in why; *other_file says the path names
 * another file now (a change, not a refusal). */
int fsti_open_direct(const fst_file *f, bool *other_file, char *why, size_t why_size);
/* The same with the caller's open flags (0: a plain read-only descriptor of
 * its own, for advice that must touch no other reader). */
int fsti_reopen(const fst_file *f, int flags, bool *other_file, char *why, size_t why_size);

/* How io_uring's descriptors read (FST_URING_PAGE_CACHE): with O_DIRECT
 * (the default), or through the page cache in the same aligned requests,
 * with the kernel's readahead off (POSIX_FADV_RANDOM: the disk sees the
 * reader's own requests) or as the kernel does it. For measuring whether
 * the page cache can keep O_DIRECT's cold rate and the model for the next
 * start (docs/design.md, "Cold reads"). */
enum fsti_page_cache { FSTI_PAGE_CACHE_OFF, FSTI_PAGE_CACHE_RANDOM, FSTI_PAGE_CACHE_READAHEAD };
/* The mode FST_URING_PAGE_CACHE asks for; another value: FST_EUSAGE. */
int fsti_page_cache_mode(enum fsti_page_cache *out, fst_error *err);
/* "" for FSTI_PAGE_CACHE_OFF, else what the description says of the mode. */
const char *fsti_page_cache_text(enum fsti_page_cache mode);

/* A load's cache of io_uring descriptors, one per file, opened on first
 * use and closed by fsti_direct_fds_free; it has its own lock. mode says
 * whether they are O_DIRECT ones. NULL when out of memory. */
struct fsti_direct_fds *fsti_direct_fds_new(size_t nfiles, enum fsti_page_cache mode);
/* The descriptor for file i (f), or -1 when the file cannot be read with
 * O_DIRECT (then read through the page cache); the first refusal is logged.
 * Under a page-cache mode it is a descriptor of its own, without O_DIRECT,
 * read in the same aligned requests. */
int fsti_direct_fd(struct fsti_direct_fds *d, uint32_t i, const fst_file *f);
/* File i's O_DIRECT reads failed (errnum) although its open succeeded: from
 * now on fsti_direct_fd gives -1 for it (read through the page cache); the
 * first refusal of a file is logged. */
void fsti_direct_refuse(struct fsti_direct_fds *d, uint32_t i, const char *path, int errnum);
/* From now on, while its O_DIRECT descriptors are in use, look for other
 * loads of the files in p (at most every 10 ms): once one is seen, every
 * file's later reads go through the page cache (fsti_direct_fd gives -1),
 * which reads each byte from the disk once for all the loads, where
 * O_DIRECT would have each read all of it. p must outlive d's use. */
struct fsti_presence;
void fsti_direct_fds_watch(struct fsti_direct_fds *d, const struct fsti_presence *p);
/* Whether d has turned to the page cache for another load. */
bool fsti_direct_fds_shared(struct fsti_direct_fds *d);
/* Ask, before each O_DIRECT read, whether the page cache holds its chunk
 * whole (io=auto's cold reads; io=uring asked for reads with O_DIRECT
 * whatever the cache holds). Call before the descriptors are in use. */
void fsti_direct_fds_check_cache(struct fsti_direct_fds *d);
/* With check_cache set: whether every page of [off, off+len) of file i (f)
 * is in the page cache, where mincore can tell (fsti_mincore_tells) and the
 * descriptors are O_DIRECT ones: then the chunk is better read through the
 * page cache. Counted in fsti_direct_cached_bytes. */
bool fsti_direct_cached(struct fsti_direct_fds *d, uint32_t i, const fst_file *f, uint64_t off,
			uint64_t len);
uint64_t fsti_direct_cached_bytes(struct fsti_direct_fds *d);
void fsti_direct_fds_free(struct fsti_direct_fds *d);

/* ---- other loads of the same files (presence.c) */

/* One load's read locks on its files, each on a descriptor of its own, that
 * other loads (any process) can see. Files without a local descriptor, and
 * files where no lock can be had, are left out. hold false: the descriptors
 * only, to look for other loads without being seen as one (a load only
 * explained). NULL: out of memory. */
struct fsti_presence *fsti_presence_join(const fst_checkpoint *ck, bool hold);
/* Whether another load holds file i's lock. */
bool fsti_presence_others(const struct fsti_presence *p, size_t i);
/* Whether another load holds any file's lock; *which (if given) is the first
 * such file. */
bool fsti_presence_any(const struct fsti_presence *p, size_t *which);
void fsti_presence_leave(struct fsti_presence *p);

/* ---- page cache residency (residency.c) */

/* Fraction (0..1) of the checkpoint's bytes resident in the page cache,
 * sampled (each file's sample weighted by its size); -1 when it cannot be
 * told. Each file is sampled with mincore
 * where mincore can tell, else by reads that only take what the page cache
 * holds (preadv2 RWF_NOWAIT). */
double fsti_cached_fraction(const fst_checkpoint *ck);
/* The same with the way chosen (for tests): AUTO as above, or one for every
 * file. */
enum fsti_residency_probe { FSTI_RESIDENCY_AUTO, FSTI_RESIDENCY_MINCORE, FSTI_RESIDENCY_NOWAIT };
double fsti_cached_fraction_by(const fst_checkpoint *ck, enum fsti_residency_probe how);
/* Whether mincore reports the page cache of the file open as fd: Linux
 * answers only for its owner, a caller who could open it for writing, or
 * one with CAP_FOWNER whose user namespace maps the file's owner and group,
 * and calls every page resident for the others. */
bool fsti_mincore_tells(int fd);

#endif
