/*
 * doctor.c - `fst doctor`: what this machine offers fst, and what a load of
 * PATH would do and why.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <linux/io_uring.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

static void help(FILE *out)
{
	fprintf(out,
		"usage: fst doctor [PATH] [--device DEV] [--no-copy-test] [--json]\n"
		"\n"
		"Reports the CUDA driver and devices (name, memory, PCIe link, integrated or\n"
		"not, GPUDirect RDMA attribute), measures pinned host-to-device copies, and,\n"
		"for PATH, what `fst load --device DEV` would choose and why; for each GPU its\n"
		"platform class (discrete, integrated, coherent) and the path a load takes\n"
		"there. Then this host's capabilities (io_uring, O_DIRECT, huge pages; and\n"
		"without a GPU, CUDA and GPUDirect Storage), each with its reason. Without\n"
		"a GPU it says so and exits 0.\n"
		"\n"
		"  --device DEV    the device PATH would be loaded onto (default: cuda:0 when\n"
		"                  there is a GPU, else cpu)\n"
		"  --no-copy-test  skip the pinned-copy measurement\n"
		"  --json          one JSON object\n"
		"  -h, --help      this help\n");
}

struct doctor_args {
	const char *device, *path;
	bool as_json, copy_test;
};

/* The command line into a; *done when the command ends here (help, or a
 * usage error). */
static int parse_args(int argc, char **argv, struct doctor_args *a, bool *done)
{
	static const struct option opts[] = {
		{"device", required_argument, NULL, 'd'},
		{"no-copy-test", no_argument, NULL, 'n'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		CLI_REMOTE_OPTIONS,
		{0, 0, 0, 0},
	};
	*a = (struct doctor_args){.copy_test = true};
	*done = true;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (cli_remote_option(c, optarg) == EXIT_OK)
			continue;
		switch (c) {
		case 'd': a->device = optarg; break;
		case 'n': a->copy_test = false; break;
		case 'j': a->as_json = true; break;
		case 'h': help(stdout); return EXIT_OK;
		default: help(stderr); return EXIT_USAGE;
		}
	}
	if (argc - optind > 1) {
		cli_error("doctor", "at most one PATH");
		return EXIT_USAGE;
	}
	a->path = optind < argc ? argv[optind] : NULL;
	*done = false;
	return EXIT_OK;
}

/* Nothing will be loaded, but a bad --device is still a usage error, found
 * by the library's parser (on no checkpoint). */
static int check_device(const char *device)
{
	fst_checkpoint *none;
	fst_load_opts lo;
	fst_load_opts_init(&lo);
	lo.device = device;
	char why[FST_ERROR_MSG_MAX + 64];
	fst_error derr;
	if (fst_checkpoint_from_files(NULL, 0, &none, &derr)) {
		cli_error("doctor", "%s", derr.message);
		return cli_exit_code(derr.code);
	}
	int drc = fst_load_explain(none, &lo, why, sizeof why, &derr);
	fst_checkpoint_close(none);
	if (drc == FST_EUSAGE) {
		cli_error("doctor", "%s", derr.message);
		return EXIT_USAGE;
	}
	return EXIT_OK;
}

/* Device i's lines of the text report: why is the copy test's failure. */
static void print_device(int i, const fst_cuda_device *d, bool copy_test, double gbps,
			 const char *why)
{
	char tot[32], fr[32];
	printf("  cuda:%d: %s, compute %d.%d, %s total, %s free\n", i, d->name, d->compute_major,
	       d->compute_minor, cli_human_bytes(tot, sizeof tot, d->total_memory),
	       cli_human_bytes(fr, sizeof fr, d->free_memory));
	if (d->pcie_gen)
		printf("    PCIe %s: gen %d x%d\n", d->pci_bus_id, d->pcie_gen, d->pcie_width);
	else
		printf("    PCIe %s: link speed not readable\n", d->pci_bus_id);
	printf("    integrated: %s; GPUDirect RDMA attribute: %d\n",
	       d->integrated ? "yes (shares host memory)" : "no", d->gpu_direct_rdma);
	if (copy_test && !why[0])
		printf("    pinned host-to-device copy: %.1f GB/s\n", gbps);
	else if (copy_test)
		printf("    pinned host-to-device copy failed: %s\n", why);
}

static void print_gds(const fst_gds_report *g)
{
	printf("    GPUDirect Storage: %s\n", g->usable ? "usable" : "not used by gds=auto");
	printf("      libcufile: %s; /dev/nvidia-fs*: %s; driver opened: %s; nvidia-fs version: "
	       "%u.%u; cufile.json allow_compat_mode: %s\n",
	       g->library ? "yes" : "no", g->nvfs_devices ? "yes" : "no",
	       g->driver_opened ? "yes" : "no", g->nvfs_major, g->nvfs_minor,
	       g->compat_allowed < 0 ? "unknown" : g->compat_allowed ? "true" : "false");
	printf("      because: %s\n", g->reason);
}

