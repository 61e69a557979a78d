/* gds_helpers.c - the GPUDirect Storage tests' view of both doubles, log
 * capture, resource snapshots, checked loads, their checkpoints and the
 * group set-up (see gds_helpers.h). */
#include "gds_helpers.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

gh_doubles gh;
bool gh_uring_ok = true;

void *gh_sym(void *lib, const char *name)
{
	void *p = dlsym(lib, name);
	if (!p) {
		fprintf(stderr, "a double lacks %s\n", name);
		exit(1);
	}
	return p;
}

int gh_open_doubles(void)
{
	const char *cuda = getenv("FST_CUDA_LIBRARY");
	const char *cufile = getenv("FST_TEST_CUFILE_DOUBLE");
	if (!cufile || !*cufile)
		cufile = getenv("FST_CUFILE_LIBRARY");
	if (!cuda || !*cuda || !cufile || !*cufile) {
		fprintf(stderr, "FST_CUDA_LIBRARY or FST_CUFILE_LIBRARY is not set: run through "
				"ctest\n");
		return 77;
	}
	gh.cuda = dlopen(cuda, RTLD_NOW | RTLD_LOCAL);
	gh.cufile = dlopen(cufile, RTLD_NOW | RTLD_LOCAL);
	if (!gh.cuda || !gh.cufile) {
		fprintf(stderr, "cannot open the doubles: %s\n", dlerror());
		exit(1);
	}
#define GH_SYM(lib, field, name) *(void **)(&gh.field) = gh_sym(gh.lib, name)
	GH_SYM(cufile, live_handles, "fst_cufile_double_live_handles");
	GH_SYM(cufile, live_bufs, "fst_cufile_double_live_bufs");
	GH_SYM(cufile, reads, "fst_cufile_double_reads");
	GH_SYM(cufile, failed_reads, "fst_cufile_double_failed_reads");
	GH_SYM(cufile, misuse, "fst_cufile_double_misuse");
	GH_SYM(cufile, driver_opens, "fst_cufile_double_driver_opens");
	GH_SYM(cufile, handle_registers, "fst_cufile_double_handle_registers");
	GH_SYM(cufile, buf_registers, "fst_cufile_double_buf_registers");
	GH_SYM(cufile, bytes, "fst_cufile_double_bytes");
	GH_SYM(cufile, path_reads, "fst_cufile_double_path_reads");
	GH_SYM(cufile, forget_bufs, "fst_cufile_double_forget_bufs");
	GH_SYM(cuda, live_device, "fst_double_live_device");
	GH_SYM(cuda, live_host, "fst_double_live_host");
#undef GH_SYM
	return 0;
}

void gh_switches_off(void)
{
	static const char *const vars[] = {
		"FST_CUFILE_DOUBLE_OPEN_ERR",  "FST_CUFILE_DOUBLE_REGISTER_ERR",
		"FST_CUFILE_DOUBLE_REGISTER_ERR_FILE", "FST_CUFILE_DOUBLE_BUFREG_ERR",
		"FST_CUFILE_DOUBLE_SHORT",     "FST_CUFILE_DOUBLE_FAIL_AFTER",
		"FST_CUFILE_DOUBLE_FAIL_RC",   "FST_CUFILE_DOUBLE_NVFS",
	};
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
		unsetenv(vars[i]);
	fst_fault_set(NULL, NULL);
}

/* ---- log capture */

#define GH_LOG_MAX 512

static struct {
	pthread_mutex_t m;
	int n;
	int level[GH_LOG_MAX];
	char *msg[GH_LOG_MAX];
} gh_log = {PTHREAD_MUTEX_INITIALIZER, 0, {0}, {0}};

static void gh_log_fn(void *ctx, int level, const char *message)
{
	(void)ctx;
	pthread_mutex_lock(&gh_log.m);
	if (gh_log.n < GH_LOG_MAX) {
		gh_log.level[gh_log.n] = level;
		gh_log.msg[gh_log.n++] = strdup(message);
	}
	pthread_mutex_unlock(&gh_log.m);
}

