/* Description: loads of remote files through the engine, against the
 * fault-injecting server of tests/remote/server.py on loopback: every byte
 * equal to the local files whatever the threads and request sizes, whole
 * and streamed, with progress; resumed after a reset connection and over
 * short honest answers; an object that changes fails with FST_ECHANGED; a
 * body past its Content-Range fails keeping none of it; a connection that
 * drops after every few bytes ends within the retry time, and one that
 * answers just above the stall rate within each attempt's time limit;
 * fst_loader_cancel stops a transfer that stalls at once; io=mmap, pread,
 * uring and gds=on refused, naming the first remote file where a local
 * one comes first (and such a checkpoint loads whole); fst_file_read; onto cuda:0 through the libcuda
 * double when ctest gives one (label cuda-double). "nocurl": with
 * FST_CURL_LIBRARY naming a missing file a URL is FST_EUNSUPPORTED naming
 * it, and local files still load. */
#include "helpers.h"
#include "load_helpers.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static lh_ckpt local;
static fst_checkpoint *local_ck;
static lh_files files;
static pid_t server = -1;
static int port;

/* The server on an ephemeral loopback port; its first line is the port. */
static int start_server(void)
{
	int p[2];
	if (pipe(p))
		return -1;
	server = fork();
	if (server == 0) {
		dup2(p[1], 1);
		close(p[0]);
		close(p[1]);
		execlp(FST_PYTHON, FST_PYTHON, FST_REMOTE_SERVER, "--dir", test_tmpdir(), (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	FILE *f = fdopen(p[0], "r");
	if (!f || fscanf(f, "%d", &port) != 1)
		port = 0;
	if (f)
		fclose(f);
	return port > 0 ? 0 : -1;
}

static void stop_server(void)
{
	if (server > 0) {
		kill(server, SIGTERM);
		waitpid(server, NULL, 0);
	}
	server = -1;
}

static int setup(void **state)
{
	(void)state;
	lh_shape sh = lh_default_shape();
	sh.max_files = 3;
	sh.max_tensors = 24;
	sh.max_big = 3u << 20;
	sh.allow_empty_files = false;
	lh_write_random("ck", 20261202, &sh, &local);
	local_ck = lh_open(local.dir);
	lh_files_read(local_ck, &files);
	if (start_server()) {
		fprintf(stderr, "cannot start %s with %s\n", FST_REMOTE_SERVER, FST_PYTHON);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	stop_server();
	lh_files_free(&files);
	fst_checkpoint_close(local_ck);
	return 0;
}

/* URL of the checkpoint's file i under mode. */
static void url_of(char *buf, size_t size, const char *mode, size_t i)
{
	const char *path = fst_file_path(fst_checkpoint_file(local_ck, i));
	const char *name = strrchr(path, '/') + 1;
	snprintf(buf, size, "http://127.0.0.1:%d/%s/ck/%s", port, mode, name);
}

/* The checkpoint's files, each by its URL under mode, as one checkpoint;
 * oo: their open options (NULL: the defaults). */
static int open_remote_ex(const char *mode, const fst_open_opts *oo, fst_checkpoint **out,
			  fst_error *err)
{
	size_t n = fst_checkpoint_file_count(local_ck);
	fst_file *fs[16];
	assert_true(n <= 16);
	for (size_t i = 0; i < n; i++) {
		char url[512];
		url_of(url, sizeof url, mode, i);
		int rc = fst_file_open_ex(url, oo, &fs[i], err);
		if (rc) {
			for (size_t j = 0; j < i; j++)
				fst_file_close(fs[j]);
			return rc;
		}
		assert_true(fst_file_is_remote(fs[i]));
		assert_int_equal(fst_file_fd(fs[i]), -1);
	}
	return fst_checkpoint_from_files(fs, n, out, err);
}

static int open_remote(const char *mode, fst_checkpoint **out, fst_error *err)
{
	return open_remote_ex(mode, NULL, out, err);
}

static void reset_server(void)
{
	/* GET /reset clears the per-file counters of the failing modes */
	char cmd[256];
	snprintf(cmd, sizeof cmd, "%s -c \"import urllib.request as u; "
				  "u.urlopen('http://127.0.0.1:%d/reset').read()\"",
		 FST_PYTHON, port);
	assert_int_equal(system(cmd), 0);
}

static void check_buffer(fst_buffer *buf, bool on_device)
{
	assert_int_equal(fst_buffer_tensor_count(buf), fst_checkpoint_tensor_count(local_ck));
	unsigned char *host = malloc(4u << 20);
	for (size_t i = 0; i < fst_checkpoint_tensor_count(local_ck); i++) {
		fst_tensor_info info;
		const unsigned char *want = lh_expected(local_ck, &files, i, &info);
		long bi = fst_buffer_find(buf, info.name);
		assert_true(bi >= 0);
		fst_tensor_view v;
		assert_int_equal(fst_buffer_tensor(buf, (size_t)bi, &v), 0);
		assert_int_equal(v.nbytes, info.nbytes);
		assert_int_equal((uintptr_t)v.data % 256, 0);
		if (on_device) {
			assert_true(info.nbytes <= (4u << 20));
			fst_error err;
			assert_int_equal(fst_copy_to_host(&v, 0, host, info.nbytes, &err), 0);
			lh_assert_bytes(info.name, host, want, info.nbytes);
		} else {
			lh_assert_bytes(info.name, v.data, want, info.nbytes);
		}
		fst_view_release(&v);
	}
	free(host);
}

static void load_and_check(const char *mode, const char *device, unsigned threads,
			   uint64_t chunk)
{
	fst_checkpoint *ck;
	fst_error err;
	assert_int_equal(open_remote(mode, &ck, &err), 0);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.device = device;
	o.threads = threads;
	o.chunk_bytes = chunk;
	fst_buffer *buf;
	int rc = fst_load(ck, &o, &buf, &err);
	if (rc)
		fail_msg("%s load (%u threads, %llu-byte chunks): %s", mode, threads,
			 (unsigned long long)chunk, err.message);
	assert_has(fst_buffer_describe(buf), "remote (ranged GETs)");
	check_buffer(buf, strcmp(device, "cpu") != 0);
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
}

static void test_bytes_equal(void **state)
{
	(void)state;
	load_and_check("ok", "cpu", 0, 0);
	load_and_check("ok", "cpu", 1, 256 << 10);
	load_and_check("ok", "cpu", 4, 64 << 10);
	load_and_check("ok", "cpu", 3, 1 << 20);
}

static void test_resumed(void **state)
{
	(void)state;
	reset_server();
	load_and_check("reset", "cpu", 2, 0); /* half a body, then a TCP reset */
	load_and_check("capped", "cpu", 2, 4u << 20); /* 1 MiB per answer */
	reset_server();
	load_and_check("flaky", "cpu", 2, 0); /* 500 twice per file */
	load_and_check("redirect", "cpu", 2, 0);
}

static void test_streamed_with_progress(void **state)
{
	(void)state;
	fst_checkpoint *ck;
	fst_error err;
	assert_int_equal(open_remote("ok", &ck, &err), 0);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.threads = 3;
	o.chunk_bytes = 256 << 10;
	fst_loader *ld;
	assert_int_equal(fst_load_start(ck, &o, &ld, &err), 0);
	size_t seen = 0;
	fst_tensor_view v;
	int rc;
	while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
		long i = fst_checkpoint_find(local_ck, v.name);
		assert_true(i >= 0);
		fst_tensor_info info;
		const unsigned char *want = lh_expected(local_ck, &files, (size_t)i, &info);
		lh_assert_bytes(v.name, v.data, want, info.nbytes);
		fst_view_release(&v);
		seen++;
	}
	assert_int_equal(rc, 0);
	uint64_t done, total;
	fst_loader_progress(ld, &done, &total);
	assert_int_equal(done, total);
	assert_int_equal(total, fst_checkpoint_total_bytes(local_ck));
	assert_int_equal(fst_loader_finish(ld, NULL, &err), 0);
	assert_int_equal(seen, fst_checkpoint_tensor_count(local_ck));
	fst_checkpoint_close(ck);
}

static void test_changed_fails(void **state)
{
	(void)state;
	reset_server();
	fst_checkpoint *ck;
	fst_error err;
	assert_int_equal(open_remote("changed", &ck, &err), 0);
	fst_buffer *buf;
	assert_int_equal(fst_load(ck, NULL, &buf, &err), FST_ECHANGED);
	assert_null(buf);
	assert_has(err.message, "/changed/ck/");
	assert_has(err.message, "object changed during the load");
	fst_checkpoint_close(ck);
}

/* A 206 whose body runs past its Content-Range (the rest some other bytes):
 * the load fails naming the range, and keeps none of those bytes. */
static void test_body_past_its_range_fails(void **state)
{
	(void)state;
	fst_checkpoint *ck;
	fst_error err;
	assert_int_equal(open_remote("overlong", &ck, &err), 0);
	fst_buffer *buf;
	assert_int_equal(fst_load(ck, NULL, &buf, &err), FST_EIO);
	assert_null(buf);
	assert_has(err.message, "/overlong/ck/");
	assert_has(err.message, "more bytes than its Content-Range says");
	fst_checkpoint_close(ck);
	/* one read of a whole file: nothing of the lie lands either */
	char url[512];
	url_of(url, sizeof url, "overlong", 0);
	fst_file *f;
	assert_int_equal(fst_file_open(url, &f, &err), 0);
	uint64_t n = fst_file_size(f) - 64;
	unsigned char *got = malloc(n);
	memset(got, 0, n);
	assert_int_equal(fst_file_read(f, 64, got, n, &err), FST_EIO);
	for (uint64_t i = 0; i < n; i++)
		if (got[i] == 0xEE && files.bytes[0][64 + i] != 0xEE)
			fail_msg("byte %llu of the read is the server's 0xEE",
				 (unsigned long long)(64 + i));
	free(got);
	fst_file_close(f);
}

/* A connection that drops after every 2 KiB: each attempt brings bytes, so
 * the retries in a row never run out, but the time does (retry_time_ms from
 * the request's first failure); it once went on for one attempt per 2 KiB. */
static void test_dribbling_server_ends_in_time(void **state)
{
	(void)state;
	char url[512];
	url_of(url, sizeof url, "dribble", 0);
	fst_open_opts oo;
	fst_open_opts_init(&oo);
	oo.retry_time_ms = 1500;
	fst_checkpoint *ck;
	fst_error err;
	assert_int_equal(fst_checkpoint_open_ex(url, &oo, &ck, &err), 0);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.threads = 1;
	o.chunk_bytes = 8u << 20;
	fst_buffer *buf;
	double t0 = test_now_s();
	assert_int_equal(fst_load(ck, &o, &buf, &err), FST_EIO);
	double secs = test_now_s() - t0;
	assert_null(buf);
	assert_has(err.message, "/dribble/ck/");
	assert_has(err.message, "attempt");
	if (secs > 6)
		fail_msg("%.1f s with a retry time of 1.5 s: %s", secs, err.message);
	fst_checkpoint_close(ck);
}

/* A server that answers at about 2 KiB/s, above the 1 KiB/s stall limit:
 * one attempt ends at the request's time limit (the option, else one
 * derived from the connect and stall timeouts and the bytes asked), then
 * the retry time ends the request. Without a limit this 64 KiB read took
 * 32 s, and a request of 8 MiB over an hour. */
static void crawl_ends_in_time(unsigned connect_ms, unsigned stall_ms, unsigned request_ms,
			       double max_secs)
{
	/* the largest file, for a read of 64 KiB after its first byte (the
	 * server answers the header's request, at byte 0, in full) */
	size_t big = 0;
	for (size_t i = 1; i < fst_checkpoint_file_count(local_ck); i++)
		if (fst_file_size(fst_checkpoint_file(local_ck, i)) >
		    fst_file_size(fst_checkpoint_file(local_ck, big)))
			big = i;
	const uint64_t n = 64u << 10;
	assert_true(fst_file_size(fst_checkpoint_file(local_ck, big)) > n + 1);
	char url[512];
	url_of(url, sizeof url, "crawl", big);
	fst_open_opts oo;
	fst_open_opts_init(&oo);
	oo.retry_time_ms = 500;
	oo.connect_timeout_ms = connect_ms;
	oo.stall_timeout_ms = stall_ms;
	oo.request_timeout_ms = request_ms;
	fst_file *f;
	fst_error err;
	assert_int_equal(fst_file_open_ex(url, &oo, &f, &err), 0);
	char *got = malloc(n);
	assert_non_null(got);
	double t0 = test_now_s();
	assert_int_equal(fst_file_read(f, 1, got, n, &err), FST_EIO);
	double secs = test_now_s() - t0;
	assert_has(err.message, "/crawl/ck/");
	assert_has(err.message, "request_timeout_ms");
	assert_has(err.message, "after 2 attempts");
	if (secs > max_secs)
		fail_msg("%.1f s, expected under %.1f s: %s", secs, max_secs, err.message);
	free(got);
	fst_file_close(f);
}

static void test_crawling_server_ends_in_time(void **state)
{
	(void)state;
	/* 1 s attempts, two of them (the second starts inside the retry
	 * time) */
	crawl_ends_in_time(0, 0, 1000, 4);
	/* derived: 0.5 s of connect timeout, 1 s of stall timeout, 1 s for
	 * the 64 KiB asked (less what the first attempt brought, for the
	 * second) */
	crawl_ends_in_time(500, 1000, 0, 8);
}

/* Every byte asked for, then a transfer error (a Content-Length one more
 * than the range, the connection closed): the read is done, with no retry
 * to wait for or to run out of. */
static void test_all_bytes_then_an_error(void **state)
{
	(void)state;
	fst_open_opts oo;
	fst_open_opts_init(&oo);
	oo.retries = -1;
	fst_checkpoint *ck;
	fst_error err;
	if (open_remote_ex("overdeclared", &oo, &ck, &err))
		fail_msg("%s", err.message);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.threads = 2;
	fst_buffer *buf;
	if (fst_load(ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	check_buffer(buf, false);
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
}

static void test_cancel_stops_a_stall(void **state)
{
	(void)state;
	fst_checkpoint *ck;
	fst_error err;
	assert_int_equal(open_remote("stall", &ck, &err), 0);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.threads = 2;
	fst_loader *ld;
	assert_int_equal(fst_load_start(ck, &o, &ld, &err), 0);
	struct timespec ms200 = {0, 200 * 1000000};
	nanosleep(&ms200, NULL);
	double t0 = test_now_s();
	fst_loader_cancel(ld);
	fst_buffer *buf;
	assert_int_equal(fst_loader_finish(ld, &buf, &err), FST_ECANCELED);
	double secs = test_now_s() - t0;
	/* libcurl asks its progress callback about once a second while idle */
	if (secs > 3)
		fail_msg("cancel took %.2f s with the transfers stalled", secs);
	assert_null(buf);
	fst_checkpoint_close(ck);
}

static void test_refused(void **state)
{
	(void)state;
	fst_checkpoint *ck;
	fst_error err;
	assert_int_equal(open_remote("ok", &ck, &err), 0);
	const struct {
		int io, gds;
		const char *msg;
	} cases[] = {
		{FST_IO_MMAP, FST_GDS_AUTO, "io=mmap reads local files"},
		{FST_IO_PREAD, FST_GDS_AUTO, "io=pread reads local files"},
		{FST_IO_URING, FST_GDS_AUTO, "io=uring reads local files"},
		{FST_IO_AUTO, FST_GDS_ON, "gds=on: "},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		fst_load_opts o;
		fst_load_opts_init(&o);
		o.io = cases[i].io;
		o.gds = cases[i].gds;
		fst_buffer *buf;
		assert_int_equal(fst_load(ck, &o, &buf, &err), FST_EUSAGE);
		assert_has(err.message, cases[i].msg);
		assert_has(err.message, "http://127.0.0.1:");
	}
	fst_checkpoint_close(ck);
}

/*
 * A checkpoint of a local file first and remote files after it: refused
 * readers name a remote file (the first), never the local one; io=auto
 * reads both kinds, every byte equal.
 */
static void test_local_and_remote(void **state)
{
	(void)state;
	size_t n = fst_checkpoint_file_count(local_ck);
	assert_true(n >= 2 && n <= 16);
	fst_file *fs[16];
	fst_error err;
	const char *local_path = fst_file_path(fst_checkpoint_file(local_ck, 0));
	assert_int_equal(fst_file_open(local_path, &fs[0], &err), 0);
	char first_remote[512];
	url_of(first_remote, sizeof first_remote, "ok", 1);
	for (size_t i = 1; i < n; i++) {
		char url[512];
		url_of(url, sizeof url, "ok", i);
		assert_int_equal(fst_file_open(url, &fs[i], &err), 0);
	}
	fst_checkpoint *ck;
	assert_int_equal(fst_checkpoint_from_files(fs, n, &ck, &err), 0);
	fst_load_opts o;
	fst_load_opts_init(&o);
	fst_buffer *buf;
	for (int gds = 0; gds < 2; gds++) {
		o.io = gds ? FST_IO_AUTO : FST_IO_PREAD;
		o.gds = gds ? FST_GDS_ON : FST_GDS_AUTO;
		assert_int_equal(fst_load(ck, &o, &buf, &err), FST_EUSAGE);
		assert_has(err.message, first_remote);
		if (strstr(err.message, local_path))
			fail_msg("names the local file: %s", err.message);
	}
	fst_load_opts_init(&o);
	assert_int_equal(fst_load(ck, &o, &buf, &err), 0);
	check_buffer(buf, false);
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
}

static void test_file_read(void **state)
{
	(void)state;
	char url[512];
	url_of(url, sizeof url, "ok", 0);
	fst_file *f;
	fst_error err;
	assert_int_equal(fst_file_open(url, &f, &err), 0);
	uint64_t size = fst_file_size(f);
	assert_int_equal(size, files.size[0]);
	unsigned char *got = malloc(size + 1);
	assert_int_equal(fst_file_read(f, 0, got, size, &err), 0);
	lh_assert_bytes("whole file", got, files.bytes[0], size);
	assert_int_equal(fst_file_read(f, size / 3, got, size / 2, &err), 0);
	lh_assert_bytes("a middle", got, files.bytes[0] + size / 3, size / 2);
	assert_int_equal(fst_file_read(f, size - 1, got, 2, &err), FST_ECHANGED);
	assert_has(err.message, "past the end");
	free(got);
	fst_file_close(f);
	url_of(url, sizeof url, "missing", 0);
	assert_int_equal(fst_file_open(url, &f, &err), FST_EIO);
	assert_int_equal(err.sys_errno, ENOENT);
	assert_has(err.message, "HTTP 404 Not Found");
}

static void test_cuda_double(void **state)
{
	(void)state;
	if (!getenv("FST_CUDA_LIBRARY"))
		skip(); /* ctest gives the double (label cuda-double) */
	load_and_check("ok", "cuda:0", 3, 256 << 10);
	load_and_check("reset", "cuda:0", 2, 0);
}

/* Files opened with a CA file and files opened without it, as one
 * checkpoint loaded by one worker (one connection for every file): each
 * request is sent with its own file's CA setting, never the one the
 * connection had for the file before (FST_CURL_LIBRARY: the libcurl double,
 * whose log says which CA file each handle had at each URL). */
static void test_ca_file_of_each_file(void **state)
{
	(void)state;
	const char *log = test_path("curl-double.log");
	unlink(log);
	assert_int_equal(setenv("CURL_DOUBLE_LOG", log, 1), 0);
	size_t n = fst_checkpoint_file_count(local_ck);
	assert_true(n >= 2 && n <= 16);
	fst_file *fs[16];
	fst_error err;
	for (size_t i = 0; i < n; i++) {
		fst_open_opts oo;
		fst_open_opts_init(&oo);
		oo.ca_bundle = i % 2 ? NULL : "/etc/fst-test-ca.pem"; /* http: never read */
		char url[512];
		url_of(url, sizeof url, "ok", i);
		assert_int_equal(fst_file_open_ex(url, &oo, &fs[i], &err), 0);
	}
	fst_checkpoint *ck;
	assert_int_equal(fst_checkpoint_from_files(fs, n, &ck, &err), 0);
	fst_load_opts o;
	fst_load_opts_init(&o);
	o.threads = 1;
	o.chunk_bytes = 64 << 10;
	fst_buffer *buf;
	for (int round = 0; round < 2; round++) { /* the last file's CA, then the first's */
		assert_int_equal(fst_load(ck, &o, &buf, &err), 0);
		check_buffer(buf, false);
		fst_buffer_release(buf);
	}
	fst_checkpoint_close(ck);
	unsetenv("CURL_DOUBLE_LOG");

	/* each handle's CA file and URL as the log goes, checked at each
	 * request sent */
	FILE *f = fopen(log, "r");
	assert_non_null(f);
	struct { char h[32], ca[600]; size_t file; } hs[64];
	size_t nh = 0, urls[2] = {0, 0};
	char what[16], h[32], value[600];
	char line[700];
	while (fgets(line, sizeof line, f)) {
		value[0] = '\0';
		if (sscanf(line, "%15s %31s %599s", what, h, value) < 2)
			fail_msg("log line: %s", line);
		size_t k = 0;
		while (k < nh && strcmp(hs[k].h, h))
			k++;
		if (k == nh) {
			assert_true(nh < 64);
			snprintf(hs[nh].h, sizeof hs[nh].h, "%s", h);
			hs[nh].ca[0] = '\0';
			hs[nh++].file = n;
		}
		if (!strcmp(what, "init") || !strcmp(what, "cleanup")) {
			hs[k].ca[0] = '\0';
			hs[k].file = n;
		} else if (!strcmp(what, "cainfo")) {
			snprintf(hs[k].ca, sizeof hs[k].ca, "%s", strcmp(value, "-") ? value : "");
		} else if (!strcmp(what, "url")) {
			size_t i = 0;
			while (i < n) {
				char url[512];
				url_of(url, sizeof url, "ok", i);
				if (!strcmp(url, value))
					break;
				i++;
			}
			assert_true(i < n);
			hs[k].file = i;
		} else if (!strcmp(what, "perform")) {
			size_t i = hs[k].file;
			assert_true(i < n);
			const char *want = i % 2 ? "" : "/etc/fst-test-ca.pem";
			if (strcmp(hs[k].ca, want))
				fail_msg("a request for file %zu sent with the CA file \"%s\"", i,
					 hs[k].ca);
			urls[i % 2]++;
		}
	}
	fclose(f);
	assert_true(urls[0] > 0 && urls[1] > 0);
}

/* FST_CURL_LIBRARY names a missing library: URLs refused, files fine. */
static int nocurl(void)
{
	const char *lib = getenv("FST_CURL_LIBRARY");
	if (!lib)
		return 77;
	fst_file *f;
	fst_error err;
	int rc = fst_file_open("http://127.0.0.1:9/x.safetensors", &f, &err);
	int bad = rc != FST_EUNSUPPORTED || !strstr(err.message, "libcurl") ||
		  !strstr(err.message, lib);
	fst_checkpoint *ck;
	rc = fst_checkpoint_open("s3://bucket/x.safetensors", &ck, &err);
	bad = bad || rc != FST_EUNSUPPORTED || !strstr(err.message, lib);
	lh_shape sh = lh_default_shape();
	lh_write_random("ck", 1, &sh, &local);
	fst_checkpoint *lc = lh_open(local.dir);
	fst_buffer *buf;
	bad = bad || fst_load(lc, NULL, &buf, &err) != 0;
	fst_buffer_release(buf);
	fst_checkpoint_close(lc);
	printf("nocurl: %s (%s)\n", bad ? "FAILED" : "passed", err.message);
	return bad;
}

int main(int argc, char **argv)
{
	if (argc > 1 && !strcmp(argv[1], "nocurl"))
		return nocurl();
	/* where libcurl is missing (an emulated aarch64 run) there is nothing
	 * to test: the nocurl scenario covers that case */
	void *curl = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
	if (!curl) {
		printf("skipped: no libcurl.so.4 here (%s)\n", dlerror());
		return 77;
	}
	dlclose(curl);
	if (argc > 1 && !strcmp(argv[1], "curl-double")) {
		if (!getenv("FST_CURL_LIBRARY"))
			return 77; /* ctest names the double */
		/* a file opened without a CA file has libcurl's own */
		unsetenv("AWS_CA_BUNDLE");
		unsetenv("CURL_CA_BUNDLE");
		unsetenv("SSL_CERT_FILE");
		const struct CMUnitTest double_tests[] = {
			cmocka_unit_test(test_ca_file_of_each_file),
		};
		return cmocka_run_group_tests(double_tests, setup, teardown);
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bytes_equal),
		cmocka_unit_test(test_resumed),
		cmocka_unit_test(test_streamed_with_progress),
		cmocka_unit_test(test_changed_fails),
		cmocka_unit_test(test_body_past_its_range_fails),
		cmocka_unit_test(test_dribbling_server_ends_in_time),
		cmocka_unit_test(test_all_bytes_then_an_error),
		cmocka_unit_test(test_crawling_server_ends_in_time),
		cmocka_unit_test(test_cancel_stops_a_stall),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_local_and_remote),
		cmocka_unit_test(test_file_read),
		cmocka_unit_test(test_cuda_double),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
