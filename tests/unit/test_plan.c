/* Description: property tests of fsti_plan_build over many random
 * checkpoints (written with fst_writer: 0-byte, odd-sized and sub-byte
 * tensors, several shards, random data alignment and header padding) with
 * random filters, align in {1, 8, 256, 4096}, small and large chunk sizes,
 * direct and slot plans. For each plan: the tensor table mirrors the
 * checkpoint (order, files, offsets, sizes); every selected tensor byte is
 * read by exactly one chunk and no other byte by any; dst_off is aligned,
 * destination ranges are disjoint and inside dst_size; each chunk's
 * first..last is exactly the tensors it touches; chunks are at most
 * chunk_bytes, never cross a multiple of chunk_bytes in slot plans, and are
 * destination-contiguous in direct plans; extents are maximal (no needless
 * cut); fsti_chunk_pieces tiles each chunk; two builds are identical. Also
 * fsti_plan_make (direct or slot reads chosen per file, each with
 * its own chunk size) against the same properties, and the plain build as
 * its all-or-nothing case. Also the argument checks and out-of-memory
 * cleanup. Replay a failure with FST_TEST_SEED. */
#include "engine.h"
#include "load_helpers.h"

/* Under AddressSanitizer (several times slower) fewer checkpoints. */
#if defined(__SANITIZE_ADDRESS__)
#define DEFAULT_ITERATIONS 100
#else
#define DEFAULT_ITERATIONS 200
#endif


/* A request as the engine makes them: direct_files NULL for slots,
 * ALL_DIRECT for every file direct, else a choice per file. */
static const bool all_direct_marker = true;
#define ALL_DIRECT (&all_direct_marker)

static int plan_mixed(const fst_checkpoint *ck, fsti_filter_fn filter, void *filter_ctx,
		      uint32_t align, uint64_t chunk, const bool *direct_files,
		      uint64_t direct_chunk, uint64_t grain, struct fsti_plan *out, fst_error *err)
{
	struct fsti_plan_request r = {
		.ck = ck, .filter = filter, .filter_ctx = filter_ctx, .align = align,
		.chunk_bytes = chunk, .direct_files = direct_files,
		.direct_chunk_bytes = direct_chunk, .grain = grain,
		.mode = !direct_files ? FSTI_PLAN_SLOTS
			: direct_files == ALL_DIRECT ? FSTI_PLAN_DIRECT : FSTI_PLAN_PER_FILE,
	};
	if (r.mode == FSTI_PLAN_DIRECT)
		r.direct_files = NULL;
	return fsti_plan_make(&r, out, err);
}

static unsigned iterations(void)
{
	const char *s = getenv("FST_PLAN_ITERATIONS");
	return s && *s ? (unsigned)strtoul(s, NULL, 10) : DEFAULT_ITERATIONS;
}

/* ---- the checks */

struct piece_log {
	uint64_t at[4096], dst[4096], len[4096];
	size_t n;
	size_t stop_after; /* return 7 after this many pieces (0: never) */
};

static int log_piece(void *ctx, uint64_t at, uint64_t dst_off, uint64_t len)
{
	struct piece_log *l = ctx;
	if (l->n >= sizeof l->at / sizeof l->at[0])
		fail_msg("more than %zu pieces in one chunk", sizeof l->at / sizeof l->at[0]);
	l->at[l->n] = at;
	l->dst[l->n] = dst_off;
	l->len[l->n] = len;
	l->n++;
	return l->stop_after && l->n == l->stop_after ? 7 : 0;
}

static bool intersects(const struct fsti_plan_tensor *t, const struct fsti_chunk *c)
{
	return t->file == c->file && t->nbytes &&
	       FSTI_MAX(t->file_off, c->file_off) <
		       FSTI_MIN(t->file_off + t->nbytes, c->file_off + c->len);
}

/* direct[f]: file f is planned for direct reads, in chunks of dchunk
 * (cut early at grain blocks of a tensor when grain is nonzero); the other
 * files for landing slots, in chunks of chunk. */
