/*
 * cold_probe.c - the cold probe: which way a load of cold files reads its disk.
 *
 * Disks reward different patterns, and some change their mind from pass to
 * pass: on one H200 machine O_DIRECT in 512 KiB requests read either 1.6 or
 * 3 GB/s, while reads through the page cache with readahead held 1.9-2.3
 * (docs/design.md, "Cold reads"). With FST_COLD_PROBE set, a GPU load of
 * cold files under io=auto measures instead of guessing: the first stretch of the plan is read with
 * O_DIRECT in small requests (io_uring), the next through the page cache
 * with readahead clipped to that stretch, and the rest the faster way.
 * Each stretch starts only once the one before has been read, so neither
 * rate includes the other's requests. Both stretches deliver their bytes
 * like any others: nothing is read twice.
 *
 * Readahead wins ties (within PREFER_CACHE): it leaves the model in the page
 * cache for the next start. Measured on the H200 the stretches did not
 * predict the rest (the readahead stretch read 0.7-0.9x of what readahead
 * reads over a whole pass), so the probe is off unless asked for, and io=auto
 * reads cold files onto a GPU with O_DIRECT in 512 KiB requests, which beat
 * both (engine.c, choose_io).
 */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of each stretch (FST_COLD_PROBE sets another size): long enough for
 * the disk's queue to fill and drain a few times at 3 GB/s. */
#define PROBE_BYTES (512ull << 20)
/* The plan must hold this many probes' worth for the probe to pay. */
#define PROBE_MIN_SHARE 8u
/* O_DIRECT request size of the probe and of a load that keeps O_DIRECT:
 * fastsafetensors' 516 KiB, rounded to the block size. */
#define PROBE_REQUEST (512ull << 10)
/* O_DIRECT must be this much faster to be kept. */
#define PREFER_CACHE 1.10

/* FST_COLD_PROBE: off (the default), on, or BYTES[:direct|:readahead] (the
 * stretch size, 0 for the default; a way named after the colon is kept
 * whatever the rates, for tests and benchmarks). Off by default: on the
 * H200 its stretches did not predict the pass (h200-2026-12-03-probe). */
static int probe_env(uint64_t *bytes, int *force, bool *off, fst_error *err)
{
	const char *v = fsti_env(FSTI_ENV_COLD_PROBE);
	*bytes = PROBE_BYTES;
	*force = -1;
	*off = !v || !strcmp(v, "off");
	if (*off)
		return 0;
	if (!strcmp(v, "on"))
		return 0;
	char *end;
	unsigned long long n = strtoull(v, &end, 10);
	bool bad = v[0] == '-' || v[0] == '+';
	if (!strcmp(end, ":direct"))
		*force = FSTI_PROBE_DIRECT;
	else if (!strcmp(end, ":readahead"))
		*force = FSTI_PROBE_AHEAD;
	else if (*end)
		bad = true;
	if (bad)
		return fsti_err(err, FST_EUSAGE,
				"%s=\"%s\": expected off, on, or BYTES with an optional :direct "
				"or :readahead",
				fsti_env_name(FSTI_ENV_COLD_PROBE), v);
	if (n)
		*bytes = n;
	return 0;
}

bool fsti_probe_asked(void)
{
	const char *v = fsti_env(FSTI_ENV_COLD_PROBE);
	return v && strcmp(v, "off");
}

int fsti_probe_setup(struct fsti_engine *e, bool wanted, fst_error *err)
{
	struct fsti_probe *p = &e->probe;
	uint64_t bytes;
	int force;
	bool off;
	int rc = probe_env(&bytes, &force, &off, err);
	if (rc || off || !wanted || !fsti_uring_available() ||
	    e->plan.total_bytes < PROBE_MIN_SHARE * bytes)
		return rc;
	/* the two stretches, in whole chunks */
	size_t i = 0;
	for (int k = 0; k < 2; k++) {
		uint64_t got = 0;
		while (i < e->plan.nc && got < bytes)
			got += e->plan.c[i++].len;
		p->end[k] = i;
		p->bytes[k] = got;
		atomic_init(&p->left[k], p->end[k] - (k ? p->end[0] : 0));
		atomic_init(&p->t0_ns[k], 0);
	}
	if (!p->bytes[1] || p->end[1] >= e->plan.nc)
		return 0;
	p->on = true;
	p->stretch = bytes;
	p->force = force;
	atomic_init(&p->phase, FSTI_PROBE_DIRECT);
	e->src.direct_request_bytes = PROBE_REQUEST;
	return 0;
}