void gh_log_clear(void)
{
	pthread_mutex_lock(&gh_log.m);
	for (int i = 0; i < gh_log.n; i++)
		free(gh_log.msg[i]);
	gh_log.n = 0;
	pthread_mutex_unlock(&gh_log.m);
}

void gh_log_capture(int level)
{
	gh_log_clear();
	fst_log_set_callback(gh_log_fn, NULL);
	fst_log_set_level(level);
}

int gh_log_count(int level, const char *a, const char *b)
{
	int n = 0;
	pthread_mutex_lock(&gh_log.m);
	for (int i = 0; i < gh_log.n; i++)
		if ((level < 0 || gh_log.level[i] == level) && (!a || strstr(gh_log.msg[i], a)) &&
		    (!b || strstr(gh_log.msg[i], b)))
			n++;
	pthread_mutex_unlock(&gh_log.m);
	return n;
}

void gh_log_dump(const char *why)
{
	pthread_mutex_lock(&gh_log.m);
	fprintf(stderr, "log lines (%s):\n", why);
	for (int i = 0; i < gh_log.n; i++)
		fprintf(stderr, "  [%d] %s\n", gh_log.level[i], gh_log.msg[i]);
	pthread_mutex_unlock(&gh_log.m);
}

void gh_log_expect(int want, int level, const char *a, const char *b)
{
	int n = gh_log_count(level, a, b);
	if (n != want) {
		gh_log_dump("unexpected count");
		fail_msg("%d log lines at level %d with \"%s\" and \"%s\", expected %d", n, level,
			 a ? a : "", b ? b : "", want);
	}
}

gh_base gh_snapshot(void)
{
	fst_trim();
	gh_base b = {gh.live_handles(), gh.live_bufs(), gh.live_device(), gh.live_host(),
		     fsti_live_allocations(), gh.misuse(), lh_count_fds()};
	return b;
}

void gh_assert_back(const gh_base *b, const char *when)
{
	gh_base now = gh_snapshot();
	if (now.bufs != b->bufs) {
		/*
		 * src/gds.c: fsti_gds_teardown deregisters the destination only
		 * while e->buf is set, and fst_loader_finish hands the buffer out
		 * (e->buf = NULL) before engine_free: after every successful load
		 * the buffer stays registered with cuFile, and is freed so.
		 */
		lh_known_bug("GDS-BUF-STAYS-REGISTERED",
			     "cuFileBufDeregister is never called after a successful load: the "
			     "device buffer is freed while registered with cuFile");
		gh.forget_bufs();
		now.bufs = gh.live_bufs();
	}
	if (now.handles != b->handles || now.bufs != b->bufs || now.device != b->device ||
	    now.host != b->host || now.allocs != b->allocs || now.fds != b->fds ||
	    now.misuse != b->misuse)
		fail_msg("%s: live cuFile handles %ld (was %ld), buffer registrations %ld (%ld), "
			 "device allocations %ld (%ld), pinned blocks %ld (%ld), libfst allocations "
			 "%ld (%ld), descriptors %d (%d), cuFile misuse %ld (%ld)",
			 when, now.handles, b->handles, now.bufs, b->bufs, now.device, b->device,
			 now.host, b->host, now.allocs, b->allocs, now.fds, b->fds, now.misuse,
			 b->misuse);
}

fst_load_opts gh_opts(const char *device, int gds, int io, unsigned threads)
{
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.device = device;
	o.gds = gds;
	o.io = io;
	o.threads = threads;
	return o;
}

