/* Description: what io=auto reads cold files with, onto the libcuda double.
 * A staged load of cold files reads them with O_DIRECT through io_uring in
 * 512 KiB chunks with 8 threads when the caller leaves those to fst, asks
 * for no readahead, and says so; a chunk size or thread count the caller
 * gives stands; a load of cold files into host memory the same, through
 * landing slots. Files in the page cache and readahead asked for (onto a
 * GPU or into host memory) read with pread; readahead off reads cold
 * files with O_DIRECT. FST_URING_PAGE_CACHE (random, readahead) makes
 * io_uring read through the page cache instead, which then holds the files,
 * as O_DIRECT's loads leave it without them; another value is a usage
 * error naming the variable. FST_READS_IN_FLIGHT=1 (fastsafetensors'
 * pattern with streams: each worker waits for its read) reads the same
 * bytes, whole and streamed, and says so, as does 3 (every slot reading);
 * pread onto a GPU delivers each slot as it is read unless told otherwise
 * (with its second read failing, its first chunk was already handed on);
 * a value other than 1 to 3 is a usage error; each read failing in turn fails the load cleanly; a load
 * freed at once stops. Every tensor of every load equals the file. */
#include "cuda_helpers.h"
#include "io.h" /* fsti_cached_fraction, fsti_presence_* */

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

static ch_ckpt c;
static bool can_evict;

static int group_setup(void **state)
{
	int rc = ch_setup(state);
	if (rc)
		return rc;
	can_evict = ch_write_cold("cold-auto", lh_base_seed() + 17, &c);
	return 0;
}

static int group_teardown(void **state)
{
	ch_close(&c);
	unsetenv("FST_URING_PAGE_CACHE");
	unsetenv("FST_READS_IN_FLIGHT");
	return ch_teardown(state);
}

/* Load with o (cold when evict), check every byte, require each of the
 * '|'-separated parts of want in the description and none of refuse, and
 * return how many readahead requests the load made. */
static long load_says(const fst_load_opts *o, bool evict, const char *want, const char *refuse,
		      const char *ctx)
{
	bool cpu = !strcmp(o->device, "cpu");
	lh_files fs;
	if (cpu)
		lh_files_read(c.ck, &fs); /* reads the files: evict after */
	if (evict)
		lh_evict(c.ck);
	fst_error err;
	assert_int_equal(fst_fault_set("prefetch:1+", &err), 0); /* counts, refuses */
	fst_buffer *buf;
	int rc = fst_load(c.ck, o, &buf, &err);
	long asked = fst_fault_last(NULL, 0);
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
	if (rc)
		fail_msg("%s: %s", ctx, err.message);
	const char *d = fst_buffer_describe(buf);
	char parts[256];
	snprintf(parts, sizeof parts, "%s", want);
	for (char *save = NULL, *p = strtok_r(parts, "|", &save); p; p = strtok_r(NULL, "|", &save))
		if (!strstr(d, p))
			fail_msg("%s: \"%s\" lacks \"%s\"", ctx, d, p);
	if (refuse && strstr(d, refuse))
		fail_msg("%s: \"%s\" says \"%s\"", ctx, d, refuse);
	if (cpu) {
		lh_check_buffer(c.ck, &fs, buf, o, NULL, ctx);
		lh_files_free(&fs);
	} else {
		ch_assert_buffer(&c, buf, 0);
	}
	fst_buffer_release(buf);
	ch_assert_clean(ctx, c.host_base);
	return asked;
}

/* io=auto onto cuda:0 with every other option left to fst, the page-cache
 * mode unset; skips where the files cannot be made cold or
 * io_uring is unavailable. */
static void cold_auto_opts(fst_load_opts *o)
{
	if (!can_evict || !ch_uring_ok)
		skip();
	unsetenv("FST_URING_PAGE_CACHE");
	ch_opts(o, "cuda:0", FST_IO_AUTO, 0, 0);
}

