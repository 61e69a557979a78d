/* Description: GPUDirect Storage (cuFile) loads where the probe says GDS is
 * usable, against the libcuda and libcufile test doubles (device pointers
 * are host pointers; every cuFileRead poisons its range, sleeps, then writes
 * the bytes). Loads with gds=auto and gds=on onto cuda:0 and cuda:1 must go
 * through cuFile (the double's read counters grow, fst_buffer_describe says
 * so) and land every byte of the file, for random checkpoints and the
 * founding-bug shape (data sections at 8 mod 16, odd-sized U8 tensors before
 * BF16 ones), through fst_load and the streaming form (each tensor right when
 * it is handed out), with every tensor aligned to 256 (or 512 when asked).
 * The double's switches, under auto (fall back, bytes equal, one warning
 * naming the file and the code) and under on (fail cleanly with the code and
 * the file, no buffer, nothing left registered, allocated or open): handle
 * registration failing with 5027 for every file or one file, buffer
 * registration failing with 5016, short reads (resumed, never a failure),
 * reads failing after N bytes (the file falls back mid-load under auto), and
 * failing with a cuFile code or with -1 and errno. The fault sites
 * cufile_register and cufile_read behave like the switches. Two bugs these
 * tests found stay checked as regressions: the destination stayed
 * registered with cuFile after a successful load (so the next load at the
 * same address was refused), and gds.c opened files again by path (a memory
 * image or a descriptor opened under a label has none). A path replaced
 * since the file was opened keeps cuFile, reading the opened file; a
 * filter, cancelling, a caller's allocator and two loads at once work with
 * cuFile too. */
#include "gds_helpers.h"

#include <sys/stat.h>

#define KiB 1024ull

static bool uring_ok = true;

/* ---- checkpoints */

/* Sum of the tensor bytes of file `file`. */
static uint64_t file_bytes(const fst_checkpoint *ck, size_t file)
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
static const char *shard_key(const char *name, size_t file)
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
static void write_founding_salted(const char *name, unsigned nfiles, uint64_t seed,
				  uint64_t salt, lh_ckpt *c)
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

static void write_founding(const char *name, unsigned nfiles, uint64_t seed, lh_ckpt *c)
{
	write_founding_salted(name, nfiles, seed, 0, c);
}

/* An open checkpoint and an independent copy of its files. */
typedef struct fixture {
	lh_ckpt c;
	fst_checkpoint *ck;
	lh_files fs;
	const char *name;
} fixture;

static void fixture_open(fixture *x, const char *name)
{
	x->name = name;
	x->ck = lh_open(x->c.path);
	lh_files_read(x->ck, &x->fs);
}

static void founding(fixture *x, const char *name, unsigned nfiles, uint64_t seed)
{
	write_founding(name, nfiles, seed, &x->c);
	fixture_open(x, name);
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

static void fixture_close(fixture *x)
{
	lh_files_free(&x->fs);
	fst_checkpoint_close(x->ck);
	lh_rmdir(x->c.dir);
	memset(x, 0, sizeof *x);
}

static void setenv_long(const char *name, long v)
{
	char s[32];
	snprintf(s, sizeof s, "%ld", v);
	setenv(name, s, 1);
}

/* ---- cuFile really used, bytes right */

static void test_random_checkpoints(void **state)
{
	(void)state;
	lh_shape sh = lh_default_shape();
	sh.max_big = 300000;
	uint64_t seed0 = lh_base_seed();
	for (unsigned k = 0; k < 24; k++) {
		char name[32];
		snprintf(name, sizeof name, "rand%u", k);
		fixture x;
		lh_write_random(name, seed0 + k, &sh, &x.c);
		fixture_open(&x, name);
		uint64_t total = fst_checkpoint_total_bytes(x.ck);
		for (int pass = 0; pass < 2; pass++) {
			gh_base b = gh_snapshot();
			int gds = (k + (unsigned)pass) % 2 ? FST_GDS_ON : FST_GDS_AUTO;
			int io = uring_ok && (k + (unsigned)pass) % 3 == 2 ? FST_IO_URING : FST_IO_PREAD;
			fst_load_opts o = gh_opts(k % 4 == 3 ? "cuda:1" : "cuda:0", gds, io,
						  1 + (k + (unsigned)pass) % 4);
			o.chunk_bytes = 4096ull << (k % 6);
			o.staging_bytes = k % 2 ? 256 * KiB : 0;
			if (k % 5 == 4)
				o.align = 512;
			long r0 = gh.reads();
			long per_file[16];
			for (size_t f = 0; f < x.c.nfiles && f < 16; f++)
				per_file[f] = gh.path_reads(shard_key(name, f));
			gh_log_clear();
			char desc[1200];
			if (pass == 0)
				gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
			else
				gh_stream_ok(x.ck, &x.fs, &o);
			long reads = gh.reads() - r0;
			if (total)
				assert_true(reads > 0);
			else
				assert_int_equal(reads, 0);
			/* every shard with data was read with cuFile */
			for (size_t f = 0; f < x.c.nfiles && f < 16; f++)
				if (file_bytes(x.ck, f))
					assert_true(gh.path_reads(shard_key(name, f)) > per_file[f]);
			if (pass == 0) {
				char want[96];
				snprintf(want, sizeof want, "GPUDirect Storage for %u of %u files",
					 x.c.nfiles, x.c.nfiles);
				assert_has(desc, want);
				assert_has(desc, "cuFile where registered");
			}
			gh_log_expect(0, FST_LOG_WARN, NULL, NULL);
			gh_log_expect(0, FST_LOG_ERROR, NULL, NULL);
			gh_assert_back(&b, name);
		}
		fixture_close(&x);
	}
}

static void test_founding_shape(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "founding", 3, lh_base_seed());
	int ios[2] = {FST_IO_PREAD, FST_IO_URING};
	for (int gds = FST_GDS_AUTO; gds <= FST_GDS_ON; gds++)
		for (int i = 0; i < (uring_ok ? 2 : 1); i++)
			for (unsigned threads = 1; threads <= 3; threads += 2)
				for (int stream = 0; stream < 2; stream++) {
					gh_base b = gh_snapshot();
					fst_load_opts o = gh_opts("cuda:0", gds, ios[i], threads);
					o.chunk_bytes = 16 * KiB;
					long r0 = gh.reads();
					gh_log_clear();
					char desc[1200] = "";
					if (stream)
						gh_stream_ok(x.ck, &x.fs, &o);
					else
						gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
					assert_true(gh.reads() - r0 >= 3);
					if (!stream)
						assert_has(desc, "GPUDirect Storage for 3 of 3 files");
					gh_log_expect(0, FST_LOG_WARN, NULL, NULL);
					gh_assert_back(&b, "founding shape");
				}
	fixture_close(&x);
}

