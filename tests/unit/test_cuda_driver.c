/* Description: the CUDA driver as libfst reports and uses it (libcuda
 * double): fst_cuda_driver (version, device count, library path),
 * fst_cuda_device_info for each device and out of range, the host-to-device
 * bandwidth probe and its argument checks, fst_load_explain onto a device
 * (pread, io_uring, pinned staging; io=mmap refused), the default worker
 * count from the page cache onto a GPU on 16 cores (at most 12), its
 * staging by the CPU's L3 (64 MiB under 256 MiB, else 128), and the
 * caller's current context left as it was by loads to another device,
 * copies back, device queries and the last release. */
#include "cuda_helpers.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>

static void test_driver_queries(void **state)
{
	(void)state;
	int version = 0, count = 0;
	char lib[512];
	fst_error err;
	assert_int_equal(fst_cuda_driver(&version, &count, lib, sizeof lib, &err), 0);
	assert_int_equal(version, 13000);
	assert_int_equal(count, 2);
	assert_string_equal(lib, getenv("FST_CUDA_LIBRARY"));
	assert_int_equal(fst_cuda_driver(NULL, NULL, NULL, 0, &err), 0);
	for (int d = 0; d < 2; d++) {
		fst_cuda_device info;
		assert_int_equal(fst_cuda_device_info(d, &info, &err), 0);
		char want[64];
		snprintf(want, sizeof want, "fst test double %d", d);
		assert_string_equal(info.name, want);
		assert_int_equal(info.index, d);
		assert_int_equal(info.total_memory, 16ull << 30);
		assert_true(info.free_memory <= info.total_memory);
		assert_int_equal(info.compute_major, 9);
		assert_int_equal(info.integrated, 0);
		assert_int_equal(info.gpu_direct_rdma, 1);
		snprintf(want, sizeof want, "0000:%02x:00.0", 0x3b + d);
		assert_string_equal(info.pci_bus_id, want);
	}
	fst_cuda_device info;
	assert_int_equal(fst_cuda_device_info(2, &info, &err), FST_EDEVICE);
	assert_has(err.message, "device 2 out of range (2 devices)");
	assert_int_equal(fst_cuda_device_info(0, NULL, &err), FST_EUSAGE);

	ch_set_delay("20");
	long base = fsti_live_allocations();
	double gbps = 0;
	assert_int_equal(fst_cuda_h2d_bandwidth(0, 4 * MiB, &gbps, &err), 0);
	assert_true(gbps > 0);
	gbps = 0;
	assert_int_equal(fst_cuda_h2d_bandwidth(1, 40 * MiB, &gbps, &err), 0); /* 3 pieces */
	assert_true(gbps > 0);
	assert_int_equal(fst_cuda_h2d_bandwidth(0, 1000, &gbps, &err), FST_EUSAGE);
	assert_int_equal(fst_cuda_h2d_bandwidth(0, 4 * MiB, NULL, &err), FST_EUSAGE);
	assert_int_equal(fst_cuda_h2d_bandwidth(7, 4 * MiB, &gbps, &err), FST_EDEVICE);
	ch_assert_clean("after the bandwidth test", base);
	ch_set_delay("50");
}

static void test_explain(void **state)
{
	(void)state;
	ch_ckpt c;
	ch_write_random("explain", 71, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	char text[512];
	fst_error err;
	fst_load_opts o;
	ch_opts(&o, "cuda:1", FST_IO_PREAD, 2, 1 * MiB);
	assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), 0);
	assert_has(text, "pread");
	assert_has(text, "pinned staging");
	assert_has(text, "2 threads");
	if (ch_uring_ok) {
		o.io = FST_IO_URING;
		assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), 0);
		assert_has(text, "uring");
		assert_has(text, "pinned staging");
	}
	o.device = "cpu";
	o.io = FST_IO_PREAD;
	assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), 0);
	assert_null(strstr(text, "pinned staging"));
	/* mmap cannot target a GPU */
	o.device = "cuda:0";
	o.io = FST_IO_MMAP;
	assert_int_equal(fst_load_explain(c.ck, &o, text, sizeof text, &err), FST_EUSAGE);
	ch_assert_clean("after explaining", c.host_base);
	ch_close(&c);
}

/* The child's checks, on a machine of 16 CPUs: 0, or the number of the
 * one that failed. */
