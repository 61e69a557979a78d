/*
 * cufile_decls.h - our own declarations of the cuFile types and constants
 * libfst needs: the CI machine has no cufile.h. Kept free of any other
 * header of ours so tests/gpu/check_cufile_decls.c can compile it beside
 * the real cufile.h and check every size, offset and value.
 */
#ifndef FST_CUFILE_DECLS_H
#define FST_CUFILE_DECLS_H

#include <stddef.h>
#include <sys/types.h>

/* CUfileError_t: returned by value. */
typedef struct fsti_cufile_error {
	int err;    /* CUfileOpError: 0 success, 5000 + n for cuFile errors */
	int cu_err; /* CUresult when err says a CUDA call failed */
} fsti_cufile_error;

/* CUfileDescr_t: the descriptor is at offset 8. */
typedef struct fsti_cufile_descr {
	int type; /* 1: CU_FILE_HANDLE_TYPE_OPAQUE_FD */
	union {
		int fd;
		void *handle;
	} handle;
	const void *fs_ops;
} fsti_cufile_descr;

#define FSTI_CU_FILE_HANDLE_TYPE_OPAQUE_FD 1
#define FSTI_CU_FILE_SUCCESS 0
#define FSTI_CU_FILE_INVALID_MAPPING_SIZE 5016
#define FSTI_CU_FILE_HANDLE_NOT_REGISTERED 5027

/* The head of CUfileDrvProps_t; the rest is room for the real struct. */
typedef struct fsti_cufile_props {
	struct {
		unsigned major_version, minor_version;
		size_t poll_thresh_size, max_direct_io_size;
		unsigned dstatusflags, dcontrolflags;
	} nvfs;
	unsigned char rest[4096];
} fsti_cufile_props;

typedef void *fsti_cufile_handle;

#endif