/* ---- handle registration fails */

static void test_register_error_every_file(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "regall", 3, lh_base_seed() + 1);
	setenv("FST_CUFILE_DOUBLE_REGISTER_ERR", "5027", 1);
	for (int stream = 0; stream < 2; stream++) {
		gh_base b = gh_snapshot();
		long r0 = gh.reads(), reg0 = gh.handle_registers();
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 2);
		char desc[1200] = "";
		if (stream)
			gh_stream_ok(x.ck, &x.fs, &o);
		else
			gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
		assert_int_equal(gh.reads() - r0, 0);
		assert_int_equal(gh.handle_registers() - reg0, 3);
		for (size_t f = 0; f < 3; f++)
			gh_log_expect(1, FST_LOG_WARN, shard_key("regall", f), "5027");
		gh_log_expect(3, FST_LOG_WARN, NULL, NULL);
		if (!stream)
			assert_has(desc, "GPUDirect Storage for 0 of 3 files");
		gh_assert_back(&b, "register 5027, auto");
	}
	/* on: a clean failure naming the first file and the code */
	gh_base b = gh_snapshot();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	gh_load_fails(x.ck, &o, FST_EUNSUPPORTED, 5027, shard_key("regall", 0),
		      "5027 (CU_FILE_HANDLE_NOT_REGISTERED)");
	gh_assert_back(&b, "register 5027, on");
	gh_stream_fails(x.ck, &x.fs, &o, FST_EUNSUPPORTED, "5027");
	gh_assert_back(&b, "register 5027, on, streaming");
	fixture_close(&x);
}

static void test_register_error_one_file(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "regone", 3, lh_base_seed() + 2);
	setenv("FST_CUFILE_DOUBLE_REGISTER_ERR", "5027", 1);
	setenv("FST_CUFILE_DOUBLE_REGISTER_ERR_FILE", shard_key("regone", 1), 1);
	for (int stream = 0; stream < 2; stream++) {
		gh_base b = gh_snapshot();
		long r[3];
		for (size_t f = 0; f < 3; f++)
			r[f] = gh.path_reads(shard_key("regone", f));
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 3);
		char desc[1200] = "";
		if (stream)
			gh_stream_ok(x.ck, &x.fs, &o);
		else
			gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
		/* the other files still use cuFile; this one never does */
		assert_true(gh.path_reads(shard_key("regone", 0)) > r[0]);
		assert_int_equal(gh.path_reads(shard_key("regone", 1)), r[1]);
		assert_true(gh.path_reads(shard_key("regone", 2)) > r[2]);
		gh_log_expect(1, FST_LOG_WARN, shard_key("regone", 1), "5027");
		gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
		if (!stream) {
			assert_has(desc, "GPUDirect Storage for 2 of 3 files");
			assert_has(desc, "cuFile where registered");
		}
		gh_assert_back(&b, "register 5027 for one file, auto");
	}
	gh_base b = gh_snapshot();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 3);
	/* file 00 was registered before 01 failed: it must be deregistered */
	gh_load_fails(x.ck, &o, FST_EUNSUPPORTED, 5027, shard_key("regone", 1), "5027");
	gh_assert_back(&b, "register 5027 for one file, on");
	fixture_close(&x);
}

