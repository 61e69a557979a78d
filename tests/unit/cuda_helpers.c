/* cuda_helpers.c - the CUDA target's tests against the libcuda double (see
 * cuda_helpers.h): the double's counters, random checkpoints of every dtype,
 * loaded tensors compared with the files, and the group set-up. */
#include "cuda_helpers.h"

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void *dbl;
long (*ch_live_device)(void);
long (*ch_live_host)(void);
long ch_device_base, ch_pinned_base;
bool ch_uring_ok = true;

const ch_gen ch_big_gen = {3, 40, 600000, 10};
const ch_gen ch_small_gen = {2, 12, 60000, 10};

int ch_init(void)
{
	const char *path = getenv("FST_CUDA_LIBRARY");
	if (!path || !*path) {
		fprintf(stderr, "FST_CUDA_LIBRARY is not set: run through ctest\n");
		return 77;
	}
	ch_set_delay("50");
	return 0;
}

void *ch_sym(const char *name)
{
	void *p = dlsym(dbl, name);
	if (!p)
		fail_msg("the double lacks %s", name);
	return p;
}

void ch_set_delay(const char *us)
{
	/* Read by each stream's thread when the stream is created. */
	setenv("FST_DOUBLE_DELAY_US", us, 1);
}

/* Nothing of the double may be live, and libfst's own host allocations are
 * back to what they were. Pinned staging blocks are kept between loads
 * until fst_trim: a block that was not given back to that pool stays live
 * past it. Only between loads. */
void ch_assert_clean(const char *when, long host_base)
{
	fst_trim();
	long d = ch_live_device() - ch_device_base, h = ch_live_host() - ch_pinned_base;
	if (d || h)
		fail_msg("%s: %ld device allocations and %ld pinned blocks still live", when, d, h);
	long a = fsti_live_allocations();
	if (a != host_base)
		fail_msg("%s: %ld libfst host allocations live, %ld before", when, a, host_base);
}

/* A tensor of dtype dt with about `bytes` bytes (exactly, for byte-sized
 * dtypes); 0 bytes gives an empty shape, scalar a shape of no dimensions. */
void ch_add_tensor(fst_writer *w, lh_rng *r, const char *name, fst_dtype dt, uint64_t bytes,
		   bool scalar, struct lh_fill_ctx *k)
{
	unsigned bits = fst_dtype_bits(dt);
	uint32_t ndim;
	uint64_t shape[4] = {0};
	if (scalar) {
		ndim = 0;
	} else if (!bytes) {
		ndim = 1 + (uint32_t)lh_below(r, 3);
		for (uint32_t d = 0; d < ndim; d++)
			shape[d] = 1 + lh_below(r, 4);
		shape[lh_below(r, ndim)] = 0;
	} else {
		uint64_t numel;
		if (bits % 8 == 0) {
			numel = bytes / (bits / 8);
			numel = numel ? numel : 1;
		} else {
			uint64_t unit = bits == 4 ? 2 : 4; /* whole bytes */
			numel = bytes * 8 / bits / unit * unit;
			numel = numel ? numel : unit;
		}
		ndim = 1 + (uint32_t)lh_below(r, 3);
		static const uint64_t divs[] = {1, 2, 3, 4, 8};
		uint64_t rest = numel;
		for (uint32_t d = 0; d + 1 < ndim; d++) {
			uint64_t q = divs[lh_below(r, 5)];
			if (rest % q)
				q = 1;
			shape[d] = q;
			rest /= q;
		}
		shape[ndim - 1] = rest;
	}
	fst_error err;
	if (fst_writer_add_fill(w, name, dt, ndim, ndim ? shape : NULL, lh_fill, k, &err))
		fail_msg("add %s: %s", name, err.message);
}

/* Layouts of the shards, in turn: the first one's data section starts at
 * 8 mod 16. */
void ch_writer_layout(unsigned f, fst_writer_opts *wo)
{
	static const uint32_t align[] = {16, 4096, 8, 64};
	static const uint32_t extra[] = {8, 0, 0, 24};
	fst_writer_opts_init(wo);
	wo->data_align = align[f % 4];
	wo->header_extra = extra[f % 4];
}

