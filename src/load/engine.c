/*
 * engine.c - the loading pipeline: the choice of read path, the plan, the
 * destination, reader threads, and the loader API over them.
 *
 * Workers take chunks in plan order from one atomic counter (with streams,
 * opts.stream_bytes: stretches of the plan, each read in order; with disk
 * helpers, FST_WARM_DISK, from the plan's front while the helpers take
 * chunks from its end and read them with O_DIRECT), ask the sink
 * where the bytes go (the destination itself on the CPU, a staging slot for
 * a GPU), read them there, and hand them to the sink. The sink reports each
 * chunk once its bytes are in their final place; only then does the engine
 * count them against their tensors. A tensor is ready exactly when its last
 * byte has been counted: readiness is decided in readiness.c and nowhere
 * else.
 */
#include "cuda.h"
#include "engine.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *fsti_engine_path(const struct fsti_engine *e, uint32_t file)
{
	return fst_file_path(fst_checkpoint_file(e->ck, file));
}

int fsti_engine_fd(const struct fsti_engine *e, uint32_t file)
{
	return fst_file_fd(fst_checkpoint_file(e->ck, file));
}

/* ---- workers */

/* Chunk i of the stretch [lo, hi) of the plan was just taken: keep the
 * kernel fetching `ahead` chunks beyond it. The taker of the stretch's first
 * chunk asks for the whole first window. */
static void prefetch_ahead(struct fsti_engine *e, size_t i, size_t lo, size_t hi, size_t ahead)
{
	size_t from = i > lo ? i + ahead : i + 1, to = i + ahead;
	for (size_t k = from; k <= to && k < hi; k++) {
		const struct fsti_chunk *c = &e->plan.c[k];
		e->reader->prefetch(&e->src, c->file, c->file_off, c->len);
	}
}

static size_t run_end(const struct fsti_engine *e, size_t r)
{
	return FSTI_MIN((r + 1) * e->run_chunks, e->plan.nc);
}

/* The next chunk for a worker, or plan.nc once every chunk is taken. With
 * streams, *run is the worker's run (SIZE_MAX before its first): it reads
 * that run in order, then takes the next fresh one; with none left it
 * joins the run with the most chunks left, so no worker idles while one
 * finishes a long run alone. Every chunk is taken exactly once: each run's
 * counter hands out its chunks. */
static size_t take_chunk(struct fsti_engine *e, size_t *run)
{
	if (e->disk_helpers) {
		/* the front of a plan the disk helpers read from its end */
		size_t i = fsti_ends_front(&e->ends);
		return i == SIZE_MAX ? e->plan.nc : i;
	}
	if (!e->run_chunks)
		return atomic_fetch_add(&e->next_chunk, 1);
	for (;;) {
		if (*run < e->nruns) {
			size_t i = atomic_fetch_add(&e->run_next[*run], 1);
			if (i < run_end(e, *run))
				return i;
		}
		size_t r = atomic_fetch_add(&e->next_run, 1);
		if (r < e->nruns) {
			*run = r;
			continue;
		}
		size_t most = 0;
		*run = SIZE_MAX;
		for (size_t k = 0; k < e->nruns; k++) {
			size_t next = atomic_load(&e->run_next[k]), end = run_end(e, k);
			if (next < end && end - next > most) {
				most = end - next;
				*run = k;
			}
		}
		if (*run == SIZE_MAX)
			return e->plan.nc;
	}
}

/*
 * Disk helpers. A load from the page cache onto a GPU copies every byte
 * twice through the host's memory: a worker's pread out of the page cache
 * into staging, then the copy engine's read of the staging. Where the
 * pread limit meets the pinned copy limit the two crowd each other and the
 * load stays near 0.9x of either (docs/design.md, "Past the copy limit").
 * The disk can deliver the same bytes into staging without the CPU's copy:
 * helpers read chunks from the end of the plan with O_DIRECT while the
 * workers read from its front, until the two meet. A helper stops taking
 * chunks once the workers would take the rest sooner than two of its reads
 * take, so the load does not wait on the disk at its end.
 */

/* The next chunk from the plan's end for a helper whose last read took
 * latency seconds (0: none yet), or plan.nc: the ends have met, or the
 * workers will have taken the rest before two reads of the helper's would
 * be done, at the rate in chunks they have taken so far. That rate counts
 * from the workers' start, pinning included, and chunks taken rather than
 * read: it leans low, toward a read more by the helpers. */
static size_t take_back(struct fsti_engine *e, double latency)
{
	double elapsed = fsti_now() - e->t_workers;
	size_t front = fsti_ends_front_taken(&e->ends);
	if (latency > 0 && elapsed > 0 && front) {
		double left = (double)fsti_ends_left(&e->ends);
		if (left < 2 * latency * ((double)front / elapsed))
			return e->plan.nc;
	}
	size_t i = fsti_ends_back(&e->ends);
	return i == SIZE_MAX ? e->plan.nc : i;
}

/* Chunk i (of the worker's run) is about to be read: keep the readahead
 * window ahead of it, inside its stretch of the plan (the run, or the
 * whole plan). */
static void chunk_prefetch(struct fsti_engine *e, size_t i, size_t run)
{
	if (!e->ahead)
		return;
	size_t lo = 0, hi = e->plan.nc;
	if (run < e->nruns)
		lo = run * e->run_chunks, hi = run_end(e, run);
	prefetch_ahead(e, i, lo, hi, e->ahead);
}

/* Direct mode: pread straight into the destination, nothing in between. */
static int run_direct(struct fsti_engine *e, void *rstate, fst_error *err)
{
	size_t run = SIZE_MAX;
	while (!atomic_load(&e->stop)) {
		size_t i = take_chunk(e, &run);
		if (i >= e->plan.nc)
			return 0;
		chunk_prefetch(e, i, run);
		const struct fsti_chunk *c = &e->plan.c[i];
		char *dst = e->write_base + c->dst_off;
		int rc = 0;
		if (!e->opts.on_landed) {
			rc = e->reader->read_exact(&e->src, rstate, c->file, c->file_off, c->len, dst, err);
		} else {
			/* Reads of at most one block, each reported at once, and
			 * never ending inside a tensor's block: every block is
			 * reported whole, straight after its read. */
			const uint64_t block = e->opts.landed_block, end = c->file_off + c->len;
			size_t k = c->first;
			for (uint64_t s = c->file_off, cut; !rc && s < end; s = cut) {
				cut = FSTI_MIN(s + block, end);
				if (cut < end)
					cut = fsti_plan_block_cut(&e->plan, &k, c->last, s, cut, block);
				char *at = dst + (s - c->file_off);
				rc = e->reader->read_exact(&e->src, rstate, c->file, s, cut - s, at, err);
				if (!rc)
					rc = fsti_report_landed(e, c, s, cut, at, NULL, err);
			}
		}
		if (rc)
			return rc;
		fsti_chunk_done(e, c);
	}
	return 0;
}