/* ---- buffer registration fails */

static void test_buffer_register_error(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "bufreg", 2, lh_base_seed() + 3);
	setenv("FST_CUFILE_DOUBLE_BUFREG_ERR", "5016", 1);
	for (int stream = 0; stream < 2; stream++) {
		gh_base b = gh_snapshot();
		long r0 = gh.reads();
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 2);
		if (stream)
			gh_stream_ok(x.ck, &x.fs, &o);
		else
			gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
		/* no partly-trusted mode: nothing is read with cuFile */
		assert_int_equal(gh.reads() - r0, 0);
		gh_log_expect(1, FST_LOG_WARN, "cuFileBufRegister", "5016");
		gh_log_expect(1, FST_LOG_WARN, "cuda:0", NULL);
		gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
		gh_assert_back(&b, "buffer registration 5016, auto");
	}
	gh_base b = gh_snapshot();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	gh_load_fails(x.ck, &o, FST_EDEVICE, 5016, "cuFileBufRegister",
		      "5016 (CU_FILE_INVALID_MAPPING_SIZE)");
	gh_assert_back(&b, "buffer registration 5016, on");
	gh_stream_fails(x.ck, &x.fs, &o, FST_EDEVICE, "5016");
	gh_assert_back(&b, "buffer registration 5016, on, streaming");
	fixture_close(&x);
}

/* ---- short reads are resumed */

static void test_short_reads(void **state)
{
	(void)state;
	lh_shape sh = lh_default_shape();
	sh.max_big = 100000;
	sh.allow_empty_files = false;
	for (unsigned k = 0; k < 4; k++) {
		char name[32];
		snprintf(name, sizeof name, "short%u", k);
		fixture x;
		if (k == 0) {
			founding(&x, name, 2, lh_base_seed() + 4);
		} else {
			lh_write_random(name, lh_base_seed() + 40 + k, &sh, &x.c);
			fixture_open(&x, name);
		}
		for (int gds = FST_GDS_AUTO; gds <= FST_GDS_ON; gds++) {
			fst_load_opts o = gh_opts("cuda:0", gds, k % 2 ? FST_IO_PREAD : FST_IO_AUTO,
						  1 + k % 3);
			o.chunk_bytes = 32 * KiB;
			gh_base b = gh_snapshot();
			unsetenv("FST_CUFILE_DOUBLE_SHORT");
			long r0 = gh.reads();
			gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
			long whole = gh.reads() - r0;
			gh_assert_back(&b, name);
			setenv("FST_CUFILE_DOUBLE_SHORT", "1", 1);
			gh_log_clear();
			r0 = gh.reads();
			long f0 = gh.failed_reads();
			if (k % 2)
				gh_stream_ok(x.ck, &x.fs, &o);
			else
				gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
			long halves = gh.reads() - r0;
			if (fst_checkpoint_total_bytes(x.ck) && halves <= whole)
				fail_msg("%s: %ld reads of halves, %ld of whole chunks", name, halves,
					 whole);
			assert_int_equal(gh.failed_reads(), f0);
			/* a short read is neither a failure nor a reason to fall back */
			gh_log_expect(0, FST_LOG_WARN, NULL, NULL);
			gh_assert_back(&b, name);
		}
		unsetenv("FST_CUFILE_DOUBLE_SHORT");
		fixture_close(&x);
	}
}

/* ---- reads fail after N bytes */

