/* Description: a checkpoint of 110 GiB that is almost all hole: the header
 * (110 U8 tensors of 1 GiB between small F32 tensors, one of them past the
 * 110 GiB mark, data offsets not block-aligned) is written by hand, the
 * file is extended with ftruncate, and only the small tensors and a few
 * markers hold written bytes. fst_checkpoint_open of the whole file takes
 * under a second and fst_load_explain describes it. Loads onto the CPU with
 * io = pread and io = uring, a filter selecting the small tensors and one
 * 1 GiB tensor and an 8 MiB staging budget, each in a forked child: the
 * small tensors hold what was written, the big one zeros where the file
 * has holes and the markers where it has bytes (its neighbours' markers
 * stay out), and the child's peak RSS (VmHWM) stays within the selected
 * bytes + the staging budget + 64 MiB. Skips where the filesystem refuses
 * a file that large, or does not keep it sparse; skips the loads under
 * ThreadSanitizer, whose shadow memory no RSS bound allows for. */
#include "load_helpers.h"

#include <inttypes.h>
#include <sys/wait.h>
#include <time.h>

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define NBIG 110u
#define PICK 57u /* the big tensor that is loaded */
#define STAGING (8 * MiB)
#define SLACK (64 * MiB)

/* ThreadSanitizer shadows every byte the program touches with several
 * (a 1 GiB load peaks near 5 GiB of RSS there): no memory bound holds. */
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

/* The small F32 tensors: two before the big ones, two after. */
struct small {
	const char *name;
	uint32_t ndim;
	uint64_t shape[2];
	bool at_end;
	uint64_t begin; /* data offset, filled in */
	float data[16];
};

static struct small smalls[] = {
	{"small.a", 2, {3, 5}, false, 0, {0}},
	{"small.b", 1, {7}, false, 0, {0}},
	{"small.tail", 2, {2, 3}, true, 0, {0}},
	{"small.scalar", 0, {0, 0}, true, 0, {0}},
};
#define NSMALL (sizeof smalls / sizeof smalls[0])

static uint64_t small_numel(const struct small *s)
{
	uint64_t n = 1;
	for (uint32_t d = 0; d < s->ndim; d++)
		n *= s->shape[d];
	return n;
}

/* Bytes written inside the loaded big tensor (offsets within it), and in
 * its neighbours right next to it. */
struct marker {
	uint64_t off;
	uint32_t len;
	unsigned char seed;
};

static const struct marker markers[] = {
	{0, 4096, 0x11},                /* its first bytes (not block-aligned) */
	{512 * MiB + 12345, 1000, 0x22}, /* the middle, across a block boundary */
	{GiB - 100, 100, 0x33},          /* its last bytes */
};
#define NMARK (sizeof markers / sizeof markers[0])

static unsigned char marker_byte(const struct marker *m, uint64_t i)
{
	return (unsigned char)(m->seed + 7 * i + 1) | 1; /* never zero */
}

struct sparse {
	char path[700];
	uint64_t data_off;  /* 8 + header length */
	uint64_t big0;      /* data offset of big.000 */
	uint64_t size;      /* the whole file */
	uint64_t sel_bytes; /* bytes of the selected tensors */
};

static char *append(char *buf, size_t *len, size_t *cap, const char *fmt, ...)
{
	va_list ap;
	for (;;) {
		va_start(ap, fmt);
		int n = vsnprintf(buf + *len, *cap - *len, fmt, ap);
		va_end(ap);
		assert_true(n >= 0);
		if ((size_t)n < *cap - *len) {
			*len += (size_t)n;
			return buf;
		}
		*cap *= 2;
		buf = realloc(buf, *cap);
		assert_non_null(buf);
	}
}

static void pwrite_all(int fd, const void *p, size_t n, uint64_t off)
{
	const char *c = p;
	while (n) {
		ssize_t k = pwrite(fd, c, n, (off_t)off);
		if (k <= 0)
			fail_msg("pwrite at %" PRIu64 ": %s", off, strerror(errno));
		c += k;
		n -= (size_t)k;
		off += (uint64_t)k;
	}
}

