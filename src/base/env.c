/*
 * env.c - every environment variable libfst reads, and its one getenv.
 *
 * Each call reads the environment afresh; a caller that reads a variable
 * once per process keeps what it made of it (the log level, the fault
 * rules, the library it opened, the GDS probe's findings). The tests rely on
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
	/* bytes of broadcast per pipeline step of a sharded load (default 256 MiB); per load */
	[FSTI_ENV_DIST_GROUP_BYTES] = "FST_DIST_GROUP_BYTES",
	/* the unified-memory policy (auto, on, off) where options leave auto; at each load */
	[FSTI_ENV_UNIFIED] = "FST_UNIFIED",
	/* pinned staging: "huge" (registered huge pages faulted in first, the
	 * default), "lazy" (registered huge pages the driver faults in) or
	 * "driver" (cuMemHostAlloc); for each new block */
	[FSTI_ENV_STAGING_PAGES] = "FST_STAGING_PAGES",
	/* io_uring reads through the page cache instead of O_DIRECT: off
	 * (default), random (the kernel's readahead off) or readahead; at
	 * each load */
	[FSTI_ENV_URING_PAGE_CACHE] = "FST_URING_PAGE_CACHE",
	/* reads each worker of a staged load keeps in flight: 1, or 2 (the
	 * default); at each load */
	[FSTI_ENV_READS_IN_FLIGHT] = "FST_READS_IN_FLIGHT",
	/* O_DIRECT helper threads beside the workers of a load from the page
	 * cache onto a GPU, reading the plan from its end: 0 (off) to 8; at
	 * each load */
	[FSTI_ENV_WARM_DISK] = "FST_WARM_DISK",
	/* whether a chunk read through the page cache for a GPU lands in its
	 * slot where its copy's source and destination share their offset
	 * within FSTI_COPY_PHASE bytes (1), or is copied whole to device scratch
	 * in phase first (2); 0, the default, neither; at each load */
	[FSTI_ENV_ALIGN_COPIES] = "FST_ALIGN_COPIES",
	/* the libcurl to open instead of libcurl.so.4; read once (net/curl.c) */
	[FSTI_ENV_CURL_LIBRARY] = "FST_CURL_LIBRARY",
	/* The AWS SDKs' variables, read at each open of a remote checkpoint
	 * (net/config.c; docs/remote.md says how they combine): credentials, */
	[FSTI_ENV_AWS_ACCESS_KEY_ID] = "AWS_ACCESS_KEY_ID",
	[FSTI_ENV_AWS_SECRET_ACCESS_KEY] = "AWS_SECRET_ACCESS_KEY",
	[FSTI_ENV_AWS_SESSION_TOKEN] = "AWS_SESSION_TOKEN",
	/* the region (AWS_REGION wins), the profile and the files that hold it, */
	[FSTI_ENV_AWS_REGION] = "AWS_REGION",
	[FSTI_ENV_AWS_DEFAULT_REGION] = "AWS_DEFAULT_REGION",
	[FSTI_ENV_AWS_PROFILE] = "AWS_PROFILE",
	[FSTI_ENV_AWS_SHARED_CREDENTIALS_FILE] = "AWS_SHARED_CREDENTIALS_FILE",
	[FSTI_ENV_AWS_CONFIG_FILE] = "AWS_CONFIG_FILE",
	/* the endpoint (the S3-specific one wins), unsigned requests (true or 1), */
	[FSTI_ENV_AWS_ENDPOINT_URL] = "AWS_ENDPOINT_URL",
	[FSTI_ENV_AWS_ENDPOINT_URL_S3] = "AWS_ENDPOINT_URL_S3",
	[FSTI_ENV_AWS_NO_SIGN_REQUEST] = "AWS_NO_SIGN_REQUEST",
	/* CA bundles for every https URL, first set wins, */
	[FSTI_ENV_AWS_CA_BUNDLE] = "AWS_CA_BUNDLE",
	[FSTI_ENV_CURL_CA_BUNDLE] = "CURL_CA_BUNDLE",
	[FSTI_ENV_SSL_CERT_FILE] = "SSL_CERT_FILE",
	/* and where ~/.aws is */
	[FSTI_ENV_HOME] = "HOME",
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
