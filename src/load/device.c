/* device.c - public questions about CUDA devices, and copying loaded bytes
 * back to the host. */
#include "cuda.h"
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "nothing saved": a CPU copy never touches the driver */
#define NO_CONTEXT ((void *)-1)

int fst_cuda_driver(int *version, int *count, char *library, size_t size, fst_error *err)
{
	fsti_err_clear(err);
	const struct fsti_cuda *cu;
	int rc = fsti_cuda_get(&cu, err);
	if (rc)
		return rc;
	if (version)
		*version = cu->driver_version;
	if (count) {
		CUresult r = cu->cuDeviceGetCount(count);
		if (r)
			return fsti_cuda_fail(cu, r, err, "cuDeviceGetCount");
	}
	if (library && size)
		snprintf(library, size, "%s", cu->path);
	return 0;
}

/* PCIe link from sysfs: "32.0 GT/s PCIe" -> generation 5. */
static void pcie_link(const char *bus_id, int *gen, int *width)
{
	char path[128], buf[64], lower[32];
	size_t i = 0;
	for (; bus_id[i] && i + 1 < sizeof lower; i++)
		lower[i] = (char)(bus_id[i] >= 'A' && bus_id[i] <= 'F' ? bus_id[i] + 32 : bus_id[i]);
	lower[i] = '\0';
	*gen = *width = 0;
	snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/current_link_speed", lower);
	if (fsti_read_first_line(path, buf, sizeof buf)) {
		double gts = atof(buf);
		*gen = gts >= 60 ? 6 : gts >= 30 ? 5 : gts >= 15 ? 4 : gts >= 7 ? 3
		     : gts >= 4 ? 2 : gts > 0 ? 1 : 0;
	}
	snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/current_link_width", lower);
	if (fsti_read_first_line(path, buf, sizeof buf))
		*width = atoi(buf);
}