/* Write the sparse checkpoint; false (after removing it) where the
 * filesystem refuses it. */
static bool write_sparse(struct sparse *sp)
{
	memset(sp, 0, sizeof *sp);
	snprintf(sp->path, sizeof sp->path, "%s", test_path("sparse.safetensors"));
	/* data offsets: small.a, small.b, big.000 .. big.109, small.tail, small.scalar */
	uint64_t at = 0;
	for (size_t i = 0; i < NSMALL; i++) {
		if (smalls[i].at_end)
			continue;
		smalls[i].begin = at;
		at += small_numel(&smalls[i]) * 4;
	}
	sp->big0 = at;
	at += (uint64_t)NBIG * GiB;
	for (size_t i = 0; i < NSMALL; i++) {
		if (!smalls[i].at_end)
			continue;
		smalls[i].begin = at;
		at += small_numel(&smalls[i]) * 4;
	}
	uint64_t data_len = at;
	for (size_t i = 0; i < NSMALL; i++)
		for (uint64_t j = 0; j < small_numel(&smalls[i]); j++)
			smalls[i].data[j] = (float)(i + 1) * 1000.0f + (float)j * 0.5f - 3.25f;

	size_t len = 0, cap = 4096;
	char *h = malloc(cap);
	assert_non_null(h);
	h = append(h, &len, &cap, "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"sparse\"}");
	for (size_t i = 0; i < NSMALL; i++) {
		const struct small *s = &smalls[i];
		h = append(h, &len, &cap, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", s->name);
		for (uint32_t d = 0; d < s->ndim; d++)
			h = append(h, &len, &cap, "%s%" PRIu64, d ? "," : "", s->shape[d]);
		h = append(h, &len, &cap, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", s->begin,
			   s->begin + small_numel(s) * 4);
	}
	for (unsigned b = 0; b < NBIG; b++) {
		uint64_t b0 = sp->big0 + (uint64_t)b * GiB;
		h = append(h, &len, &cap,
			   ",\"big.%03u\":{\"dtype\":\"U8\",\"shape\":[%" PRIu64
			   "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
			   b, GiB, b0, b0 + GiB);
	}
	h = append(h, &len, &cap, "}");
	while (len % 8)
		h = append(h, &len, &cap, " ");
	sp->data_off = 8 + len;
	sp->size = sp->data_off + data_len;

	int fd = open(sp->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		fail_msg("create %s: %s", sp->path, strerror(errno));
	unsigned char lenb[8];
	for (int i = 0; i < 8; i++)
		lenb[i] = (unsigned char)((uint64_t)len >> (8 * i));
	pwrite_all(fd, lenb, 8, 0);
	pwrite_all(fd, h, len, 8);
	free(h);
	if (ftruncate(fd, (off_t)sp->size)) {
		int e = errno;
		close(fd);
		unlink(sp->path);
		print_message("ftruncate to %" PRIu64 " bytes refused: %s\n", sp->size, strerror(e));
		return false;
	}
	for (size_t i = 0; i < NSMALL; i++)
		pwrite_all(fd, smalls[i].data, (size_t)small_numel(&smalls[i]) * 4,
			   sp->data_off + smalls[i].begin);
	uint64_t pick = sp->data_off + sp->big0 + (uint64_t)PICK * GiB;
	for (size_t m = 0; m < NMARK; m++) {
		unsigned char *b = malloc(markers[m].len);
		for (uint32_t i = 0; i < markers[m].len; i++)
			b[i] = marker_byte(&markers[m], i);
		pwrite_all(fd, b, markers[m].len, pick + markers[m].off);
		free(b);
	}
	/* the neighbours' bytes right next to the loaded tensor */
	unsigned char before[64], after[64];
	memset(before, 0xA5, sizeof before);
	memset(after, 0x5A, sizeof after);
	pwrite_all(fd, before, sizeof before, pick - sizeof before);
	pwrite_all(fd, after, sizeof after, pick + GiB);
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	close(fd);
	assert_int_equal((uint64_t)st.st_size, sp->size);
	if ((uint64_t)st.st_blocks * 512 > 64 * MiB) {
		unlink(sp->path);
		print_message("the filesystem does not keep the file sparse (%" PRIu64
			      " bytes allocated)\n",
			      (uint64_t)st.st_blocks * 512);
		return false;
	}
	sp->sel_bytes = GiB;
	for (size_t i = 0; i < NSMALL; i++)
		sp->sel_bytes += small_numel(&smalls[i]) * 4;
	return true;
}

static int keep_selected(void *ctx, const char *name)
{
	(void)ctx;
	char pick[16];
	snprintf(pick, sizeof pick, "big.%03u", PICK);
	return !strncmp(name, "small.", 6) || !strcmp(name, pick);
}

/* ---- the load, in a child process */

struct result {
	int ok;
	uint64_t hwm;       /* VmHWM, bytes */
	uint64_t rss_start; /* VmRSS when the child started, bytes */
	double secs;
	char describe[300];
	char msg[1500];
};

static uint64_t status_bytes(const char *key)
{
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return 0;
	char line[256];
	uint64_t v = 0;
	size_t kl = strlen(key);
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, key, kl) && line[kl] == ':')
			v = strtoull(line + kl + 1, NULL, 10) * 1024; /* "NNN kB" */
	fclose(f);
	return v;
}