static void test_fail_after_auto(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "failauto", 3, lh_base_seed() + 5);
	uint64_t b0 = file_bytes(x.ck, 0), b1 = file_bytes(x.ck, 1);

	/* One thread, chunks in plan order: file 00 entirely with cuFile, file
	 * 01 fails half-way (inside a read: a short one, then -EIO) and falls
	 * back mid-load, and 02 fails at its first read. */
	gh_base b = gh_snapshot();
	long start = gh.bytes(), f0 = gh.failed_reads();
	setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", start + (long)(b0 + b1 / 2) + 1);
	gh_log_clear();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 1);
	o.chunk_bytes = 16 * KiB;
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	assert_int_equal(gh.bytes() - start, (long)(b0 + b1 / 2) + 1);
	assert_true(gh.failed_reads() - f0 >= 2);
	gh_log_expect(0, FST_LOG_WARN, shard_key("failauto", 0), NULL);
	gh_log_expect(1, FST_LOG_WARN, shard_key("failauto", 1), "Input/output error");
	gh_log_expect(1, FST_LOG_WARN, shard_key("failauto", 2), "Input/output error");
	gh_log_expect(2, FST_LOG_WARN, NULL, NULL);
	gh_assert_back(&b, "fail after N, auto, 1 thread");

	/* Several threads, through the streaming form: whoever reads past N
	 * falls back; bytes stay right. */
	for (unsigned threads = 2; threads <= 4; threads++) {
		start = gh.bytes();
		setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", start + (long)(b0 / threads));
		gh_log_clear();
		o = gh_opts("cuda:0", FST_GDS_AUTO,
			    threads == 3 && uring_ok ? FST_IO_URING : FST_IO_PREAD, threads);
		o.chunk_bytes = 8 * KiB;
		gh_stream_ok(x.ck, &x.fs, &o);
		assert_true(gh_log_count(FST_LOG_WARN, "cuFileRead", "Input/output error") >= 1);
		assert_int_equal(gh_log_count(FST_LOG_WARN, NULL, NULL),
				 gh_log_count(FST_LOG_WARN, "cuFileRead", "pinned staging"));
		gh_assert_back(&b, "fail after N, auto, threads");
	}
	fixture_close(&x);
}

static void test_fail_after_on(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "failon", 2, lh_base_seed() + 6);
	uint64_t total = fst_checkpoint_total_bytes(x.ck);
	for (int stream = 0; stream < 2; stream++)
		for (unsigned threads = 1; threads <= 3; threads += 2) {
			gh_base b = gh_snapshot();
			setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", gh.bytes() + (long)(total / 2));
			fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, threads);
			o.chunk_bytes = 16 * KiB;
			gh_log_clear();
			if (stream)
				gh_stream_fails(x.ck, &x.fs, &o, FST_EIO, "cuFileRead");
			else
				gh_load_fails(x.ck, &o, FST_EIO, EIO, "/failon/0", "cuFileRead");
			gh_assert_back(&b, "fail after N, on");
		}
	/* a negative cuFile code is named as such */
	gh_base b = gh_snapshot();
	setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", gh.bytes());
	setenv("FST_CUFILE_DOUBLE_FAIL_RC", "-5011", 1);
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	gh_load_fails(x.ck, &o, FST_EIO, 5011, "/failon/0", "5011 (CU_FILE_CUDA_DRIVER_ERROR)");
	gh_assert_back(&b, "cuFile code, on");
	gh_log_clear();
	o.gds = FST_GDS_AUTO;
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	gh_log_expect(2, FST_LOG_WARN, "5011", "pinned staging");
	gh_assert_back(&b, "cuFile code, auto");
	unsetenv("FST_CUFILE_DOUBLE_FAIL_RC");
	fixture_close(&x);
}

/*
 * cuFileRead's contract: "-1 on an error, so errno is set to indicate
 * filesystem errors; all other errors return a negative integer value of
 * the CUfileOpError enum value". -1 must be read as errno, not as EPERM.
 */
static void test_fail_minus_one_errno(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "failerrno", 1, lh_base_seed() + 7);
	gh_base b = gh_snapshot();
	setenv_long("FST_CUFILE_DOUBLE_FAIL_AFTER", gh.bytes());
	setenv("FST_CUFILE_DOUBLE_FAIL_RC", "-1", 1);
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 1);
	gh_load_fails(x.ck, &o, FST_EIO, EIO, "/failerrno/00.safetensors", strerror(EIO));
	gh_assert_back(&b, "-1 and errno, on");
	/* auto falls back and lands the right bytes */
	o.gds = FST_GDS_AUTO;
	gh_log_clear();
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	gh_log_expect(1, FST_LOG_WARN, "/failerrno/00.safetensors", strerror(EIO));
	gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
	gh_assert_back(&b, "-1 and errno, auto");
	fixture_close(&x);
}

/* ---- fault sites */

static void test_fault_register(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "faultreg", 3, lh_base_seed() + 8);
	fst_error err;
	for (size_t nth = 1; nth <= 3; nth++) {
		char spec[32];
		snprintf(spec, sizeof spec, "cufile_register:%zu", nth);
		assert_int_equal(fst_fault_set(spec, &err), 0);
		gh_base b = gh_snapshot();
		long r[3];
		for (size_t f = 0; f < 3; f++)
			r[f] = gh.path_reads(shard_key("faultreg", f));
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 2);
		char desc[1200];
		gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
		/* files are registered in order: the nth is the one refused */
		for (size_t f = 0; f < 3; f++) {
			long grew = gh.path_reads(shard_key("faultreg", f)) - r[f];
			if (f == nth - 1)
				assert_int_equal(grew, 0);
			else
				assert_true(grew > 0);
		}
		gh_log_expect(1, FST_LOG_WARN, shard_key("faultreg", nth - 1), "5027");
		gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
		assert_has(desc, "GPUDirect Storage for 2 of 3 files");
		gh_assert_back(&b, spec);

		assert_int_equal(fst_fault_set(spec, &err), 0);
		o.gds = FST_GDS_ON;
		gh_load_fails(x.ck, &o, FST_EUNSUPPORTED, 5027, shard_key("faultreg", nth - 1),
			      "5027");
		gh_assert_back(&b, spec);
	}
	fixture_close(&x);
}

