/*
 * cuda.h - the CUDA driver API as libfst uses it: our own declarations of
 * the few types and constants we need (checked against the real cuda.h by
 * tests/unit/test_cuda_decls.c), and a table of functions resolved from
 * libcuda.so.1 with dlopen on first use. No link-time GPU dependency.
 */
#ifndef FST_CUDA_H
#define FST_CUDA_H

#include "base.h"

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;

#define FSTI_CUDA_SUCCESS 0
#define FSTI_CUDA_ERROR_OUT_OF_MEMORY 2
#define FSTI_CUDA_ERROR_STUB_LIBRARY 34
#define FSTI_CUDA_ERROR_NOT_READY 600
#define FSTI_CU_DEVICE_ATTRIBUTE_MAX_PITCH 11
#define FSTI_CU_DEVICE_ATTRIBUTE_INTEGRATED 18
#define FSTI_CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY 19
#define FSTI_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define FSTI_CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34
#define FSTI_CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID 50
#define FSTI_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define FSTI_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define FSTI_CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS 88
#define FSTI_CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM 91
#define FSTI_CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES 100
#define FSTI_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED 116
#define FSTI_CU_STREAM_NON_BLOCKING 0x1
#define FSTI_CU_EVENT_DISABLE_TIMING 0x2
#define FSTI_CU_MEMHOSTALLOC_PORTABLE 0x1
#define FSTI_CU_MEMHOSTALLOC_DEVICEMAP 0x2
#define FSTI_CU_MEMHOSTREGISTER_PORTABLE 0x1
#define FSTI_CU_MEMORYTYPE_DEVICE 0x2

/* CUDA_MEMCPY2D (the _v2 layout): a strided copy, for tensor-parallel
 * slices along inner dimensions. */
typedef struct fsti_memcpy2d {
	size_t srcXInBytes, srcY;
	int srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	void *srcArray;
	size_t srcPitch;
	size_t dstXInBytes, dstY;
	int dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	void *dstArray;
	size_t dstPitch;
	size_t WidthInBytes, Height;
} fsti_memcpy2d;

/* The driver functions, by their real (versioned) symbol names. */
struct fsti_cuda {
	void *lib;
	char path[256];
	int driver_version;
	CUresult (*cuInit)(unsigned flags);
	CUresult (*cuDriverGetVersion)(int *version);
	CUresult (*cuGetErrorName)(CUresult e, const char **s);
	CUresult (*cuGetErrorString)(CUresult e, const char **s);
	CUresult (*cuDeviceGetCount)(int *n);
	CUresult (*cuDeviceGet)(CUdevice *d, int ordinal);
	CUresult (*cuDeviceGetName)(char *name, int len, CUdevice d);
	CUresult (*cuDeviceTotalMem_v2)(size_t *bytes, CUdevice d);
	CUresult (*cuDeviceGetAttribute)(int *v, int attr, CUdevice d);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice d);
	CUresult (*cuCtxSetCurrent)(CUcontext ctx);
	CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
	CUresult (*cuMemAlloc_v2)(CUdeviceptr *p, size_t bytes);
	CUresult (*cuMemFree_v2)(CUdeviceptr p);
	CUresult (*cuMemGetInfo_v2)(size_t *free_bytes, size_t *total);
	CUresult (*cuMemHostAlloc)(void **p, size_t bytes, unsigned flags);
	CUresult (*cuMemFreeHost)(void *p);
	CUresult (*cuMemHostRegister_v2)(void *p, size_t bytes, unsigned flags);
	CUresult (*cuMemHostUnregister)(void *p);
	CUresult (*cuMemHostGetDevicePointer_v2)(CUdeviceptr *d, void *p, unsigned flags);
	CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr dst, const void *src, size_t bytes,
					 CUstream s);
	CUresult (*cuMemcpyDtoH_v2)(void *dst, CUdeviceptr src, size_t bytes);
	CUresult (*cuMemcpyDtoDAsync_v2)(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
					 CUstream s);
	CUresult (*cuStreamCreate)(CUstream *s, unsigned flags);
	CUresult (*cuStreamDestroy_v2)(CUstream s);
	CUresult (*cuStreamSynchronize)(CUstream s);
	CUresult (*cuStreamQuery)(CUstream s);
	CUresult (*cuMemcpy2DAsync_v2)(const fsti_memcpy2d *copy, CUstream s);
	CUresult (*cuEventCreate)(CUevent *e, unsigned flags);
	CUresult (*cuEventRecord)(CUevent e, CUstream s);
	CUresult (*cuEventQuery)(CUevent e);
	CUresult (*cuEventSynchronize)(CUevent e);
	CUresult (*cuEventDestroy_v2)(CUevent e);
};

/* Load the driver once per process (FST_CUDA_LIBRARY names another library,
 * for tests) and cuInit it. Returns 0 with *out, or the error code (always
 * the same one) with *out NULL and err filled when there is no driver. */
int fsti_cuda_get(const struct fsti_cuda **out, fst_error *err);

/* Make device's primary context current on this thread (retained once per
 * process and device, shared with PyTorch and any other user). */
int fsti_cuda_use_device(const struct fsti_cuda *cu, int device, fst_error *err);

/* The calling thread's current context, to give back with
 * fsti_cuda_restore: public calls leave the caller's thread as they found it
 * (PyTorch takes its current device from it). NULL when no driver is loaded. */
void *fsti_cuda_save(void);
void fsti_cuda_restore(void *ctx);

/*
 * What kind of machine a device is on (platform.c), from its attributes:
 *  - integrated: INTEGRATED = 1 and CAN_MAP_HOST_MEMORY = 1. The GPU has no
 *    memory of its own (DGX Spark's GB10, Jetson): host memory mapped for it
 *    is the same memory a device allocation would be.
 *  - coherent: not integrated, and PAGEABLE_MEMORY_ACCESS = 1,
 *    PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 1,
 *    CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 1 and CAN_MAP_HOST_MEMORY = 1:
 *    a cache-coherent CPU-GPU link with address translation through the
 *    host's page tables (GH200, GB200 over NVLink-C2C). x86 machines with HMM
 *    report pageable access through software faults, not the host's page
 *    tables (attribute 100 = 0), and stay discrete.
 *  - discrete: everything else (PCIe GPUs with their own memory).
 */
enum fsti_platform_class {
	FSTI_PLATFORM_DISCRETE,
	FSTI_PLATFORM_INTEGRATED,
	FSTI_PLATFORM_COHERENT,
};
struct fsti_platform {
	int cls; /* enum fsti_platform_class */
	int integrated, can_map_host, pageable, host_page_tables, host_pointer_registered;
	char reason[256]; /* the attributes that decided, for logs and fst doctor */
};
/* Classify device (its attributes; the driver loaded). */
int fsti_cuda_platform(const struct fsti_cuda *cu, int device, struct fsti_platform *out,
		       fst_error *err);
/* "discrete", "integrated" or "coherent". */
const char *fsti_platform_name(int cls);

/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for messages. */
const char *fsti_cuda_error(const struct fsti_cuda *cu, CUresult r, char *buf, size_t size);

/* Fill err with a message "what: CUDA_ERROR_X (text)" and FST_EDEVICE. */
int fsti_cuda_fail(const struct fsti_cuda *cu, CUresult r, fst_error *err, const char *fmt, ...)
	FSTI_PRINTF(4, 5);

#endif
