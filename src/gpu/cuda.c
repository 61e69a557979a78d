/*
 * cuda.c - the CUDA driver, opened with dlopen on first GPU use.
 *
 * libcuda.so.1 is the driver's versioned soname; the toolkit's stub
 * (lib64/stubs/libcuda.so) has another name and is never opened. Symbols are
 * resolved by their real, versioned names (cuMemAlloc_v2, ...), as cuda.h's
 * macros would name them. The primary context of each device is used, so
 * memory and streams are shared with PyTorch in the same process.
 */
#include "cuda.h"
#include "dl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define MIN_DRIVER_VERSION 11000 /* CUDA 11.0 */
#define MAX_DEVICES 64

static struct fsti_cuda table;
static struct fsti_dl_once loaded = FSTI_DL_ONCE_INIT;

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext contexts[MAX_DEVICES];

const char *fsti_cuda_error(const struct fsti_cuda *cu, CUresult r, char *buf, size_t size)
{
	const char *name = NULL, *text = NULL;
	if (cu && cu->cuGetErrorName)
		cu->cuGetErrorName(r, &name);
	if (cu && cu->cuGetErrorString)
		cu->cuGetErrorString(r, &text);
	snprintf(buf, size, "%s (%s)", name ? name : "CUDA error", text ? text : "no description");
	if (!name)
		snprintf(buf, size, "CUDA error %d", r);
	return buf;
}

int fsti_cuda_fail(const struct fsti_cuda *cu, CUresult r, fst_error *err, const char *fmt, ...)
{
	char what[512], why[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	/* Out of device memory is a GPU error (exit 6), not host memory. */
	return fsti_err_backend(err, FST_EDEVICE, r, "%s: %s", what,
				fsti_cuda_error(cu, r, why, sizeof why));
}

/* Resolved by their real, versioned names, in this order. */
#define SYM(f) FSTI_DL_SYM(struct fsti_cuda, f)
static const struct fsti_dl_sym syms[] = {
	SYM(cuInit),
	SYM(cuDriverGetVersion),
	SYM(cuGetErrorName),
	SYM(cuGetErrorString),
	SYM(cuDeviceGetCount),
	SYM(cuDeviceGet),
	SYM(cuDeviceGetName),
	SYM(cuDeviceTotalMem_v2),
	SYM(cuDeviceGetAttribute),
	SYM(cuDevicePrimaryCtxRetain),
	SYM(cuCtxSetCurrent),
	SYM(cuCtxGetCurrent),
	SYM(cuMemAlloc_v2),
	SYM(cuMemFree_v2),
	SYM(cuMemGetInfo_v2),
	SYM(cuMemHostAlloc),
	SYM(cuMemFreeHost),
	SYM(cuMemHostRegister_v2),
	SYM(cuMemHostUnregister),
	SYM(cuMemHostGetDevicePointer_v2),
	SYM(cuMemcpyHtoDAsync_v2),
	SYM(cuMemcpyDtoH_v2),
	SYM(cuMemcpyDtoDAsync_v2),
	SYM(cuStreamCreate),
	SYM(cuStreamDestroy_v2),
	SYM(cuStreamSynchronize),
	SYM(cuStreamQuery),
	SYM(cuMemcpy2DAsync_v2),
	SYM(cuEventCreate),
	SYM(cuEventRecord),
	SYM(cuEventQuery),
	SYM(cuEventSynchronize),
	SYM(cuEventDestroy_v2),
};
#undef SYM

static void load(void)
{
	const struct fsti_dl_lib lib = {"CUDA driver", fsti_env(FSTI_ENV_CUDA_LIBRARY),
					"libcuda.so.1", FST_EDEVICE};
	loaded.status = fsti_dl_load(&lib, syms, sizeof syms / sizeof syms[0], &table, &table.lib,
				    table.path, sizeof table.path, &loaded.error);
	if (loaded.status)
		return;
	CUresult r = table.cuInit(0);
	if (r == FSTI_CUDA_ERROR_STUB_LIBRARY) {
		loaded.status = fsti_err_backend(&loaded.error, FST_EDEVICE, r,
					        "no CUDA driver: %s is the toolkit's stub library",
					        table.path);
		return;
	}
	if (r != FSTI_CUDA_SUCCESS) {
		loaded.status = fsti_cuda_fail(&table, r, &loaded.error,
					      "no usable CUDA driver: cuInit failed");
		return;
	}
	table.cuDriverGetVersion(&table.driver_version);
	if (table.driver_version < MIN_DRIVER_VERSION) {
		loaded.status = fsti_err(&loaded.error, FST_EDEVICE,
				        "CUDA driver version %d.%d is older than the 11.0 libfst needs",
				        table.driver_version / 1000, table.driver_version % 1000 / 10);
		return;
	}
	loaded.status = 0;
}

int fsti_cuda_get(const struct fsti_cuda **out, fst_error *err)
{
	int rc = fsti_dl_once(&loaded, load, err);
	*out = rc ? NULL : &table;
	return rc;
}

int fsti_cuda_use_device(const struct fsti_cuda *cu, int device, fst_error *err)
{
	int n = 0;
	CUresult r = cu->cuDeviceGetCount(&n);
	if (r)
		return fsti_cuda_fail(cu, r, err, "cuDeviceGetCount");
	if (device < 0 || device >= n)
		return fsti_err(err, FST_EDEVICE, "device %d out of range (%d device%s)", device, n,
				n == 1 ? "" : "s");
	if (device >= MAX_DEVICES)
		return fsti_err(err, FST_EUNSUPPORTED, "device %d: at most %d devices", device,
				MAX_DEVICES);
	pthread_mutex_lock(&ctx_lock);
	CUcontext ctx = contexts[device];
	if (!ctx) {
		CUdevice d;
		r = cu->cuDeviceGet(&d, device);
		if (!r)
			r = cu->cuDevicePrimaryCtxRetain(&ctx, d);
		if (!r)
			contexts[device] = ctx;
	}
	pthread_mutex_unlock(&ctx_lock);
	if (r)
		return fsti_cuda_fail(cu, r, err, "cuda:%d: cannot retain the primary context",
				      device);
	r = cu->cuCtxSetCurrent(ctx);
	if (r)
		return fsti_cuda_fail(cu, r, err, "cuda:%d: cannot make the context current",
				      device);
	return 0;
}

void *fsti_cuda_save(void)
{
	const struct fsti_cuda *cu;
	CUcontext ctx = NULL;
	if (!fsti_cuda_get(&cu, NULL))
		cu->cuCtxGetCurrent(&ctx);
	return ctx;
}

void fsti_cuda_restore(void *ctx)
{
	const struct fsti_cuda *cu;
	if (!fsti_cuda_get(&cu, NULL))
		cu->cuCtxSetCurrent((CUcontext)ctx);
}