/* What a worker of slot mode reads with: the load's reader and source, or
 * a disk helper's (io_uring on O_DIRECT descriptors). */
struct worker_role {
	const struct fsti_reader *reader;
	const struct fsti_source *src;
	unsigned depth; /* reads in flight */
	bool helper;
};

/*
 * Slot mode: up to role->depth reads in flight (default_depth), the oldest
 * delivered first; the other slots' bytes may still be on their way to the
 * destination (a GPU copy), and the sink waits for that copy before a slot
 * is reused.
 */
static int run_slots(struct fsti_engine *e, const struct worker_role *role, void *rstate,
		     void *sstate, fst_error *err)
{
	const struct fsti_chunk *inflight[FSTI_SLOTS] = {0};
	double started[FSTI_SLOTS] = {0}; /* when a helper's read began */
	bool direct[FSTI_SLOTS] = {0}; /* a helper's read with O_DIRECT */
	int head = 0, count = 0, rc = 0;
	size_t run = SIZE_MAX;
	double latency = 0; /* a helper's last read */
	bool helping = true;
	for (;;) {
		while (!rc && count < (int)role->depth && !atomic_load(&e->stop)) {
			size_t i = !role->helper ? take_chunk(e, &run)
				   : helping     ? take_back(e, latency)
						 : e->plan.nc;
			if (i >= e->plan.nc)
				break;
			const struct fsti_chunk *c = &e->plan.c[i];
			int s = (head + count) % FSTI_SLOTS;
			if (role->helper) {
				/* a file without O_DIRECT: this chunk through the
				 * page cache, then no more */
				const fst_file *f = fst_checkpoint_file(e->ck, c->file);
				helping = direct[s] =
					fsti_direct_fd(role->src->direct, c->file, f) >= 0;
			} else {
				chunk_prefetch(e, i, run);
			}
			if (fsti_gds_wanted(e, c)) {
				/* cuFile: synchronous, straight into the tensors */
				int g = fsti_gds_read(e, c, err);
				if (g == 0) {
					fsti_chunk_done(e, c);
					continue;
				}
				if (g < 0) {
					rc = g;
					break;
				}
				/* g == 1: this file now goes through staging */
			}
			char *buf;
			rc = e->sink->slot_buffer(e, sstate, s, &buf, err);
			if (!rc && e->copy_phase == FSTI_PHASE_IN_SLOT && role->reader->any_buffer &&
			    e->sink->landing_skew)
				buf += e->sink->landing_skew(e, c);
			if (role->helper)
				started[s] = fsti_now();
			if (!rc)
				rc = role->reader->start(role->src, rstate, s, c->file, c->file_off,
							 c->len, buf, err);
			inflight[s] = c;
			count++;
		}
		if (!count)
			return rc;
		/* Even after an error every started read is waited for: nothing
		 * may still be writing into a slot when it is freed. */
		const char *where;
		fst_error werr;
		int wrc = role->reader->wait(role->src, rstate, head, &where, &werr);
		if (!rc && wrc) {
			rc = wrc;
			*err = werr;
		}
		/* the share the description gives: chunks a helper asked of the
		 * disk (one whose O_DIRECT read the filesystem refused midway is
		 * read again through the page cache, and still counted) */
		if (!rc && role->helper) {
			latency = fsti_now() - started[head];
			if (direct[head])
				atomic_fetch_add(&e->disk_bytes, inflight[head]->len);
		}
		if (!rc && !atomic_load(&e->stop))
			rc = e->sink->deliver(e, sstate, head, inflight[head], where, err);
		inflight[head] = NULL;
		head = (head + 1) % FSTI_SLOTS;
		count--;
	}
}

static void *worker_main(void *arg)
{
	struct fsti_engine *e = arg;
	fst_error err;
	fsti_err_clear(&err);
	void *rstate = NULL, *sstate = NULL;
	unsigned k = atomic_fetch_add(&e->worker_seq, 1);
	struct worker_role role = {e->reader, &e->src, e->reads_in_flight, false};
	if (e->sink && k >= e->nthreads - e->disk_helpers)
		role = (struct worker_role){&fsti_reader_uring, &e->disk_src, FSTI_SLOTS - 1, true};
	int rc = role.reader->worker_init(role.src, &rstate, &err);
	if (rc && !role.helper && role.reader == &fsti_reader_uring &&
	    e->opts.io == FST_IO_AUTO) {
		/* auto never fails where a slower path reads the same bytes: a
		 * worker without a ring of its own (a process near its descriptor
		 * limit) reads its chunks with pread, through the page cache */
		if (!atomic_exchange(&e->ring_fallback, true))
			fsti_log(FST_LOG_WARN, "io=auto: %s; a worker without an io_uring ring reads "
					       "with pread",
				 err.message);
		role = (struct worker_role){&fsti_reader_pread, &e->src, 1, false};
		fsti_err_clear(&err);
		rc = role.reader->worker_init(role.src, &rstate, &err);
	}
	if (rc && role.helper) {
		/* the workers read everything without it */
		fsti_log(FST_LOG_INFO, "disk helper: %s; the workers read its share", err.message);
		rstate = NULL;
		rc = 0;
	} else if (!rc && !e->sink) {
		rc = run_direct(e, rstate, &err);
		e->reader->worker_fini(rstate);
	} else if (!rc) {
		rc = e->sink->worker_init(e, &sstate, &err);
		if (!rc)
			rc = run_slots(e, &role, rstate, sstate, &err);
		/* Wait for this worker's copies even after an error: nothing may
		 * still be writing when the destination is released. */
		fst_error derr;
		int drc = e->sink->drain(e, sstate, &derr);
		if (!rc && drc) {
			rc = drc;
			err = derr;
		}
		role.reader->worker_fini(rstate);
		e->sink->worker_fini(e, sstate);
	}
	if (rc)
		fsti_engine_fail(e, &err);
	pthread_mutex_lock(&e->lock);
	e->running--;
	pthread_mutex_unlock(&e->lock);
	pthread_cond_broadcast(&e->cond);
	return NULL;
}

