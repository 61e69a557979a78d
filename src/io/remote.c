/*
 * remote.c - the remote reader: each worker keeps one libcurl connection
 * (kept alive) and reads its chunks with ranged GETs straight into their
 * destination (the tensors on the CPU, a landing slot for a GPU), as the
 * pread reader does from a descriptor. net/http.c checks every response,
 * retries what may pass, and aborts once the load stops.
 */
#include "io.h"

/* where[] first: fsti_sync_wait reads it */
struct remote_worker {
	const char *where[FSTI_SLOTS];
	struct fsti_conn *conn;
};

bool fsti_checkpoint_is_remote(const fst_checkpoint *ck)
{
	for (size_t i = 0; i < fst_checkpoint_file_count(ck); i++)
		if (fst_file_is_remote(fst_checkpoint_file(ck, i)))
			return true;
	return false;
}

static int remote_init(const struct fsti_source *src, void **state, fst_error *err)
{
	(void)src;
	struct remote_worker *w = fsti_calloc(1, sizeof *w);
	if (!w)
		return fsti_err(err, FST_ENOMEM, "out of memory for a reader");
	int rc = fsti_conn_new(&w->conn, err);
	if (rc) {
		fsti_free(w);
		return rc;
	}
	*state = w;
	return 0;
}

static int remote_read(const struct fsti_source *src, void *state, uint32_t file, uint64_t off,
		       uint64_t len, void *dst, fst_error *err)
{
	struct remote_worker *w = state;
	const fst_file *f = fst_checkpoint_file(src->ck, file);
	if (f->remote)
		return fsti_object_read(w->conn, f->remote, off, len, dst, src->stop, err);
	return fsti_reader_pread.read_exact(src, NULL, file, off, len, dst, err);
}

/* Synchronous, as pread's: start reads, wait only says where. */
static int remote_start(const struct fsti_source *src, void *state, int slot, uint32_t file,
			uint64_t off, uint64_t len, char *buf, fst_error *err)
{
	struct remote_worker *w = state;
	w->where[slot] = buf;
	return remote_read(src, state, file, off, len, buf, err);
}

static void remote_fini(void *state)
{
	struct remote_worker *w = state;
	if (!w)
		return;
	fsti_conn_free(w->conn);
	fsti_free(w);
}

const struct fsti_reader fsti_reader_remote = {
	.name = "remote (ranged GETs)",
	.exact_reads = true,
	/* a GPU's landing slots: big requests amortise each one's round trip */
	.default_staging = FSTI_STAGING_DIRECT,
	.reads_at_start = true,
	.any_buffer = true,
	.worker_init = remote_init,
	.read_exact = remote_read,
	.start = remote_start,
	.wait = fsti_sync_wait,
	.worker_fini = remote_fini,
};