static void test_cold_staged_reads_direct(void **state)
{
	(void)state;
	fst_load_opts o;
	cold_auto_opts(&o);
	long asked = load_says(&o, true, "uring|512 KiB chunks|cold files read with O_DIRECT",
			       "readahead", "cold, defaults");
	assert_int_equal(asked, 0);

	/* 8 threads whatever the cores: the plan has chunks for twice that */
	o.chunk_bytes = 64 << 10;
	uint64_t total = 0;
	for (size_t i = 0; i < c.nfiles; i++)
		total += c.sizes[i];
	if (total / o.chunk_bytes < 17)
		fail_msg("the checkpoint (%llu bytes) makes 16 chunks or fewer",
			 (unsigned long long)total);
	load_says(&o, true, "uring|8 threads|64 KiB chunks", "readahead", "cold, chunk given");

	o.threads = 3;
	load_says(&o, true, "uring|3 threads|64 KiB chunks|cold files read with O_DIRECT",
		  "readahead", "cold, chunk and threads given");

	o.readahead_bytes = FST_READAHEAD_OFF;
	load_says(&o, true, "uring|cold files read with O_DIRECT", "readahead",
		  "cold, readahead off");

	/* into host memory the same, through landing slots */
	fst_load_opts h;
	cold_auto_opts(&h);
	h.device = "cpu";
	asked = load_says(&h, true, "uring|512 KiB chunks|cold files read with O_DIRECT",
			  "readahead", "cold, cpu");
	assert_int_equal(asked, 0);
}

static void test_where_auto_keeps_pread(void **state)
{
	(void)state;
	fst_load_opts o;
	cold_auto_opts(&o);
	o.threads = 3;
	o.chunk_bytes = 64 << 10;

	/* in the page cache */
	lh_files fs;
	lh_files_read(c.ck, &fs);
	load_says(&o, false, "pread", "O_DIRECT", "warm");
	lh_files_free(&fs);

	/* readahead asked for */
	o.readahead_bytes = 1 << 20;
	if (load_says(&o, true, "pread|readahead 1 MiB", "O_DIRECT", "cold, readahead asked") < 1)
		fail_msg("cold, readahead asked: no readahead requested");
	o.readahead_bytes = 0;

	/* into host memory with readahead asked for: pread straight into the
	 * destination */
	fst_load_opts h = o;
	h.device = "cpu";
	h.readahead_bytes = 1 << 20;
	if (load_says(&h, true, "pread|readahead 1 MiB", "O_DIRECT", "cold, cpu, readahead") < 1)
		fail_msg("cold, cpu, readahead asked: no readahead requested");
}

/* The share of the checkpoint in the page cache after a cold load with o
 * under FST_URING_PAGE_CACHE=mode (NULL: unset). */
static double cached_after(const fst_load_opts *o, const char *mode, const char *want,
			   const char *refuse, const char *ctx)
{
	if (mode)
		setenv("FST_URING_PAGE_CACHE", mode, 1);
	else
		unsetenv("FST_URING_PAGE_CACHE");
	load_says(o, true, want, refuse, ctx);
	unsetenv("FST_URING_PAGE_CACHE");
	return fsti_cached_fraction(c.ck);
}

static void test_page_cache_modes(void **state)
{
	(void)state;
	fst_load_opts o;
	cold_auto_opts(&o);

	double d = cached_after(&o, NULL, "uring|cold files read with O_DIRECT",
				"through the page cache", "O_DIRECT");
	if (d >= 0.5)
		fail_msg("O_DIRECT: %.0f%% of the files in the page cache after the load", d * 100);

	double r = cached_after(&o, "random",
				"uring|512 KiB chunks|cold files read with io_uring|"
				"through the page cache, readahead off (FST_URING_PAGE_CACHE=random)",
				"O_DIRECT", "random");
	if (r < 0.9)
		fail_msg("random: %.0f%% of the files in the page cache after the load", r * 100);

	fst_load_opts u = o;
	u.io = FST_IO_URING;
	double a = cached_after(&u, "readahead",
				"uring|asked for (io=uring)|(FST_URING_PAGE_CACHE=readahead)",
				"readahead off", "readahead, io=uring");
	if (a < 0.9)
		fail_msg("readahead: %.0f%% of the files in the page cache after the load", a * 100);

	fst_load_opts h = u;
	h.device = "cpu";
	double cpu = cached_after(&h, "random", "uring|(FST_URING_PAGE_CACHE=random)", NULL,
				  "random, cpu");
	if (cpu < 0.9)
		fail_msg("random, cpu: %.0f%% of the files in the page cache after the load",
			 cpu * 100);

	/* off is the default, said out loud */
	double off = cached_after(&u, "off", "uring", "through the page cache", "off");
	if (off >= 0.5)
		fail_msg("off: %.0f%% of the files in the page cache after the load", off * 100);

	setenv("FST_URING_PAGE_CACHE", "direct", 1);
	fst_error err;
	fst_buffer *buf = NULL;
	assert_int_equal(fst_load(c.ck, &o, &buf, &err), FST_EUSAGE);
	assert_null(buf);
	assert_non_null(strstr(err.message, "FST_URING_PAGE_CACHE=\"direct\": expected off, "
					    "random or readahead"));
	unsetenv("FST_URING_PAGE_CACHE");
	ch_assert_clean("bad FST_URING_PAGE_CACHE", c.host_base);
}