void ch_write_random(const char *name, uint64_t seed, const ch_gen *g, ch_ckpt *c)
{
	lh_rng r = {seed};
	memset(c, 0, sizeof *c);
	snprintf(c->dir, sizeof c->dir, "%s/%s", test_tmpdir(), name);
	lh_rmdir(c->dir);
	if (mkdir(c->dir, 0755))
		fail_msg("mkdir %s: %s", c->dir, strerror(errno));
	for (unsigned f = 0; f < g->nfiles; f++) {
		fst_writer_opts wo;
		ch_writer_layout(f, &wo);
		fst_writer *w;
		fst_error err;
		if (fst_writer_new(&wo, &w, &err))
			fail_msg("writer: %s", err.message);
		unsigned n = (unsigned)FST_DTYPE_COUNT - 1 + g->extra;
		struct lh_fill_ctx *keys = calloc(n, sizeof *keys);
		char tname[64];
		unsigned t = 0;
		/* one of every dtype, small, in a random rotation */
		unsigned rot = (unsigned)lh_below(&r, FST_DTYPE_COUNT - 1);
		for (unsigned i = 0; i < FST_DTYPE_COUNT - 1; i++, t++) {
			fst_dtype dt = (fst_dtype)(1 + (i + rot) % (FST_DTYPE_COUNT - 1));
			snprintf(tname, sizeof tname, "s%u.%s.%u", f, fst_dtype_name(dt), t);
			keys[t].key = lh_mix(seed * 1000003u + f * 1009u + t);
			ch_add_tensor(w, &r, tname, dt, 1 + lh_below(&r, 3000), false, &keys[t]);
		}
		for (unsigned i = 0; i < g->extra; i++, t++) {
			unsigned dice = (unsigned)lh_below(&r, 100);
			fst_dtype dt = (fst_dtype)(1 + lh_below(&r, FST_DTYPE_COUNT - 1));
			uint64_t bytes;
			bool scalar = false;
			if (dice < 12) {
				bytes = 0;
			} else if (dice < 22) {
				static const fst_dtype sc[] = {FST_DTYPE_BOOL, FST_DTYPE_F64, FST_DTYPE_I16,
							       FST_DTYPE_BF16, FST_DTYPE_F32, FST_DTYPE_U8};
				dt = sc[lh_below(&r, 6)];
				scalar = true;
				bytes = fst_dtype_bits(dt) / 8;
			} else if (dice < 22 + g->big_percent) {
				bytes = 1 + lh_below(&r, g->max_big);
			} else if (dice < 60) {
				dt = FST_DTYPE_U8; /* odd sizes */
				bytes = 1 + 2 * lh_below(&r, 10000);
			} else {
				bytes = 1 + lh_below(&r, 30000);
			}
			snprintf(tname, sizeof tname, "s%u.x%u", f, t);
			keys[t].key = lh_mix(seed * 1000003u + f * 1009u + t);
			ch_add_tensor(w, &r, tname, dt, bytes, scalar, &keys[t]);
		}
		char file[700];
		snprintf(file, sizeof file, "%s/%02u.safetensors", c->dir, f);
		if (fst_writer_finish(w, file, &err))
			fail_msg("finish %s: %s", file, err.message);
		fst_writer_free(w);
		free(keys);
	}
}

double fsti_cached_fraction(const fst_checkpoint *ck); /* io/residency.c */

void ch_temperature(const ch_ckpt *c, bool cold)
{
	if (cold) {
		lh_evict(c->ck);
		return;
	}
	lh_files fs;
	lh_files_read(c->ck, &fs);
	lh_files_free(&fs);
	double cached = fsti_cached_fraction(c->ck);
	if (cached >= 0 && cached < 0.5)
		fail_msg("%s: %.0f%% in the page cache after reading it", c->dir, cached * 100);
}