static int fst_cuda_device_info_impl(int index, fst_cuda_device *out, fst_error *err)
{
	fsti_err_clear(err);
	if (!out)
		return fsti_err(err, FST_EUSAGE, "fst_cuda_device_info: out is required");
	memset(out, 0, sizeof *out);
	const struct fsti_cuda *cu;
	int rc = fsti_cuda_get(&cu, err);
	if (!rc)
		rc = fsti_cuda_use_device(cu, index, err);
	if (rc)
		return rc;
	CUdevice d;
	CUresult r = cu->cuDeviceGet(&d, index);
	if (r)
		return fsti_cuda_fail(cu, r, err, "cuDeviceGet(%d)", index);
	out->index = index;
	cu->cuDeviceGetName(out->name, sizeof out->name, d);
	size_t total = 0, free_bytes = 0;
	cu->cuDeviceTotalMem_v2(&total, d);
	cu->cuMemGetInfo_v2(&free_bytes, &total);
	out->total_memory = total;
	out->free_memory = free_bytes;
	int dom = 0, bus = 0, dev = 0;
	cu->cuDeviceGetAttribute(&out->integrated, FSTI_CU_DEVICE_ATTRIBUTE_INTEGRATED, d);
	cu->cuDeviceGetAttribute(&out->gpu_direct_rdma,
				 FSTI_CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, d);
	cu->cuDeviceGetAttribute(&out->compute_major,
				 FSTI_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
	cu->cuDeviceGetAttribute(&out->compute_minor,
				 FSTI_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
	cu->cuDeviceGetAttribute(&dom, FSTI_CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d);
	cu->cuDeviceGetAttribute(&bus, FSTI_CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d);
	cu->cuDeviceGetAttribute(&dev, FSTI_CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d);
	snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "%04x:%02x:%02x.0", dom & 0xFFFF,
		 bus & 0xFF, dev & 0xFF);
	pcie_link(out->pci_bus_id, &out->pcie_gen, &out->pcie_width);
	return 0;
}

static int fst_cuda_h2d_bandwidth_impl(int index, uint64_t bytes, double *gbps, fst_error *err)
{
	fsti_err_clear(err);
	if (!gbps || bytes < (1u << 20))
		return fsti_err(err, FST_EUSAGE, "fst_cuda_h2d_bandwidth: at least 1 MiB");
	const struct fsti_cuda *cu;
	int rc = fsti_cuda_get(&cu, err);
	if (!rc)
		rc = fsti_cuda_use_device(cu, index, err);
	if (rc)
		return rc;
	const size_t piece = 16u << 20;
	void *host = NULL;
	CUdeviceptr dev = 0;
	CUstream s = NULL;
	CUresult r = cu->cuMemHostAlloc(&host, (size_t)bytes, FSTI_CU_MEMHOSTALLOC_PORTABLE);
	if (r) {
		host = NULL;
		rc = fsti_cuda_fail(cu, r, err, "cannot allocate pinned memory");
		goto out;
	}
	memset(host, 0x5A, (size_t)bytes);
	if ((r = cu->cuMemAlloc_v2(&dev, (size_t)bytes))) {
		dev = 0;
		rc = fsti_cuda_fail(cu, r, err, "cuda:%d: cannot allocate device memory", index);
		goto out;
	}
	if ((r = cu->cuStreamCreate(&s, FSTI_CU_STREAM_NON_BLOCKING))) {
		s = NULL;
		rc = fsti_cuda_fail(cu, r, err, "cannot create a stream");
		goto out;
	}
	double best = 0;
	for (int run = 0; run < 3 && !r; run++) {
		double t0 = fsti_now();
		for (uint64_t off = 0; off < bytes && !r; off += piece)
			r = cu->cuMemcpyHtoDAsync_v2(dev + off, (char *)host + off,
						     (size_t)FSTI_MIN((uint64_t)piece, bytes - off), s);
		if (!r)
			r = cu->cuStreamSynchronize(s);
		double rate = (double)bytes / (fsti_now() - t0) / 1e9;
		best = FSTI_MAX(best, rate);
	}
	if (r)
		rc = fsti_cuda_fail(cu, r, err, "host-to-device copy failed");
	*gbps = best;
out:
	if (s)
		cu->cuStreamDestroy_v2(s);
	if (dev)
		cu->cuMemFree_v2(dev);
	if (host)
		cu->cuMemFreeHost(host);
	return rc;
}

static int fst_copy_to_host_impl(const fst_tensor_view *v, uint64_t offset, void *dst, uint64_t len,
			   fst_error *err)
{
	fsti_err_clear(err);
	if (!v || !dst || offset > v->nbytes || len > v->nbytes - offset)
		return fsti_err(err, FST_EUSAGE,
				"fst_copy_to_host: range outside tensor \"%s\"",
				v && v->name ? v->name : "");
	if (v->device_type == FST_DEVICE_CPU) {
		memcpy(dst, (const char *)v->data + offset, (size_t)len);
		return 0;
	}
	const struct fsti_cuda *cu;
	int rc = fsti_cuda_get(&cu, err);
	if (!rc)
		rc = fsti_cuda_use_device(cu, v->device_id, err);
	if (rc)
		return rc;
	CUresult r = cu->cuMemcpyDtoH_v2(dst, (CUdeviceptr)(uintptr_t)v->data + offset, (size_t)len);
	if (r)
		return fsti_cuda_fail(cu, r, err, "tensor \"%s\": copy from cuda:%d failed", v->name,
				      v->device_id);
	return 0;
}

int fst_cuda_device_info(int index, fst_cuda_device *out, fst_error *err)
{
	/* leave the caller's thread on the context it had */
	void *saved = fsti_cuda_save();
	int rc = fst_cuda_device_info_impl(index, out, err);
	if (saved != NO_CONTEXT)
		fsti_cuda_restore(saved);
	return rc;
}

int fst_cuda_h2d_bandwidth(int index, uint64_t bytes, double *gbps, fst_error *err)
{
	/* leave the caller's thread on the context it had */
	void *saved = fsti_cuda_save();
	int rc = fst_cuda_h2d_bandwidth_impl(index, bytes, gbps, err);
	if (saved != NO_CONTEXT)
		fsti_cuda_restore(saved);
	return rc;
}

int fst_copy_to_host(const fst_tensor_view *v, uint64_t offset, void *dst, uint64_t len,
		     fst_error *err)
{
	/* leave the caller's thread on the context it had */
	void *saved = v && v->device_type == FST_DEVICE_CPU ? NO_CONTEXT : fsti_cuda_save();
	int rc = fst_copy_to_host_impl(v, offset, dst, len, err);
	if (saved != NO_CONTEXT)
		fsti_cuda_restore(saved);
	return rc;
}
