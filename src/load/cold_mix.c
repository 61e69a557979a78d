/*
 * cold_mix.c - the cold mix: a load of cold files read both ways at once.
 *
 * The H200's disk has two moods that flip between passes a minute apart:
 * O_DIRECT in 512 KiB requests reads either about 1.8 or 2.8 GB/s, while
 * the page cache with readahead holds about 2.0-2.4 (docs/design.md, "Cold
 * reads"). A probe that picks one way at the start cannot follow a mood that
 * changes after it. With FST_COLD_MIX set, a staged load of cold files under
 * io=auto reads both ways for its whole length: some workers take chunks
 * from the front of the plan with O_DIRECT (io_uring), the others claim
 * stretches from the back and read each in order through the page cache
 * with readahead. Whichever way reads faster takes more of the bytes; they
 * meet somewhere in between, and each chunk is read once. An O_DIRECT worker
 * that finds no front left helps finish the last stretch.
 *
 * A measuring aid, off by default: whether the two ways together beat the
 * better one alone is for the H200 to show (scripts/gpu-side-by-side.sh
 * runs it beside the default as fst.load+FST_COLD_MIX=on).
 */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* O_DIRECT request size: io=auto's own for cold files (engine.c). */
#define MIX_REQUEST (512ull << 10)
/* Each page-cache reader's share of the plan is cut into this many
 * stretches at least, so that the two ways meet near where their rates
 * say, not a whole readahead window away. */
#define MIX_STRETCHES_PER_READER 4u

/* FST_COLD_MIX: off (the default), on (half the workers read with
 * O_DIRECT) or N (that many, 1 to the load's workers - 1). */
static int mix_env(unsigned *direct, bool *off, fst_error *err)
{
	const char *v = fsti_env(FSTI_ENV_COLD_MIX);
	*direct = 0;
	*off = !v || !strcmp(v, "off");
	if (*off || !strcmp(v, "on"))
		return 0;
	char *end;
	unsigned long n = strtoul(v, &end, 10);
	if (!v[0] || *end || v[0] == '-' || v[0] == '+' || !n || n > 4096)
		return fsti_err(err, FST_EUSAGE,
				"%s=\"%s\": expected off, on, or the number of threads that read "
				"with O_DIRECT (1 or more)",
				fsti_env_name(FSTI_ENV_COLD_MIX), v);
	*direct = (unsigned)n;
	return 0;
}

bool fsti_mix_asked(void)
{
	const char *v = fsti_env(FSTI_ENV_COLD_MIX);
	return v && strcmp(v, "off");
}

int fsti_mix_setup(struct fsti_engine *e, bool wanted, fst_error *err)
{
	struct fsti_mix *m = &e->mix;
	unsigned direct;
	bool off;
	int rc = mix_env(&direct, &off, err);
	if (rc || off || !wanted || e->nthreads < 2 || !fsti_uring_available())
		return rc;
	if (!direct)
		direct = e->nthreads / 2;
	m->direct_workers = FSTI_MIN(direct, e->nthreads - 1);
	size_t readers = e->nthreads - m->direct_workers;
	size_t share = e->plan.nc / (readers * MIX_STRETCHES_PER_READER);
	m->stretch = FSTI_MAX(FSTI_MIN(e->ahead, share), (size_t)1);
	pthread_mutex_init(&m->lock, NULL);
	m->back = e->plan.nc;
	atomic_init(&m->roles, 0);
	atomic_init(&m->bytes[0], 0);
	atomic_init(&m->bytes[1], 0);
	m->on = true;
	e->src.direct_request_bytes = MIX_REQUEST;
	return 0;
}

void fsti_mix_free(struct fsti_engine *e)
{
	if (e->mix.on)
		pthread_mutex_destroy(&e->mix.lock);
}

bool fsti_mix_role(struct fsti_engine *e)
{
	return atomic_fetch_add(&e->mix.roles, 1) < e->mix.direct_workers;
}

size_t fsti_mix_take(struct fsti_engine *e, bool direct, size_t *lo, size_t *hi)
{
	struct fsti_mix *m = &e->mix;
	size_t i = e->plan.nc;
	pthread_mutex_lock(&m->lock);
	if (direct && m->front < m->back) {
		i = m->front++;
	} else {
		if (!direct && m->cache_next == m->cache_end && m->front < m->back) {
			/* the next stretch from the back */
			m->cache_end = m->back;
			m->back -= FSTI_MIN(m->stretch, m->back - m->front);
			m->cache_lo = m->cache_next = m->back;
		}
		if (m->cache_next < m->cache_end) {
			i = m->cache_next++;
			*lo = m->cache_lo;
			*hi = m->cache_end;
		}
	}
	pthread_mutex_unlock(&m->lock);
	return i;
}

void fsti_mix_count(struct fsti_engine *e, bool direct, uint64_t bytes)
{
	atomic_fetch_add(&e->mix.bytes[direct], bytes);
}

void fsti_mix_note(struct fsti_engine *e, char *note, size_t size)
{
	const struct fsti_mix *m = &e->mix;
	if (!size)
		return;
	note[0] = '\0';
	if (!m->on)
		return;
	double direct = (double)atomic_load(&m->bytes[1]),
	       cache = (double)atomic_load(&m->bytes[0]), all = direct + cache;
	if (all <= 0)
		return;
	snprintf(note, size,
		 "cold mix: %u thread%s with O_DIRECT read %.0f%% of the bytes from the front, "
		 "%u through the page cache %.0f%% from the back",
		 m->direct_workers, m->direct_workers == 1 ? "" : "s", 100.0 * direct / all,
		 e->nthreads - m->direct_workers, 100.0 * cache / all);
}
