/* load_helpers.c - random checkpoints, independent file reads, filters and
 * resource counters for the loading tests (see load_helpers.h). */
#include "load_helpers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

lh_shape lh_default_shape(void)
{
	lh_shape s = {4, 12, 200000, 10, 12, true};
	return s;
}

int lh_fill(void *ctx, void *buf, uint64_t off, size_t len)
{
	const struct lh_fill_ctx *c = ctx;
	unsigned char *p = buf;
	for (size_t i = 0; i < len; i++) {
		uint64_t pos = off + i;
		p[i] = (unsigned char)(lh_mix(c->key ^ (pos >> 3) * 0x100000001b3ull) >>
				       (8 * (pos & 7)));
	}
	return 0;
}

void lh_pick_type(lh_rng *r, uint64_t bytes, fst_dtype *dt, uint32_t *ndim, uint64_t shape[4])
{
	switch (lh_below(r, 6)) {
	case 0: /* BF16 matrix */
		*dt = FST_DTYPE_BF16;
		*ndim = 2;
		shape[0] = 1 + lh_below(r, 8);
		shape[1] = bytes / 2 / shape[0];
		break;
	case 1: /* F32 vector */
		*dt = FST_DTYPE_F32;
		*ndim = 1;
		shape[0] = bytes / 4;
		break;
	case 2: /* a scalar */
		*dt = bytes & 1 ? FST_DTYPE_F64 : FST_DTYPE_I16;
		*ndim = 0;
		break;
	case 3: /* F4: two elements a byte */
		*dt = FST_DTYPE_F4;
		*ndim = 1;
		shape[0] = bytes * 2;
		break;
	default: /* U8 of any (odd) size */
		*dt = FST_DTYPE_U8;
		*ndim = 1;
		shape[0] = bytes;
		break;
	}
}

void lh_rmdir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	size_t dl = strlen(dir);
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		size_t nl = strlen(e->d_name);
		char *p = malloc(dl + nl + 2);
		memcpy(p, dir, dl);
		p[dl] = '/';
		memcpy(p + dl + 1, e->d_name, nl + 1);
		if (unlink(p))
			lh_rmdir(p);
		free(p);
	}
	closedir(d);
	rmdir(dir);
}

void lh_write_random(const char *name, uint64_t seed, const lh_shape *sh, lh_ckpt *ck)
{
	lh_rng r = {seed};
	memset(ck, 0, sizeof *ck);
	snprintf(ck->dir, sizeof ck->dir, "%s/%s", test_tmpdir(), name);
	lh_rmdir(ck->dir);
	if (mkdir(ck->dir, 0755))
		fail_msg("mkdir %s: %s", ck->dir, strerror(errno));
	ck->nfiles = 1 + (unsigned)lh_below(&r, sh->max_files);
	char file[700] = "";
	for (unsigned f = 0; f < ck->nfiles; f++) {
		fst_writer_opts wo;
		fst_writer_opts_init(&wo);
		static const uint32_t aligns[] = {8, 8, 16, 64, 4096};
		wo.data_align = aligns[lh_below(&r, 5)];
		wo.header_extra = 8 * (uint32_t)lh_below(&r, 4);
		fst_writer *w;
		fst_error err;
		if (fst_writer_new(&wo, &w, &err))
			fail_msg("writer: %s", err.message);
		unsigned nt = (unsigned)lh_below(&r, sh->max_tensors + 1);
		if (!nt && !sh->allow_empty_files)
			nt = 1;
		struct lh_fill_ctx *ctxs = calloc(nt + 1, sizeof *ctxs);
		for (unsigned t = 0; t < nt; t++) {
			uint64_t bytes;
			unsigned dice = (unsigned)lh_below(&r, 100);
			if (dice < sh->empty_percent)
				bytes = 0;
			else if (dice < sh->empty_percent + sh->big_percent)
				bytes = 1 + lh_below(&r, sh->max_big);
			else if (dice < 60)
				bytes = 1 + lh_below(&r, 300);
			else
				bytes = 1 + lh_below(&r, 20000);
			fst_dtype dt;
			uint32_t ndim = 0;
			uint64_t shape[4] = {0};
			lh_pick_type(&r, bytes, &dt, &ndim, shape);
			if (!bytes && ndim == 0) {
				dt = FST_DTYPE_U8;
				ndim = 1;
				shape[0] = 0;
			}
			char tname[64];
			snprintf(tname, sizeof tname, "f%u.t%u", f, t);
			ctxs[t].key = lh_mix(seed * 1000003u + f * 1009u + t);
			if (fst_writer_add_fill(w, tname, dt, ndim, shape, lh_fill, &ctxs[t], &err))
				fail_msg("add %s: %s", tname, err.message);
			ck->ntensors++;
		}
		snprintf(file, sizeof file, "%s/%02u.safetensors", ck->dir, f);
		if (fst_writer_finish(w, file, &err))
			fail_msg("finish %s: %s", file, err.message);
		fst_writer_free(w);
		free(ctxs);
	}
	/* a single shard is sometimes opened as the file itself */
	if (ck->nfiles == 1 && lh_below(&r, 2))
		snprintf(ck->path, sizeof ck->path, "%s", file);
	else
		snprintf(ck->path, sizeof ck->path, "%s", ck->dir);
}

