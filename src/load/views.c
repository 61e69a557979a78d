/*
 * views.c - the mmap "load": views of the files, no copy; read-only shared
 * mappings, or private copy-on-write ones that may be written.
 */
#include "engine.h"

#include <errno.h>
#include <sys/mman.h>


static void release_maps(struct fst_buffer *b)
{
	for (size_t i = 0; i < b->nmaps; i++)
		if (b->maps[i])
			munmap(b->maps[i], b->map_lens[i]);
	fsti_free(b->maps);
	fsti_free(b->map_lens);
}

int fsti_map_files(struct fsti_engine *e, fst_error *err)
{
	struct fst_buffer *b = e->buf;
	size_t nf = fst_checkpoint_file_count(e->ck);
	b->maps = fsti_calloc(nf, sizeof *b->maps);
	b->map_lens = fsti_calloc(nf, sizeof *b->map_lens);
	b->release_memory = release_maps;
	if (!b->maps || !b->map_lens)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	b->nmaps = nf;
	/* a private mapping of a file opened read-only may still be writable:
	 * written pages are copied, the file is never written */
	int prot = e->opts.mmap_private ? PROT_READ | PROT_WRITE : PROT_READ;
	int flags = e->opts.mmap_private ? MAP_PRIVATE : MAP_SHARED;
	b->read_only = !e->opts.mmap_private;
	for (size_t i = 0; i < nf; i++) {
		const fst_file *f = fst_checkpoint_file(e->ck, i);
		if (f->fd < 0)
			return fsti_err(err, FST_EUNSUPPORTED,
					"%s: io=mmap needs files, not memory images", f->path);
		int fault = fsti_fault("mmap");
		void *m = fault ? (errno = fault, MAP_FAILED)
				: mmap(NULL, f->size, prot, flags, f->fd, 0);
		if (m == MAP_FAILED)
			return fsti_err_sys(err, FST_EIO, errno, "%s: mmap failed", f->path);
		b->maps[i] = m;
		b->map_lens[i] = f->size;
	}
	for (size_t i = 0; i < e->plan.nt; i++) {
		const struct fsti_plan_tensor *t = &e->plan.t[i];
		b->t[i].data = (char *)b->maps[t->file] + t->file_off;
	}
	return 0;
}

