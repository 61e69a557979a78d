/*
 * gds.c - GPUDirect Storage reads, only where they are real.
 *
 * The decision is taken per device by the probe (probe.c) and then per
 * file: each file is registered with cuFile on its own, and under gds=auto
 * a file that cannot be registered, or whose read fails, goes down the
 * pinned-staging path alone, with one warning that names the file, the code
 * and the reason. cuFile reads land directly at each tensor's planned,
 * aligned device address (the buffer offset argument): nothing is moved
 * afterwards. cuFileRead is synchronous; a chunk is counted only once every
 * read into it has returned its full length, and short reads are resumed,
 * never accepted.
 */
#include "cufile.h"
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <stdatomic.h>
#include <unistd.h>

/* A load's GPUDirect Storage state: the cuFile table, each file's
 * descriptor and handle, which files are planned for cuFile reads, the
 * registered buffer, and why (for the load's description). */
struct fsti_gds_file {
	int fd;             /* O_DIRECT descriptor given to cuFile */
	void *handle;       /* cuFile handle, when registered */
	atomic_bool failed; /* a read failed: the file goes through staging */
};

struct fsti_gds {
	const struct fsti_cufile *cufile;
	struct fsti_gds_file *file; /* per file, once cuFile is tried */
	bool *direct;               /* per file: planned for cuFile reads */
	size_t ndirect;             /* how many */
	bool buffer_registered;
	void *registered_base;
	char why[700];
};

static const struct fsti_cufile *table_of(const struct fsti_engine *e)
{
	return e->gds->cufile;
}

void fsti_gds_teardown(struct fsti_engine *e)
{
	struct fsti_gds *g = e->gds;
	if (!g)
		return;
	const struct fsti_cufile *cf = g->cufile;
	if (g->file) {
		for (size_t i = 0; i < fst_checkpoint_file_count(e->ck); i++) {
			if (g->file[i].handle)
				cf->cuFileHandleDeregister(g->file[i].handle);
			if (g->file[i].fd >= 0)
				close(g->file[i].fd);
		}
	}
	/* by the base registered: the buffer itself may have been handed to
	 * the caller already */
	if (g->buffer_registered)
		cf->cuFileBufDeregister(g->registered_base);
	fsti_free(g->file);
	fsti_free(g->direct);
	fsti_free(g);
	e->gds = NULL;
}

size_t fsti_gds_direct_count(const struct fsti_gds *g)
{
	return g ? g->ndirect : 0;
}

const bool *fsti_gds_direct_files(const struct fsti_gds *g)
{
	return g ? g->direct : NULL;
}

const char *fsti_gds_why(const struct fsti_gds *g)
{
	return g ? g->why : "";
}

/* Whether cuFile is tried, per opts.gds and the probe: *out is the probe
 * when it is, NULL when not (e->gds->why says why). */
static int gds_decide(struct fsti_engine *e, const struct fsti_gds_probe **out, fst_error *err)
{
	*out = NULL;
	if (e->device_type != FST_DEVICE_CUDA || e->opts.gds == FST_GDS_OFF) {
		snprintf(e->gds->why, sizeof e->gds->why, "%s",
			 e->opts.gds == FST_GDS_OFF ? "gds=off" : "");
		return 0;
	}
	if (e->unified) {
		/* One copy into mapped host memory: cuFile has nothing to do, and
		 * is never opened (docs/platforms.md). */
		if (e->opts.gds == FST_GDS_ON)
			return fsti_err(err, FST_EUNSUPPORTED,
					"gds=on but cuda:%d loads through unified memory (reads into "
					"mapped host memory); pass unified=off for the discrete path",
					e->device_id);
		snprintf(e->gds->why, sizeof e->gds->why,
			 "GPUDirect Storage not used: unified memory needs no device transfer");
		return 0;
	}
	const struct fsti_cuda *cu;
	int rc = fsti_cuda_get(&cu, err);
	if (rc)
		return rc;
	const struct fsti_gds_probe *p = fsti_gds_probe(cu, e->device_id);
	/* FST_GDS_TRY=1 reaches past the driver's own "no" (no nvidia-fs,
	 * version 0.0), never past the device's: an integrated GPU (its memory
	 * the host's: the founding case) or one without GPUDirect RDMA */
	bool try_anyway = fsti_env_gds_try() && p->driver_opened && !p->integrated &&
			  p->rdma == 1;
	if (!p->usable && !try_anyway) {
		if (e->opts.gds == FST_GDS_ON)
			return fsti_err(err, FST_EUNSUPPORTED,
					"gds=on but GPUDirect Storage cannot run on cuda:%d: %s",
					e->device_id, p->reason);
		fsti_log(FST_LOG_INFO, "GPUDirect Storage not used on cuda:%d: %s; using pinned "
				       "staging",
			 e->device_id, p->reason);
		snprintf(e->gds->why, sizeof e->gds->why, "GPUDirect Storage not used: %s",
			 p->reason);
		return 0;
	}
	*out = p;
	return 0;
}

