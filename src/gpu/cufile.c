/*
 * cufile.c - libcufile.so.0 (GPUDirect Storage), opened with dlopen on the
 * first probe of a device; FST_CUFILE_LIBRARY names another file. Opening
 * the library opens nothing else: the cuFile driver is the probe's to open.
 */
#include "cufile.h"
#include "dl.h"

#include <stdio.h>

static struct fsti_cufile table;
static struct fsti_dl_once loaded = FSTI_DL_ONCE_INIT;

const char *fsti_cufile_error_name(int err, char *buf, size_t size)
{
	static const char *const names[] = {
		[1] = "CU_FILE_DRIVER_NOT_INITIALIZED", [2] = "CU_FILE_DRIVER_INVALID_PROPS",
		[3] = "CU_FILE_DRIVER_UNSUPPORTED_LIMIT", [4] = "CU_FILE_DRIVER_VERSION_MISMATCH",
		[5] = "CU_FILE_DRIVER_VERSION_READ_ERROR", [6] = "CU_FILE_DRIVER_CLOSING",
		[7] = "CU_FILE_PLATFORM_NOT_SUPPORTED", [8] = "CU_FILE_IO_NOT_SUPPORTED",
		[9] = "CU_FILE_DEVICE_NOT_SUPPORTED", [10] = "CU_FILE_NVFS_DRIVER_ERROR",
		[11] = "CU_FILE_CUDA_DRIVER_ERROR", [12] = "CU_FILE_CUDA_POINTER_INVALID",
		[13] = "CU_FILE_CUDA_MEMORY_TYPE_INVALID", [14] = "CU_FILE_CUDA_POINTER_RANGE_ERROR",
		[15] = "CU_FILE_CUDA_CONTEXT_MISMATCH", [16] = "CU_FILE_INVALID_MAPPING_SIZE",
		[17] = "CU_FILE_INVALID_MAPPING_RANGE", [18] = "CU_FILE_INVALID_FILE_TYPE",
		[19] = "CU_FILE_INVALID_FILE_OPEN_FLAG", [20] = "CU_FILE_DIO_NOT_SET",
		[22] = "CU_FILE_INVALID_VALUE", [23] = "CU_FILE_MEMORY_ALREADY_REGISTERED",
		[24] = "CU_FILE_MEMORY_NOT_REGISTERED", [25] = "CU_FILE_PERMISSION_DENIED",
		[26] = "CU_FILE_DRIVER_ALREADY_OPEN", [27] = "CU_FILE_HANDLE_NOT_REGISTERED",
		[28] = "CU_FILE_HANDLE_ALREADY_REGISTERED", [29] = "CU_FILE_DEVICE_NOT_FOUND",
		[30] = "CU_FILE_INTERNAL_ERROR", [31] = "CU_FILE_GETNEWFD_FAILED",
		[33] = "CU_FILE_NVFS_SETUP_ERROR", [34] = "CU_FILE_IO_DISABLED",
	};
	int k = err - 5000;
	const char *name = k > 0 && k < (int)(sizeof names / sizeof names[0]) && names[k]
				   ? names[k]
				   : "cuFile error";
	snprintf(buf, size, "%d (%s)", err, name);
	return buf;
}

#define SYM(f) FSTI_DL_SYM(struct fsti_cufile, f)
static const struct fsti_dl_sym syms[] = {
	SYM(cuFileDriverOpen),
	/* cuda 12+ names the close _v2; older libraries have the plain name */
	{"cuFileDriverClose_v2", "cuFileDriverClose",
	 offsetof(struct fsti_cufile, cuFileDriverClose), false},
	SYM(cuFileDriverGetProperties),
	SYM(cuFileHandleRegister),
	SYM(cuFileHandleDeregister),
	SYM(cuFileBufRegister),
	SYM(cuFileBufDeregister),
	SYM(cuFileRead),
};
#undef SYM

static void load(void)
{
	const struct fsti_dl_lib lib = {"cuFile library", fsti_env(FSTI_ENV_CUFILE_LIBRARY),
					"libcufile.so.0", FST_EUNSUPPORTED};
	loaded.status = fsti_dl_load(&lib, syms, sizeof syms / sizeof syms[0], &table, &table.lib,
				    table.path, sizeof table.path, &loaded.error);
}

int fsti_cufile_get(const struct fsti_cufile **out, fst_error *err)
{
	int rc = fsti_dl_once(&loaded, load, err);
	*out = rc ? NULL : &table;
	return rc;
}