/* Device i appended to devs, with its GDS probe g (NULL: none); ok stays
 * true while the JSON has lost nothing. Strings from the driver or the
 * environment (a library's path in a reason) need not be UTF-8. */
static bool put_device(json_t *devs, int i, const fst_cuda_device *d, double gbps,
		       const fst_gds_report *g, bool ok)
{
	json_t *dj = ok ? json_object() : NULL;
	ok = cli_json_push(devs, dj) && cli_json_put(dj, "index", json_integer(i)) &&
	     cli_json_put(dj, "name", cli_json_text(d->name)) &&
	     cli_json_put(dj, "total_memory", json_integer((json_int_t)d->total_memory)) &&
	     cli_json_put(dj, "free_memory", json_integer((json_int_t)d->free_memory)) &&
	     cli_json_put(dj, "integrated", json_integer(d->integrated)) &&
	     cli_json_put(dj, "gpu_direct_rdma", json_integer(d->gpu_direct_rdma)) &&
	     cli_json_put(dj, "pci_bus_id", cli_json_text(d->pci_bus_id)) &&
	     cli_json_put(dj, "pcie_gen", json_integer(d->pcie_gen)) &&
	     cli_json_put(dj, "pcie_width", json_integer(d->pcie_width)) &&
	     cli_json_put(dj, "pinned_h2d_gbps", json_real(gbps)) &&
	     cli_json_put(dj, "gds", g ? json_object() : json_null());
	json_t *gj = ok && g ? json_object_get(dj, "gds") : NULL;
	if (gj)
		ok = cli_json_put(gj, "library", json_boolean(g->library)) &&
		     cli_json_put(gj, "nvfs_devices", json_boolean(g->nvfs_devices)) &&
		     cli_json_put(gj, "driver_opened", json_boolean(g->driver_opened)) &&
		     cli_json_put(gj, "integrated", json_boolean(g->integrated)) &&
		     cli_json_put(gj, "gpu_direct_rdma", json_integer(g->gpu_direct_rdma)) &&
		     cli_json_put(gj, "nvfs_major", json_integer((int)g->nvfs_major)) &&
		     cli_json_put(gj, "nvfs_minor", json_integer((int)g->nvfs_minor)) &&
		     cli_json_put(gj, "compat_allowed", json_integer(g->compat_allowed)) &&
		     cli_json_put(gj, "usable", json_boolean(g->usable)) &&
		     cli_json_put(gj, "reason", cli_json_text(g->reason));
	return ok;
}

/* Device i: its properties, the pinned-copy test, the GDS probe. */
static bool report_device(int i, json_t *devs, bool as_json, bool copy_test, bool ok)
{
	fst_cuda_device d;
	fst_error err;
	if (fst_cuda_device_info(i, &d, &err)) {
		if (!as_json)
			printf("  cuda:%d: %s\n", i, err.message);
		return ok;
	}
	double gbps = 0;
	char why[FST_ERROR_MSG_MAX] = "";
	if (copy_test && fst_cuda_h2d_bandwidth(i, 256u << 20, &gbps, &err))
		snprintf(why, sizeof why, "%s", err.message);
	if (!as_json)
		print_device(i, &d, copy_test, gbps, why);
	fst_platform_report p;
	bool classified = fst_platform_probe(i, &p, &err) == 0;
	const char *path = !classified ? "unknown"
			   : p.unified_by_default
				   ? "unified memory: one copy into mapped host memory, no staging, no "
				     "cuFile (--unified off for the discrete path)"
			   : p.platform == FST_PLATFORM_COHERENT
				   ? "discrete path into the GPU's own memory (--unified on: one copy "
				     "into host memory the GPU reads coherently)"
				   : "discrete path: device memory, pinned staging and copies, or cuFile "
				     "where GPUDirect Storage is usable";
	if (!as_json)
		printf("    platform: %s (%s)\n    a load here: %s\n",
		       classified ? p.name : "unknown", classified ? p.reason : err.message, path);
	fst_gds_report g;
	bool probed = fst_gds_probe(i, &g, &err) == 0;
	if (probed && !as_json)
		print_gds(&g);
	ok = put_device(devs, i, &d, gbps, probed ? &g : NULL, ok);
	json_t *dj = ok ? json_array_get(devs, json_array_size(devs) - 1) : NULL;
	return ok && cli_json_put(dj, "platform", cli_json_text(classified ? p.name : "unknown")) &&
	       cli_json_put(dj, "platform_reason",
			    cli_json_text(classified ? p.reason : "attributes not readable")) &&
	       cli_json_put(dj, "load_path", cli_json_text(path));
}