/* on_landed that counts its calls (the hand-off test below) */
static int count_landed(void *ctx, size_t tensor, uint64_t offset, const void *bytes,
			uint64_t len)
{
	(void)tensor;
	(void)offset;
	(void)bytes;
	(void)len;
	++*(unsigned *)ctx;
	return 0;
}

/* One read in flight per worker, in streams of their own (fastsafetensors'
 * pattern): the same bytes, whole and streamed; io_uring's default, 2, says
 * nothing; another value is refused; each read failing in turn fails
 * the load cleanly; a load freed at once stops. */
static void test_reads_in_flight(void **state)
{
	(void)state;
	fst_load_opts o;
	cold_auto_opts(&o);
	o.chunk_bytes = 64 << 10;
	o.stream_bytes = 256 << 10;
	o.threads = 4;
	setenv("FST_READS_IN_FLIGHT", "1", 1);
	load_says(&o, true, "uring|4 threads|streams of 256 KiB, one read in flight per thread",
		  "readahead", "one read in flight");
	/* 1 and every slot (3) read the same bytes, whole and streamed */
	static const char *const depths[][2] = {{"1", "one read in flight per thread"},
						{"3", "three reads in flight per thread"}};
	for (size_t d = 0; d < sizeof depths / sizeof *depths; d++) {
		setenv("FST_READS_IN_FLIGHT", depths[d][0], 1);
		for (unsigned t = 1; t <= 16; t *= 4) {
			o.threads = t;
			lh_evict(c.ck);
			fst_buffer *buf;
			fst_error err;
			if (ch_load_whole_or_streamed(&c, &o, true, &buf, &err))
				fail_msg("streamed, %u threads, %s in flight: %s", t, depths[d][0],
					 err.message);
			if (!strstr(fst_buffer_describe(buf), depths[d][1]))
				fail_msg("streamed: \"%s\"", fst_buffer_describe(buf));
			fst_buffer_release(buf);
			ch_assert_clean("streamed, reads in flight", c.host_base);
		}
	}
	o.threads = 4;
	setenv("FST_READS_IN_FLIGHT", "2", 1);
	load_says(&o, true, "uring|streams of 256 KiB", "in flight", "two reads in flight");
	/* pread's direct reads into host memory have no slots: nothing said */
	setenv("FST_READS_IN_FLIGHT", "1", 1);
	fst_load_opts h = o;
	h.device = "cpu";
	h.io = FST_IO_PREAD;
	load_says(&h, false, "pread", "in flight", "cpu, one read in flight");
	unsetenv("FST_READS_IN_FLIGHT");

	const char *const bad[] = {"0", "4", "12", "one", "-1", " 1"};
	ch_cold_bad_env(&c, "FST_READS_IN_FLIGHT", bad, sizeof bad / sizeof *bad);
	/* every read of the load failing in turn (its ring's set-up failing is
	 * no different with one read in flight: test_engine_faults) */
	ch_fault_loop(&c, true, "FST_READS_IN_FLIGHT", "1", 256 << 10, "uring_complete", FST_EIO,
		      "one read in flight per thread");
	const unsigned threads[] = {1, 4, 16};
	ch_freed_at_once(&c, true, "FST_READS_IN_FLIGHT", "1", 64 << 10, threads,
			 sizeof threads / sizeof *threads);
}

