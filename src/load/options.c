/*
 * options.c - fst_load_opts: defaults, and the one check every entry point
 * (fst_load, fst_load_start, fst_load_explain, fst_load_sharded) makes.
 */
#include "engine.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_ALIGN 256u
#define DEFAULT_CHUNK (16ull << 20)
/* A read and its block fit a core's L2 together: measured best on the H200 host
 * (docs/design.md, "Integrity"). */
#define DEFAULT_LANDED_BLOCK (256ull << 10)
#define MAX_THREADS 64u

void fst_load_opts_init(fst_load_opts *o)
{
	memset(o, 0, sizeof *o);
	o->struct_size = sizeof *o;
	o->device = "cpu";
	o->io = FST_IO_AUTO;
	o->gds = FST_GDS_AUTO;
}

int fsti_parse_device(const char *s, int *type, int *id, fst_error *err)
{
	if (!s || !strcmp(s, "cpu")) {
		*type = FST_DEVICE_CPU;
		*id = 0;
		return 0;
	}
	if (!strcmp(s, "cuda")) {
		*type = FST_DEVICE_CUDA;
		*id = 0;
		return 0;
	}
	/* cuda:N, N in plain decimal digits as torch writes it: no sign, no
	 * space, no leading zero (strtol would take all three) */
	if (!strncmp(s, "cuda:", 5) && s[5] >= '0' && s[5] <= '9' &&
	    (s[5] != '0' || !s[6])) {
		int v = 0;
		const char *c = s + 5;
		while (*c >= '0' && *c <= '9' && v < 1024)
			v = v * 10 + (*c++ - '0');
		if (!*c && v < 1024) {
			*type = FST_DEVICE_CUDA;
			*id = v;
			return 0;
		}
	}
	return fsti_err(err, FST_EUSAGE, "device \"%s\": expected cpu, cuda or cuda:N", s);
}

static unsigned default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 16 ? 16 : (unsigned)n;
}

/* A policy the caller left at auto is decided by its environment variable,
 * so deployments can switch it without code: on, off or auto. FST_GDS and
 * FST_UNIFIED share the numbering (auto 0, on 1, off 2). */
static int policy_from_env(int *policy, enum fsti_env var, fst_error *err)
{
	const char *env = fsti_env(var);
	if (*policy != FST_GDS_AUTO || !env)
		return 0;
	if (!strcmp(env, "on"))
		*policy = FST_GDS_ON;
	else if (!strcmp(env, "off"))
		*policy = FST_GDS_OFF;
	else if (strcmp(env, "auto"))
		return fsti_err(err, FST_EUSAGE, "%s=\"%s\": expected auto, on or off",
				fsti_env_name(var), env);
	return 0;
}

int fsti_load_opts_check(const fst_load_opts *in, fst_load_opts *o, fst_error *err)
{
	fst_load_opts_init(o);
	if (in) {
		/* every size fst_load_opts has had in a release; a new field
		 * appends the new sizeof */
		static const size_t released[] = {sizeof(fst_load_opts)};
		if (!fsti_struct_size_known(in->struct_size, released, 1))
			return fsti_err(err, FST_EUSAGE,
					"load options not initialised with fst_load_opts_init");
		memcpy(o, in, in->struct_size);
		o->struct_size = sizeof *o;
	}
	if (o->io < FST_IO_AUTO || o->io > FST_IO_MMAP)
		return fsti_err(err, FST_EUSAGE, "unknown io method %d", o->io);
	if (o->gds < FST_GDS_AUTO || o->gds > FST_GDS_OFF)
		return fsti_err(err, FST_EUSAGE, "unknown gds policy %d", o->gds);
	int rc = policy_from_env(&o->gds, FSTI_ENV_GDS, err);
	if (rc)
		return rc;
	if (o->unified < FST_UNIFIED_AUTO || o->unified > FST_UNIFIED_OFF)
		return fsti_err(err, FST_EUSAGE, "unknown unified policy %d", o->unified);
	rc = policy_from_env(&o->unified, FSTI_ENV_UNIFIED, err);
	if (rc)
		return rc;
	if (!o->align)
		o->align = DEFAULT_ALIGN;
	if (o->align & (o->align - 1))
		return fsti_err(err, FST_EUSAGE, "align %u is not a power of two", o->align);
	if (!o->threads)
		o->threads = default_threads();
	if (o->threads > MAX_THREADS)
		return fsti_err(err, FST_EUSAGE, "%u threads: at most %u", o->threads, MAX_THREADS);
	if (!o->landed_block)
		o->landed_block = DEFAULT_LANDED_BLOCK;
	if ((o->landed_block & (o->landed_block - 1)) || o->landed_block < 4096 ||
	    o->landed_block > (1ull << 30))
		return fsti_err(err, FST_EUSAGE,
				"landed_block %" PRIu64 " must be a power of two, 4 KiB to 1 GiB",
				o->landed_block);
	if (!o->chunk_bytes)
		o->chunk_bytes = DEFAULT_CHUNK;
	if (o->chunk_bytes < 4096 || o->chunk_bytes > (1ull << 30))
		return fsti_err(err, FST_EUSAGE, "chunk size %" PRIu64 " must be 4 KiB to 1 GiB",
				o->chunk_bytes);
	return 0;
}