#define CHILD_FAIL(r, ...)                                             \
	do {                                                           \
		snprintf((r)->msg, sizeof (r)->msg, __VA_ARGS__);      \
		return;                                                \
	} while (0)

static bool all_zero(const unsigned char *p, uint64_t n)
{
	static const unsigned char zero[1 << 16];
	while (n) {
		size_t k = n < sizeof zero ? (size_t)n : sizeof zero;
		if (memcmp(p, zero, k))
			return false;
		p += k;
		n -= k;
	}
	return true;
}

/* Check the loaded big tensor: markers where they were written, zeros
 * everywhere else (the holes). */
static void check_big(const unsigned char *d, struct result *r)
{
	uint64_t at = 0;
	for (size_t m = 0; m < NMARK; m++) {
		const struct marker *mk = &markers[m];
		if (!all_zero(d + at, mk->off - at))
			CHILD_FAIL(r, "big.%03u: nonzero bytes in the hole [%" PRIu64 ", %" PRIu64 ")",
				   PICK, at, mk->off);
		for (uint32_t i = 0; i < mk->len; i++)
			if (d[mk->off + i] != marker_byte(mk, i))
				CHILD_FAIL(r, "big.%03u: byte %" PRIu64 " is 0x%02x, want 0x%02x",
					   PICK, mk->off + i, d[mk->off + i], marker_byte(mk, i));
		at = mk->off + mk->len;
	}
	if (!all_zero(d + at, GiB - at))
		CHILD_FAIL(r, "big.%03u: nonzero bytes in the hole [%" PRIu64 ", %" PRIu64 ")", PICK,
			   at, GiB);
}

