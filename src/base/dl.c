/* dl.c - opening a library at run time and resolving its function table (dl.h). */
#include "dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static void **slot(void *table, const struct fsti_dl_sym *s)
{
	return (void **)((char *)table + s->offset);
}

int fsti_dl_load(const struct fsti_dl_lib *lib, const struct fsti_dl_sym *syms, size_t n,
		 void *table, void **handle, char *path, size_t size, fst_error *err)
{
	const char *file = lib->override ? lib->override : lib->soname;
	*handle = NULL;
	if (path && size)
		snprintf(path, size, "%s", file);
	dlerror();
	void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *why = dlerror();
		return fsti_err(err, lib->code, "no %s: cannot load %s (%s)", lib->what, file,
				why ? why : "not found");
	}
	for (size_t i = 0; i < n; i++) {
		const struct fsti_dl_sym *s = &syms[i];
		void *p = dlsym(h, s->name);
		if (!p && s->older)
			p = dlsym(h, s->older);
		*slot(table, s) = p;
		if (p || s->optional)
			continue;
		for (size_t j = 0; j < i; j++)
			*slot(table, &syms[j]) = NULL;
		dlclose(h);
		if (s->older)
			return fsti_err(err, lib->code,
					"%s %s lacks both %s and %s: too old, or another library",
					lib->what, file, s->name, s->older);
		return fsti_err(err, lib->code, "%s %s lacks %s: too old, or another library",
				lib->what, file, s->name);
	}
	*handle = h;
	return 0;
}

int fsti_dl_once(struct fsti_dl_once *o, void (*load)(void), fst_error *err)
{
	pthread_once(&o->once, load);
	if (o->status && err)
		*err = o->error;
	return o->status;
}
