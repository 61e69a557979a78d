/*
 * dl.h - the one way libfst opens a library at run time: dlopen of the
 * path the environment names or of the default soname, then a table of
 * symbols resolved into a struct of function pointers. gpu/cuda.c,
 * gpu/cufile.c, gpu/nccl.c and net/curl.c each describe their library and
 * table and call fsti_dl_load. In base/ because it knows nothing of what it
 * opens: both gpu/ and net/ use it.
 */
#ifndef FST_DL_H
#define FST_DL_H

#include "base.h"

#include <pthread.h>

/* One function of a table: its symbol; an older name tried where the
 * library lacks it (or NULL); where its pointer goes (offsetof in the
 * table); whether the library is usable without it (the pointer is then
 * left NULL). */
struct fsti_dl_sym {
	const char *name;
	const char *older;
	size_t offset;
	bool optional;
};

/* A required entry named as its field, e.g. FSTI_DL_SYM(struct fsti_cuda,
 * cuMemAlloc_v2): the field is spelled as the real, versioned symbol. */
#define FSTI_DL_SYM(type, field) {#field, NULL, offsetof(type, field), false}

/* The library to open. */
struct fsti_dl_lib {
	const char *what;     /* in messages: "CUDA driver", "NCCL", "cuFile library" */
	const char *override; /* a path from the environment, or NULL for soname */
	const char *soname;   /* the default */
	int code;             /* the error code of every failure */
};

/*
 * Open lib with RTLD_NOW | RTLD_LOCAL and resolve syms[0..n) into table, in
 * order. path (size bytes, may be NULL) receives the path opened. Returns 0
 * with *handle; else lib->code with err "no WHAT: cannot load PATH
 * (dlerror)" or "WHAT PATH lacks SYMBOL: too old, or another library", every
 * entry of table cleared and nothing left open.
 */
int fsti_dl_load(const struct fsti_dl_lib *lib, const struct fsti_dl_sym *syms, size_t n,
		 void *table, void **handle, char *path, size_t size, fst_error *err);

/*
 * A library opened once per process: load runs the first time any thread
 * asks (pthread_once) and leaves its outcome in status and error, which
 * every later caller gets. status is 1 until load has run.
 */
struct fsti_dl_once {
	pthread_once_t once;
	int status;
	fst_error error;
};
#define FSTI_DL_ONCE_INIT {PTHREAD_ONCE_INIT, 1, {0}}

/* Run load once; then 0, or its status with *err (may be NULL) its error. */
int fsti_dl_once(struct fsti_dl_once *o, void (*load)(void), fst_error *err);

#endif