static void child_load(const struct sparse *sp, int io, struct result *r)
{
	r->rss_start = status_bytes("VmRSS");
	fst_checkpoint *ck = NULL;
	fst_error err;
	if (fst_checkpoint_open(sp->path, &ck, &err))
		CHILD_FAIL(r, "open: %s", err.message);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.io = io;
	o.staging_bytes = STAGING;
	o.filter = keep_selected;
	fst_buffer *buf = NULL;
	double t0 = test_now_s();
	int rc = fst_load(ck, &o, &buf, &err);
	r->secs = test_now_s() - t0;
	fst_checkpoint_close(ck);
	if (rc)
		CHILD_FAIL(r, "load: %d %s", rc, err.message);
	snprintf(r->describe, sizeof r->describe, "%s", fst_buffer_describe(buf));
	if (fst_buffer_tensor_count(buf) != NSMALL + 1 ||
	    fst_buffer_tensor_bytes(buf) != sp->sel_bytes)
		CHILD_FAIL(r, "%zu tensors, %" PRIu64 " bytes loaded; want %zu, %" PRIu64,
			   fst_buffer_tensor_count(buf), fst_buffer_tensor_bytes(buf), NSMALL + 1,
			   sp->sel_bytes);
	/* the destination holds what was selected, not the whole file */
	if (fst_buffer_size(buf) < sp->sel_bytes ||
	    fst_buffer_size(buf) > sp->sel_bytes + (NSMALL + 1) * 256)
		CHILD_FAIL(r, "buffer of %" PRIu64 " bytes for %" PRIu64 " selected",
			   fst_buffer_size(buf), sp->sel_bytes);
	for (size_t i = 0; i < NSMALL; i++) {
		long k = fst_buffer_find(buf, smalls[i].name);
		fst_tensor_view v;
		if (k < 0 || fst_buffer_tensor(buf, (size_t)k, &v))
			CHILD_FAIL(r, "%s is not in the buffer", smalls[i].name);
		uint64_t n = small_numel(&smalls[i]) * 4;
		bool same = v.nbytes == n && v.dtype == FST_DTYPE_F32 &&
			    v.ndim == smalls[i].ndim && !memcmp(v.data, smalls[i].data, (size_t)n);
		fst_view_release(&v);
		if (!same)
			CHILD_FAIL(r, "%s differs from what was written", smalls[i].name);
	}
	char pick[16];
	snprintf(pick, sizeof pick, "big.%03u", PICK);
	long k = fst_buffer_find(buf, pick);
	fst_tensor_view v;
	if (k < 0 || fst_buffer_tensor(buf, (size_t)k, &v))
		CHILD_FAIL(r, "%s is not in the buffer", pick);
	if (v.nbytes != GiB || v.dtype != FST_DTYPE_U8 || v.ndim != 1 || v.shape[0] != GiB) {
		fst_view_release(&v);
		CHILD_FAIL(r, "%s has the wrong shape or size", pick);
	}
	check_big(v.data, r);
	fst_view_release(&v);
	fst_buffer_release(buf);
	r->hwm = status_bytes("VmHWM");
	if (!r->msg[0])
		r->ok = 1;
}

static void load_in_child(const struct sparse *sp, int io, const char *io_name)
{
	int p[2];
	assert_int_equal(pipe(p), 0);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		static struct result r;
		child_load(sp, io, &r);
		const char *c = (const char *)&r;
		size_t left = sizeof r;
		while (left) {
			ssize_t k = write(p[1], c, left);
			if (k <= 0)
				_exit(3);
			c += k;
			left -= (size_t)k;
		}
		_exit(0);
	}
	close(p[1]);
	static struct result r;
	memset(&r, 0, sizeof r);
	char *c = (char *)&r;
	size_t got = 0;
	while (got < sizeof r) {
		ssize_t k = read(p[0], c + got, sizeof r - got);
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	close(p[0]);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFEXITED(status) || WEXITSTATUS(status) || got != sizeof r)
		fail_msg("io=%s: the child died (status 0x%x, %zu of %zu result bytes)", io_name,
			 status, got, sizeof r);
	if (!r.ok)
		fail_msg("io=%s: %s", io_name, r.msg);
	uint64_t limit = sp->sel_bytes + STAGING + SLACK;
	print_message("io=%s: %.0f MiB loaded in %.2f s; peak RSS %.1f MiB (%.1f MiB at start, "
		      "limit %.1f MiB): %s\n",
		      io_name, (double)sp->sel_bytes / MiB, r.secs, (double)r.hwm / MiB,
		      (double)r.rss_start / MiB, (double)limit / MiB, r.describe);
	if (!r.hwm)
		fail_msg("io=%s: no VmHWM in /proc/self/status", io_name);
	if (r.hwm > limit)
		fail_msg("io=%s: peak RSS %" PRIu64 " bytes exceeds %" PRIu64
			 " (selected %" PRIu64 " + staging %" PRIu64 " + %" PRIu64 ")",
			 io_name, r.hwm, limit, sp->sel_bytes, STAGING, SLACK);
	const char *want = io == FST_IO_URING ? "uring" : "pread";
	if (!strstr(r.describe, want))
		fail_msg("io=%s: describe \"%s\"", io_name, r.describe);
}