static void check_plan(const fst_checkpoint *ck, const lh_filter *flt, uint32_t align,
		       uint64_t chunk, const bool *direct_files, uint64_t dchunk, uint64_t grain,
		       const struct fsti_plan *p, const char *ctx)
{
	/* the tensor table: the selected checkpoint tensors, in order */
	size_t n = fst_checkpoint_tensor_count(ck), k = 0;
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info info;
		size_t file;
		assert_int_equal(fst_checkpoint_tensor(ck, i, &info, &file), 0);
		if (flt && !lh_keeps(flt, info.name))
			continue;
		if (k >= p->nt)
			fail_msg("%s: plan has %zu tensors, tensor %zu is missing", ctx, p->nt, i);
		const struct fsti_plan_tensor *t = &p->t[k++];
		if (t->entry != i || t->file != file || t->file_off != info.file_offset ||
		    t->nbytes != info.nbytes)
			fail_msg("%s: plan tensor %zu is entry %u file %u [%" PRIu64 " +%" PRIu64
				 "], want entry %zu file %zu [%" PRIu64 " +%" PRIu64 "]",
				 ctx, k - 1, t->entry, t->file, t->file_off, t->nbytes, i, file,
				 info.file_offset, info.nbytes);
		total += info.nbytes;
	}
	if (k != p->nt)
		fail_msg("%s: plan has %zu tensors, %zu selected", ctx, p->nt, k);
	assert_int_equal(p->total_bytes, total);
	assert_int_equal(p->align, align);

	/* destination: aligned, disjoint (the table keeps checkpoint order, so
	 * disjoint means increasing), inside dst_size, and no padding beyond
	 * what alignment needs */
	uint64_t end = 0;
	for (size_t i = 0; i < p->nt; i++) {
		const struct fsti_plan_tensor *t = &p->t[i];
		if (t->dst_off % align)
			fail_msg("%s: tensor %zu dst_off %" PRIu64 " is not a multiple of %u", ctx, i,
				 t->dst_off, align);
		if (t->dst_off < end)
			fail_msg("%s: tensor %zu at dst %" PRIu64 " overlaps the previous one "
				 "(ends at %" PRIu64 ")",
				 ctx, i, t->dst_off, end);
		if (t->dst_off >= end + align)
			fail_msg("%s: tensor %zu at dst %" PRIu64 ": needless gap after %" PRIu64,
				 ctx, i, t->dst_off, end);
		end = t->dst_off + t->nbytes;
		if (end > p->dst_size)
			fail_msg("%s: tensor %zu ends at %" PRIu64 " past dst_size %" PRIu64, ctx, i,
				 end, p->dst_size);
	}
	assert_true(p->dst_size >= end);
	assert_true(p->dst_size < end + align);

	/* coverage: per file, how many chunks read each byte */
	size_t nf = fst_checkpoint_file_count(ck);
	unsigned char **cover = calloc(nf, sizeof *cover);
	for (size_t f = 0; f < nf; f++)
		cover[f] = calloc(fst_file_size(fst_checkpoint_file(ck, f)) + 1, 1);
	struct piece_log *log = malloc(sizeof *log);
	for (size_t ci = 0; ci < p->nc; ci++) {
		const struct fsti_chunk *c = &p->c[ci];
		assert_true(c->file < nf);
		const bool direct = direct_files[c->file];
		const uint64_t chunk_here = direct ? dchunk : chunk;
		uint64_t fsize = fst_file_size(fst_checkpoint_file(ck, c->file));
		if (!c->len || c->len > chunk_here || c->file_off + c->len > fsize)
			fail_msg("%s: chunk %zu [%" PRIu64 " +%" PRIu64 "]: bad length (chunk %" PRIu64
				 ", file %" PRIu64 ")",
				 ctx, ci, c->file_off, c->len, chunk_here, fsize);
		if (!direct && c->file_off / chunk != (c->file_off + c->len - 1) / chunk)
			fail_msg("%s: slot chunk %zu [%" PRIu64 " +%" PRIu64
				 "] crosses a multiple of %" PRIu64,
				 ctx, ci, c->file_off, c->len, chunk);
		for (uint64_t b = c->file_off; b < c->file_off + c->len; b++)
			if (cover[c->file][b]++ > 250)
				fail_msg("%s: byte %" PRIu64 " read too often", ctx, b);
		/* first..last: exactly the tensors the chunk touches */
		if (c->first > c->last || c->last >= p->nt)
			fail_msg("%s: chunk %zu: tensors %u..%u of %zu", ctx, ci, c->first, c->last,
				 p->nt);
		if (!intersects(&p->t[c->first], c) || !intersects(&p->t[c->last], c))
			fail_msg("%s: chunk %zu [%" PRIu64 " +%" PRIu64 "] does not touch its first "
				 "(%u) or last (%u) tensor",
				 ctx, ci, c->file_off, c->len, c->first, c->last);
		/* Tensors outside first..last: all of them on small plans; on big
		 * ones the nearest touching candidates (the table is in file
		 * order, checked above, so farther ones cannot touch). */
		size_t lo = 0, hi = p->nt;
		if (p->nc * p->nt > 200000) {
			lo = c->first > 2 ? c->first - 2 : 0;
			hi = FSTI_MIN(p->nt, (size_t)c->last + 3);
			for (size_t i = c->first; i-- > 0 && !p->t[i].nbytes;)
				lo = i > 0 ? i - 1 : 0;
			for (size_t i = c->last + 1; i < p->nt && !p->t[i].nbytes; i++)
				hi = FSTI_MIN(p->nt, i + 2);
		}
		for (size_t i = lo; i < hi; i++) {
			bool in = i >= c->first && i <= c->last;
			if (intersects(&p->t[i], c) && !in)
				fail_msg("%s: chunk %zu touches tensor %zu outside %u..%u", ctx, ci, i,
					 c->first, c->last);
			if (in && p->t[i].nbytes && !intersects(&p->t[i], c))
				fail_msg("%s: chunk %zu lists tensor %zu it does not touch", ctx, ci, i);
			if (in && p->t[i].file != c->file)
				fail_msg("%s: chunk %zu lists tensor %zu of another file", ctx, ci, i);
		}
		/* pieces tile the chunk, in order, each at its tensor's place */
		log->n = 0;
		log->stop_after = 0;
		assert_int_equal(fsti_chunk_pieces(p, c, log_piece, log), 0);
		uint64_t at = 0;
		for (size_t j = 0; j < log->n; j++) {
			if (log->at[j] != at || !log->len[j])
				fail_msg("%s: chunk %zu piece %zu at %" PRIu64 " +%" PRIu64
					 ", expected at %" PRIu64,
					 ctx, ci, j, log->at[j], log->len[j], at);
			uint64_t fo = c->file_off + at;
			const struct fsti_plan_tensor *t = NULL;
			for (size_t i = c->first; i <= c->last; i++)
				if (p->t[i].nbytes && fo >= p->t[i].file_off &&
				    fo < p->t[i].file_off + p->t[i].nbytes)
					t = &p->t[i];
			if (!t)
				fail_msg("%s: chunk %zu piece %zu: file byte %" PRIu64
					 " is in no tensor",
					 ctx, ci, j, fo);
			if (fo + log->len[j] > t->file_off + t->nbytes)
				fail_msg("%s: chunk %zu piece %zu runs past its tensor", ctx, ci, j);
			if (log->dst[j] != t->dst_off + (fo - t->file_off))
				fail_msg("%s: chunk %zu piece %zu lands at %" PRIu64 ", want %" PRIu64,
					 ctx, ci, j, log->dst[j], t->dst_off + (fo - t->file_off));
			/* direct: the whole chunk lands contiguously at dst_off */
			if (direct && log->dst[j] != c->dst_off + at)
				fail_msg("%s: direct chunk %zu piece %zu lands at %" PRIu64
					 ", not dst_off + at = %" PRIu64,
					 ctx, ci, j, log->dst[j], c->dst_off + at);
			at += log->len[j];
		}
		if (at != c->len)
			fail_msg("%s: chunk %zu: pieces cover %" PRIu64 " of %" PRIu64 " bytes", ctx,
				 ci, at, c->len);
	}
	free(log);
	/* every selected tensor byte exactly once, nothing else */
	for (size_t f = 0; f < nf; f++) {
		uint64_t fsize = fst_file_size(fst_checkpoint_file(ck, f));
		unsigned char *want = calloc(fsize + 1, 1);
		for (size_t i = 0; i < p->nt; i++)
			if (p->t[i].file == f)
				memset(want + p->t[i].file_off, 1, p->t[i].nbytes);
		for (uint64_t b = 0; b < fsize; b++)
			if (cover[f][b] != want[b])
				fail_msg("%s: file %zu byte %" PRIu64 " is read %u times, want %u", ctx, f,
					 b, cover[f][b], want[b]);
		free(want);
		free(cover[f]);
	}
	free(cover);

	/* Chunks are in plan order and extents are maximal: two neighbouring
	 * chunks that could have been one read are cut only at a multiple of
	 * chunk_bytes (slot plans) or because the first is full (direct). */
	for (size_t ci = 1; ci < p->nc; ci++) {
		const struct fsti_chunk *a = &p->c[ci - 1], *b = &p->c[ci];
		bool order = a->file < b->file ||
			     (a->file == b->file && a->file_off + a->len <= b->file_off);
		if (!order)
			fail_msg("%s: chunks %zu and %zu out of file order", ctx, ci - 1, ci);
		const bool direct = direct_files[a->file];
		bool joinable = a->file == b->file && a->file_off + a->len == b->file_off &&
				(!direct || a->dst_off + a->len == b->dst_off);
		if (!joinable)
			continue;
		/* with a grain a direct cut may come early, at the last block
		 * boundary of the tensor it falls in */
		const struct fsti_plan_tensor *t = NULL;
		for (size_t i = a->first; i <= b->last; i++)
			if (p->t[i].file_off < b->file_off &&
			    b->file_off < p->t[i].file_off + p->t[i].nbytes)
				t = &p->t[i];
		bool early_ok = direct && grain && grain <= dchunk && a->len + grain > dchunk &&
				(!t || (b->file_off - t->file_off) % grain == 0);
		if (direct && grain && grain <= dchunk && t &&
		    (b->file_off - t->file_off) % grain)
			fail_msg("%s: chunks %zu and %zu split a %" PRIu64 "-byte block of tensor %zu",
				 ctx, ci - 1, ci, grain, (size_t)(t - p->t));
		if (direct ? a->len != dchunk && !early_ok : b->file_off % chunk)
			fail_msg("%s: chunks %zu [%" PRIu64 " +%" PRIu64 "] and %zu [%" PRIu64
				 " +%" PRIu64 "] are cut for no reason",
				 ctx, ci - 1, a->file_off, a->len, ci, b->file_off, b->len);
	}
}

