/* Description: the unified-memory CUDA path and the platform decision,
 * against the libcuda double acting as each platform (FST_DOUBLE_PLATFORM)
 * and the libcufile double (GPUDirect Storage usable where the probe
 * allows it). The decision table: every platform (discrete, integrated
 * GB10-like, jetson, coherent GH200-like, x86 hmm) x unified auto/on/off x
 * with and without the caller's allocator gives the class fst_platform_probe
 * reports, the path (or the error) expected, and a description that says
 * which path and why. Unified loads (pread straight into the mapped memory,
 * and io_uring slots copied once) give bytes equal to the file, every tensor
 * 256-byte aligned at a device address of the mapped block (never its host
 * address), no device allocation, no pinned staging, no cuFile call
 * (gds=on is refused), and a streamed tensor is handed out only once all of
 * its bytes were read (on_landed, slowed). Releasing the buffer unmaps the
 * block: the double's count of mapped blocks goes back, also after a view
 * outlives the buffer's own reference. FST_UNIFIED=off forces the discrete
 * path, FST_UNIFIED=bogus is a usage error. */
#include "cuda_helpers.h"

#include <dlfcn.h>

static long (*live_mapped)(void);
static int (*is_mapped_device)(const void *p);
static long (*cufile_reads)(void);
static long (*cufile_registers)(void);

enum { P_DISCRETE, P_INTEGRATED, P_JETSON, P_COHERENT, P_HMM, NPLAT };
static const char *const plat_env[NPLAT] = {"discrete", "integrated", "jetson", "coherent",
					    "hmm"};
static const char *const plat_class[NPLAT] = {"discrete", "integrated", "integrated", "coherent",
					      "discrete"};

/* Each platform has its own device: the GDS probe is cached per device. */
static const char *plat_device(int p)
{
	static const char *const dev[NPLAT] = {"cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:4"};
	return dev[p];
}

static void *device_alloc(void *ctx, uint64_t size, uint32_t align, int type, int id)
{
	(void)ctx;
	(void)align;
	(void)type;
	(void)id;
	int (*alloc)(unsigned long long *, size_t);
	*(void **)&alloc = ch_sym("cuMemAlloc_v2");
	unsigned long long p = 0;
	return alloc(&p, (size_t)size) ? NULL : (void *)(uintptr_t)p;
}

static void device_free(void *ctx, void *ptr, uint64_t size, int type, int id)
{
	(void)ctx;
	(void)size;
	(void)type;
	(void)id;
	int (*f)(unsigned long long);
	*(void **)&f = ch_sym("cuMemFree_v2");
	f((unsigned long long)(uintptr_t)ptr);
}

static const fst_allocator caller_alloc = {device_alloc, device_free, NULL};

static ch_ckpt ck;

static int setup(void **state)
{
	int rc = ch_setup(state);
	if (rc)
		return rc;
	*(void **)&live_mapped = ch_sym("fst_double_live_mapped");
	*(void **)&is_mapped_device = ch_sym("fst_double_is_mapped_device");
	const char *cf = getenv("FST_TEST_CUFILE_DOUBLE");
	void *h = cf ? dlopen(cf, RTLD_NOW | RTLD_LOCAL) : NULL;
	if (!h) {
		fprintf(stderr, "cannot open the cuFile double\n");
		return -1;
	}
	*(void **)&cufile_reads = dlsym(h, "fst_cufile_double_reads");
	*(void **)&cufile_registers = dlsym(h, "fst_cufile_double_handle_registers");
	if (!cufile_reads || !cufile_registers)
		return -1;
	return 0;
}

static int reset(void **state)
{
	unsetenv("FST_DOUBLE_PLATFORM");
	unsetenv("FST_UNIFIED");
	int rc = ch_reset(state);
	setenv("FST_DOUBLE_DEVICES", "8", 1); /* one per platform */
	return rc;
}

/* ---- the decision table */