static void test_sparse_checkpoint(void **state)
{
	(void)state;
	struct sparse sp;
	if (!write_sparse(&sp)) {
		skip();
		return;
	}
	/* opening validates the whole table without touching the data */
	double t0 = test_now_s();
	fst_checkpoint *ck = NULL;
	fst_error err;
	if (fst_checkpoint_open(sp.path, &ck, &err))
		fail_msg("open: %s", err.message);
	double open_s = test_now_s() - t0;
	print_message("%" PRIu64 " bytes (%.1f GiB), header %" PRIu64 " bytes: opened in %.3f s\n",
		      sp.size, (double)sp.size / GiB, sp.data_off, open_s);
	assert_true(open_s < 1.0);
	assert_int_equal(fst_checkpoint_file_count(ck), 1);
	assert_int_equal(fst_checkpoint_tensor_count(ck), NBIG + NSMALL);
	assert_int_equal(fst_file_size(fst_checkpoint_file(ck, 0)), sp.size);
	assert_int_equal(fst_file_data_offset(fst_checkpoint_file(ck, 0)), sp.data_off);
	uint64_t total = (uint64_t)NBIG * GiB;
	for (size_t i = 0; i < NSMALL; i++)
		total += small_numel(&smalls[i]) * 4;
	assert_int_equal(fst_checkpoint_total_bytes(ck), total);
	assert_true(total > 100 * GiB);
	long t = fst_checkpoint_find(ck, "small.tail");
	assert_true(t >= 0);
	fst_tensor_info info;
	assert_int_equal(fst_checkpoint_tensor(ck, (size_t)t, &info, NULL), 0);
	assert_int_equal(info.file_offset, sp.data_off + smalls[2].begin);
	assert_true(info.file_offset > 110 * GiB);
	assert_true(fst_checkpoint_find(ck, "big.109") >= 0);
	assert_string_equal(fst_file_metadata_get(fst_checkpoint_file(ck, 0), "note"), "sparse");

	/* explain: the whole file, and the selection, with each io */
	static const int ios[] = {FST_IO_AUTO, FST_IO_PREAD, FST_IO_URING, FST_IO_MMAP};
	static const char *const wants[] = {"auto: ", "pread, ", "uring, ", "mmap"};
	for (int k = 0; k < 4; k++)
		for (int filtered = 0; filtered < 2; filtered++) {
			fst_load_opts o;
			fst_load_opts_init(&o);
			o.io = ios[k];
			o.staging_bytes = STAGING;
			if (filtered)
				o.filter = keep_selected;
			char text[1024];
			t0 = test_now_s();
			if (fst_load_explain(ck, &o, text, sizeof text, &err))
				fail_msg("explain io=%d: %s", ios[k], err.message);
			double s = test_now_s() - t0;
			if (!strstr(text, wants[k]))
				fail_msg("explain io=%d: \"%s\" lacks \"%s\"", ios[k], text, wants[k]);
			if (s > 1.0)
				fail_msg("explain io=%d took %.2f s", ios[k], s);
			if (k == 0 && filtered)
				print_message("explain: %s (%.3f s)\n", text, s);
		}
	fst_checkpoint_close(ck);

#ifdef UNDER_TSAN
	assert_int_equal(unlink(sp.path), 0);
	print_message("ThreadSanitizer build: its shadow memory makes the RSS bound meaningless; "
		      "loads skipped\n");
	skip();
#endif
	load_in_child(&sp, FST_IO_PREAD, "pread");
	if (!lh_io_skipped(FST_IO_URING))
		load_in_child(&sp, FST_IO_URING, "uring");
	assert_int_equal(unlink(sp.path), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sparse_checkpoint),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