static void assert_plans_equal(const struct fsti_plan *a, const struct fsti_plan *b)
{
	assert_int_equal(a->nt, b->nt);
	assert_int_equal(a->nc, b->nc);
	assert_int_equal(a->dst_size, b->dst_size);
	assert_int_equal(a->total_bytes, b->total_bytes);
	assert_int_equal(a->align, b->align);
	for (size_t i = 0; i < a->nt; i++) {
		assert_int_equal(a->t[i].file, b->t[i].file);
		assert_int_equal(a->t[i].entry, b->t[i].entry);
		assert_int_equal(a->t[i].file_off, b->t[i].file_off);
		assert_int_equal(a->t[i].nbytes, b->t[i].nbytes);
		assert_int_equal(a->t[i].dst_off, b->t[i].dst_off);
	}
	for (size_t i = 0; i < a->nc; i++) {
		assert_int_equal(a->c[i].file, b->c[i].file);
		assert_int_equal(a->c[i].first, b->c[i].first);
		assert_int_equal(a->c[i].last, b->c[i].last);
		assert_int_equal(a->c[i].file_off, b->c[i].file_off);
		assert_int_equal(a->c[i].len, b->c[i].len);
		assert_int_equal(a->c[i].dst_off, b->c[i].dst_off);
	}
}