/* A descriptor of opened file f for cuFile: the file again, with O_DIRECT
 * where the filesystem allows it, never another file now at its path
 * (io/direct.c). *fd is -1 when the file goes through staging (auto). */
static int gds_reopen(const fst_file *f, const char *path, bool on, int *fd, fst_error *err)
{
	char why[96];
	bool other_file;
	*fd = fsti_open_direct(f, &other_file, why, sizeof why);
	if (*fd < 0 && other_file) {
		if (on)
			return fsti_err(err, FST_ECHANGED,
					"%s: the path now names another file than the one opened; "
					"cuFile cannot read it",
					path);
		fsti_log(FST_LOG_WARN, "%s: the path now names another file than the one "
				       "opened; loading it through pinned staging",
			 path);
		return 0;
	}
	if (*fd < 0)
		*fd = fcntl(f->fd, F_DUPFD_CLOEXEC, 0); /* cuFile may still cope */
	if (*fd < 0) {
		if (on)
			return fsti_err_sys(err, FST_EIO, errno, "%s: cannot open", path);
		fsti_log(FST_LOG_WARN, "%s: cannot open it again for cuFile (%s); loading it "
				       "through pinned staging",
			 path, strerror(errno));
	}
	return 0;
}

/* Register file i with cuFile; under auto a file that cannot be is left to
 * the staging path with a warning, under on it fails the load. */
static int gds_register_file(struct fsti_engine *e, size_t i, const struct fsti_gds_probe *p,
			     fst_error *err)
{
	bool on = e->opts.gds == FST_GDS_ON;
	const char *path = fsti_engine_path(e, (uint32_t)i);
	const fst_file *f = fst_checkpoint_file(e->ck, i);
	if (f->fd < 0) {
		if (on)
			return fsti_err(err, FST_EUNSUPPORTED,
					"%s: gds=on but a memory image cannot be read with cuFile",
					path);
		return 0; /* staged */
	}
	int fd;
	int rc = gds_reopen(f, path, on, &fd, err);
	if (rc || fd < 0)
		return rc;
	e->gds->file[i].fd = fd;
	fsti_cufile_descr d;
	memset(&d, 0, sizeof d);
	d.type = FSTI_CU_FILE_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = fd;
	fsti_cufile_handle h = NULL;
	fsti_cufile_error r = fsti_fault("cufile_register")
				      ? (fsti_cufile_error){FSTI_CU_FILE_HANDLE_NOT_REGISTERED, 0}
				      : p->cf->cuFileHandleRegister(&h, &d);
	if (r.err) {
		char code[64];
		fsti_cufile_error_name(r.err, code, sizeof code);
		if (on)
			return fsti_err_backend(err, FST_EUNSUPPORTED, r.err,
						"%s: gds=on but cuFileHandleRegister failed with %s "
						"(probe: %s)",
						path, code, p->reason);
		fsti_log(FST_LOG_WARN,
			 "%s: cuFileHandleRegister failed with %s; loading this file through "
			 "pinned staging instead (probe: %s)",
			 path, code, p->reason);
		return 0;
	}
	e->gds->file[i].handle = h;
	e->gds->direct[i] = true;
	e->gds->ndirect++;
	return 0;
}