/* pread onto a GPU, from the page cache, needing neither io_uring nor
 * eviction (so never skipped): each slot handed on as soon as it is read by
 * default, 2 and 3 held back and said so; the hand-off itself. */
static void test_pread_hand_off(void **state)
{
	(void)state;
	/* every count reads the same bytes, whole and streamed */
	fst_load_opts g;
	ch_opts(&g, "cuda:0", FST_IO_PREAD, 4, 0);
	g.chunk_bytes = 64 << 10;
	g.stream_bytes = 256 << 10;
	unsetenv("FST_READS_IN_FLIGHT");
	load_says(&g, false, "pread|streams of 256 KiB", "in flight", "pread, default depth");
	static const char *const held[][2] = {{"1", NULL},
					      {"2", "two reads in flight per thread"},
					      {"3", "three reads in flight per thread"}};
	for (size_t d = 0; d < sizeof held / sizeof *held; d++) {
		setenv("FST_READS_IN_FLIGHT", held[d][0], 1);
		for (unsigned k = 0; k < 6; k++) {
			unsigned t = 1u << (2 * (k / 2)); /* 1, 4, 16 threads */
			bool streamed = k % 2;
			g.threads = t;
			fst_buffer *buf;
			fst_error err;
			if (ch_load_whole_or_streamed(&c, &g, streamed, &buf, &err))
				fail_msg("pread, %u threads, %s in flight, %s: %s", t, held[d][0],
					 streamed ? "streamed" : "whole", err.message);
			const char *say = fst_buffer_describe(buf);
			if (held[d][1] ? !strstr(say, held[d][1]) : strstr(say, "in flight") != NULL)
				fail_msg("pread, %s in flight: \"%s\"", held[d][0], say);
			fst_buffer_release(buf);
			ch_assert_clean("pread, reads in flight", c.host_base);
		}
	}
	/* The hand-off itself, one worker, its second read failing: a slot
	 * handed on as soon as it is read has shown its bytes (on_landed
	 * reports them when their copies are queued) before that failure;
	 * held back for the next read (2, the way before), never. */
	fst_load_opts one = g;
	one.threads = 1;
	one.stream_bytes = 0;
	unsigned landed = 0;
	one.on_landed = count_landed;
	one.on_landed_ctx = &landed;
	static const char *const ways[] = {NULL, "2"}; /* the default, the way before */
	for (int w = 0; w < 2; w++) {
		if (ways[w])
			setenv("FST_READS_IN_FLIGHT", ways[w], 1);
		else
			unsetenv("FST_READS_IN_FLIGHT");
		landed = 0;
		fst_error err;
		assert_int_equal(fst_fault_set("read:2", &err), 0);
		fst_buffer *buf = NULL;
		int rc = fst_load(c.ck, &one, &buf, &err);
		assert_int_equal(fst_fault_set(NULL, NULL), 0);
		assert_int_equal(rc, FST_EIO);
		assert_null(buf);
		if (!ways[w] ? landed == 0 : landed != 0)
			fail_msg("pread, FST_READS_IN_FLIGHT=%s: %u on_landed calls before the "
				 "second read failed",
				 ways[w] ? ways[w] : "unset", landed);
		ch_assert_clean("pread, the second read failing", c.host_base);
	}
	unsetenv("FST_READS_IN_FLIGHT");
}

/* Replicas: another load of the same files (here a presence lock this
 * process holds itself, as any other load's would be). Seen at the start,
 * io=auto reads through the page cache with readahead instead of O_DIRECT
 * and says why; readahead off keeps O_DIRECT. */
