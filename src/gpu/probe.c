/*
 * probe.c - may this device use GPUDirect Storage for real?
 *
 * The founding lesson: a machine can have libcufile installed, a GPU whose
 * GPU_DIRECT_RDMA_SUPPORTED attribute reads 1, a cuFileDriverOpen that
 * succeeds, and still no peer-to-peer DMA (no nvidia-fs: cuFile silently
 * runs in compatibility mode, or fails every cuFileHandleRegister with
 * 5027). So `auto` asks everything, in order, and uses cuFile only when all
 * of it says yes; each file is then registered on its own and falls back
 * alone. The cuFile driver is never opened where /dev/nvidia-fs* is missing
 * (its error path there has been seen to close fd 0, and opening it creates
 * contexts on every visible GPU), unless FST_GDS_TRY=1 asks for it to
 * exercise the fallback.
 */
#include "cufile.h"

#include <glob.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEVICES 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fsti_gds_probe probes[MAX_DEVICES];
static bool probed[MAX_DEVICES];
static int driver_state = -1; /* -1 untried, 0 open, else the error */

static bool nvfs_devices_present(void)
{
	const char *pattern = fsti_env(FSTI_ENV_NVFS_DEVICES);
	if (!pattern)
		pattern = "/dev/nvidia-fs*";
	glob_t g;
	bool found = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc > 0;
	globfree(&g);
	return found;
}

/* allow_compat_mode from cufile.json (which allows // comments). */
static int compat_allowed(void)
{
	const char *path = fsti_env(FSTI_ENV_CUFILE_JSON);
	if (!path)
		path = "/etc/cufile.json";
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	char *text = NULL;
	size_t n = 0, cap = 0;
	int c;
	bool in_string = false;
	while ((c = fgetc(f)) != EOF) {
		if (c == '"' && (n == 0 || text[n - 1] != '\\'))
			in_string = !in_string;
		if (!in_string && c == '/') {
			int d = fgetc(f);
			if (d == '/') {
				while ((c = fgetc(f)) != EOF && c != '\n') {
				}
				if (c == EOF)
					break;
			} else if (d != EOF) {
				ungetc(d, f);
			}
		}
		if (n + 2 > cap) {
			cap = cap ? cap * 2 : 4096;
			char *g = fsti_realloc(text, cap);
			if (!g) {
				fsti_free(text);
				fclose(f);
				return -1;
			}
			text = g;
		}
		text[n++] = (char)c;
	}
	fclose(f);
	int result = -1;
	json_t *root = text ? json_loadb(text, n, 0, NULL) : NULL;
	json_t *v = root ? json_object_get(json_object_get(root, "properties"), "allow_compat_mode")
			 : NULL;
	if (json_is_boolean(v))
		result = json_is_true(v);
	json_decref(root);
	fsti_free(text);
	return result;
}