int fsti_gds_setup(struct fsti_engine *e, fst_error *err)
{
	e->gds = fsti_calloc(1, sizeof *e->gds);
	if (!e->gds)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	const struct fsti_gds_probe *p;
	int rc = gds_decide(e, &p, err);
	if (rc || !p)
		return rc;
	size_t nf = fst_checkpoint_file_count(e->ck);
	e->gds->cufile = p->cf;
	e->gds->file = fsti_calloc(nf + 1, sizeof *e->gds->file);
	if (!e->gds->file)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	/* before anything else can fail: teardown closes every fd >= 0, and
	 * calloc's 0 is a descriptor of the caller's */
	for (size_t i = 0; i < nf; i++) {
		e->gds->file[i].fd = -1;
		atomic_init(&e->gds->file[i].failed, false);
	}
	e->gds->direct = fsti_calloc(nf + 1, sizeof *e->gds->direct);
	if (!e->gds->direct)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	for (size_t i = 0; i < nf; i++) {
		rc = gds_register_file(e, i, p, err);
		if (rc)
			return rc;
	}
	snprintf(e->gds->why, sizeof e->gds->why, "GPUDirect Storage for %zu of %zu files (%s)",
		 e->gds->ndirect, nf, p->reason);
	return 0;
}

int fsti_gds_register_buffer(struct fsti_engine *e, fst_error *err)
{
	if (!fsti_gds_direct_count(e->gds))
		return 0;
	const struct fsti_cufile *cf = table_of(e);
	fsti_cufile_error r = cf->cuFileBufRegister(e->buf->base, (size_t)e->buf->size, 0);
	if (!r.err) {
		e->gds->buffer_registered = true;
		e->gds->registered_base = e->buf->base;
		return 0;
	}
	char code[64];
	fsti_cufile_error_name(r.err, code, sizeof code);
	if (e->opts.gds == FST_GDS_ON)
		return fsti_err_backend(err, FST_EDEVICE, r.err,
					"gds=on but cuFileBufRegister of %" PRIu64
					" bytes on cuda:%d failed with %s",
					e->buf->size, e->device_id, code);
	/* Any cuFile failure under auto sends the work to the staging path:
	 * there is no partly-trusted mode. */
	fsti_log(FST_LOG_WARN,
		 "cuda:%d: cuFileBufRegister of %" PRIu64 " bytes failed with %s; loading every "
		 "file through pinned staging instead",
		 e->device_id, e->buf->size, code);
	for (size_t i = 0; i < fst_checkpoint_file_count(e->ck); i++)
		atomic_store(&e->gds->file[i].failed, true);
	return 0;
}

bool fsti_gds_wanted(const struct fsti_engine *e, const struct fsti_chunk *c)
{
	return e->gds && e->gds->direct && e->gds->direct[c->file] &&
	       !atomic_load(&e->gds->file[c->file].failed);
}

int fsti_gds_read(struct fsti_engine *e, const struct fsti_chunk *c, fst_error *err)
{
	const struct fsti_cufile *cf = table_of(e);
	struct fsti_gds_file *g = &e->gds->file[c->file];
	const char *path = fsti_engine_path(e, c->file);
	uint64_t done = 0;
	while (done < c->len) {
		ssize_t n = fsti_fault("cufile_read")
				    ? -EIO
				    : cf->cuFileRead(g->handle, e->buf->base, (size_t)(c->len - done),
						     (off_t)(c->file_off + done),
						     (off_t)(c->dst_off + done));
		if (n > 0) {
			done += (uint64_t)n; /* a short read: ask for the rest */
			continue;
		}
		if (n == 0)
			return fsti_err(err, FST_ECHANGED,
					"%s: file ended at offset %" PRIu64 " while %" PRIu64
					" more bytes were expected (file truncated during the load?)",
					path, c->file_off + done, c->len - done);
		/* n < 0: -1 with errno set, or minus a cuFile error code */
		char what[96];
		int code = n == -1 ? errno : (int)-n;
		if (code >= 5000)
			fsti_cufile_error_name(code, what, sizeof what);
		else
			snprintf(what, sizeof what, "%s", strerror(code));
		if (e->opts.gds == FST_GDS_ON)
			return fsti_err_backend(err, FST_EIO, code,
						"%s: cuFileRead of %" PRIu64 " bytes at offset %" PRIu64
						" failed: %s",
						path, c->len - done, c->file_off + done, what);
		if (!atomic_exchange(&g->failed, true))
			fsti_log(FST_LOG_WARN,
				 "%s: cuFileRead at offset %" PRIu64 " failed (%s); loading the "
				 "rest of this file through pinned staging",
				 path, c->file_off + done, what);
		return 1;
	}
	return 0;
}
