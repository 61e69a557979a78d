/* nccl.c - NCCL, opened with dlopen on first multi-GPU use. */
#include "nccl.h"
#include "dl.h"


static struct fsti_nccl table;
static struct fsti_dl_once loaded = FSTI_DL_ONCE_INIT;

#define SYM(f) FSTI_DL_SYM(struct fsti_nccl, f)
static const struct fsti_dl_sym syms[] = {
	SYM(ncclGetVersion),
	SYM(ncclGetUniqueId),
	SYM(ncclCommInitRank),
	SYM(ncclCommDestroy),
	SYM(ncclCommAbort),
	SYM(ncclCommGetAsyncError),
	SYM(ncclGetErrorString),
	SYM(ncclBroadcast),
	SYM(ncclAllReduce),
	SYM(ncclGroupStart),
	SYM(ncclGroupEnd),
};
#undef SYM

static void load(void)
{
	const struct fsti_dl_lib lib = {"NCCL", fsti_env(FSTI_ENV_NCCL_LIBRARY), "libnccl.so.2",
					FST_EUNSUPPORTED};
	loaded.status = fsti_dl_load(&lib, syms, sizeof syms / sizeof syms[0], &table, &table.lib,
				    NULL, 0, &loaded.error);
}

int fsti_nccl_get(const struct fsti_nccl **out, fst_error *err)
{
	int rc = fsti_dl_once(&loaded, load, err);
	*out = rc ? NULL : &table;
	return rc;
}