static int explain_on_16_cpus(const ch_ckpt *c)
{
	if (sysconf(_SC_NPROCESSORS_ONLN) != 16)
		return 77; /* a libc that counts CPUs elsewhere: nothing to check */
	char text[512];
	fst_error err;
	fst_load_opts o;
	ch_opts(&o, "cuda:1", FST_IO_AUTO, 0, 0);
	o.chunk_bytes = 4096; /* more chunks than workers: the count is not cut */
	/* from the page cache onto a GPU: 12 */
	if (fst_load_explain(c->ck, &o, text, sizeof text, &err) || !strstr(text, "pread") ||
	    !strstr(text, " 12 threads"))
		return fprintf(stderr, "cuda:1, auto: %s %s\n", text, err.message), 1;
	/* a count the caller gives stands */
	o.threads = 14;
	if (fst_load_explain(c->ck, &o, text, sizeof text, &err) || !strstr(text, " 14 threads"))
		return fprintf(stderr, "cuda:1, 14 asked: %s %s\n", text, err.message), 2;
	/* into host memory: one per CPU */
	o.threads = 0;
	o.device = "cpu";
	if (fst_load_explain(c->ck, &o, text, sizeof text, &err) || !strstr(text, " 16 threads"))
		return fprintf(stderr, "cpu, auto: %s %s\n", text, err.message), 3;
	/* io_uring onto a GPU is not the page-cache copy */
	if (ch_uring_ok) {
		o.device = "cuda:1";
		o.io = FST_IO_URING;
		if (fst_load_explain(c->ck, &o, text, sizeof text, &err) ||
		    !strstr(text, " 16 threads"))
			return fprintf(stderr, "cuda:1, uring: %s %s\n", text, err.message), 4;
	}
	return 0;
}

/* Runs check in a child whose view of the sysfs file target holds text
 * (a file of the checkpoint's folder bind-mounted over it, in a mount
 * namespace of the child's own). check returns 0, 77 where it has nothing
 * to check, or the number of the check that failed. */
static void with_sysfs_file(const char *name, const char *target, const char *text,
			    int (*check)(const ch_ckpt *c))
{
	if (geteuid() != 0)
		skip(); /* it takes root to mount */
	if (access(target, R_OK))
		skip(); /* no such file to stand in for here */
	ch_ckpt c;
	ch_write_random(name, 73, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	char fake[sizeof c.dir + 16];
	snprintf(fake, sizeof fake, "%s/sysfs-file", c.dir);
	int fd = open(fake, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
		    mount(fake, target, NULL, MS_BIND, NULL))
			_exit(77);
		_exit(check(&c));
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	unlink(fake);
	ch_close(&c);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == 77)
		skip(); /* no mount namespace here, or nothing the check could read */
	if (WEXITSTATUS(status))
		fail_msg("%s = \"%s\": check %d failed", target, text, WEXITSTATUS(status));
}

/* From the page cache onto a GPU a load left to fst starts at most 12
 * workers (FSTI_CACHED_GPU_THREADS): 16 on 16 cores loaded slower. The CPU
 * count is sysfs's. */
static void test_workers_from_the_page_cache(void **state)
{
	(void)state;
	with_sysfs_file("workers", "/sys/devices/system/cpu/online", "0-15\n",
			explain_on_16_cpus);
}

/* The description of a page-cache load onto cuda:1 by 12 workers has
 * chunks of want (the staging budget / 36 slots, 4 KiB-aligned); 0 or
 * the number of the check that failed. */
static int chunks_are(const ch_ckpt *c, uint64_t staging, const char *want, int which)
{
	char text[512];
	fst_error err;
	fst_load_opts o;
	ch_opts(&o, "cuda:1", FST_IO_AUTO, 12, staging);
	if (fst_load_explain(c->ck, &o, text, sizeof text, &err) || !strstr(text, "pread") ||
	    !strstr(text, want))
		return fprintf(stderr, "staging %llu: want \"%s\": %s %s\n",
			       (unsigned long long)staging, want, text, err.message),
		       which;
	return 0;
}

/* Where cpu0's sysfs lists its level-3 cache (the checks skip where
 * index3 is another level) */
#define L3_SIZE "/sys/devices/system/cpu/cpu0/cache/index3/size"