static int phase_of(const struct fsti_probe *p, size_t i)
{
	return i < p->end[0] ? FSTI_PROBE_DIRECT : i < p->end[1] ? FSTI_PROBE_AHEAD
								  : FSTI_PROBE_DECIDED;
}

bool fsti_probe_direct(const struct fsti_engine *e, size_t i)
{
	const struct fsti_probe *p = &e->probe;
	int k = phase_of(p, i);
	/* phase DECIDED is published after direct_won is set */
	return k == FSTI_PROBE_DIRECT || (k == FSTI_PROBE_DECIDED && p->direct_won);
}

void fsti_probe_stretch(const struct fsti_engine *e, size_t i, size_t *lo, size_t *hi,
			bool *ahead)
{
	const struct fsti_probe *p = &e->probe;
	switch (phase_of(p, i)) {
	case FSTI_PROBE_DIRECT:
		*lo = 0, *hi = p->end[0], *ahead = false;
		return;
	case FSTI_PROBE_AHEAD:
		*lo = p->end[0], *hi = p->end[1], *ahead = true;
		return;
	default:
		*lo = p->end[1], *hi = e->plan.nc, *ahead = !p->direct_won;
	}
}

bool fsti_probe_open(struct fsti_engine *e, size_t i)
{
	return phase_of(&e->probe, i) <= atomic_load(&e->probe.phase);
}

void fsti_probe_wait_open(struct fsti_engine *e, size_t i)
{
	pthread_mutex_lock(&e->lock);
	while (!fsti_probe_open(e, i) && !atomic_load(&e->stop))
		pthread_cond_wait(&e->cond, &e->lock);
	pthread_mutex_unlock(&e->lock);
}

static uint64_t now_ns(void)
{
	return (uint64_t)(fsti_now() * 1e9) | 1; /* never 0: 0 means not begun */
}

void fsti_probe_began(struct fsti_engine *e, size_t i)
{
	struct fsti_probe *p = &e->probe;
	int k = phase_of(p, i);
	if (k == FSTI_PROBE_DECIDED || atomic_load(&p->t0_ns[k]))
		return;
	uint_fast64_t zero = 0;
	atomic_compare_exchange_strong(&p->t0_ns[k], &zero, now_ns());
}

static void decide(struct fsti_engine *e)
{
	struct fsti_probe *p = &e->probe;
	double rate[2];
	for (int k = 0; k < 2; k++) {
		double secs = (double)(p->t1_ns[k] - atomic_load(&p->t0_ns[k])) / 1e9;
		rate[k] = (double)p->bytes[k] / (secs > 1e-9 ? secs : 1e-9);
	}
	bool direct = p->force >= 0 ? p->force == FSTI_PROBE_DIRECT
				    : rate[0] > rate[1] * PREFER_CACHE;
	p->direct_won = direct;
	char stretch[32];
	fsti_size_text(stretch, sizeof stretch, p->stretch);
	snprintf(p->note, sizeof p->note,
		 "cold probe: O_DIRECT in %llu KiB requests read %.2f GB/s over the first %s, "
		 "the page cache with readahead %.2f GB/s over the next %s: the rest %s%s",
		 (unsigned long long)(PROBE_REQUEST >> 10), rate[0] / 1e9, stretch, rate[1] / 1e9,
		 stretch, direct ? "with O_DIRECT" : "through the page cache",
		 p->force >= 0 ? " (as FST_COLD_PROBE asked)" : "");
	fsti_log(FST_LOG_INFO, "%s", p->note);
}

void fsti_probe_read_done(struct fsti_engine *e, size_t i)
{
	struct fsti_probe *p = &e->probe;
	int k = phase_of(p, i);
	if (k == FSTI_PROBE_DECIDED || atomic_fetch_sub(&p->left[k], 1) != 1)
		return;
	/* the stretch's last read: the next phase opens */
	p->t1_ns[k] = now_ns();
	if (k == FSTI_PROBE_AHEAD)
		decide(e);
	pthread_mutex_lock(&e->lock);
	atomic_store(&p->phase, k + 1);
	pthread_mutex_unlock(&e->lock);
	pthread_cond_broadcast(&e->cond);
}
