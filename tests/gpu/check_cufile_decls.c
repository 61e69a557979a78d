/*
 * Description: our cuFile declarations (src/gpu/cufile_decls.h) against the
 * real cufile.h: sizes, field offsets, constants and function types. Built
 * and run on a machine with the CUDA toolkit's cufile.h:
 *   cc -std=c11 -I/usr/local/cuda/include -iquote src \
 *      tests/gpu/check_cufile_decls.c -L/usr/local/cuda/lib64 -lcufile -o check && ./check
 */
#define _GNU_SOURCE /* cufile.h uses loff_t */
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#include <cufile.h>

#include "cufile_decls.h"

#define SAME_LAYOUT(ours, theirs, field) \
	_Static_assert(offsetof(ours, field) == offsetof(theirs, field), #field " moved")

_Static_assert(sizeof(fsti_cufile_error) == sizeof(CUfileError_t), "CUfileError_t size");
SAME_LAYOUT(fsti_cufile_error, CUfileError_t, err);
SAME_LAYOUT(fsti_cufile_error, CUfileError_t, cu_err);
_Static_assert(sizeof(fsti_cufile_descr) == sizeof(CUfileDescr_t), "CUfileDescr_t size");
SAME_LAYOUT(fsti_cufile_descr, CUfileDescr_t, type);
SAME_LAYOUT(fsti_cufile_descr, CUfileDescr_t, handle.fd);
SAME_LAYOUT(fsti_cufile_descr, CUfileDescr_t, fs_ops);
_Static_assert(offsetof(fsti_cufile_descr, handle.fd) == 8, "fd at offset 8");
SAME_LAYOUT(fsti_cufile_props, CUfileDrvProps_t, nvfs.major_version);
SAME_LAYOUT(fsti_cufile_props, CUfileDrvProps_t, nvfs.minor_version);
_Static_assert(sizeof(CUfileDrvProps_t) <= sizeof(fsti_cufile_props), "props room");
_Static_assert(FSTI_CU_FILE_HANDLE_TYPE_OPAQUE_FD == CU_FILE_HANDLE_TYPE_OPAQUE_FD, "fd type");
_Static_assert(FSTI_CU_FILE_SUCCESS == CU_FILE_SUCCESS, "success");
_Static_assert(FSTI_CU_FILE_HANDLE_NOT_REGISTERED == CU_FILE_HANDLE_NOT_REGISTERED, "5027");
_Static_assert(FSTI_CU_FILE_INVALID_MAPPING_SIZE == CU_FILE_INVALID_MAPPING_SIZE, "5016");

/* Function types: each assignment must compile without a cast. */
static void types(void)
{
	ssize_t (*read_fn)(CUfileHandle_t, void *, size_t, off_t, off_t) = cuFileRead;
	CUfileError_t (*open_fn)(void) = cuFileDriverOpen;
	CUfileError_t (*reg)(CUfileHandle_t *, CUfileDescr_t *) = cuFileHandleRegister;
	void (*dereg)(CUfileHandle_t) = cuFileHandleDeregister;
	CUfileError_t (*props)(CUfileDrvProps_t *) = cuFileDriverGetProperties;
	CUfileError_t (*breg)(const void *, size_t, int) = cuFileBufRegister;
	CUfileError_t (*bdereg)(const void *) = cuFileBufDeregister;
	(void)read_fn, (void)open_fn, (void)reg, (void)dereg, (void)props, (void)breg, (void)bdereg;
}

int main(void)
{
	(void)types;
	printf("cuFile declarations match cufile.h (CUfileDrvProps_t is %zu bytes, ours %zu)\n",
	       sizeof(CUfileDrvProps_t), sizeof(fsti_cufile_props));
	printf("1 passed, 0 failed\n");
	return 0;
}
