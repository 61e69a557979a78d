/*
 * platform.c - what kind of machine a CUDA device is on: discrete (its own
 * memory behind PCIe), integrated (one memory shared with the CPU: DGX
 * Spark's GB10, Jetson) or coherent (its own memory, and host memory
 * reachable through the host's page tables over a coherent link: GH200,
 * GB200). The rule is in cuda.h and docs/platforms.md; only the driver's
 * attributes decide it.
 */
#include "cuda.h"

#include <stdio.h>

const char *fsti_platform_name(int cls)
{
	switch (cls) {
	case FSTI_PLATFORM_INTEGRATED:
		return "integrated";
	case FSTI_PLATFORM_COHERENT:
		return "coherent";
	default:
		return "discrete";
	}
}

static int attr(const struct fsti_cuda *cu, CUdevice d, int which)
{
	int v = 0;
	return cu->cuDeviceGetAttribute(&v, which, d) ? 0 : v;
}

int fsti_cuda_platform(const struct fsti_cuda *cu, int device, struct fsti_platform *out,
		       fst_error *err)
{
	*out = (struct fsti_platform){0};
	CUdevice d;
	CUresult r = cu->cuDeviceGet(&d, device);
	if (r)
		return fsti_cuda_fail(cu, r, err, "cuda:%d", device);
	out->integrated = attr(cu, d, FSTI_CU_DEVICE_ATTRIBUTE_INTEGRATED);
	out->can_map_host = attr(cu, d, FSTI_CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
	out->pageable = attr(cu, d, FSTI_CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS);
	out->host_page_tables =
		attr(cu, d, FSTI_CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES);
	out->host_pointer_registered =
		attr(cu, d, FSTI_CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
	if (out->integrated && out->can_map_host) {
		out->cls = FSTI_PLATFORM_INTEGRATED;
		snprintf(out->reason, sizeof out->reason,
			 "cuda:%d is integrated (INTEGRATED=1, CAN_MAP_HOST_MEMORY=1): one memory "
			 "shared with the CPU",
			 device);
	} else if (out->integrated) {
		out->cls = FSTI_PLATFORM_DISCRETE;
		snprintf(out->reason, sizeof out->reason,
			 "cuda:%d is integrated but cannot map host memory (CAN_MAP_HOST_MEMORY=0): "
			 "treated as discrete",
			 device);
	} else if (out->pageable && out->host_page_tables && out->host_pointer_registered &&
		   out->can_map_host) {
		out->cls = FSTI_PLATFORM_COHERENT;
		snprintf(out->reason, sizeof out->reason,
			 "cuda:%d reaches host memory coherently through the host's page tables "
			 "(PAGEABLE_MEMORY_ACCESS=1, USES_HOST_PAGE_TABLES=1)",
			 device);
	} else {
		out->cls = FSTI_PLATFORM_DISCRETE;
		snprintf(out->reason, sizeof out->reason,
			 "cuda:%d has its own memory (INTEGRATED=0, PAGEABLE_MEMORY_ACCESS=%d, "
			 "USES_HOST_PAGE_TABLES=%d)",
			 device, out->pageable, out->host_page_tables);
	}
	return 0;
}