/* The files must be the ones that were opened, unchanged. */
static int check_files_unchanged(const fst_checkpoint *ck, const char *when, fst_error *err)
{
	for (size_t i = 0; i < fst_checkpoint_file_count(ck); i++) {
		const fst_file *f = fst_checkpoint_file(ck, i);
		int rc = fsti_file_check_unchanged(f, when, err);
		if (rc)
			return rc;
		struct stat now;
		if (f->fd >= 0 && stat(f->path, &now) == 0 &&
		    ((uint64_t)now.st_ino != f->ino || (uint64_t)now.st_dev != f->dev))
			fsti_log(FST_LOG_WARN,
				 "%s: the path now names another file (replaced %s); the "
				 "opened file was read",
				 f->path, when);
	}
	return 0;
}

/* ---- start, next, finish */

static void engine_free(struct fsti_engine *e)
{
	if (!e)
		return;
	/* a cancel or progress call from another thread finishes first */
	while (atomic_load(&e->visitors))
		sched_yield();
	fsti_direct_fds_free(e->src.direct);
	fsti_direct_fds_free(e->disk_src.direct);
	fsti_presence_leave(e->presence);
	fsti_gds_teardown(e); /* before the buffer may go: it deregisters it */
	if (e->sink && e->sink->load_fini)
		e->sink->load_fini(e);
	fst_buffer_release(e->buf);
	fsti_plan_free(&e->plan);
	fsti_free((void *)e->remaining);
	fsti_free((void *)e->run_next);
	fsti_free(e->ready);
	fsti_free(e->threads);
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->cond);
	fsti_free(e);
}

static void join_workers(struct fsti_engine *e)
{
	for (unsigned i = 0; i < e->started; i++)
		pthread_join(e->threads[i], NULL);
	e->started = 0;
}

/* Remote files have one reader, ranged GETs; never cuFile, never a
 * mapping. */
static int choose_remote(struct fsti_engine *e, const fst_load_opts *asked, fst_error *err)
{
	static const char *const names[] = {"auto", "pread", "uring", "mmap"};
	/* a checkpoint may mix local and remote files: name a remote one */
	uint32_t first = 0;
	while (!fst_file_is_remote(fst_checkpoint_file(e->ck, first)))
		first++;
	const char *url = fsti_engine_path(e, first);
	if (e->opts.io != FST_IO_AUTO)
		return fsti_err(err, FST_EUSAGE,
				"io=%s reads local files, and %s is remote: it is read with ranged "
				"GETs (io=auto)",
				names[e->opts.io], url);
	if (e->opts.gds == FST_GDS_ON)
		return fsti_err(err, FST_EUSAGE,
				"gds=on: %s is remote, and GPUDirect Storage reads local files only", url);
	e->opts.gds = FST_GDS_OFF;
	e->cached = -1; /* no page cache, no readahead */
	e->reader = &fsti_reader_remote;
	/* concurrency and request size are the network's, not the CPUs' */
	if (!asked || !asked->threads)
		e->opts.threads = FSTI_REMOTE_THREADS;
	if (!asked || !asked->chunk_bytes)
		e->opts.chunk_bytes = FSTI_REMOTE_CHUNK;
	snprintf(e->why, sizeof e->why, "auto: remote files");
	return 0;
}

/* The reads a worker keeps in flight unless FST_READS_IN_FLIGHT says: a
 * reader whose start returns with the read done delivers each slot at once
 * (io.h), an asynchronous one keeps FSTI_SLOTS - 1 reads going while the
 * spare slot's bytes may still be on their way to a GPU. */
static unsigned default_depth(const struct fsti_engine *e)
{
	return e->reader && e->reader->reads_at_start ? 1 : FSTI_SLOTS - 1;
}

/* A count of one digit, lo to hi, from the environment variable var; 0
 * where unset or empty, a usage error naming the variable otherwise. */
static int env_digit(enum fsti_env var, unsigned lo, unsigned hi, unsigned *out, fst_error *err)
{
	const char *v = fsti_env(var);
	*out = 0;
	if (!v || !*v)
		return 0;
	if (v[0] >= (char)('0' + lo) && v[0] <= (char)('0' + hi) && !v[1]) {
		*out = (unsigned)(v[0] - '0');
		return 0;
	}
	return fsti_err(err, FST_EUSAGE, "%s=\"%s\": expected %u to %u", fsti_env_name(var), v,
			lo, hi);
}

/* FST_READS_IN_FLIGHT: 1 (each worker waits for its read before the next,
 * as fastsafetensors' threads do), 2 or FSTI_SLOTS (every slot reading;
 * onto a GPU a read then waits for its slot's copy); 0 where unset, for
 * default_depth once the reader is chosen */
static int reads_in_flight(unsigned *out, fst_error *err)
{
	return env_digit(FSTI_ENV_READS_IN_FLIGHT, 1, FSTI_SLOTS, out, err);
}

/* FST_ALIGN_COPIES: 0 (also where unset or empty), 1 or 2 (enum
 * fsti_copy_phase) */
static int copy_phase(enum fsti_copy_phase *out, fst_error *err)
{
	unsigned v;
	int rc = env_digit(FSTI_ENV_ALIGN_COPIES, 0, 2, &v, err);
	*out = (enum fsti_copy_phase)v;
	return rc;
}

/* FST_WARM_DISK: the disk helpers asked for, 0 (off, and where unset) to
 * FSTI_MAX_DISK_HELPERS */
#define FSTI_MAX_DISK_HELPERS 8
static int warm_disk(unsigned *out, fst_error *err)
{
	return env_digit(FSTI_ENV_WARM_DISK, 0, FSTI_MAX_DISK_HELPERS, out, err);
}

