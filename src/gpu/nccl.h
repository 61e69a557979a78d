/* nccl.h - the few NCCL calls libfst uses, resolved from libnccl.so.2 with
 * dlopen on first use (FST_NCCL_LIBRARY names another file). */
#ifndef FST_NCCL_H
#define FST_NCCL_H

#include "cuda.h"

typedef struct fsti_nccl_comm *fsti_nccl_comm;
typedef struct {
	char internal[128];
} fsti_nccl_id;

#define FSTI_NCCL_SUCCESS 0
#define FSTI_NCCL_IN_PROGRESS 7
#define FSTI_NCCL_INT8 0
#define FSTI_NCCL_UINT8 1
#define FSTI_NCCL_INT32 2
#define FSTI_NCCL_MAX 2

struct fsti_nccl {
	void *lib;
	int (*ncclGetVersion)(int *version);
	int (*ncclGetUniqueId)(fsti_nccl_id *id);
	int (*ncclCommInitRank)(fsti_nccl_comm *comm, int nranks, fsti_nccl_id id, int rank);
	int (*ncclCommDestroy)(fsti_nccl_comm comm);
	int (*ncclCommAbort)(fsti_nccl_comm comm);
	int (*ncclCommGetAsyncError)(fsti_nccl_comm comm, int *async_error);
	const char *(*ncclGetErrorString)(int result);
	int (*ncclBroadcast)(const void *send, void *recv, size_t count, int datatype, int root,
			     fsti_nccl_comm comm, CUstream stream);
	int (*ncclAllReduce)(const void *send, void *recv, size_t count, int datatype, int op,
			     fsti_nccl_comm comm, CUstream stream);
	int (*ncclGroupStart)(void);
	int (*ncclGroupEnd)(void);
};

/* Load NCCL once per process: 0 with *out, or the error code
 * (FST_EUNSUPPORTED) with *out NULL and err filled. */
int fsti_nccl_get(const struct fsti_nccl **out, fst_error *err);

#endif