static void test_replica_at_start(void **state)
{
	(void)state;
	fst_load_opts o;
	cold_auto_opts(&o);
	long base = c.host_base;
	struct fsti_presence *other = fsti_presence_join(c.ck, true);
	assert_non_null(other);
	c.host_base = fsti_live_allocations(); /* the other load's, not a leak */
	assert_false(fsti_presence_any(other, NULL)); /* its own lock is not another's */
	double r = cached_after(&o, NULL,
				"pread|readahead|another load is reading these files|"
				"which reads them once for both",
				"O_DIRECT", "another load at the start");
	if (r < 0.9)
		fail_msg("another load: %.0f%% of the files in the page cache after the load",
			 r * 100);
	/* into host memory the same */
	fst_load_opts h = o;
	h.device = "cpu";
	r = cached_after(&h, NULL, "pread|readahead|another load is reading these files",
			 "O_DIRECT", "cpu, another load at the start");
	if (r < 0.9)
		fail_msg("cpu, another load: %.0f%% of the files in the page cache after the load",
			 r * 100);

	fst_load_opts off = o;
	off.readahead_bytes = FST_READAHEAD_OFF;
	double d = cached_after(&off, NULL, "uring|cold files read with O_DIRECT",
				"another load", "another load, readahead off");
	if (d >= 0.5)
		fail_msg("readahead off: %.0f%% of the files in the page cache", d * 100);

	/* the load's own lock refused (a filesystem without locks): alone as far
	 * as it can tell, O_DIRECT */
	fst_error err;
	assert_int_equal(fst_fault_set("presence:1+", &err), 0);
	lh_evict(c.ck);
	fst_buffer *buf = NULL;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("presence refused: %s", err.message);
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
	assert_non_null(strstr(fst_buffer_describe(buf), "cold files read with O_DIRECT"));
	ch_assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);

	fsti_presence_leave(other);
	c.host_base = base;
	d = cached_after(&o, NULL, "cold files read with O_DIRECT", "another load",
			 "the other load gone");
	if (d >= 0.5)
		fail_msg("alone again: %.0f%% of the files in the page cache", d * 100);
	ch_assert_clean("replica at start", c.host_base);
}

/* Another load arriving during an O_DIRECT load (when its first bytes have
 * landed): the rest of the reads go through the page cache, which then
 * holds most of the files; the bytes are the files' all the same. */
static struct fsti_presence *arrived;
static int arrive(void *ctx, size_t tensor, uint64_t offset, const void *bytes, uint64_t len)
{
	(void)ctx;
	(void)tensor;
	(void)offset;
	(void)bytes;
	(void)len;
	if (!__atomic_load_n(&arrived, __ATOMIC_ACQUIRE)) {
		struct fsti_presence *p = fsti_presence_join(c.ck, true);
		struct fsti_presence *none = NULL;
		if (!__atomic_compare_exchange_n(&arrived, &none, p, false, __ATOMIC_ACQ_REL,
						 __ATOMIC_ACQUIRE))
			fsti_presence_leave(p);
	}
	return 0;
}

/* fst_load_explain of a cold load takes no presence lock: a load of the
 * same files looking for others (share_watch, every 10 ms) took it for a
 * replica and left O_DIRECT for the rest of its load. It still sees
 * another load's lock. */
static void test_explain_takes_no_lock(void **state)
{
	(void)state;
	fst_load_opts o;
	cold_auto_opts(&o);
	lh_evict(c.ck);
	char why[1024];
	fst_error err;
	assert_int_equal(fst_fault_set("presence:1+", &err), 0); /* counts, refuses */
	assert_int_equal(fst_load_explain(c.ck, &o, why, sizeof why, &err), 0);
	long locks = fst_fault_last(NULL, 0);
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
	if (locks)
		fail_msg("fst_load_explain asked for %ld presence locks: \"%s\"", locks, why);
	if (!strstr(why, "cold files read with O_DIRECT"))
		fail_msg("alone: \"%s\"", why);
	long base = c.host_base;
	struct fsti_presence *other = fsti_presence_join(c.ck, true);
	assert_non_null(other);
	c.host_base = fsti_live_allocations(); /* the other load's, not a leak */
	assert_int_equal(fst_load_explain(c.ck, &o, why, sizeof why, &err), 0);
	if (!strstr(why, "another load is reading these files"))
		fail_msg("beside another load: \"%s\"", why);
	fsti_presence_leave(other);
	c.host_base = base;
	ch_assert_clean("explain", c.host_base);
}