static void test_decisions(void **state)
{
	(void)state;
	ch_write_random("unified_table", 7, &ch_small_gen, &ck);
	ch_open(&ck, ck.dir);
	for (int p = 0; p < NPLAT; p++) {
		setenv("FST_DOUBLE_PLATFORM", plat_env[p], 1);
		const char *dev = plat_device(p);
		fst_platform_report r;
		fst_error err;
		if (fst_platform_probe(dev[5] - '0', &r, &err))
			fail_msg("fst_platform_probe(%s): %s", dev, err.message);
		if (strcmp(r.name, plat_class[p]))
			fail_msg("%s: class %s, expected %s (%s)", plat_env[p], r.name, plat_class[p],
				 r.reason);
		assert_int_equal(r.unified_by_default, p == P_INTEGRATED || p == P_JETSON);
		assert_true(r.reason[0] != '\0');
		for (int u = FST_UNIFIED_AUTO; u <= FST_UNIFIED_OFF; u++)
			for (int a = 0; a < 2; a++) {
				fst_load_opts o;
				ch_opts(&o, dev, FST_IO_PREAD, 2, 0);
				o.unified = u;
				o.allocator = a ? &caller_alloc : NULL;
				char text[1200] = "", ctx[200];
				snprintf(ctx, sizeof ctx, "%s, unified=%d, allocator %d", plat_env[p], u,
					 a);
				int rc = fst_load_explain(ck.ck, &o, text, sizeof text, &err);
				bool unified_capable = p != P_DISCRETE && p != P_HMM;
				bool want_unified =
					!a && (u == FST_UNIFIED_ON ? unified_capable
					       : u == FST_UNIFIED_AUTO ? p == P_INTEGRATED || p == P_JETSON
								       : false);
				int want_rc = 0;
				if (u == FST_UNIFIED_ON && a)
					want_rc = FST_EUSAGE;
				else if (u == FST_UNIFIED_ON && !unified_capable)
					want_rc = FST_EUNSUPPORTED;
				if (rc != want_rc)
					fail_msg("%s: rc %d, expected %d: %s", ctx, rc, want_rc,
						 rc ? err.message : text);
				if (rc) {
					assert_has(err.message, "unified");
					continue;
				}
				if (want_unified) {
					assert_has(text, "straight into host memory mapped for the GPU");
					assert_has(text, "unified memory");
					assert_has(text, "GPUDirect Storage not used: unified memory");
					if (strstr(text, "cuFile where registered"))
						fail_msg("%s: %s", ctx, text);
				} else {
					assert_has(text, "pinned staging");
					assert_has(text, u == FST_UNIFIED_OFF ? "unified=off"
						       : a ? "caller's allocator"
						       : p == P_COHERENT ? "coherent GPU" : "discrete: ");
				}
			}
	}
	/* the environment decides where the options leave auto */
	setenv("FST_DOUBLE_PLATFORM", "integrated", 1);
	fst_load_opts o;
	ch_opts(&o, plat_device(P_INTEGRATED), FST_IO_PREAD, 2, 0);
	char text[1200];
	fst_error err;
	setenv("FST_UNIFIED", "off", 1);
	assert_int_equal(fst_load_explain(ck.ck, &o, text, sizeof text, &err), 0);
	assert_has(text, "unified=off");
	setenv("FST_UNIFIED", "bogus", 1);
	assert_int_equal(fst_load_explain(ck.ck, &o, text, sizeof text, &err), FST_EUSAGE);
	assert_has(err.message, "FST_UNIFIED");
	unsetenv("FST_UNIFIED");
	ch_close(&ck);
}

/* ---- unified loads */

/* Every view a device address inside a mapped block, aligned, equal to the
 * file (ch_assert_buffer). */