static int choose_io(struct fsti_engine *e, fst_error *err)
{
	char pct[256] = "";
	e->cached = -1;
	switch (e->opts.io) {
	case FST_IO_MMAP:
		if (e->device_type != FST_DEVICE_CPU)
			return fsti_err(err, FST_EUSAGE,
					"io=mmap gives views of the files: cpu device only");
		snprintf(e->why, sizeof e->why, "asked for (io=mmap)");
		return 0;
	case FST_IO_PREAD:
		e->reader = &fsti_reader_pread;
		snprintf(e->why, sizeof e->why, "asked for (io=pread)");
		if (e->opts.readahead_bytes != FST_READAHEAD_OFF)
			e->cached = fsti_cached_fraction(e->ck);
		/* a cold load through the page cache: O_DIRECT loads of the same
		 * files should know of it */
		if (e->cached >= 0 && e->cached < 0.5 && !e->pieces_only)
			e->presence = fsti_presence_join(e->ck, !e->explain_only);
		return 0;
	case FST_IO_URING:
		e->reader = &fsti_reader_uring;
		snprintf(e->why, sizeof e->why, "asked for (io=uring)");
		return 0;
	default: {
		/* auto. Files mostly in the page cache: pread, one kernel copy,
		 * in parallel. Files mostly not, onto a GPU or into host memory
		 * (through landing slots of huge pages): O_DIRECT through
		 * io_uring in 512 KiB requests, the steadiest and fastest pattern
		 * on the H200's disk, where readahead read 0.8-0.9x of it; into
		 * host memory 1.15-1.41x readahead and 1.23-1.42x Run:ai
		 * (docs/design.md, "Cold reads"). With readahead asked for, and
		 * into unified memory (not measured there): pread with
		 * readahead, which leaves the model in the page cache. With
		 * readahead off, cold files go to O_DIRECT wherever they are
		 * bound. */
		double cached = e->cached = fsti_cached_fraction(e->ck);
		if (cached >= 0)
			snprintf(pct, sizeof pct, "%.0f%% of the data in the page cache",
				 cached * 100);
		else
			snprintf(pct, sizeof pct, "page-cache residency unknown");
		bool cold = cached >= 0 && cached < 0.5;
		bool uring = cold && (e->opts.readahead_bytes == FST_READAHEAD_OFF ||
				      (!e->unified && !e->opts.readahead_bytes));
		if (uring && !fsti_uring_available()) {
			uring = false;
			snprintf(pct + strlen(pct), sizeof pct - strlen(pct), ", io_uring unavailable");
		}
		/* Replicas: loads of the same files at once. With O_DIRECT each
		 * would read every byte from the disk; through the page cache
		 * the disk reads them once for all (3 at once on the H200: all
		 * done 2.4x sooner, bench/results/h200-2026-12-04b). O_DIRECT
		 * asked for (readahead off) and the page-cache modes stay. */
		if (cold && !e->pieces_only)
			e->presence = fsti_presence_join(e->ck, !e->explain_only);
		size_t other;
		if (uring && e->opts.readahead_bytes != FST_READAHEAD_OFF &&
		    e->page_cache == FSTI_PAGE_CACHE_OFF) {
			if (fsti_presence_any(e->presence, &other)) {
				const char *path = fst_checkpoint_file(e->ck, other)->path;
				const char *name = strrchr(path, '/');
				uring = false;
				snprintf(pct + strlen(pct), sizeof pct - strlen(pct),
					 ", another load is reading these files (%.100s): through "
					 "the page cache, which reads them once for both",
					 name ? name + 1 : path);
			} else {
				e->share_watch = true;
			}
		}
		e->reader = uring ? &fsti_reader_uring : &fsti_reader_pread;
		e->cold_direct = uring;
		snprintf(e->why, sizeof e->why, "auto: %s%s", pct,
			 !uring ? ""
			 : e->page_cache ? ", cold files read with io_uring"
					 : ", cold files read with O_DIRECT");
		return 0;
	}
	}
}

/* Whether the load reads cold files through the page cache with readahead. */
static bool reads_ahead(const struct fsti_engine *e)
{
	return e->reader && e->reader->prefetch && e->opts.io != FST_IO_MMAP && e->cached >= 0 &&
	       e->cached < 0.5 && e->opts.readahead_bytes != FST_READAHEAD_OFF;
}


static void describe(struct fsti_engine *e)
{
	if (e->opts.io == FST_IO_MMAP) {
		snprintf(e->describe, sizeof e->describe, "mmap: %s views of the files, no copy (%s)",
			 e->opts.mmap_private ? "copy-on-write" : "read-only", e->why);
		return;
	}
	char chunk[32];
	fsti_size_text(chunk, sizeof chunk, e->opts.chunk_bytes);
	const char *how = e->sink ? e->sink->how : "";
	if (e->unified)
		how = e->sink ? " to landing slots, copied once into host memory mapped for the GPU"
			      : " straight into host memory mapped for the GPU, no copy";
	char ahead[48] = "", streams[48] = "";
	if (e->ahead) {
		memcpy(ahead, ", readahead ", 13);
		fsti_size_text(ahead + 12, sizeof ahead - 12,
			  (uint64_t)e->ahead * e->opts.chunk_bytes * (e->run_chunks ? e->nthreads : 1));
	}
	if (e->run_chunks) {
		memcpy(streams, ", streams of ", 14);
		fsti_size_text(streams + 13, sizeof streams - 13, (uint64_t)e->run_chunks * e->opts.chunk_bytes);
	}
	/* FST_READS_IN_FLIGHT other than the reader's default, where slots
	 * are read */
	_Static_assert(FSTI_SLOTS == 3, "the description names up to three reads");
	static const char *const depths[] = {"", ", one read in flight per thread",
					     ", two reads in flight per thread",
					     ", three reads in flight per thread"};
	const char *depth = !e->sink || e->reads_in_flight == default_depth(e)
				    ? ""
				    : depths[e->reads_in_flight];
	/* the page-cache mode, where io_uring reads */
	const char *cache = e->reader == &fsti_reader_uring ? fsti_page_cache_text(e->page_cache) : "";
	char helpers[96] = "";
	if (e->disk_helpers)
		snprintf(helpers, sizeof helpers,
			 ", and %u disk helper%s reading the end with O_DIRECT (FST_WARM_DISK)",
			 e->disk_helpers, e->disk_helpers == 1 ? "" : "s");
	/* FST_ALIGN_COPIES, where it changes the copies */
	const char *phase = "";
	if (e->sink == &fsti_sink_cuda && e->copy_phase == FSTI_PHASE_ON_DEVICE)
		phase = ", copied in phase through device scratch (FST_ALIGN_COPIES=2)";
	else if (e->sink == &fsti_sink_cuda && e->copy_phase == FSTI_PHASE_IN_SLOT &&
		 e->reader->any_buffer)
		phase = ", read into the slots in the copies' phase (FST_ALIGN_COPIES=1)";
	unsigned workers = e->nthreads - e->disk_helpers;
	snprintf(e->describe, sizeof e->describe,
		 "%s%s%s, %u thread%s, %s chunks%s%s%s%s%s: %s%s%s%s%s%s%s",
		 fsti_gds_direct_count(e->gds) ? "cuFile where registered, else " : "", e->reader->name,
		 how, workers, workers == 1 ? "" : "s", chunk, streams, depth, ahead, helpers, phase, e->why,
		 cache[0] ? "; " : "", cache, e->platform_why[0] ? "; " : "", e->platform_why,
		 fsti_gds_why(e->gds)[0] ? "; " : "", fsti_gds_why(e->gds));
}

