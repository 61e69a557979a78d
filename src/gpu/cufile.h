/*
 * cufile.h - cuFile (GPUDirect Storage) as libfst uses it: the function
 * table of libcufile.so.0, opened with dlopen on first use
 * (FST_CUFILE_LIBRARY names another file; cufile.c), and the probe's
 * findings (probe.c).
 */
#ifndef FST_CUFILE_H
#define FST_CUFILE_H

#include "cuda.h"

#include "cufile_decls.h"

struct fsti_cufile {
	void *lib;
	char path[256];
	fsti_cufile_error (*cuFileDriverOpen)(void);
	fsti_cufile_error (*cuFileDriverClose)(void);
	fsti_cufile_error (*cuFileDriverGetProperties)(fsti_cufile_props *props);
	fsti_cufile_error (*cuFileHandleRegister)(fsti_cufile_handle *fh, fsti_cufile_descr *d);
	void (*cuFileHandleDeregister)(fsti_cufile_handle fh);
	fsti_cufile_error (*cuFileBufRegister)(const void *base, size_t len, int flags);
	fsti_cufile_error (*cuFileBufDeregister)(const void *base);
	ssize_t (*cuFileRead)(fsti_cufile_handle fh, void *base, size_t size, off_t file_offset,
			      off_t buf_offset);
};

/* Load libcufile once per process: 0 with *out, else the error code with
 * *out NULL and err filled. Opens the library only, never the driver. */
int fsti_cufile_get(const struct fsti_cufile **out, fst_error *err);

/* "5027 (CU_FILE_HANDLE_NOT_REGISTERED)" */
const char *fsti_cufile_error_name(int err, char *buf, size_t size);

/* What the probe found for one device, and the decision under gds=auto. */
struct fsti_gds_probe {
	bool library;          /* libcufile could be loaded */
	bool integrated;       /* unified memory: never GDS */
	int rdma;              /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED */
	bool nvfs_devices;     /* /dev/nvidia-fs* present */
	bool driver_opened;    /* cuFileDriverOpen succeeded */
	int driver_error;      /* its error otherwise */
	unsigned nvfs_major, nvfs_minor;
	int compat_allowed;    /* cufile.json allow_compat_mode: 1, 0, -1 unknown */
	bool usable;           /* real peer-to-peer DMA: auto would use cuFile */
	char reason[512];      /* why not, or what was found */
	const struct fsti_cufile *cf; /* the table when the driver is open */
};

/* Probe device once per process (cached); never opens the cuFile driver
 * where /dev/nvidia-fs* is missing, unless FST_GDS_TRY=1 asks to. */
const struct fsti_gds_probe *fsti_gds_probe(const struct fsti_cuda *cu, int device);

#endif