static void check_unified_buffer(const ch_ckpt *c, fst_buffer *buf, int dev)
{
	ch_assert_buffer(c, buf, dev);
	for (size_t i = 0; i < fst_buffer_tensor_count(buf); i++) {
		fst_tensor_view v;
		assert_int_equal(fst_buffer_tensor(buf, i, &v), 0);
		assert_int_equal(v.device_type, FST_DEVICE_CUDA);
		assert_int_equal((uintptr_t)v.data % 256, 0);
		if (!is_mapped_device(v.data))
			fail_msg("%s: %p is not a device address of the mapped block", v.name, v.data);
		/* the CPU's view: the host address of the same bytes (the double
		 * maps the block twice, so the addresses differ) */
		const void *host = fst_view_host_data(&v);
		if (!host || (v.nbytes && host == v.data) || is_mapped_device(host))
			fail_msg("%s: host view %p of device address %p", v.name, host, v.data);
		assert_memory_equal(host, v.data, v.nbytes);
		fst_view_release(&v);
	}
}

static void test_unified_loads(void **state)
{
	(void)state;
	ch_write_random("unified_load", 11, &ch_big_gen, &ck);
	ch_open(&ck, ck.dir);
	for (int p = P_INTEGRATED; p <= P_COHERENT; p++) {
		setenv("FST_DOUBLE_PLATFORM", plat_env[p], 1);
		int dev = plat_device(p)[5] - '0';
		for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
			if (io == FST_IO_URING && !ch_uring_ok)
				continue;
			for (int stream = 0; stream < 2; stream++) {
				fst_load_opts o;
				ch_opts(&o, plat_device(p), io, 1 + 2u * (unsigned)stream, 1 * MiB);
				if (p == P_COHERENT)
					o.unified = FST_UNIFIED_ON;
				long m0 = live_mapped(), d0 = ch_live_device(), h0 = ch_live_host();
				long r0 = cufile_reads(), g0 = cufile_registers();
				fst_buffer *buf = NULL;
				fst_error err;
				if (!stream) {
					if (fst_load(ck.ck, &o, &buf, &err))
						fail_msg("%s %s: %s", plat_env[p], lh_io_name(io),
							 err.message);
				} else {
					fst_loader *ld;
					assert_int_equal(fst_load_start(ck.ck, &o, &ld, &err), 0);
					fst_tensor_view v;
					int rc;
					while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
						ch_assert_view(&ck, &v, dev);
						fst_view_release(&v);
					}
					assert_int_equal(rc, 0);
					assert_int_equal(fst_loader_finish(ld, &buf, &err), 0);
				}
				assert_has(fst_buffer_describe(buf), "unified memory");
				assert_int_equal(live_mapped(), m0 + 1);
				assert_int_equal(ch_live_device(), d0); /* no cuMemAlloc */
				assert_int_equal(ch_live_host(), h0);   /* no pinned staging */
				assert_int_equal(cufile_reads(), r0);
				assert_int_equal(cufile_registers(), g0);
				check_unified_buffer(&ck, buf, dev);
				/* a view outlives the buffer's own reference */
				fst_tensor_view keep;
				assert_int_equal(fst_buffer_tensor(buf, 0, &keep), 0);
				fst_buffer_release(buf);
				assert_int_equal(live_mapped(), m0 + 1);
				ch_assert_view(&ck, &keep, dev);
				fst_view_release(&keep);
				assert_int_equal(live_mapped(), m0); /* cuMemFreeHost */
				ch_assert_clean("a unified load", ck.host_base);
			}
		}
		/* gds=on has nothing to do there */
		fst_load_opts o;
		ch_opts(&o, plat_device(p), FST_IO_PREAD, 2, 0);
		o.gds = FST_GDS_ON;
		o.unified = p == P_COHERENT ? FST_UNIFIED_ON : FST_UNIFIED_AUTO;
		fst_buffer *buf = NULL;
		fst_error err;
		assert_int_equal(fst_load(ck.ck, &o, &buf, &err), FST_EUNSUPPORTED);
		assert_has(err.message, "unified");
		assert_null(buf);
		assert_int_equal(live_mapped(), 0);
		ch_assert_clean("gds=on refused", ck.host_base);
	}
	ch_close(&ck);
}