static void test_fault_read(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "faultread", 3, lh_base_seed() + 9);
	fst_error err;
	gh_base b = gh_snapshot();

	/* the first read fails: with one thread that is file 00's, which falls
	 * back; the others keep using cuFile */
	assert_int_equal(fst_fault_set("cufile_read:1", &err), 0);
	long r1 = gh.path_reads(shard_key("faultread", 1));
	gh_log_clear();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 1);
	o.chunk_bytes = 16 * KiB;
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	gh_log_expect(1, FST_LOG_WARN, shard_key("faultread", 0), "Input/output error");
	gh_log_expect(1, FST_LOG_WARN, NULL, NULL);
	assert_true(gh.path_reads(shard_key("faultread", 1)) > r1);
	gh_assert_back(&b, "cufile_read:1, auto");

	/* a later read, mid-file, through the streaming form */
	assert_int_equal(fst_fault_set("cufile_read:5", &err), 0);
	gh_log_clear();
	o.threads = 3;
	gh_stream_ok(x.ck, &x.fs, &o);
	gh_log_expect(1, FST_LOG_WARN, "cuFileRead", "Input/output error");
	gh_assert_back(&b, "cufile_read:5, auto");

	/* every read fails: every file falls back, once each */
	assert_int_equal(fst_fault_set("cufile_read:1+", &err), 0);
	gh_log_clear();
	o.threads = 4;
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	for (size_t f = 0; f < 3; f++)
		gh_log_expect(1, FST_LOG_WARN, shard_key("faultread", f), "Input/output error");
	gh_log_expect(3, FST_LOG_WARN, NULL, NULL);
	gh_assert_back(&b, "cufile_read:1+, auto");

	/* on: a clean failure */
	for (int stream = 0; stream < 2; stream++) {
		assert_int_equal(fst_fault_set("cufile_read:3", &err), 0);
		o.gds = FST_GDS_ON;
		o.threads = 2;
		if (stream)
			gh_stream_fails(x.ck, &x.fs, &o, FST_EIO, "cuFileRead");
		else
			gh_load_fails(x.ck, &o, FST_EIO, EIO, "/faultread/0", "cuFileRead");
		gh_assert_back(&b, "cufile_read:3, on");
	}
	fixture_close(&x);
}

/* ---- cuFile with the rest of the loader's features */

static void test_filter(void **state)
{
	(void)state;
	lh_shape sh = lh_default_shape();
	sh.max_big = 200000;
	for (unsigned k = 0; k < 4; k++) {
		char name[32];
		snprintf(name, sizeof name, "filter%u", k);
		fixture x;
		lh_write_random(name, lh_base_seed() + 60 + k, &sh, &x.c);
		fixture_open(&x, name);
		lh_filter flt = {lh_base_seed() + k, 50, 0};
		fst_load_opts o = gh_opts("cuda:0", k % 2 ? FST_GDS_ON : FST_GDS_AUTO,
					  FST_IO_PREAD, 1 + k);
		o.filter = lh_filter_fn;
		o.filter_ctx = &flt;
		o.chunk_bytes = 8 * KiB;
		gh_base b = gh_snapshot();
		long r0 = gh.reads();
		fst_buffer *buf = NULL;
		fst_error err;
		if (fst_load(x.ck, &o, &buf, &err))
			fail_msg("%s: %s", name, err.message);
		size_t kept = 0;
		uint64_t kept_bytes = 0;
		for (size_t i = 0; i < fst_checkpoint_tensor_count(x.ck); i++) {
			fst_tensor_info info;
			assert_int_equal(fst_checkpoint_tensor(x.ck, i, &info, NULL), 0);
			long j = fst_buffer_find(buf, info.name);
			if (!lh_keeps(&flt, info.name)) {
				assert_int_equal(j, -1);
				continue;
			}
			kept++;
			kept_bytes += info.nbytes;
			if (j < 0)
				fail_msg("%s: kept by the filter but not loaded", info.name);
			fst_tensor_view v;
			assert_int_equal(fst_buffer_tensor(buf, (size_t)j, &v), 0);
			gh_check_view(x.ck, &x.fs, &v, 0, 256);
			fst_view_release(&v);
		}
		assert_int_equal(fst_buffer_tensor_count(buf), kept);
		if (kept_bytes)
			assert_true(gh.reads() > r0);
		else
			assert_int_equal(gh.reads(), r0);
		fst_buffer_release(buf);
		gh_log_expect(0, FST_LOG_WARN, NULL, NULL);
		gh_assert_back(&b, name);
		fixture_close(&x);
	}
}