bool ch_write_cold(const char *name, uint64_t seed, ch_ckpt *c)
{
	ch_write_random(name, seed, &ch_big_gen, c);
	ch_open(c, c->dir);
	lh_evict(c->ck);
	double cached = fsti_cached_fraction(c->ck);
	return cached >= 0 && cached < 0.5;
}

void ch_open(ch_ckpt *c, const char *path)
{
	fst_error err;
	if (fst_checkpoint_open(path, &c->ck, &err))
		fail_msg("open %s: %s", path, err.message);
	c->nfiles = fst_checkpoint_file_count(c->ck);
	c->bytes = calloc(c->nfiles + 1, sizeof *c->bytes);
	c->sizes = calloc(c->nfiles + 1, sizeof *c->sizes);
	for (size_t i = 0; i < c->nfiles; i++)
		c->bytes[i] = lh_slurp(fst_file_path(fst_checkpoint_file(c->ck, i)), &c->sizes[i]);
	c->host_base = fsti_live_allocations();
}

void ch_close(ch_ckpt *c)
{
	for (size_t i = 0; i < c->nfiles; i++)
		free(c->bytes[i]);
	free(c->bytes);
	free(c->sizes);
	fst_checkpoint_close(c->ck);
	lh_rmdir(c->dir);
	memset(c, 0, sizeof *c);
}

/* Compare one view with the file; 0, or -1 with why filled. */
int ch_view_check(const ch_ckpt *c, const fst_tensor_view *v, int device_id, char *why, size_t wn)
{
	if (v->device_type != FST_DEVICE_CUDA || v->device_id != device_id) {
		snprintf(why, wn, "%s: device %d:%d, expected cuda:%d", v->name, v->device_type,
			 v->device_id, device_id);
		return -1;
	}
	if ((uintptr_t)v->data % 256) {
		snprintf(why, wn, "%s: device address %p not aligned to 256", v->name, v->data);
		return -1;
	}
	long idx = fst_checkpoint_find(c->ck, v->name);
	fst_tensor_info info;
	size_t file;
	if (idx < 0 || fst_checkpoint_tensor(c->ck, (size_t)idx, &info, &file)) {
		snprintf(why, wn, "%s: not in the checkpoint", v->name);
		return -1;
	}
	bool same_shape = info.ndim == v->ndim && (!info.ndim || !memcmp(info.shape, v->shape,
									 info.ndim * sizeof(uint64_t)));
	if (info.dtype != v->dtype || !same_shape || info.nbytes != v->nbytes) {
		snprintf(why, wn, "%s: dtype, shape or size differ from the file's", v->name);
		return -1;
	}
	const unsigned char *want = c->bytes[file] + info.file_offset;
	unsigned char *got = malloc(v->nbytes + 1);
	fst_error err;
	int rc = fst_copy_to_host(v, 0, got, v->nbytes, &err);
	if (rc) {
		snprintf(why, wn, "%.200s: fst_copy_to_host: %.280s", v->name, err.message);
		free(got);
		return -1;
	}
	if (memcmp(got, want, v->nbytes)) {
		uint64_t k = 0;
		while (got[k] == want[k])
			k++;
		snprintf(why, wn, "%s: byte %" PRIu64 " of %" PRIu64 " is 0x%02x, the file has 0x%02x",
			 v->name, k, v->nbytes, got[k], want[k]);
		free(got);
		return -1;
	}
	/* a piece from the middle, through the offset argument */
	if (v->nbytes > 16) {
		uint64_t off = v->nbytes / 3, len = v->nbytes / 2;
		memset(got, 0, len);
		if (fst_copy_to_host(v, off, got, len, &err) || memcmp(got, want + off, len)) {
			snprintf(why, wn, "%s: partial copy [%" PRIu64 ", +%" PRIu64 ") differs",
				 v->name, off, len);
			free(got);
			return -1;
		}
	}
	free(got);
	return 0;
}

void ch_assert_view(const ch_ckpt *c, const fst_tensor_view *v, int device_id)
{
	char why[512];
	if (ch_view_check(c, v, device_id, why, sizeof why))
		fail_msg("%s", why);
}

struct span {
	uintptr_t a;
	uint64_t n;
};