static int staging_on_105_mib(const ch_ckpt *c)
{
	if (fsti_l3_cache_bytes() != 105ull << 20)
		return 77; /* index3 is not the level-3 cache here */
	int rc = chunks_are(c, 0, " 1820 KiB chunks", 1); /* 64 MiB */
	/* a budget the caller gives stands */
	return rc ? rc : chunks_are(c, 128ull << 20, " 3640 KiB chunks", 2);
}

static int staging_on_300_mib(const ch_ckpt *c)
{
	if (fsti_l3_cache_bytes() != 300ull << 20)
		return 77;
	return chunks_are(c, 0, " 3640 KiB chunks", 3); /* 128 MiB */
}

static int staging_on_unknown(const ch_ckpt *c)
{
	if (fsti_l3_cache_bytes())
		return 77;
	return chunks_are(c, 0, " 3640 KiB chunks", 4);
}

/* From the page cache onto a GPU the staging a load left to fst keeps is
 * 64 MiB where the CPU's L3 holds less than 256 MiB, else 128 MiB, and 128
 * where sysfs does not say (FSTI_STAGING_CACHED_L3). */
static void test_staging_from_the_l3(void **state)
{
	(void)state;
	with_sysfs_file("l3-105", L3_SIZE, "107520K\n", staging_on_105_mib);
	with_sysfs_file("l3-300", L3_SIZE, "307200K\n", staging_on_300_mib);
	with_sysfs_file("l3-none", L3_SIZE, "\n", staging_on_unknown);
}

/* The caller's current context is its own: a load to another device, a
 * copy back, a device query or the last release must not leave the
 * caller's thread on another device's context (PyTorch reads the current
 * device from it). Once a bug: libfst made the target's
 * primary context current on the calling thread and leaves it there
 * (fixed: public calls give the context back). */
static void test_caller_context_kept(void **state)
{
	(void)state;
	int (*cuDevicePrimaryCtxRetain)(void **, int) = NULL;
	int (*cuCtxSetCurrent)(void *) = NULL;
	int (*cuCtxGetCurrent)(void **) = NULL;
	*(void **)&cuDevicePrimaryCtxRetain = ch_sym("cuDevicePrimaryCtxRetain");
	*(void **)&cuCtxSetCurrent = ch_sym("cuCtxSetCurrent");
	*(void **)&cuCtxGetCurrent = ch_sym("cuCtxGetCurrent");
	ch_ckpt c;
	ch_write_random("context", 81, &ch_small_gen, &c);
	ch_open(&c, c.dir);
	void *mine = NULL, *now = NULL;
	assert_int_equal(cuDevicePrimaryCtxRetain(&mine, 0), 0);
	assert_int_equal(cuCtxSetCurrent(mine), 0);
	const char *moved = NULL; /* the first call that moved the caller */
#define KEPT(what)                                                                          \
	do {                                                                               \
		assert_int_equal(cuCtxGetCurrent(&now), 0);                                \
		if (now != mine && !moved)                                                 \
			moved = what;                                                      \
		cuCtxSetCurrent(mine);                                                     \
	} while (0)
	fst_load_opts o;
	ch_opts(&o, "cuda:1", FST_IO_PREAD, 2, 1 * MiB);
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(c.ck, &o, &buf, &err))
		fail_msg("%s", err.message);
	KEPT("fst_load to cuda:1");
	ch_assert_buffer(&c, buf, 1);
	KEPT("fst_copy_to_host from cuda:1");
	fst_buffer_release(buf);
	KEPT("releasing a cuda:1 buffer");
	fst_cuda_device info;
	assert_int_equal(fst_cuda_device_info(1, &info, &err), 0);
	KEPT("fst_cuda_device_info(1)");
#undef KEPT
	if (moved)
		fail_msg("%s left the caller's thread on another device's context", moved);
	ch_assert_clean("after the context checks", c.host_base);
	ch_close(&c);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_driver_queries, ch_reset),
		cmocka_unit_test_setup(test_explain, ch_reset),
		cmocka_unit_test_setup(test_workers_from_the_page_cache, ch_reset),
		cmocka_unit_test_setup(test_staging_from_the_l3, ch_reset),
		cmocka_unit_test_setup(test_caller_context_kept, ch_reset),
	};
	return cmocka_run_group_tests(tests, ch_setup, ch_teardown);
}