void gh_check_view(const fst_checkpoint *ck, const lh_files *fs, const fst_tensor_view *v,
		   int device_id, uint32_t align)
{
	if (v->device_type != FST_DEVICE_CUDA || v->device_id != device_id)
		fail_msg("%s: on device %d:%d, expected cuda:%d", v->name, v->device_type,
			 v->device_id, device_id);
	if ((uintptr_t)v->data % align)
		fail_msg("%s: device address %p not aligned to %u", v->name, v->data, align);
	long idx = fst_checkpoint_find(ck, v->name);
	if (idx < 0)
		fail_msg("%s: not in the checkpoint", v->name);
	fst_tensor_info info;
	const unsigned char *want = lh_expected(ck, fs, (size_t)idx, &info);
	if (info.nbytes != v->nbytes || info.dtype != v->dtype || info.ndim != v->ndim)
		fail_msg("%s: size, dtype or rank differ from the file's", v->name);
	if (!v->nbytes)
		return;
	unsigned char *got = malloc((size_t)v->nbytes);
	fst_error err;
	if (fst_copy_to_host(v, 0, got, v->nbytes, &err))
		fail_msg("%s: copy to host: %s", v->name, err.message);
	lh_assert_bytes(v->name, got, want, v->nbytes);
	free(got);
}

void gh_check_buffer(const fst_checkpoint *ck, const lh_files *fs, fst_buffer *buf, int device_id,
		     uint32_t align)
{
	size_t n = fst_checkpoint_tensor_count(ck);
	assert_int_equal(fst_buffer_tensor_count(buf), n);
	for (size_t i = 0; i < n; i++) {
		fst_tensor_info info;
		assert_int_equal(fst_checkpoint_tensor(ck, i, &info, NULL), 0);
		long j = fst_buffer_find(buf, info.name);
		if (j < 0)
			fail_msg("%s: missing from the buffer", info.name);
		fst_tensor_view v;
		assert_int_equal(fst_buffer_tensor(buf, (size_t)j, &v), 0);
		gh_check_view(ck, fs, &v, device_id, align);
		fst_view_release(&v);
	}
}

int gh_device_id(const char *device)
{
	return !strncmp(device, "cuda:", 5) ? atoi(device + 5) : 0;
}

void gh_load_ok(const fst_checkpoint *ck, const lh_files *fs, const fst_load_opts *o, char *desc,
		size_t desc_size)
{
	fst_buffer *buf = NULL;
	fst_error err;
	int rc = fst_load(ck, o, &buf, &err);
	if (rc) {
		gh_log_dump("load failed");
		fail_msg("load to %s (gds %d, io %d, %u threads) failed: %s", o->device, o->gds,
			 o->io, o->threads, err.message);
	}
	gh_check_buffer(ck, fs, buf, gh_device_id(o->device), o->align ? o->align : 256);
	if (desc)
		snprintf(desc, desc_size, "%s", fst_buffer_describe(buf));
	fst_buffer_release(buf);
}

void gh_stream_ok(const fst_checkpoint *ck, const lh_files *fs, const fst_load_opts *o)
{
	fst_loader *ld = NULL;
	fst_error err;
	if (fst_load_start(ck, o, &ld, &err))
		fail_msg("load_start: %s", err.message);
	size_t n = fst_checkpoint_tensor_count(ck), seen = 0;
	fst_tensor_view v;
	int rc;
	int id = gh_device_id(o->device);
	while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
		gh_check_view(ck, fs, &v, id, o->align ? o->align : 256);
		fst_view_release(&v);
		seen++;
	}
	if (rc)
		fail_msg("loader_next: %s", err.message);
	assert_int_equal(seen, n);
	fst_buffer *buf = NULL;
	if (fst_loader_finish(ld, &buf, &err))
		fail_msg("loader_finish: %s", err.message);
	gh_check_buffer(ck, fs, buf, id, o->align ? o->align : 256);
	fst_buffer_release(buf);
}

void gh_load_fails(const fst_checkpoint *ck, const fst_load_opts *o, int code, int backend,
		   const char *a, const char *b)
{
	fst_buffer *buf = (fst_buffer *)(uintptr_t)1;
	fst_error err;
	memset(&err, 0, sizeof err);
	int rc = fst_load(ck, o, &buf, &err);
	if (rc != code)
		fail_msg("load returned %d (%s), expected %d", rc, rc ? err.message : "success",
			 code);
	assert_null(buf);
	assert_int_equal(err.code, code);
	if (backend >= 0 && err.backend_code != backend)
		fail_msg("backend code %d, expected %d (%s)", err.backend_code, backend, err.message);
	if (a)
		assert_has(err.message, a);
	if (b)
		assert_has(err.message, b);
}