/* The staging budget of a load whose caller left it to fst: the reader's,
 * the readahead one for cold files, and from the page cache onto a GPU one
 * that a smaller last-level cache still holds (io.h). */
static uint64_t default_staging(const struct fsti_engine *e, bool cached_gpu)
{
	if (reads_ahead(e))
		return FSTI_STAGING_COLD;
	if (cached_gpu) {
		uint64_t l3 = fsti_l3_cache_bytes();
		if (l3 && l3 < FSTI_STAGING_CACHED_L3)
			return FSTI_STAGING_CACHED_SMALL_L3;
	}
	return e->reader->default_staging;
}

/* Public calls leave the caller's thread on the CUDA context it had. */
static void give_back_context(struct fsti_engine *e)
{
	if (e->restore_ctx)
		fsti_cuda_restore(e->saved_ctx);
	e->restore_ctx = false;
}

/* Every decision of a load, and its plan, without taking any memory for
 * tensors: shared by fst_load_start and fst_load_explain. */
static struct fsti_engine *configure(const fst_checkpoint *ck, const fst_load_opts *opts,
				     const struct fsti_plan_tensor *pieces, size_t npieces,
				     bool explain_only, int *rcp, fst_error *err)
{
	struct fsti_engine *e = fsti_calloc(1, sizeof *e);
	if (!e) {
		*rcp = fsti_err(err, FST_ENOMEM, "out of memory for the loader");
		return NULL;
	}
	pthread_mutex_init(&e->lock, NULL);
	/* timed waits (progress) on the monotonic clock: a step of the wall
	 * clock neither stops nor floods the reports */
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&e->cond, &ca);
	pthread_condattr_destroy(&ca);
	e->ck = ck;
	e->pieces_only = pieces != NULL;
	e->explain_only = explain_only;
	int rc = fsti_load_opts_check(opts, &e->opts, err);
	if (!rc)
		rc = fsti_parse_device(e->opts.device, &e->device_type, &e->device_id, err);
	if (!rc && e->device_type == FST_DEVICE_CUDA) {
		/* Fail early and clearly where there is no driver or no such
		 * device, before any memory is taken. */
		const struct fsti_cuda *cu;
		rc = fsti_cuda_get(&cu, err);
		if (!rc) {
			e->saved_ctx = fsti_cuda_save();
			e->restore_ctx = true;
			rc = fsti_cuda_use_device(cu, e->device_id, err);
		}
		/* Loads into given memory (pieces) are always discrete. */
		if (!rc && !pieces)
			rc = fsti_unified_decide(e, err);
	}
	if (!rc)
		rc = fsti_page_cache_mode(&e->page_cache, err);
	if (!rc)
		rc = reads_in_flight(&e->reads_in_flight, err);
	if (!rc)
		rc = copy_phase(&e->copy_phase, err);
	if (!rc)
		rc = fsti_checkpoint_is_remote(ck) ? choose_remote(e, opts, err)
						   : choose_io(e, err);
	if (!rc && !e->reads_in_flight)
		e->reads_in_flight = default_depth(e);
	unsigned helpers = 0;
	if (!rc)
		rc = warm_disk(&helpers, err);
	if (!rc)
		rc = check_files_unchanged(ck, "since it was opened", err);
	/* Cold reads wait on the disk, not on the CPUs: enough of them in
	 * flight to keep its queue deep whatever the core count. A count the
	 * caller gave stands. */
	if (!rc && reads_ahead(e) && (!opts || !opts->threads))
		e->opts.threads = FSTI_MAX(e->opts.threads, FSTI_COLD_THREADS);
	/* O_DIRECT, though, reads best with a queue of a set depth */
	if (!rc && e->cold_direct && (!opts || !opts->threads))
		e->opts.threads = FSTI_COLD_DIRECT_THREADS;
	if (!rc && !pieces)
		rc = fsti_gds_setup(e, err);
	/* and in small requests, except where cuFile reads the chunks */
	if (!rc && e->cold_direct && !fsti_gds_direct_count(e->gds) &&
	    (!opts || !opts->chunk_bytes))
		e->opts.chunk_bytes = FSTI_COLD_DIRECT_CHUNK;
	/* pread into host memory needs nothing in between; everything else
	 * lands in per-worker slots first. */
	bool host_dst = e->device_type == FST_DEVICE_CPU || e->unified;
	bool direct = host_dst && e->reader && e->reader->exact_reads;
	/* From the page cache onto a GPU, fewer workers than cores leave the
	 * memory to the copy engine (io.h). A count the caller gave stands. */
	bool cached_gpu = !host_dst && e->reader == &fsti_reader_pread && !reads_ahead(e) &&
			  !fsti_gds_direct_count(e->gds);
	if (!rc && cached_gpu && (!opts || !opts->threads))
		e->opts.threads = FSTI_MIN(e->opts.threads, FSTI_CACHED_GPU_THREADS);
	if (!rc && !direct && e->opts.io != FST_IO_MMAP) {
		e->sink = host_dst ? &fsti_sink_host : &fsti_sink_cuda;
		/* Landing slots of every thread fit the staging budget, by
		 * default the reader's own (io.h). */
		if (!e->opts.staging_bytes)
			e->opts.staging_bytes = default_staging(e, cached_gpu);
		uint64_t per_slot = e->opts.staging_bytes / ((uint64_t)e->opts.threads * FSTI_SLOTS);
		/* Host slots are one mapping of huge pages per worker (host_sink.c):
		 * a whole number of them within each worker's share, where the
		 * share holds one, slot margins included. */
		if (host_dst) {
			uint64_t share = e->opts.staging_bytes / e->opts.threads;
			if (share >= FSTI_HUGE_PAGE)
				share &= ~(FSTI_HUGE_PAGE - 1);
			per_slot = share / FSTI_SLOTS;
			per_slot -= FSTI_MIN(per_slot, 2 * FSTI_DIRECT_ALIGN);
		}
		uint64_t chunk = FSTI_MIN(e->opts.chunk_bytes, per_slot);
		chunk &= ~(uint64_t)(FSTI_DIRECT_ALIGN - 1);
		e->opts.chunk_bytes = FSTI_MAX(chunk, (uint64_t)FSTI_DIRECT_ALIGN);
		e->slot_bytes = e->opts.chunk_bytes + 2 * FSTI_DIRECT_ALIGN;
	}
	/* Files read with cuFile get direct extents (bytes land at their
	 * tensors); their chunks are no larger than a landing slot, so one
	 * whose cuFile read fails can be redone through staging as it is. */
	if (!rc && pieces)
		rc = fsti_plan_from_pieces(pieces, npieces, e->opts.align, e->opts.chunk_bytes, direct,
					   &e->plan, err);
	else if (!rc) {
		struct fsti_plan_request r = {
			.ck = ck, .filter = e->opts.filter, .filter_ctx = e->opts.filter_ctx,
			.align = e->opts.align, .chunk_bytes = e->opts.chunk_bytes,
		};
		if (fsti_gds_direct_count(e->gds)) {
			r.mode = FSTI_PLAN_PER_FILE;
			r.direct_files = fsti_gds_direct_files(e->gds);
		} else {
			r.mode = direct || e->opts.io == FST_IO_MMAP ? FSTI_PLAN_DIRECT
								     : FSTI_PLAN_SLOTS;
			/* reported blocks are whole when no chunk splits one */
			r.grain = e->opts.on_landed ? e->opts.landed_block : 0;
		}
		rc = fsti_plan_make(&r, &e->plan, err);
	}
	/* Readahead where the page cache is read and mostly empty: the kernel
	 * fetches the window ahead while the workers copy what has landed. */
	if (!rc && reads_ahead(e) && !fsti_gds_direct_count(e->gds)) {
		uint64_t want = e->opts.readahead_bytes ? e->opts.readahead_bytes : FSTI_READAHEAD;
		e->ahead = (size_t)FSTI_MAX(want / e->opts.chunk_bytes, (uint64_t)1);
	}
	/* no more threads than chunks */
	e->nthreads = FSTI_MIN(e->opts.threads, (unsigned)FSTI_MIN(e->plan.nc, (size_t)UINT_MAX));
	/* Disk helpers, where asked for, beside the workers of a load from the
	 * page cache (as measured: not where residency is unknown) onto a GPU
	 * in one queue, with io_uring here and chunks
	 * enough for every worker to take several (staging grows by their
	 * slots; the workers' chunks stay as they are). */
	bool one_queue = !e->opts.stream_bytes || e->opts.stream_bytes == FST_STREAM_OFF;
	if (!rc && helpers && cached_gpu && e->cached >= 0.5 && e->sink && one_queue &&
	    e->plan.nc < UINT32_MAX && e->plan.nc >= 4 * ((size_t)e->nthreads + helpers) &&
	    fsti_uring_available()) {
		e->disk_helpers = helpers;
		e->nthreads += helpers;
	}
	/* Streams: runs of stream_bytes, each read in order by one worker;
	 * the readahead window is shared among them. */
	if (!rc && e->opts.stream_bytes && e->opts.stream_bytes != FST_STREAM_OFF &&
	    e->opts.io != FST_IO_MMAP && e->plan.nc) {
		e->run_chunks = (size_t)FSTI_MAX(e->opts.stream_bytes / e->opts.chunk_bytes, (uint64_t)1);
		e->nruns = (e->plan.nc + e->run_chunks - 1) / e->run_chunks;
		if (e->ahead)
			e->ahead = FSTI_MAX(e->ahead / FSTI_MAX(e->nthreads, 1u), (size_t)1);
	}
	if (!rc)
		describe(e);
	*rcp = rc;
	if (rc) {
		give_back_context(e);
		engine_free(e);
		return NULL;
	}
	return e;
}

