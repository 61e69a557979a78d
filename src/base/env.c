/*
 * env.c - every environment variable libfst reads, and its one getenv.
 *
 * Each call reads the environment afresh; a caller that reads a variable
 * once per process keeps what it made of it (the log level, the fault
 * rules, the library it opened, the probe's findings). The tests rely on
 * the others being read at every use: they change them between calls.
 */
#include "base.h"

#include <stdlib.h>
#include <string.h>

static const char *const names[FSTI_ENV_COUNT] = {
	/* log threshold: error, warn (default), info or debug; read once (log.c) */
	[FSTI_ENV_LOG] = "FST_LOG",
	/* fault injection rules SITE:N[+][:ERRNO],...; read once (fault.c) */
	[FSTI_ENV_FAULT] = "FST_FAULT",
	/* the CUDA driver to open instead of libcuda.so.1; read once (gpu/cuda.c) */
	[FSTI_ENV_CUDA_LIBRARY] = "FST_CUDA_LIBRARY",
	/* the cuFile library to open instead of libcufile.so.0; read once (gpu/cufile.c) */
	[FSTI_ENV_CUFILE_LIBRARY] = "FST_CUFILE_LIBRARY",
	/* the NCCL library to open instead of libnccl.so.2; read once (gpu/nccl.c) */
	[FSTI_ENV_NCCL_LIBRARY] = "FST_NCCL_LIBRARY",
	/* glob of the nvidia-fs devices (default /dev/nvidia-fs*); at each device's probe */
	[FSTI_ENV_NVFS_DEVICES] = "FST_NVFS_DEVICES",
	/* cuFile's own: the cufile.json path (default /etc/cufile.json); at each probe */
	[FSTI_ENV_CUFILE_JSON] = "CUFILE_ENV_PATH_JSON",
	/* 1: open the cuFile driver even where the probe rules GDS out; at each use */
	[FSTI_ENV_GDS_TRY] = "FST_GDS_TRY",
	/* the GDS policy (auto, on, off) where options leave auto; at each load */
	[FSTI_ENV_GDS] = "FST_GDS",
	/* collective deadline in ms for comms made with timeout 0 (default 300000); per comm */
	[FSTI_ENV_DIST_TIMEOUT_MS] = "FST_DIST_TIMEOUT_MS",
	/* the unified-memory policy (auto, on, off) where options leave auto; at each load */
	[FSTI_ENV_UNIFIED] = "FST_UNIFIED",
	/* pinned staging: "huge" (registered huge pages, the default) or
	 * "driver" (cuMemHostAlloc); for each new block */
	[FSTI_ENV_STAGING_PAGES] = "FST_STAGING_PAGES",
};

const char *fsti_env_name(enum fsti_env var)
{
	return (unsigned)var < FSTI_ENV_COUNT ? names[var] : NULL;
}

const char *fsti_env(enum fsti_env var)
{
	const char *name = fsti_env_name(var);
	const char *v = name ? getenv(name) : NULL;
	return v && *v ? v : NULL;
}

bool fsti_env_gds_try(void)
{
	const char *v = fsti_env(FSTI_ENV_GDS_TRY);
	return v && !strcmp(v, "1");
}