static int span_cmp(const void *x, const void *y)
{
	const struct span *p = x, *q = y;
	return p->a < q->a ? -1 : p->a > q->a;
}

/* Every tensor of the buffer equals the file, and no two overlap. */
int ch_buffer_check(const ch_ckpt *c, fst_buffer *buf, int device_id, char *why, size_t wn)
{
	size_t nt = fst_buffer_tensor_count(buf);
	if (nt != fst_checkpoint_tensor_count(c->ck)) {
		snprintf(why, wn, "%zu tensors loaded of %zu", nt, fst_checkpoint_tensor_count(c->ck));
		return -1;
	}
	struct span *sp = calloc(nt + 1, sizeof *sp);
	int rc = 0;
	for (size_t i = 0; i < nt && !rc; i++) {
		fst_tensor_view v;
		if (fst_buffer_tensor(buf, i, &v)) {
			snprintf(why, wn, "fst_buffer_tensor(%zu) failed", i);
			rc = -1;
			break;
		}
		if (v.index != i || v.buffer != buf) {
			snprintf(why, wn, "%s: view index %zu, expected %zu", v.name, v.index, i);
			rc = -1;
		}
		if (!rc)
			rc = ch_view_check(c, &v, device_id, why, wn);
		sp[i] = (struct span){(uintptr_t)v.data, v.nbytes};
		fst_view_release(&v);
	}
	if (!rc) {
		qsort(sp, nt, sizeof *sp, span_cmp);
		for (size_t i = 1; i < nt; i++)
			if (sp[i - 1].a + sp[i - 1].n > sp[i].a) {
				snprintf(why, wn, "tensors at %#" PRIxPTR " and %#" PRIxPTR " overlap",
					 sp[i - 1].a, sp[i].a);
				rc = -1;
			}
	}
	free(sp);
	return rc;
}

void ch_assert_buffer(const ch_ckpt *c, fst_buffer *buf, int device_id)
{
	char why[512];
	if (ch_buffer_check(c, buf, device_id, why, sizeof why))
		fail_msg("%s", why);
}

void ch_opts(fst_load_opts *o, const char *device, int io, unsigned threads, uint64_t staging)
{
	fst_load_opts_init(o);
	o->device = device;
	o->io = io;
	o->threads = threads;
	o->staging_bytes = staging;
}

int ch_load_whole_or_streamed(const ch_ckpt *c, const fst_load_opts *o, bool stream,
			      fst_buffer **out, fst_error *err)
{
	int rc;
	*out = NULL;
	if (!stream) {
		rc = fst_load(c->ck, o, out, err);
	} else {
		fst_loader *ld = NULL;
		rc = fst_load_start(c->ck, o, &ld, err);
		fst_tensor_view v;
		while (!rc && (rc = fst_loader_next(ld, &v, err)) == 1) {
			ch_assert_view(c, &v, 0);
			fst_view_release(&v);
			rc = 0;
		}
		if (ld) {
			fst_error ferr;
			int frc = fst_loader_finish(ld, out, &ferr);
			if (!rc) {
				rc = frc;
				*err = ferr;
			}
		}
	}
	if (!rc)
		ch_assert_buffer(c, *out, 0);
	return rc;
}