int fst_load_explain(const fst_checkpoint *ck, const fst_load_opts *opts, char *buf, size_t size,
		     fst_error *err)
{
	fsti_err_clear(err);
	if (!ck || !buf || !size)
		return fsti_err(err, FST_EUSAGE, "fst_load_explain: checkpoint and buf are required");
	int rc;
	struct fsti_engine *e = configure(ck, opts, NULL, 0, true, &rc, err);
	if (!e)
		return rc;
	snprintf(buf, size, "%s", e->describe);
	give_back_context(e);
	engine_free(e);
	return 0;
}

/* The load; with pieces, only those, into dst (the caller's memory). */
/* The reader threads; on a failure to start one, those started are
 * stopped and joined. They may be waiting for the sink's load_started,
 * which then never runs: the sink lets them go first. */
static int start_workers(struct fsti_engine *e, fst_error *err)
{
	e->threads = fsti_calloc(e->nthreads + 1, sizeof *e->threads);
	if (!e->threads)
		return fsti_err(err, FST_ENOMEM, "out of memory for the loader");
	e->running = e->nthreads;
	for (unsigned i = 0; i < e->nthreads; i++) {
		/* pthread_create returns its error; it does not set errno */
		int errnum = fsti_fault("thread");
		if (!errnum)
			errnum = pthread_create(&e->threads[i], NULL, worker_main, e);
		if (errnum) {
			pthread_mutex_lock(&e->lock);
			e->running -= e->nthreads - i;
			pthread_mutex_unlock(&e->lock);
			atomic_store(&e->stop, 1);
			if (e->sink && e->sink->load_abandoned)
				e->sink->load_abandoned(e);
			join_workers(e);
			return fsti_err_sys(err, FST_ENOMEM, errnum, "cannot start reader threads");
		}
		e->started++;
	}
	return 0;
}