/* ---- this host's capabilities, each with its reason */

static void uring_capability(bool *yes, char *why, size_t n)
{
	struct io_uring_params p;
	memset(&p, 0, sizeof p);
	long fd = syscall(__NR_io_uring_setup, 4, &p);
	*yes = fd >= 0;
	if (fd >= 0) {
		close((int)fd);
		snprintf(why, n, "io_uring_setup works");
	} else if (errno == ENOSYS) {
		snprintf(why, n, "the kernel has no io_uring (ENOSYS); reads use pread");
	} else if (errno == EPERM) {
		snprintf(why, n, "io_uring is disabled here (EPERM: kernel.io_uring_disabled or a "
			 "seccomp profile, common in containers); reads use pread");
	} else {
		snprintf(why, n, "io_uring_setup failed: %s; reads use pread", strerror(errno));
	}
}

static void direct_capability(const char *dir, bool *yes, char *why, size_t n)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/.fst-doctor-XXXXXX", dir);
	int fd = mkstemp(path);
	if (fd < 0) {
		*yes = false;
		snprintf(why, n, "cannot create a file in %.400s to try: %s", dir, strerror(errno));
		return;
	}
	close(fd);
	fd = open(path, O_RDONLY | O_DIRECT);
	int e = errno;
	unlink(path);
	*yes = fd >= 0;
	if (fd >= 0) {
		close(fd);
		snprintf(why, n, "%.400s accepts O_DIRECT", dir);
	} else {
		snprintf(why, n, "%.400s refuses O_DIRECT (%s, e.g. tmpfs): io_uring reads are "
			 "buffered there", dir, strerror(e));
	}
}

static void huge_capability(bool *yes, char *why, size_t n)
{
	char mode[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	*yes = false;
	if (!f) {
		snprintf(why, n, "no /sys/kernel/mm/transparent_hugepage: 4 KiB pages only");
		return;
	}
	if (!fgets(mode, sizeof mode, f))
		mode[0] = '\0';
	fclose(f);
	mode[strcspn(mode, "\n")] = '\0';
	*yes = !strstr(mode, "[never]");
	snprintf(why, n, "transparent huge pages %s (%s)%s", *yes ? "available" : "off", mode,
		 *yes ? ": host destinations are advised for 2 MiB pages" : "");
}

/* io_uring, O_DIRECT (in PATH's directory, else the temp directory), huge
 * pages, and, without a GPU, CUDA and GPUDirect Storage, into out["host"]. */
static bool report_host(json_t *out, const char *path, bool as_json, int gpus, bool ok)
{
	char dir[4096];
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof dir, "%s", tmp && *tmp ? tmp : "/tmp");
	/* PATH's folder when it is a local file, PATH when a directory; a URL
	 * or a path that is not there: the temp directory */
	struct stat st;
	if (path && !strstr(path, "://") && !stat(path, &st)) {
		snprintf(dir, sizeof dir, "%s", path);
		char *slash = strrchr(dir, '/');
		if (!S_ISDIR(st.st_mode) && slash)
			*slash = '\0';
		else if (!S_ISDIR(st.st_mode))
			snprintf(dir, sizeof dir, ".");
	}
	struct {
		const char *name;
		bool yes;
		char why[600];
	} c[5];
	size_t nc = 0;
	c[nc].name = "io_uring";
	uring_capability(&c[nc].yes, c[nc].why, sizeof c[nc].why);
	nc++;
	c[nc].name = "O_DIRECT";
	direct_capability(dir, &c[nc].yes, c[nc].why, sizeof c[nc].why);
	nc++;
	c[nc].name = "huge pages";
	huge_capability(&c[nc].yes, c[nc].why, sizeof c[nc].why);
	nc++;
	if (gpus <= 0) {
		json_t *cu = json_object_get(out, "cuda");
		json_t *r = cu ? json_object_get(cu, "reason") : NULL;
		c[nc].name = "CUDA";
		c[nc].yes = false;
		snprintf(c[nc].why, sizeof c[nc].why, "%.500s; loads go to the CPU",
			 json_is_string(r) ? json_string_value(r) : "no CUDA device");
		nc++;
		c[nc].name = "GPUDirect Storage";
		c[nc].yes = false;
		snprintf(c[nc].why, sizeof c[nc].why, "needs a CUDA GPU with GPUDirect RDMA, and there is none");
		nc++;
	}
	if (!as_json)
		printf("host:\n");
	json_t *hj = ok ? json_object() : NULL;
	ok = ok && cli_json_put(out, "host", hj);
	for (size_t i = 0; i < nc; i++) {
		if (!as_json)
			printf("  %s: %s: %s\n", c[i].name, c[i].yes ? "yes" : "no", c[i].why);
		json_t *cj = ok ? json_object() : NULL;
		ok = ok && cli_json_put(hj, c[i].name, cj) &&
		     cli_json_put(cj, "available", json_boolean(c[i].yes)) &&
		     cli_json_put(cj, "reason", cli_json_text(c[i].why));
	}
	return ok;
}


