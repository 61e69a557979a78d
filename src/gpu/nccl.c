/* nccl.c - NCCL, opened with dlopen on first multi-GPU use. */
#include "nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

static struct fsti_nccl table;
static fst_error load_error;
static int load_status = 1;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
	const char *path = fsti_env(FSTI_ENV_NCCL_LIBRARY);
	if (!path)
		path = "libnccl.so.2";
	table.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!table.lib) {
		const char *e = dlerror();
		load_status = fsti_err(&load_error, FST_EUNSUPPORTED, "no NCCL: cannot load %s (%s)",
				       path, e ? e : "not found");
		return;
	}
#define SYM(name)                                                                         \
	do {                                                                              \
		*(void **)(&table.name) = dlsym(table.lib, #name);                        \
		if (!table.name) {                                                        \
			load_status = fsti_err(&load_error, FST_EUNSUPPORTED,             \
					       "%s lacks %s: NCCL too old", path, #name); \
			return;                                                   \
		}                                                                         \
	} while (0)
	SYM(ncclGetVersion);
	SYM(ncclGetUniqueId);
	SYM(ncclCommInitRank);
	SYM(ncclCommDestroy);
	SYM(ncclCommAbort);
	SYM(ncclCommGetAsyncError);
	SYM(ncclGetErrorString);
	SYM(ncclBroadcast);
	SYM(ncclAllReduce);
	SYM(ncclGroupStart);
	SYM(ncclGroupEnd);
#undef SYM
	load_status = 0;
}

const struct fsti_nccl *fsti_nccl_load(fst_error *err)
{
	pthread_once(&once, load);
	if (load_status) {
		if (err)
			*err = load_error;
		return NULL;
	}
	return &table;
}