static int start_engine(const fst_checkpoint *ck, const fst_load_opts *opts,
			const struct fsti_plan_tensor *pieces, size_t npieces, void *dst,
			uint64_t dst_size, fst_loader **out, fst_error *err)
{
	fsti_err_clear(err);
	if (!ck || !out)
		return fsti_err(err, FST_EUSAGE, "fst_load_start: checkpoint and out are required");
	*out = NULL;
	double t0 = fsti_now();
	int rc;
	struct fsti_engine *e = configure(ck, opts, pieces, npieces, false, &rc, err);
	if (!e)
		return rc;
	rc = fsti_buffer_new(ck, &e->plan, &e->buf, err);
	if (rc)
		goto fail;
	if (dst) {
		if (e->opts.io == FST_IO_MMAP) {
			rc = fsti_err(err, FST_EUSAGE, "io=mmap cannot load into given memory");
			goto fail;
		}
		e->buf->base = dst; /* not owned: no release_memory */
		e->buf->size = dst_size;
	}
	e->buf->device_type = e->device_type;
	e->buf->device_id = e->device_id;
	snprintf(e->buf->describe, sizeof e->buf->describe, "%s", e->describe);
	e->ready = fsti_calloc(e->plan.nt + 1, sizeof *e->ready);
	e->remaining = fsti_calloc(e->plan.nt + 1, sizeof *e->remaining);
	if (e->nruns) {
		e->run_next = fsti_calloc(e->nruns, sizeof *e->run_next);
		for (size_t r = 0; e->run_next && r < e->nruns; r++)
			atomic_init(&e->run_next[r], r * e->run_chunks);
	}
	e->src.ck = ck;
	e->src.stop = &e->stop;
	e->src.direct = fsti_direct_fds_new(fst_checkpoint_file_count(ck), e->page_cache);
	if (e->disk_helpers) {
		/* O_DIRECT whatever the page cache holds: that is their point */
		e->disk_src = e->src;
		e->disk_src.direct = fsti_direct_fds_new(fst_checkpoint_file_count(ck),
							 FSTI_PAGE_CACHE_OFF);
		fsti_ends_init(&e->ends, e->plan.nc);
	}
	if (!e->ready || !e->remaining || !e->src.direct || (e->nruns && !e->run_next) ||
	    (e->disk_helpers && !e->disk_src.direct)) {
		rc = fsti_err(err, FST_ENOMEM, "out of memory for the loader");
		goto fail;
	}
	if (e->share_watch)
		fsti_direct_fds_watch(e->src.direct, e->presence);
	/* cold files may be partly in the page cache: chunks it holds whole
	 * are read from it (io=uring asked for keeps O_DIRECT throughout) */
	if (e->cold_direct)
		fsti_direct_fds_check_cache(e->src.direct);

	if (e->opts.io == FST_IO_MMAP) {
		rc = fsti_map_files(e, err);
		if (rc)
			goto fail;
		for (size_t i = 0; i < e->plan.nt; i++)
			fsti_ready_push_locked(e, i);
		atomic_store(&e->bytes_done, e->plan.total_bytes);
		*out = (fst_loader *)e;
		return 0; /* mmap: no device, no context */
	}

	if (e->unified)
		rc = fsti_unified_alloc(e, err);
	else if (e->sink && e->sink->load_init)
		rc = e->sink->load_init(e, err);
	else if (!e->buf->base)
		rc = fsti_alloc_host(e, err);
	if (!rc && !e->unified)
		e->write_base = e->buf->base;
	if (!rc)
		rc = fsti_gds_register_buffer(e, err);
	if (rc)
		goto fail;
	for (size_t i = 0; i < e->plan.nt; i++) {
		const struct fsti_plan_tensor *t = &e->plan.t[i];
		e->buf->t[i].data = (char *)e->buf->base + t->dst_off;
		atomic_init(&e->remaining[i], t->nbytes);
		if (!t->nbytes)
			fsti_ready_push_locked(e, i);
	}
	e->t_workers = fsti_now();
	rc = start_workers(e, err);
	if (!rc && e->sink && e->sink->load_started) {
		rc = e->sink->load_started(e, err);
		if (rc) {
			atomic_store(&e->stop, 1);
			join_workers(e);
		}
	}
	if (rc)
		goto fail;
	/* what a load costs before its workers run (the first load of a
	 * process is slower than the next ones) */
	fsti_log(FST_LOG_DEBUG, "load set up in %.1f ms (plan, destination, threads): %s",
		 (fsti_now() - t0) * 1e3, e->describe);
	give_back_context(e);
	*out = (fst_loader *)e;
	return 0;
fail:
	give_back_context(e);
	engine_free(e);
	return rc;
}

int fst_load_start(const fst_checkpoint *ck, const fst_load_opts *opts, fst_loader **out,
		   fst_error *err)
{
	return start_engine(ck, opts, NULL, 0, NULL, 0, out, err);
}

int fsti_load_pieces(const fst_checkpoint *ck, const fst_load_opts *opts,
		     const struct fsti_plan_tensor *pieces, size_t n, void *dst, uint64_t dst_size,
		     fst_error *err)
{
	fst_loader *ld;
	int rc = start_engine(ck, opts, pieces, n, dst, dst_size, &ld, err);
	if (rc)
		return rc;
	fst_buffer *buf = NULL;
	rc = fst_loader_finish(ld, &buf, err);
	fst_buffer_release(buf); /* its memory is the caller's */
	return rc;
}

/* One wait on the engine's condition (lock held) of at most 100 ms; true
 * when 100 ms have passed since *last, which becomes now: time to report.
 * Every finished tensor wakes a waiter, so reports come at most every
 * 100 ms, as documented. */
static bool wait_beat(struct fsti_engine *e, double *last)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_nsec += 100 * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&e->cond, &e->lock, &ts);
	double now = fsti_now();
	if (now - *last < 0.1)
		return false;
	*last = now;
	return true;
}

/* The progress callback, called with the lock let go (it may cancel). */
static void report_progress(struct fsti_engine *e)
{
	pthread_mutex_unlock(&e->lock);
	e->opts.progress(e->opts.progress_ctx, atomic_load(&e->bytes_done), e->plan.total_bytes);
	pthread_mutex_lock(&e->lock);
}

static bool all_handed(const struct fsti_engine *e)
{
	return e->nhanded == e->plan.nt;
}