/* The CUDA driver and every device (*count of them) into out["cuda"]. */
static bool report_cuda(json_t *out, bool as_json, bool copy_test, int *count, bool ok)
{
	int version = 0;
	char lib[256] = "";
	fst_error err;
	ok = ok && cli_json_put(out, "cuda", json_object());
	json_t *cuda = ok ? json_object_get(out, "cuda") : NULL;
	if (fst_cuda_driver(&version, count, lib, sizeof lib, &err)) {
		ok = ok && cli_json_put(cuda, "available", json_false()) &&
		     cli_json_put(cuda, "reason", cli_json_text(err.message));
		if (!as_json)
			printf("CUDA: not available: %s\n", err.message);
		return ok;
	}
	ok = ok && cli_json_put(cuda, "available", json_true()) &&
	     cli_json_put(cuda, "driver_version", json_integer(version)) &&
	     cli_json_put(cuda, "library", cli_json_text(lib));
	if (!as_json)
		printf("CUDA: driver %d.%d (%s), %d device%s\n", version / 1000, version % 1000 / 10,
		       lib, *count, *count == 1 ? "" : "s");
	ok = ok && cli_json_put(cuda, "devices", json_array());
	json_t *devs = ok ? json_object_get(cuda, "devices") : NULL;
	for (int i = 0; i < *count; i++)
		ok = report_device(i, devs, as_json, copy_test, ok);
	return ok;
}

/* What `fst load --device device` of path would choose and why, into
 * out["load"]; returns the exit code. */
static int report_load(json_t *out, const char *path, const char *device, bool as_json,
		       bool *ok)
{
	fst_checkpoint *ck;
	char why[FST_ERROR_MSG_MAX + 64];
	fst_load_opts lo;
	fst_load_opts_init(&lo);
	lo.device = device;
	fst_error err;
	if (cli_open_checkpoint(path, &ck, &err)) {
		cli_error("doctor", "%s", err.message);
		return cli_exit_code(err.code);
	}
	int rc = EXIT_OK;
	if (fst_load_explain(ck, &lo, why, sizeof why, &err)) {
		snprintf(why, sizeof why, "cannot load: %s", err.message);
		rc = cli_exit_code(err.code);
		/* on the load line, and on stderr as every failure is */
		cli_error("doctor", "%s: %s", fst_checkpoint_path(ck), why);
	}
	char hb[32];
	if (!as_json)
		printf("%s: %zu files, %zu tensors, %s\n  fst load --device %s: %s\n",
		       fst_checkpoint_path(ck),
		       fst_checkpoint_file_count(ck), fst_checkpoint_tensor_count(ck),
		       cli_human_bytes(hb, sizeof hb, fst_checkpoint_total_bytes(ck)), device, why);
	json_t *lj = *ok ? json_object() : NULL;
	*ok = cli_json_put(out, "load", lj) &&
	      cli_json_put_path(lj, "path", fst_checkpoint_path(ck)) &&
	      cli_json_put(lj, "device", cli_json_text(device)) &&
	      cli_json_put(lj, "plan", cli_json_text(why));
	fst_checkpoint_close(ck);
	return rc;
}

int cmd_doctor(int argc, char **argv)
{
	struct doctor_args a;
	bool done;
	int rc = parse_args(argc, argv, &a, &done);
	if (done)
		return rc;
	if (a.device && !a.path && (rc = check_device(a.device)))
		return rc;
	json_t *out = json_object();
	bool ok = cli_json_put(out, "version", cli_json_text(fst_version()));
	if (!a.as_json)
		printf("fst %s\n", fst_version());
	int count = 0;
	ok = report_cuda(out, a.as_json, a.copy_test, &count, ok);
	ok = report_host(out, a.path, a.as_json, count, ok);
	const char *device = a.device ? a.device : count > 0 ? "cuda:0" : "cpu";
	rc = a.path ? report_load(out, a.path, device, a.as_json, &ok) : EXIT_OK;
	if (a.as_json) {
		int jrc = cli_print_json("doctor", out, ok);
		if (rc == EXIT_OK)
			rc = jrc;
	}
	json_decref(out);
	return rc;
}