void gh_stream_fails(const fst_checkpoint *ck, const lh_files *fs, const fst_load_opts *o, int code,
		     const char *a)
{
	fst_loader *ld = NULL;
	fst_error err;
	int rc = fst_load_start(ck, o, &ld, &err);
	if (rc) {
		assert_int_equal(rc, code);
		assert_null(ld);
		if (a)
			assert_has(err.message, a);
		return;
	}
	fst_tensor_view v;
	int id = gh_device_id(o->device);
	while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
		gh_check_view(ck, fs, &v, id, o->align ? o->align : 256);
		fst_view_release(&v);
	}
	if (rc != code)
		fail_msg("loader_next returned %d, expected %d (%s)", rc, code,
			 rc ? err.message : "all tensors handed out");
	if (a)
		assert_has(err.message, a);
	fst_buffer *buf = (fst_buffer *)(uintptr_t)1;
	assert_int_equal(fst_loader_finish(ld, &buf, &err), code);
	assert_null(buf);
}

/* ---- checkpoints */

/* Sum of the tensor bytes of file `file`. */
uint64_t gh_file_bytes(const fst_checkpoint *ck, size_t file)
{
	uint64_t n = 0;
	for (size_t i = 0; i < fst_checkpoint_tensor_count(ck); i++) {
		fst_tensor_info info;
		size_t f;
		assert_int_equal(fst_checkpoint_tensor(ck, i, &info, &f), 0);
		if (f == file)
			n += info.nbytes;
	}
	return n;
}

/* "/<dir name>/NN.safetensors": how the double's per-path counters find a
 * shard whatever the real path of the test directory is. */
const char *gh_shard_key(const char *name, size_t file)
{
	static char keys[4][128];
	static int next;
	char *k = keys[next++ % 4];
	snprintf(k, sizeof keys[0], "/%s/%02zu.safetensors", name, file);
	return k;
}

struct founding_tensor {
	const char *tag;
	fst_dtype dtype;
	uint32_t ndim;
	uint64_t shape[2];
};

/*
 * The shape that broke the first GDS loader: every shard's data section
 * starts 8 bytes past a 16-byte boundary (data_align 16, header_extra 8),
 * and odd-sized U8 tensors come before BF16 ones, so the BF16 tensors sit at
 * odd file offsets while their destinations are 256-aligned.
 */
void gh_write_founding_salted(const char *name, unsigned nfiles, uint64_t seed, uint64_t salt,
			      lh_ckpt *c)
{
	lh_rng r = {seed};
	memset(c, 0, sizeof *c);
	snprintf(c->dir, sizeof c->dir, "%s/%s", test_tmpdir(), name);
	lh_rmdir(c->dir);
	if (mkdir(c->dir, 0755))
		fail_msg("mkdir %s: %s", c->dir, strerror(errno));
	snprintf(c->path, sizeof c->path, "%s", c->dir);
	c->nfiles = nfiles;
	for (unsigned f = 0; f < nfiles; f++) {
		const struct founding_tensor ts[] = {
			{"a", FST_DTYPE_U8, 1, {1 + 2 * lh_below(&r, 50)}},
			{"b", FST_DTYPE_U8, 1, {3 + 2 * lh_below(&r, 1000)}},
			{"c", FST_DTYPE_BF16, 2, {3, 1000 + f}},
			{"d", FST_DTYPE_U8, 1, {7}},
			{"e", FST_DTYPE_BF16, 2, {2, 40000 + lh_below(&r, 5000)}},
			{"f", FST_DTYPE_U8, 1, {100001 + 2 * lh_below(&r, 1000)}},
			{"g", FST_DTYPE_F32, 1, {1000 + lh_below(&r, 100)}},
			{"h", FST_DTYPE_U8, 1, {1}},
			{"i", FST_DTYPE_BF16, 2, {5, 7}},
			{"j", FST_DTYPE_U8, 1, {0}},
			{"k", FST_DTYPE_BF16, 1, {30001}},
		};
		size_t nt = sizeof ts / sizeof ts[0];
		fst_writer_opts wo;
		fst_writer_opts_init(&wo);
		wo.data_align = 16;
		wo.header_extra = 8;
		fst_writer *w;
		fst_error err;
		if (fst_writer_new(&wo, &w, &err))
			fail_msg("writer: %s", err.message);
		struct lh_fill_ctx keys[sizeof ts / sizeof ts[0]];
		for (size_t t = 0; t < nt; t++) {
			char tname[64];
			snprintf(tname, sizeof tname, "f%u.%s", f, ts[t].tag);
			keys[t].key = lh_mix((seed ^ salt) * 7919u + f * 131u + t);
			if (fst_writer_add_fill(w, tname, ts[t].dtype, ts[t].ndim, ts[t].shape, lh_fill,
						&keys[t], &err))
				fail_msg("add %s: %s", tname, err.message);
			c->ntensors++;
		}
		char file[800];
		snprintf(file, sizeof file, "%s/%02u.safetensors", c->dir, f);
		if (fst_writer_finish(w, file, &err))
			fail_msg("finish %s: %s", file, err.message);
		fst_writer_free(w);
	}
}