fst_checkpoint *lh_open(const char *path)
{
	fst_checkpoint *ck = NULL;
	fst_error err;
	if (fst_checkpoint_open(path, &ck, &err))
		fail_msg("open %s: %s", path, err.message);
	return ck;
}

unsigned char *lh_slurp(const char *path, uint64_t *size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		fail_msg("open %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st))
		fail_msg("stat %s: %s", path, strerror(errno));
	unsigned char *b = malloc((size_t)st.st_size + 1);
	uint64_t done = 0;
	while (done < (uint64_t)st.st_size) {
		ssize_t n = read(fd, b + done, (size_t)st.st_size - done);
		if (n <= 0)
			fail_msg("read %s: %s", path, n ? strerror(errno) : "end of file");
		done += (uint64_t)n;
	}
	close(fd);
	*size = (uint64_t)st.st_size;
	return b;
}

void lh_files_read(const fst_checkpoint *ck, lh_files *fs)
{
	fs->n = fst_checkpoint_file_count(ck);
	fs->bytes = calloc(fs->n + 1, sizeof *fs->bytes);
	fs->size = calloc(fs->n + 1, sizeof *fs->size);
	for (size_t i = 0; i < fs->n; i++)
		fs->bytes[i] = lh_slurp(fst_file_path(fst_checkpoint_file(ck, i)), &fs->size[i]);
}

void lh_evict(const fst_checkpoint *ck)
{
	for (size_t i = 0; i < fst_checkpoint_file_count(ck); i++) {
		int fd = fst_file_fd(fst_checkpoint_file(ck, i));
		assert_int_equal(fsync(fd), 0);
		assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	}
}

void lh_files_free(lh_files *fs)
{
	for (size_t i = 0; i < fs->n; i++)
		free(fs->bytes[i]);
	free(fs->bytes);
	free(fs->size);
	memset(fs, 0, sizeof *fs);
}

const unsigned char *lh_expected(const fst_checkpoint *ck, const lh_files *fs, size_t i,
				 fst_tensor_info *info)
{
	size_t file;
	assert_int_equal(fst_checkpoint_tensor(ck, i, info, &file), 0);
	assert_true(file < fs->n);
	assert_true(info->file_offset + info->nbytes <= fs->size[file]);
	return fs->bytes[file] + info->file_offset;
}

void lh_assert_bytes(const char *what, const void *got, const void *want, uint64_t n)
{
	if (!n || !memcmp(got, want, (size_t)n))
		return;
	const unsigned char *g = got, *w = want;
	uint64_t k = 0;
	while (g[k] == w[k])
		k++;
	fail_msg("%s: byte %" PRIu64 " of %" PRIu64 " differs: loaded 0x%02x, file 0x%02x", what,
		 k, n, g[k], w[k]);
}

uint64_t lh_hash_name(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

bool lh_keeps(const lh_filter *f, const char *name)
{
	return lh_mix(lh_hash_name(name) ^ f->seed) % 100 < f->percent;
}

int lh_filter_fn(void *ctx, const char *name)
{
	lh_filter *f = ctx;
	f->calls++;
	return lh_keeps(f, name);
}

int lh_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

void lh_known_bug(const char *id, const char *detail)
{
	fail_msg("regression %s: %s", id, detail);
}

uint64_t lh_base_seed(void)
{
	const char *s = getenv("FST_TEST_SEED");
	return s && *s ? strtoull(s, NULL, 0) : 20240611u;
}

const char *lh_io_name(int io)
{
	switch (io) {
	case FST_IO_PREAD: return "pread";
	case FST_IO_URING: return "uring";
	case FST_IO_MMAP: return "mmap";
	default: return "auto";
	}
}

int lh_uring_probe(void)
{
	static int known = 2; /* 2: not asked yet */
	if (known != 2)
		return known;
	lh_shape sh = {1, 3, 1000, 0, 0, false};
	lh_ckpt lc;
	lh_write_random("uring_probe", 7, &sh, &lc);
	fst_checkpoint *ck = NULL;
	fst_error err;
	if (fst_checkpoint_open(lc.path, &ck, &err)) {
		fprintf(stderr, "io_uring probe: open %s: %s\n", lc.path, err.message);
		return -1;
	}
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = FST_IO_URING;
	o.threads = 1;
	fst_buffer *buf = NULL;
	int rc = fst_load(ck, &o, &buf, &err);
	if (rc == FST_EUNSUPPORTED)
		fprintf(stderr, "io_uring unavailable (%s): uring cases skipped\n", err.message);
	else if (rc)
		fprintf(stderr, "io_uring probe load failed: %s\n", err.message);
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
	lh_rmdir(lc.dir);
	known = !rc ? 1 : rc == FST_EUNSUPPORTED ? 0 : -1;
	return known;
}

bool lh_uring_usable(void)
{
	int u = lh_uring_probe();
	if (u < 0)
		fail_msg("the io=uring probe load failed (see above)");
	return u > 0;
}

bool lh_io_skipped(int io)
{
	return io == FST_IO_URING && !lh_uring_usable();
}