/* ---- tests */

static void test_random_plans(void **state)
{
	(void)state;
	uint64_t base = lh_base_seed();
	unsigned n = iterations();
	static const uint32_t aligns[] = {1, 8, 256, 4096};
	static const uint64_t chunks[] = {1, 7, 512, 4096, 65536, 1u << 20, 16u << 20};
	unsigned plans = 0, with_chunks = 0, multi_chunk_tensors = 0, mixed = 0;
	for (unsigned it = 0; it < n; it++) {
		uint64_t seed = base + it;
		lh_shape sh = lh_default_shape();
		sh.max_big = 80000; /* byte-level checks: keep the files small */
		lh_ckpt lc;
		lh_write_random("plan", seed, &sh, &lc);
		fst_checkpoint *ck = lh_open(lc.path);
		size_t nf = fst_checkpoint_file_count(ck);
		lh_rng r = {seed ^ 0xabcdefull};
		for (int round = 0; round < 6; round++) {
			uint32_t align = aligns[lh_below(&r, 4)];
			uint64_t chunk = chunks[lh_below(&r, 7)];
			if (lh_below(&r, 3) == 0)
				chunk = 1 + lh_below(&r, 50000); /* any size, not only powers of two */
			uint64_t dchunk = chunk;
			/* 0: fsti_plan_build for slots, 1: for direct reads,
			 * 2: fsti_plan_make with a choice per file */
			int mode = (int)lh_below(&r, 3);
			bool direct_files[16];
			for (size_t f = 0; f < 16; f++)
				direct_files[f] = mode == 1 || (mode == 2 && lh_below(&r, 2));
			if (mode == 2 && lh_below(&r, 2))
				dchunk = chunks[lh_below(&r, 7)];
			lh_filter flt = {lh_next(&r), (unsigned)lh_below(&r, 101), 0};
			bool filtered = lh_below(&r, 3) != 0;
			fsti_filter_fn filter = filtered ? lh_filter_fn : NULL;
			char ctx[240];
			snprintf(ctx, sizeof ctx,
				 "seed %" PRIu64 " round %d (align %u, chunk %" PRIu64 ", %s, direct "
				 "chunk %" PRIu64 ", filter %u%%)",
				 seed, round, align, chunk,
				 mode == 0 ? "slots" : mode == 1 ? "direct" : "mixed", dchunk,
				 filtered ? flt.percent : 100);
			struct fsti_plan p, q;
			fst_error err;
			/* direct extents may be cut at blocks of each tensor */
			static const uint64_t grains[] = {0, 0, 512, 4096, 65536};
			uint64_t grain = mode ? grains[lh_below(&r, 5)] : 0;
			int rc = mode == 2 ? plan_mixed(ck, filter, &flt, align, chunk,
								   direct_files, dchunk, grain, &p,
								   &err)
				 : grain   ? plan_mixed(ck, filter, &flt, align, chunk,
								   ALL_DIRECT, chunk, grain,
								   &p, &err)
					   : fsti_plan_build(ck, filter, &flt, align, chunk, mode == 1,
							     &p, &err);
			if (rc)
				fail_msg("%s: %s", ctx, err.message);
			if (filtered)
				assert_int_equal(flt.calls, fst_checkpoint_tensor_count(ck));
			check_plan(ck, filtered ? &flt : NULL, align, chunk, direct_files, dchunk, grain, &p,
				   ctx);
			/* deterministic; and the plain build is the mixed one with
			 * every file (or none) direct */
			if (mode == 2)
				rc = plan_mixed(ck, filter, &flt, align, chunk, direct_files,
							   dchunk, grain, &q, &err);
			else
				rc = plan_mixed(ck, filter, &flt, align, chunk,
							   mode == 1 ? direct_files : NULL, chunk, grain,
							   &q, &err);
			assert_int_equal(rc, 0);
			assert_plans_equal(&p, &q);
			plans++;
			with_chunks += p.nc > 1;
			for (size_t f = 0; mode == 2 && f + 1 < nf; f++)
				mixed += direct_files[f] != direct_files[f + 1];
			for (size_t i = 0; i + 1 < p.nc; i++)
				multi_chunk_tensors += p.c[i].last == p.c[i + 1].first &&
						       p.c[i].file == p.c[i + 1].file;
			fsti_plan_free(&p);
			fsti_plan_free(&q);
			assert_null(p.t);
			assert_null(p.c);
		}
		fst_checkpoint_close(ck);
	}
	/* the generator must have exercised the interesting cases */
	if (n >= 20) {
		assert_true(with_chunks > plans / 4);
		assert_true(multi_chunk_tensors > 0);
		assert_true(mixed > 0);
	}
}