static void test_cancel_and_free(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "cancel", 3, lh_base_seed() + 14);
	/* slow reads: the loads are still running when they are stopped */
	setenv("FST_CUFILE_DOUBLE_DELAY_US", "2000", 1);
	for (int gds = FST_GDS_AUTO; gds <= FST_GDS_ON; gds++) {
		fst_load_opts o = gh_opts("cuda:0", gds, FST_IO_PREAD, 2);
		o.chunk_bytes = 8 * KiB;
		gh_base b = gh_snapshot();
		fst_error err;
		fst_loader *ld = NULL;
		fst_tensor_view v;

		/* free after the first tensor; its view outlives the loader */
		assert_int_equal(fst_load_start(x.ck, &o, &ld, &err), 0);
		assert_int_equal(fst_loader_next(ld, &v, &err), 1);
		fst_loader_free(ld);
		gh_check_view(x.ck, &x.fs, &v, 0, 256);
		fst_view_release(&v);
		gh_assert_back(&b, "loader freed");

		/* cancel, then finish */
		assert_int_equal(fst_load_start(x.ck, &o, &ld, &err), 0);
		fst_loader_cancel(ld);
		fst_buffer *buf = (fst_buffer *)(uintptr_t)1;
		assert_int_equal(fst_loader_finish(ld, &buf, &err), FST_ECANCELED);
		assert_null(buf);
		gh_assert_back(&b, "loader cancelled");
	}
	fixture_close(&x);
}

/* A caller's allocator giving memory of the libcuda double. */
struct dev_allocator {
	int (*mem_alloc)(unsigned long long *p, size_t n);
	int (*mem_free)(unsigned long long p);
	long allocs, frees;
};

static void *dev_alloc(void *ctx, uint64_t size, uint32_t align, int device_type, int device_id)
{
	struct dev_allocator *a = ctx;
	(void)align;
	assert_int_equal(device_type, FST_DEVICE_CUDA);
	assert_int_equal(device_id, 0);
	unsigned long long p = 0;
	if (a->mem_alloc(&p, (size_t)size))
		return NULL;
	a->allocs++;
	return (void *)(uintptr_t)p;
}

static void dev_free(void *ctx, void *ptr, uint64_t size, int device_type, int device_id)
{
	struct dev_allocator *a = ctx;
	(void)size;
	(void)device_type;
	(void)device_id;
	a->mem_free((unsigned long long)(uintptr_t)ptr);
	a->frees++;
}

static void test_caller_allocator(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "allocator", 2, lh_base_seed() + 15);
	struct dev_allocator da = {0};
	*(void **)(&da.mem_alloc) = gh_sym(gh.cuda, "cuMemAlloc_v2");
	*(void **)(&da.mem_free) = gh_sym(gh.cuda, "cuMemFree_v2");
	fst_allocator al = {dev_alloc, dev_free, &da};
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	o.allocator = &al;
	gh_base b = gh_snapshot();
	long r0 = gh.reads();
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	assert_true(gh.reads() > r0);
	assert_int_equal(da.allocs, 1);
	assert_int_equal(da.frees, 1);
	gh_assert_back(&b, "caller's allocator");
	/* a failed gds=on load gives the caller's memory back */
	setenv("FST_CUFILE_DOUBLE_BUFREG_ERR", "5016", 1);
	gh_load_fails(x.ck, &o, FST_EDEVICE, 5016, "cuFileBufRegister", "5016");
	assert_int_equal(da.allocs, 2);
	assert_int_equal(da.frees, 2);
	gh_assert_back(&b, "caller's allocator, failed");
	unsetenv("FST_CUFILE_DOUBLE_BUFREG_ERR");
	fixture_close(&x);
}