static void test_replica_arrives(void **state)
{
	(void)state;
	fst_load_opts o;
	cold_auto_opts(&o);
	o.threads = 2;
	o.chunk_bytes = 64 << 10; /* many chunks, each slow: the load outlasts 10 ms */
	o.on_landed = arrive;
	ch_set_delay("2000");
	arrived = NULL;
	/* the arriving load's allocation is live through the check */
	lh_evict(c.ck);
	fst_error err;
	fst_buffer *buf = NULL;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("another load arrives: %s", err.message);
	ch_set_delay("50");
	assert_non_null(strstr(fst_buffer_describe(buf), "cold files read with O_DIRECT"));
	assert_non_null(strstr(fst_buffer_describe(buf), "; another load of these files "
							 "appeared: the rest read through the "
							 "page cache"));
	ch_assert_buffer(&c, buf, 0);
	fst_buffer_release(buf);
	double r = fsti_cached_fraction(c.ck);
	assert_non_null(arrived);
	fsti_presence_leave(arrived);
	if (r < 0.5)
		fail_msg("another load arrived: %.0f%% of the files in the page cache after the "
			 "load (the rest not read through it)",
			 r * 100);
	/* and without one, O_DIRECT to the end */
	o.on_landed = NULL;
	double d = cached_after(&o, NULL, "cold files read with O_DIRECT", "another load", "alone");
	if (d >= 0.05)
		fail_msg("alone: %.0f%% of the files in the page cache", d * 100);
	ch_assert_clean("replica arrives", c.host_base);
}

/* Cold files partly in the page cache: io=auto still reads them with
 * O_DIRECT, except the chunks the page cache holds whole, which it reads
 * from there and counts in the description; none when nothing is cached,
 * and io=uring asked for reads everything with O_DIRECT. */
static void test_partly_cached(void **state)
{
	(void)state;
	fst_load_opts o;
	cold_auto_opts(&o);
	o.chunk_bytes = 64 << 10; /* chunks enough inside a third of each file */
	const char *note = "of the bytes read from the page cache, which held their chunks whole";
	load_says(&o, true, "cold files read with O_DIRECT", note, "nothing cached");
	for (int round = 0; round < 2; round++) {
		lh_evict(c.ck);
		/* the first third of every file into the page cache */
		for (size_t i = 0; i < c.nfiles; i++) {
			const char *path = fst_file_path(fst_checkpoint_file(c.ck, i));
			int fd = open(path, O_RDONLY);
			assert_true(fd >= 0);
			(void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM); /* no more than read */
			size_t n = (size_t)(c.sizes[i] / 3);
			char *b = malloc(n + 1);
			assert_true(pread(fd, b, n, 0) == (ssize_t)n);
			free(b);
			close(fd);
		}
		double before = fsti_cached_fraction(c.ck);
		if (before < 0.1 || before >= 0.5)
			fail_msg("a third of each file read: %.0f%% in the page cache", before * 100);
		fst_load_opts u = o;
		if (round == 1)
			u.io = FST_IO_URING;
		fst_error err;
		fst_buffer *buf = NULL;
		if (fst_load(c.ck, &u, &buf, &err))
			fail_msg("partly cached: %s", err.message);
		const char *d = fst_buffer_describe(buf);
		const char *at = strstr(d, note);
		if (round == 1) {
			if (at)
				fail_msg("io=uring asked for: \"%s\"", d);
		} else {
			if (!strstr(d, "cold files read with O_DIRECT") || !at)
				fail_msg("partly cached: \"%s\"", d);
			/* "; P% of the bytes ...": back over "P% " */
			const char *p = at - 1;
			while (p > d && p[-1] != ' ')
				p--;
			double pct = atof(p);
			if (pct < 5 || pct > 40)
				fail_msg("partly cached: %.0f%% read from the page cache (\"%s\")", pct, d);
		}
		ch_assert_buffer(&c, buf, 0);
		fst_buffer_release(buf);
	}
	ch_assert_clean("partly cached", c.host_base);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_cold_staged_reads_direct, ch_reset),
		cmocka_unit_test_setup(test_where_auto_keeps_pread, ch_reset),
		cmocka_unit_test_setup(test_page_cache_modes, ch_reset),
		cmocka_unit_test_setup(test_reads_in_flight, ch_reset),
		cmocka_unit_test_setup(test_pread_hand_off, ch_reset),
		cmocka_unit_test_setup(test_replica_at_start, ch_reset),
		cmocka_unit_test_setup(test_explain_takes_no_lock, ch_reset),
		cmocka_unit_test_setup(test_replica_arrives, ch_reset),
		cmocka_unit_test_setup(test_partly_cached, ch_reset),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