void ch_fault_loop(const ch_ckpt *c, bool cold, const char *var, const char *value,
		   uint64_t chunk, const char *site, int code, const char *says)
{
	unsigned failures = 0;
	setenv(var, value, 1);
	for (long n = 1;; n++) {
		if (n > 3000)
			fail_msg("%s: still failing after 3000 calls", site);
		char spec[64];
		snprintf(spec, sizeof spec, "%s:%ld", site, n);
		fst_load_opts o;
		ch_opts(&o, "cuda:0", FST_IO_AUTO, 4, 1 * MiB);
		o.chunk_bytes = chunk;
		ch_temperature(c, cold);
		fst_error err;
		assert_int_equal(fst_fault_set(spec, &err), 0);
		fst_buffer *buf = (fst_buffer *)&o;
		int rc = fst_load(c->ck, &o, &buf, &err);
		long injected = fst_fault_last(NULL, 0);
		assert_int_equal(fst_fault_set(NULL, NULL), 0);
		if (!rc) {
			if (!strstr(fst_buffer_describe(buf), says))
				fail_msg("%s: \"%s\"", spec, fst_buffer_describe(buf));
			ch_assert_buffer(c, buf, 0);
			fst_buffer_release(buf);
			ch_assert_clean(spec, c->host_base);
			if (!injected)
				break;
			continue;
		}
		failures++;
		if (rc != code || !err.message[0])
			fail_msg("%s: status %d (%s), expected %d", spec, rc, err.message, code);
		assert_null(buf);
		ch_assert_clean(spec, c->host_base);
	}
	if (!failures)
		fail_msg("%s: no load failed", site);
	unsetenv(var);
}

void ch_cold_bad_env(const ch_ckpt *c, const char *var, const char *const *bad, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		setenv(var, bad[i], 1);
		fst_load_opts o;
		ch_opts(&o, "cuda:0", FST_IO_AUTO, 2, 1 * MiB);
		lh_evict(c->ck);
		fst_buffer *buf = (fst_buffer *)&o;
		fst_error err;
		int rc = fst_load(c->ck, &o, &buf, &err);
		char quoted[64];
		snprintf(quoted, sizeof quoted, "\"%s\"", bad[i]);
		if (rc != FST_EUSAGE || !strstr(err.message, var) || !strstr(err.message, quoted))
			fail_msg("%s=%s: status %d, \"%s\"", var, bad[i], rc, err.message);
		assert_null(buf);
		char text[1200];
		assert_int_equal(fst_load_explain(c->ck, &o, text, sizeof text, &err), FST_EUSAGE);
	}
	unsetenv(var);
	ch_assert_clean("bad values", c->host_base);
}

void ch_freed_at_once(const ch_ckpt *c, bool cold, const char *var, const char *value,
		      uint64_t chunk, const unsigned *threads, size_t n)
{
	setenv(var, value, 1);
	ch_set_delay("2000"); /* slow copies: the load is still reading */
	for (size_t k = 0; k < n; k++) {
		fst_load_opts o;
		ch_opts(&o, "cuda:0", FST_IO_AUTO, threads[k], 1 * MiB);
		o.chunk_bytes = chunk;
		ch_temperature(c, cold);
		fst_loader *ld;
		fst_error err;
		assert_int_equal(fst_load_start(c->ck, &o, &ld, &err), 0);
		fst_loader_free(ld);
		ch_assert_clean("freed at once", c->host_base);
	}
	ch_set_delay("0");
	unsetenv(var);
}

int ch_setup(void **state)
{
	(void)state;
	const char *path = getenv("FST_CUDA_LIBRARY");
	dbl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!dbl) {
		fprintf(stderr, "cannot open the double %s: %s\n", path, dlerror());
		return -1;
	}
	*(void **)&ch_live_device = ch_sym("fst_double_live_device");
	*(void **)&ch_live_host = ch_sym("fst_double_live_host");
	/* Does this kernel allow io_uring? */
	int u = lh_uring_probe();
	if (u < 0)
		return -1;
	ch_uring_ok = u > 0;
	return 0;
}

/* Each test starts with the double's defaults and no fault armed, whatever
 * a failed test before it left behind. */
int ch_reset(void **state)
{
	(void)state;
	unsetenv("FST_DOUBLE_MEM");
	unsetenv("FST_DOUBLE_DEVICES");
	ch_set_delay("50");
	fst_fault_set(NULL, NULL);
	fst_trim();
	ch_device_base = ch_live_device();
	ch_pinned_base = ch_live_host();
	return 0;
}

int ch_teardown(void **state)
{
	(void)state;
	fst_trim();
	long d = ch_live_device(), h = ch_live_host();
	dlclose(dbl);
	if (d || h) {
		fprintf(stderr, "at the end: %ld device allocations and %ld pinned blocks live\n", d,
			h);
		return -1;
	}
	return 0;
}