/* Two loads in flight at once, on two devices, handed out in turn. */
static void test_two_loaders(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "two", 2, lh_base_seed() + 16);
	gh_base b = gh_snapshot();
	fst_load_opts oa = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	fst_load_opts ob = gh_opts("cuda:1", FST_GDS_AUTO, FST_IO_PREAD, 3);
	oa.chunk_bytes = ob.chunk_bytes = 8 * KiB;
	fst_loader *la = NULL, *lb = NULL;
	fst_error err;
	assert_int_equal(fst_load_start(x.ck, &oa, &la, &err), 0);
	assert_int_equal(fst_load_start(x.ck, &ob, &lb, &err), 0);
	int ra = 1, rb = 1;
	size_t na = 0, nb = 0;
	while (ra == 1 || rb == 1) {
		fst_tensor_view v;
		if (ra == 1 && (ra = fst_loader_next(la, &v, &err)) == 1) {
			gh_check_view(x.ck, &x.fs, &v, 0, 256);
			fst_view_release(&v);
			na++;
		}
		if (rb == 1 && (rb = fst_loader_next(lb, &v, &err)) == 1) {
			gh_check_view(x.ck, &x.fs, &v, 1, 256);
			fst_view_release(&v);
			nb++;
		}
	}
	assert_int_equal(ra, 0);
	assert_int_equal(rb, 0);
	assert_int_equal(na, fst_checkpoint_tensor_count(x.ck));
	assert_int_equal(nb, fst_checkpoint_tensor_count(x.ck));
	fst_buffer *ba = NULL, *bb = NULL;
	assert_int_equal(fst_loader_finish(la, &ba, &err), 0);
	assert_int_equal(fst_loader_finish(lb, &bb, &err), 0);
	gh_check_buffer(x.ck, &x.fs, ba, 0, 256);
	gh_check_buffer(x.ck, &x.fs, bb, 1, 256);
	fst_buffer_release(ba);
	fst_buffer_release(bb);
	gh_assert_back(&b, "two loaders");
	fixture_close(&x);
}

/* ---- gds.c opens files again by path (known bugs) */

/*
 * Loads one after another in one process, with gds=on: each must use cuFile
 * and succeed. src/gds.c leaves the destination registered after a
 * successful load; when the next load's allocation lands at the same
 * address, cuFileBufRegister refuses it as registered already (5023).
 */
static void test_consecutive_loads(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "again", 1, lh_base_seed() + 13);
	gh_base b = gh_snapshot();
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	for (int i = 0; i < 4; i++) {
		long r0 = gh.reads();
		fst_buffer *buf = NULL;
		fst_error err;
		int rc = fst_load(x.ck, &o, &buf, &err);
		if (rc && err.backend_code == 5023) {
			char why[1300];
			snprintf(why, sizeof why, "load %d of the same checkpoint with gds=on failed: %s",
				 i + 1, err.message);
			lh_known_bug("GDS-NEXT-LOAD-REFUSED", why);
			break;
		}
		if (rc)
			fail_msg("load %d: %s", i + 1, err.message);
		assert_true(gh.reads() > r0);
		gh_check_buffer(x.ck, &x.fs, buf, 0, 256);
		fst_buffer_release(buf);
	}
	gh_assert_back(&b, "consecutive loads");
	fixture_close(&x);
}

/*
 * A file renamed over the checkpoint's path after it was opened: libfst
 * reads the file it opened and validated, never the one the path names now.
 * gds.c reopens the opened file itself for cuFile (through /proc/self/fd),
 * so both files keep cuFile, under auto and on, and the bytes are the
 * opened file's.
 */
static void test_replaced_path(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "replaced", 2, lh_base_seed() + 10);
	/* the same header (names, shapes, layout), other bytes */
	lh_ckpt other;
	write_founding_salted("replaced-other", 2, lh_base_seed() + 10, 0x5a17, &other);
	char from[900], to[900];
	snprintf(from, sizeof from, "%s/01.safetensors", other.dir);
	snprintf(to, sizeof to, "%s/01.safetensors", x.c.dir);
	uint64_t other_size;
	unsigned char *other_bytes = lh_slurp(from, &other_size);
	uint64_t data_at = fst_file_data_offset(fst_checkpoint_file(x.ck, 1));
	assert_int_equal(other_size, x.fs.size[1]);
	assert_int_equal(memcmp(other_bytes, x.fs.bytes[1], (size_t)data_at), 0);
	assert_true(memcmp(other_bytes + data_at, x.fs.bytes[1] + data_at,
			   (size_t)(other_size - data_at)) != 0);
	free(other_bytes);
	if (rename(from, to))
		fail_msg("rename: %s", strerror(errno));
	gh_base b = gh_snapshot();
	for (int stream = 0; stream < 2; stream++) {
		long r0 = gh.path_reads(shard_key("replaced", 0));
		long r1 = gh.path_reads(shard_key("replaced", 1));
		gh_log_clear();
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_AUTO, FST_IO_PREAD, 2);
		char desc[1200] = "";
		if (stream)
			gh_stream_ok(x.ck, &x.fs, &o);
		else
			gh_load_ok(x.ck, &x.fs, &o, desc, sizeof desc);
		/* both with cuFile, 01 from the opened (now unlinked) file: the
		 * bytes checked above are the opened file's, not the new one's */
		assert_true(gh.path_reads(shard_key("replaced", 0)) > r0);
		assert_true(gh.path_reads(shard_key("replaced", 1)) > r1);
		/* the engine says the path was replaced; nothing is staged */
		assert_int_equal(gh_log_count(FST_LOG_WARN, shard_key("replaced", 1),
					      "pinned staging"), 0);
		if (!stream)
			assert_has(desc, "GPUDirect Storage for 2 of 2 files");
		gh_assert_back(&b, "replaced path, auto");
	}
	fst_load_opts o = gh_opts("cuda:0", FST_GDS_ON, FST_IO_PREAD, 2);
	gh_load_ok(x.ck, &x.fs, &o, NULL, 0);
	gh_assert_back(&b, "replaced path, on");
	lh_rmdir(other.dir);
	fixture_close(&x);
}