/* Without a filter, the plan reads each file's data section as one extent:
 * its chunk count is exactly what the section needs. */
static void test_unfiltered_extents(void **state)
{
	(void)state;
	uint64_t base = lh_base_seed() + 7777;
	for (unsigned it = 0; it < 30; it++) {
		lh_shape sh = lh_default_shape();
		lh_ckpt lc;
		lh_write_random("extents", base + it, &sh, &lc);
		fst_checkpoint *ck = lh_open(lc.path);
		static const uint64_t chunks[] = {4096, 10000, 1u << 20};
		for (int ci = 0; ci < 3; ci++) {
			uint64_t chunk = chunks[ci];
			for (int direct = 0; direct < 2; direct++) {
				struct fsti_plan p;
				/* align 1: direct extents may span whole files too */
				assert_int_equal(fsti_plan_build(ck, NULL, NULL, 1, chunk, direct, &p, NULL),
						 0);
				size_t want = 0;
				for (size_t f = 0; f < fst_checkpoint_file_count(ck); f++) {
					const fst_file *file = fst_checkpoint_file(ck, f);
					uint64_t s = fst_file_data_offset(file), e = fst_file_size(file);
					if (e == s)
						continue;
					want += direct ? (e - s + chunk - 1) / chunk
						       : (e - 1) / chunk - s / chunk + 1;
				}
				if (p.nc != want)
					fail_msg("seed %" PRIu64 " chunk %" PRIu64 " %s: %zu chunks, want %zu",
						 base + it, chunk, direct ? "direct" : "slots", p.nc, want);
				fsti_plan_free(&p);
			}
		}
		fst_checkpoint_close(ck);
	}
}