/* unified=off on an integrated GPU: the discrete path, as before. */
static void test_forced_discrete(void **state)
{
	(void)state;
	ch_write_random("unified_off", 13, &ch_small_gen, &ck);
	ch_open(&ck, ck.dir);
	setenv("FST_DOUBLE_PLATFORM", "integrated", 1);
	fst_load_opts o;
	ch_opts(&o, plat_device(P_INTEGRATED), FST_IO_PREAD, 2, 1 * MiB);
	o.unified = FST_UNIFIED_OFF;
	long m0 = live_mapped(), d0 = ch_live_device();
	fst_buffer *buf = NULL;
	fst_error err;
	if (fst_load(ck.ck, &o, &buf, &err))
		fail_msg("unified=off: %s", err.message);
	assert_has(fst_buffer_describe(buf), "pinned staging");
	assert_has(fst_buffer_describe(buf), "unified=off");
	assert_int_equal(live_mapped(), m0);
	assert_int_equal(ch_live_device(), d0 + 1);
	ch_assert_buffer(&ck, buf, P_INTEGRATED);
	fst_tensor_view v;
	assert_int_equal(fst_buffer_tensor(buf, 0, &v), 0);
	assert_null(fst_view_host_data(&v)); /* device memory: no CPU view */
	fst_view_release(&v);
	assert_null(fst_view_host_data(&v));
	fst_buffer_release(buf);
	ch_assert_clean("unified=off", ck.host_base);
	ch_close(&ck);
}

/* Streamed with on_landed slowed: a tensor leaves only once every byte of
 * it was read (reported), and its bytes are the file's (the mapped block
 * is poisoned until written). */
static void test_unified_readiness(void **state)
{
	(void)state;
	ch_write_random("unified_ready", 17, &ch_big_gen, &ck);
	ch_open(&ck, ck.dir);
	setenv("FST_DOUBLE_PLATFORM", "integrated", 1);
	for (int io = FST_IO_PREAD; io <= FST_IO_URING; io++) {
		if (io == FST_IO_URING && !ch_uring_ok)
			continue;
		fst_load_opts o;
		ch_opts(&o, plat_device(P_INTEGRATED), io, 3, 1 * MiB);
		o.landed_block = 16384;
		lh_landed l;
		lh_landed_init(&l, ck.ck, ck.bytes, NULL, o.landed_block, false);
		l.sleep_every = 2;
		o.on_landed = lh_on_landed;
		o.on_landed_ctx = &l;
		fst_loader *ld;
		fst_error err;
		assert_int_equal(fst_load_start(ck.ck, &o, &ld, &err), 0);
		fst_tensor_view v;
		int rc;
		size_t n = 0;
		while ((rc = fst_loader_next(ld, &v, &err)) == 1) {
			long entry = fst_checkpoint_find(ck.ck, v.name);
			assert_true(entry >= 0);
			if (!lh_landed_complete(&l, (size_t)entry))
				fail_msg("%s: %s handed out before all of it was read", lh_io_name(io),
					 v.name);
			ch_assert_view(&ck, &v, P_INTEGRATED);
			fst_view_release(&v);
			n++;
		}
		assert_int_equal(rc, 0);
		assert_int_equal(n, fst_checkpoint_tensor_count(ck.ck));
		fst_buffer *buf = NULL;
		assert_int_equal(fst_loader_finish(ld, &buf, &err), 0);
		lh_landed_check(&l, lh_io_name(io));
		check_unified_buffer(&ck, buf, P_INTEGRATED);
		fst_buffer_release(buf);
		lh_landed_free(&l);
		assert_int_equal(live_mapped(), 0);
		ch_assert_clean("streamed unified", ck.host_base);
	}
	ch_close(&ck);
}

int main(void)
{
	int rc = ch_init();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_decisions, reset),
		cmocka_unit_test_setup(test_unified_loads, reset),
		cmocka_unit_test_setup(test_forced_discrete, reset),
		cmocka_unit_test_setup(test_unified_readiness, reset),
	};
	return cmocka_run_group_tests(tests, setup, ch_teardown);
}