/* Memory images and descriptors opened under a label have no path to open
 * again: under auto they must load through staging. */
static void test_files_without_paths(void **state)
{
	(void)state;
	fixture x;
	founding(&x, "nopath", 2, lh_base_seed() + 12);
	for (int kind = 0; kind < 2; kind++) {
		fst_file *files[2] = {NULL, NULL};
		fst_error err;
		int fds[2] = {-1, -1};
		for (size_t f = 0; f < 2; f++) {
			char label[64];
			snprintf(label, sizeof label, "label-%d-%zu.safetensors", kind, f);
			if (kind == 0) {
				assert_int_equal(fst_file_open_memory(x.fs.bytes[f], x.fs.size[f], label,
								      &files[f], &err),
						 0);
			} else {
				fds[f] = open(fst_file_path(fst_checkpoint_file(x.ck, f)),
					      O_RDONLY | O_CLOEXEC);
				assert_true(fds[f] >= 0);
				assert_int_equal(fst_file_open_fd(fds[f], label, &files[f], &err), 0);
			}
		}
		fst_checkpoint *ck = NULL;
		assert_int_equal(fst_checkpoint_from_files(files, 2, &ck, &err), 0);
		gh_base b = gh_snapshot();
		/* control: without cuFile this loads */
		fst_load_opts o = gh_opts("cuda:0", FST_GDS_OFF, FST_IO_PREAD, 2);
		gh_load_ok(ck, &x.fs, &o, NULL, 0);
		gh_assert_back(&b, "no path, gds=off");
		o.gds = FST_GDS_AUTO;
		fst_buffer *buf = NULL;
		int rc = fst_load(ck, &o, &buf, &err);
		if (rc) {
			char why[1300];
			snprintf(why, sizeof why, "%s checkpoint on cuda:0 with gds=auto: %s",
				 kind ? "a descriptor opened under a label" : "a memory",
				 err.message);
			lh_known_bug(kind ? "GDS-FD-OPENED-FILES" : "GDS-MEMORY-FILES", why);
		} else {
			gh_check_buffer(ck, &x.fs, buf, 0, 256);
			fst_buffer_release(buf);
		}
		gh_assert_back(&b, "no path, gds=auto");
		fst_checkpoint_close(ck);
		for (size_t f = 0; f < 2; f++)
			if (fds[f] >= 0)
				close(fds[f]);
	}
	fixture_close(&x);
}

/* ---- the group */

static int reset(void **state)
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

static int group_setup(void **state)
{
	(void)state;
	/* Is io_uring there at all? */
	int u = lh_uring_probe();
	if (u < 0)
		return -1;
	uring_ok = u > 0;
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
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

int main(void)
{
	int rc = gh_open_doubles();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_random_checkpoints, reset),
		cmocka_unit_test_setup(test_founding_shape, reset),
		cmocka_unit_test_setup(test_register_error_every_file, reset),
		cmocka_unit_test_setup(test_register_error_one_file, reset),
		cmocka_unit_test_setup(test_buffer_register_error, reset),
		cmocka_unit_test_setup(test_short_reads, reset),
		cmocka_unit_test_setup(test_fail_after_auto, reset),
		cmocka_unit_test_setup(test_fail_after_on, reset),
		cmocka_unit_test_setup(test_fail_minus_one_errno, reset),
		cmocka_unit_test_setup(test_fault_register, reset),
		cmocka_unit_test_setup(test_fault_read, reset),
		cmocka_unit_test_setup(test_filter, reset),
		cmocka_unit_test_setup(test_cancel_and_free, reset),
		cmocka_unit_test_setup(test_caller_allocator, reset),
		cmocka_unit_test_setup(test_two_loaders, reset),
		cmocka_unit_test_setup(test_consecutive_loads, reset),
		cmocka_unit_test_setup(test_replaced_path, reset),
		cmocka_unit_test_setup(test_files_without_paths, reset),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