static int drop_b(void *ctx, const char *name)
{
	(void)ctx;
	return strcmp(name, "b") != 0;
}

/* A hand-made layout: offsets and destinations known exactly. */
static void test_known_layout(void **state)
{
	(void)state;
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	static unsigned char data[10000];
	for (size_t i = 0; i < sizeof data; i++)
		data[i] = (unsigned char)(i * 7 + 1);
	/* a: 3 bytes, e: empty, b: 5000 bytes, c: 1 byte */
	uint64_t s3[1] = {3}, s0[1] = {0}, s5000[1] = {5000}, s1[1] = {1};
	assert_int_equal(fst_writer_add(w, "a", FST_DTYPE_U8, 1, s3, data, 3, &err), 0);
	assert_int_equal(fst_writer_add(w, "e", FST_DTYPE_U8, 1, s0, data, 0, &err), 0);
	assert_int_equal(fst_writer_add(w, "b", FST_DTYPE_U8, 1, s5000, data, 5000, &err), 0);
	assert_int_equal(fst_writer_add(w, "c", FST_DTYPE_U8, 1, s1, data, 1, &err), 0);
	const char *path = test_path("known.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	fst_checkpoint *ck = lh_open(path);
	uint64_t d = fst_file_data_offset(fst_checkpoint_file(ck, 0));

	struct fsti_plan p;
	assert_int_equal(fsti_plan_build(ck, NULL, NULL, 256, 4096, true, &p, &err), 0);
	assert_int_equal(p.nt, 4);
	assert_int_equal(p.t[0].dst_off, 0);
	assert_int_equal(p.t[1].dst_off, 256); /* empty tensors are aligned too */
	assert_int_equal(p.t[2].dst_off, 256);
	assert_int_equal(p.t[3].dst_off, 256 + 5120);
	assert_int_equal(p.dst_size, 256 + 5120 + 1);
	assert_int_equal(p.total_bytes, 5004);
	/* direct: a breaks from b in the destination, b from c too */
	assert_int_equal(p.nc, 4);
	assert_int_equal(p.c[0].file_off, d);
	assert_int_equal(p.c[0].len, 3);
	assert_int_equal(p.c[1].file_off, d + 3);
	assert_int_equal(p.c[1].len, 4096);
	assert_int_equal(p.c[1].dst_off, 256);
	assert_int_equal(p.c[2].len, 5000 - 4096);
	assert_int_equal(p.c[2].dst_off, 256 + 4096);
	assert_int_equal(p.c[3].first, 3);
	fsti_plan_free(&p);

	/* slots: one extent cut at multiples of 4096 in the file */
	assert_int_equal(fsti_plan_build(ck, NULL, NULL, 256, 4096, false, &p, &err), 0);
	uint64_t end = d + 5004;
	assert_int_equal(p.nc, (end - 1) / 4096 - d / 4096 + 1);
	assert_int_equal(p.c[0].first, 0);
	assert_int_equal(p.c[p.nc - 1].last, 3);
	fsti_plan_free(&p);

	/* a filter dropping b leaves a, e and c: c is not contiguous with a */
	assert_int_equal(fsti_plan_build(ck, drop_b, NULL, 1, 4096, true, &p, &err), 0);
	assert_int_equal(p.nt, 3);
	assert_int_equal(p.t[2].entry, 3);
	assert_int_equal(p.t[2].dst_off, 3);
	assert_int_equal(p.nc, 2);
	assert_int_equal(p.c[0].len, 3);
	assert_int_equal(p.c[1].file_off, d + 5003);
	assert_int_equal(p.c[1].dst_off, 3);
	fsti_plan_free(&p);

	/* a filter keeping nothing: an empty plan */
	lh_filter none = {0, 0, 0};
	assert_int_equal(fsti_plan_build(ck, lh_filter_fn, &none, 8, 4096, false, &p, &err), 0);
	assert_int_equal(none.calls, 4);
	assert_int_equal(p.nt, 0);
	assert_int_equal(p.nc, 0);
	assert_int_equal(p.dst_size, 0);
	assert_int_equal(p.total_bytes, 0);
	fsti_plan_free(&p);
	fst_checkpoint_close(ck);
}

static int stop_after_one(void *ctx, uint64_t at, uint64_t dst_off, uint64_t len)
{
	(void)at;
	(void)dst_off;
	(void)len;
	(*(int *)ctx)++;
	return 42;
}

/* fsti_chunk_pieces stops at the first nonzero return and passes it on. */
static void test_pieces_stop(void **state)
{
	(void)state;
	lh_shape sh = {1, 20, 100, 0, 0, false};
	lh_ckpt lc;
	lh_write_random("pieces", 5, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	struct fsti_plan p;
	assert_int_equal(fsti_plan_build(ck, NULL, NULL, 1, 1u << 20, false, &p, NULL), 0);
	assert_int_equal(p.nc, 1);
	assert_true(p.c[0].last > p.c[0].first); /* several pieces */
	int calls = 0;
	assert_int_equal(fsti_chunk_pieces(&p, &p.c[0], stop_after_one, &calls), 42);
	assert_int_equal(calls, 1);
	fsti_plan_free(&p);
	fst_checkpoint_close(ck);
}

static void test_bad_arguments(void **state)
{
	(void)state;
	lh_shape sh = {1, 3, 100, 0, 0, false};
	lh_ckpt lc;
	lh_write_random("args", 9, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	long base = fsti_live_allocations();
	struct fsti_plan p;
	fst_error err;
	static const uint32_t bad[] = {0, 3, 6, 100, 0x80000001u};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		assert_int_equal(fsti_plan_build(ck, NULL, NULL, bad[i], 4096, false, &p, &err),
				 FST_EUSAGE);
		assert_has(err.message, "align");
		assert_null(p.t);
	}
	assert_int_equal(fsti_plan_build(ck, NULL, NULL, 8, 0, true, &p, &err), FST_EUSAGE);
	assert_has(err.message, "chunk");
	bool direct_files[1] = {true};
	/* a per-file plan needs its files */
	struct fsti_plan_request req = {.ck = ck, .align = 8, .chunk_bytes = 4096,
					.mode = FSTI_PLAN_PER_FILE};
	assert_int_equal(fsti_plan_make(&req, &p, &err), FST_EUSAGE);
	assert_has(err.message, "per-file");
	/* direct_chunk_bytes 0 is chunk_bytes */
	struct fsti_plan q;
	assert_int_equal(plan_mixed(ck, NULL, NULL, 8, 4096, direct_files, 0, 0, &p, &err), 0);
	assert_int_equal(plan_mixed(ck, NULL, NULL, 8, 4096, direct_files, 4096, 0, &q, &err), 0);
	assert_int_equal(p.nc, q.nc);
	for (size_t i = 0; i < p.nc; i++)
		assert_int_equal(p.c[i].len, q.c[i].len);
	fsti_plan_free(&p);
	fsti_plan_free(&q);
	assert_int_equal(plan_mixed(ck, NULL, NULL, 8, 0, direct_files, 4096, 0, &p, &err),
			 FST_EUSAGE);
	assert_int_equal(fsti_live_allocations(), base);
	fst_checkpoint_close(ck);
}

/* Every allocation of a build failing in turn: FST_ENOMEM, nothing kept. */
static void test_out_of_memory(void **state)
{
	(void)state;
	lh_shape sh = {3, 40, 5000, 0, 10, false};
	lh_ckpt lc;
	lh_write_random("oom", 11, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	long base = fsti_live_allocations();
	int failures = 0;
	for (int nth = 1;; nth++) {
		char spec[32];
		snprintf(spec, sizeof spec, "alloc:%d", nth);
		assert_int_equal(fst_fault_set(spec, NULL), 0);
		struct fsti_plan p;
		fst_error err;
		/* 1-byte chunks: thousands of them, so the chunk array grows */
		int rc = fsti_plan_build(ck, NULL, NULL, 8, 1, false, &p, &err);
		assert_int_equal(fst_fault_set(NULL, NULL), 0);
		if (!rc) {
			assert_true(p.nc > 256);
			fsti_plan_free(&p);
			break;
		}
		assert_int_equal(rc, FST_ENOMEM);
		assert_has(err.message, "out of memory");
		assert_null(p.t);
		assert_null(p.c);
		assert_int_equal(fsti_live_allocations(), base);
		failures++;
	}
	assert_true(failures >= 2); /* the table and at least one growth */
	assert_int_equal(fsti_live_allocations(), base);
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_random_plans),
		cmocka_unit_test(test_unfiltered_extents),
		cmocka_unit_test(test_known_layout),
		cmocka_unit_test(test_pieces_stop),
		cmocka_unit_test(test_bad_arguments),
		cmocka_unit_test(test_out_of_memory),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