void gh_write_founding(const char *name, unsigned nfiles, uint64_t seed, lh_ckpt *c)
{
	gh_write_founding_salted(name, nfiles, seed, 0, c);
}

void gh_fixture_open(gh_fixture *x, const char *name)
{
	x->name = name;
	x->ck = lh_open(x->c.path);
	lh_files_read(x->ck, &x->fs);
}

void gh_founding(gh_fixture *x, const char *name, unsigned nfiles, uint64_t seed)
{
	gh_write_founding(name, nfiles, seed, &x->c);
	gh_fixture_open(x, name);
	/* the shape really is the founding one */
	for (size_t f = 0; f < fst_checkpoint_file_count(x->ck); f++)
		assert_int_equal(fst_file_data_offset(fst_checkpoint_file(x->ck, f)) % 16, 8);
	bool odd_bf16 = false;
	for (size_t i = 0; i < fst_checkpoint_tensor_count(x->ck); i++) {
		fst_tensor_info info;
		assert_int_equal(fst_checkpoint_tensor(x->ck, i, &info, NULL), 0);
		if (info.dtype == FST_DTYPE_BF16 && info.file_offset % 2)
			odd_bf16 = true;
	}
	assert_true(odd_bf16);
}

void gh_fixture_close(gh_fixture *x)
{
	lh_files_free(&x->fs);
	fst_checkpoint_close(x->ck);
	lh_rmdir(x->c.dir);
	memset(x, 0, sizeof *x);
}

void gh_setenv_long(const char *name, long v)
{
	char s[32];
	snprintf(s, sizeof s, "%ld", v);
	setenv(name, s, 1);
}

/* ---- the group */

int gh_reset(void **state)
{
	(void)state;
	/* a failed test may have left its buffer registered (see
	 * GDS-BUF-STAYS-REGISTERED): every test starts with none */
	gh.forget_bufs();
	gh_switches_off();
	setenv("FST_CUFILE_DOUBLE_DELAY_US", "100", 1);
	setenv("FST_DOUBLE_DELAY_US", "50", 1);
	gh_log_capture(FST_LOG_INFO);
	return 0;
}

int gh_group_setup(void **state)
{
	(void)state;
	/* Is io_uring there at all? */
	int u = lh_uring_probe();
	if (u < 0)
		return -1;
	gh_uring_ok = u > 0;
	return 0;
}

int gh_leftovers(void)
{
	fst_log_set_callback(NULL, NULL);
	gh_log_clear();
	fst_trim();
	long bad = gh.misuse() + gh.live_handles() + gh.live_device() + gh.live_host();
	if (bad) {
		fprintf(stderr, "at the end: cuFile misuse %ld, live handles %ld, device allocations "
				"%ld, pinned blocks %ld\n",
			gh.misuse(), gh.live_handles(), gh.live_device(), gh.live_host());
		return -1;
	}
	return 0;
}

int gh_group_teardown(void **state)
{
	(void)state;
	return gh_leftovers();
}