const struct fsti_gds_probe *fsti_gds_probe(const struct fsti_cuda *cu, int device)
{
	if (device < 0 || device >= MAX_DEVICES)
		return NULL;
	pthread_mutex_lock(&lock);
	struct fsti_gds_probe *p = &probes[device];
	if (probed[device]) {
		pthread_mutex_unlock(&lock);
		return p;
	}
	memset(p, 0, sizeof *p);
	const struct fsti_cufile *cf;
	fst_error lib_error;
	p->library = fsti_cufile_get(&cf, &lib_error) == 0;
	CUdevice d;
	int integrated = 0;
	if (cu->cuDeviceGet(&d, device) == 0) {
		cu->cuDeviceGetAttribute(&integrated, FSTI_CU_DEVICE_ATTRIBUTE_INTEGRATED, d);
		cu->cuDeviceGetAttribute(&p->rdma, FSTI_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
					 d);
	}
	p->integrated = integrated != 0;
	p->nvfs_devices = nvfs_devices_present();
	p->compat_allowed = compat_allowed();
	bool try_anyway = fsti_env_gds_try();
	if (p->library && (p->nvfs_devices || try_anyway)) {
		if (driver_state < 0) {
			driver_state = cf->cuFileDriverOpen().err;
		}
		p->driver_opened = driver_state == 0;
		p->driver_error = driver_state;
		if (p->driver_opened) {
			fsti_cufile_props props;
			memset(&props, 0, sizeof props);
			if (cf->cuFileDriverGetProperties(&props).err == 0) {
				p->nvfs_major = props.nvfs.major_version;
				p->nvfs_minor = props.nvfs.minor_version;
			}
			p->cf = cf;
		}
	}
	char code[64];
	if (!p->library)
		snprintf(p->reason, sizeof p->reason, "%.*s", (int)sizeof p->reason - 1,
			 lib_error.message);
	else if (p->integrated)
		snprintf(p->reason, sizeof p->reason,
			 "cuda:%d is integrated (it shares memory with the host): GPUDirect Storage "
			 "does not apply",
			 device);
	else if (p->rdma != 1)
		snprintf(p->reason, sizeof p->reason,
			 "cuda:%d does not support GPUDirect RDMA (GPU_DIRECT_RDMA_SUPPORTED = %d)",
			 device, p->rdma);
	else if (!p->nvfs_devices && !try_anyway)
		snprintf(p->reason, sizeof p->reason,
			 "no /dev/nvidia-fs* (the nvidia-fs module is not loaded): cuFile could "
			 "only run in compatibility mode, so the cuFile driver was not opened");
	else if (!p->driver_opened)
		snprintf(p->reason, sizeof p->reason, "cuFileDriverOpen failed with %s",
			 fsti_cufile_error_name(p->driver_error, code, sizeof code));
	else if (!p->nvfs_major && !p->nvfs_minor)
		snprintf(p->reason, sizeof p->reason,
			 "cuFile reports nvidia-fs version 0.0: compatibility mode only, no "
			 "peer-to-peer DMA%s",
			 p->nvfs_devices ? "" : " (and no /dev/nvidia-fs*)");
	else if (!p->nvfs_devices)
		snprintf(p->reason, sizeof p->reason, "no /dev/nvidia-fs*");
	else {
		p->usable = true;
		snprintf(p->reason, sizeof p->reason,
			 "nvidia-fs %u.%u and GPUDirect RDMA on cuda:%d: peer-to-peer DMA available",
			 p->nvfs_major, p->nvfs_minor, device);
	}
	probed[device] = true;
	pthread_mutex_unlock(&lock);
	return p;
}

int fst_gds_probe(int device, fst_gds_report *out, fst_error *err)
{
	fsti_err_clear(err);
	if (!out)
		return fsti_err(err, FST_EUSAGE, "fst_gds_probe: out is required");
	memset(out, 0, sizeof *out);
	const struct fsti_cuda *cu;
	int rc = fsti_cuda_get(&cu, err);
	if (rc)
		return rc;
	void *saved = fsti_cuda_save();
	rc = fsti_cuda_use_device(cu, device, err);
	const struct fsti_gds_probe *p = rc ? NULL : fsti_gds_probe(cu, device);
	fsti_cuda_restore(saved);
	if (rc)
		return rc;
	if (!p)
		return fsti_err(err, FST_EUSAGE, "device %d out of range", device);
	out->library = p->library;
	out->integrated = p->integrated;
	out->gpu_direct_rdma = p->rdma;
	out->nvfs_devices = p->nvfs_devices;
	out->driver_opened = p->driver_opened;
	out->driver_error = p->driver_error;
	out->nvfs_major = p->nvfs_major;
	out->nvfs_minor = p->nvfs_minor;
	out->compat_allowed = p->compat_allowed;
	out->usable = p->usable;
	snprintf(out->reason, sizeof out->reason, "%s", p->reason);
	return 0;
}

int fst_platform_probe(int device, fst_platform_report *out, fst_error *err)
{
	fsti_err_clear(err);
	if (!out)
		return fsti_err(err, FST_EUSAGE, "fst_platform_probe: out is required");
	memset(out, 0, sizeof *out);
	const struct fsti_cuda *cu;
	int rc = fsti_cuda_get(&cu, err);
	if (rc)
		return rc;
	void *saved = fsti_cuda_save();
	struct fsti_platform p;
	rc = fsti_cuda_use_device(cu, device, err);
	if (!rc)
		rc = fsti_cuda_platform(cu, device, &p, err);
	fsti_cuda_restore(saved);
	if (rc)
		return rc;
	out->platform = p.cls;
	out->integrated = p.integrated;
	out->can_map_host_memory = p.can_map_host;
	out->pageable_memory_access = p.pageable;
	out->uses_host_page_tables = p.host_page_tables;
	out->host_pointer_registered = p.host_pointer_registered;
	out->unified_by_default = p.cls == FSTI_PLATFORM_INTEGRATED;
	snprintf(out->name, sizeof out->name, "%s", fsti_platform_name(p.cls));
	snprintf(out->reason, sizeof out->reason, "%s", p.reason);
	return 0;
}