int fst_loader_next(fst_loader *ld, fst_tensor_view *view, fst_error *err)
{
	struct fsti_engine *e = (struct fsti_engine *)ld;
	fsti_err_clear(err);
	if (!e || !view)
		return fsti_err(err, FST_EUSAGE, "fst_loader_next: loader and view are required");
	pthread_mutex_lock(&e->lock);
	/* with progress asked for, the wait reports as fst_loader_finish's
	 * does (a caller may stop the load from there: Ctrl-C in Python) */
	double last = fsti_now();
	while (!e->error && e->nhanded == e->nready && e->running) {
		if (!e->opts.progress)
			pthread_cond_wait(&e->cond, &e->lock);
		else if (wait_beat(e, &last))
			report_progress(e);
	}
	int rc;
	if (e->error) {
		rc = e->error;
		if (err)
			*err = e->first_error;
	} else if (e->nhanded < e->nready) {
		/* A tensor leaves only while its file is still the one opened:
		 * its bytes were all read before this check, so a write that
		 * comes after it cannot be in them. mmap views show the file as
		 * it is now and cannot be vouched for (docs/api.md). */
		size_t i = e->ready[e->nhanded];
		const fst_file *f = fst_checkpoint_file(e->ck, e->plan.t[i].file);
		fst_error cerr;
		if (e->opts.io != FST_IO_MMAP &&
		    fsti_file_check_unchanged(f, "during the load", &cerr)) {
			/* the load fails as on any error (the first one wins), and
			 * this call reports it like every later one */
			pthread_mutex_unlock(&e->lock);
			fsti_engine_fail(e, &cerr);
			return fst_loader_next(ld, view, err);
		}
		e->nhanded++;
		fst_buffer_tensor(e->buf, i, view);
		rc = 1;
	} else if (all_handed(e)) {
		rc = 0;
	} else {
		rc = fsti_err(err, FST_EIO, "internal: readers stopped with %zu of %zu tensors "
					    "complete",
			      e->nready, e->plan.nt);
	}
	pthread_mutex_unlock(&e->lock);
	return rc;
}

void fst_loader_progress(const fst_loader *ld, uint64_t *done, uint64_t *total)
{
	struct fsti_engine *e = (struct fsti_engine *)ld;
	atomic_fetch_add(&e->visitors, 1);
	if (done)
		*done = atomic_load(&e->bytes_done);
	if (total)
		*total = e->plan.total_bytes;
	atomic_fetch_sub(&e->visitors, 1);
}

void fst_loader_cancel(fst_loader *ld)
{
	struct fsti_engine *e = (struct fsti_engine *)ld;
	if (!e)
		return;
	atomic_fetch_add(&e->visitors, 1);
	pthread_mutex_lock(&e->lock);
	if (!e->error) {
		e->canceled = true;
		e->error = FST_ECANCELED;
		fsti_err(&e->first_error, FST_ECANCELED, "load cancelled");
	}
	/* the workers told under the lock, in the same step as the error */
	atomic_store(&e->stop, 1);
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	/* the last touch of e: a finish or free waiting in engine_free may
	 * go on */
	atomic_fetch_sub(&e->visitors, 1);
}

/* Wait for the workers, calling progress every 100 ms. */
static void wait_workers(struct fsti_engine *e, bool report)
{
	double last = fsti_now();
	pthread_mutex_lock(&e->lock);
	while (e->running) {
		if (!report)
			pthread_cond_wait(&e->cond, &e->lock);
		else if (wait_beat(e, &last))
			report_progress(e);
	}
	pthread_mutex_unlock(&e->lock);
}

/* What the load found on its way, at the end of the buffer's description. */
static void describe_append(struct fst_buffer *b, const char *fmt, ...) FSTI_PRINTF(2, 3);
static void describe_append(struct fst_buffer *b, const char *fmt, ...)
{
	size_t n = strlen(b->describe);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b->describe + n, sizeof b->describe - n, fmt, ap);
	va_end(ap);
}

int fst_loader_finish(fst_loader *ld, fst_buffer **out, fst_error *err)
{
	struct fsti_engine *e = (struct fsti_engine *)ld;
	fsti_err_clear(err);
	if (out)
		*out = NULL;
	if (!e)
		return fsti_err(err, FST_EUSAGE, "fst_loader_finish: loader is required");
	wait_workers(e, e->opts.progress != NULL);
	join_workers(e);
	int rc = e->error;
	if (rc) {
		if (err)
			*err = e->first_error;
	} else if (e->opts.io != FST_IO_MMAP) {
		/* Every byte must have been counted, and the files must still be
		 * the ones we read. */
		if (atomic_load(&e->bytes_done) != e->plan.total_bytes)
			rc = fsti_err(err, FST_EIO, "internal: %" PRIu64 " of %" PRIu64
						    " bytes arrived",
				      (uint64_t)atomic_load(&e->bytes_done), e->plan.total_bytes);
		else
			rc = check_files_unchanged(e->ck, "during the load", err);
	}
	if (!rc) {
		if (e->opts.progress)
			e->opts.progress(e->opts.progress_ctx, e->plan.total_bytes,
					 e->plan.total_bytes);
		uint64_t cached = fsti_direct_cached_bytes(e->src.direct);
		if (cached && e->plan.total_bytes)
			describe_append(e->buf,
					"; %.0f%% of the bytes read from the page cache, which held "
					"their chunks whole",
					100.0 * (double)cached / (double)e->plan.total_bytes);
		if (e->disk_helpers && e->plan.total_bytes)
			describe_append(e->buf, "; %.1f%% of the bytes read from the disk by the helpers",
					100.0 * (double)atomic_load(&e->disk_bytes) /
						(double)e->plan.total_bytes);
		if (fsti_direct_fds_shared(e->src.direct))
			describe_append(e->buf, "; another load of these files appeared: the rest "
						"read through the page cache");
		if (atomic_load(&e->ring_fallback))
			describe_append(e->buf, "; workers without an io_uring ring of their own read "
						"with pread");
		if (out) {
			*out = e->buf;
			e->buf = NULL;
		}
	}
	engine_free(e);
	return rc;
}

void fst_loader_free(fst_loader *ld)
{
	struct fsti_engine *e = (struct fsti_engine *)ld;
	if (!e)
		return;
	fst_loader_cancel(ld);
	wait_workers(e, false);
	join_workers(e);
	engine_free(e);
}

int fst_load(const fst_checkpoint *ck, const fst_load_opts *opts, fst_buffer **out,
	     fst_error *err)
{
	if (out)
		*out = NULL;
	if (!out)
		return fsti_err(err, FST_EUSAGE, "fst_load: out is required");
	fst_loader *ld;
	int rc = fst_load_start(ck, opts, &ld, err);
	if (rc)
		return rc;
	return fst_loader_finish(ld, out, err);
}
