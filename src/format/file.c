/* file.c - open one safetensors file (path, descriptor or memory) and
 * answer questions about its header. */
#include "format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void file_free(fst_file *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	if (f->remote)
		pthread_mutex_destroy(&f->conn_lock);
	fsti_conn_free(f->conn);
	fsti_object_free(f->remote);
	for (size_t i = 0; i < f->nmeta; i++) {
		fsti_free(f->meta_keys[i]);
		fsti_free(f->meta_values[i]);
	}
	fsti_free(f->meta_keys);
	fsti_free(f->meta_values);
	fsti_names_free(&f->by_name);
	fsti_free(f->tensors);
	fsti_free(f->arena);
	fsti_free(f->path);
	fsti_free(f);
}

void fst_file_close(fst_file *f)
{
	file_free(f);
}

static fst_file *file_new(const char *name, fst_error *err)
{
	fst_file *f = fsti_calloc(1, sizeof *f);
	if (f) {
		f->fd = -1;
		f->path = fsti_url_display(name); /* a URL's secrets not shown */
		if (f->path)
			return f;
		fsti_free(f);
	}
	fsti_err(err, FST_ENOMEM, "%s: out of memory", name);
	return NULL;
}

/* The size checks that come before any JSON: REFERENCE "header too small",
 * "header too large", "invalid header length". */
static int check_lengths(const char *name, uint64_t size, const unsigned char *prefix,
			 uint64_t *header_len, fst_error *err)
{
	if (size < 8)
		return fsti_err(err, FST_EFORMAT,
				"%s: file is %" PRIu64 " bytes, shorter than the 8-byte header "
				"length (header too small)",
				name, size);
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = (n << 8) | prefix[i];
	if (n > FST_HEADER_MAX)
		return fsti_err(err, FST_EFORMAT,
				"%s: header length %" PRIu64 " exceeds the %u-byte limit (header "
				"too large)",
				name, n, FST_HEADER_MAX);
	if (8 + n > size)
		return fsti_err(err, FST_EFORMAT,
				"%s: header length %" PRIu64 " runs past the end of the %" PRIu64
				"-byte file (invalid header length)",
				name, n, size);
	*header_len = n;
	return 0;
}

int64_t fsti_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;
	while (done < len) {
		int fault = fsti_fault("read");
		ssize_t n = fault ? (errno = fault, -1)
				  : pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (int64_t)done;
}

static uint64_t timespec_ns(const struct timespec *t)
{
	return (uint64_t)t->tv_sec * 1000000000ull + (uint64_t)t->tv_nsec;
}

int fsti_file_check_unchanged(const fst_file *f, const char *when, fst_error *err)
{
	/* memory images cannot change; remote files are checked on every
	 * response instead (net/http.c) */
	if (f->fd < 0)
		return 0;
	struct stat st;
	if (fstat(f->fd, &st))
		return fsti_err_sys(err, FST_EIO, errno, "%s: cannot stat", f->path);
	uint64_t mtime = timespec_ns(&st.st_mtim), ctime = timespec_ns(&st.st_ctim);
	/* Renaming another file over the path, or removing it, moves the
	 * status change time through the link count alone: the opened file
	 * keeps its bytes, and is still what is read. */
	bool relinked = (uint64_t)st.st_nlink != f->nlink;
	if ((uint64_t)st.st_size == f->size && mtime == f->mtime_ns &&
	    (ctime == f->ctime_ns || relinked))
		return 0;
	const char *what = (uint64_t)st.st_size != f->size ? "its size"
			   : mtime != f->mtime_ns	 ? "its modification time"
						 : "its status change time (written in place, "
						   "modification time restored?)";
	return fsti_err(err, FST_ECHANGED,
			"%s: file changed %s (%s moved; size %" PRIu64 " -> %" PRIu64
			"); its bytes cannot be trusted",
			f->path, when, what, f->size, (uint64_t)st.st_size);
}

/* Two ticks of the slowest clock that stamps changes (HZ=100). */
#define SETTLE_NS (20ull * 1000000)

bool fsti_ctime_unsettled(uint64_t ctime_ns, uint64_t now_ns)
{
	/* further ahead is a clock skewed into the future (a file server's
	 * ahead of this one): no wait would pass it */
	return ctime_ns >= now_ns && ctime_ns - now_ns <= SETTLE_NS;
}

/*
 * fstat, once the clock that stamps file changes has moved past the file's
 * last change. Before Linux 6.13 (and on file systems without fine-grained
 * stamps) that clock ticks every 1-10 ms, and a write within the tick of the
 * previous change leaves the status change time as it was: an identity
 * taken in that tick could miss a later overwrite. Only just-written files
 * wait, at most a few ticks.
 */
static int stat_settled(const fst_file *f, struct stat *st, fst_error *err)
{
	for (int tries = 0;; tries++) {
		if (fstat(f->fd, st))
			return fsti_err_sys(err, FST_EIO, errno, "%s: cannot stat", f->path);
		struct timespec now;
		if (tries == 20 || clock_gettime(CLOCK_REALTIME_COARSE, &now) ||
		    !fsti_ctime_unsettled(timespec_ns(&st->st_ctim), timespec_ns(&now)))
			return 0;
		struct timespec ms = {0, 1000000};
		nanosleep(&ms, NULL);
	}
}

static int open_from_fd(fst_file *f, fst_error *err)
{
	struct stat st;
	int rc = stat_settled(f, &st, err);
	if (rc)
		return rc;
	if (S_ISDIR(st.st_mode))
		return fsti_err(err, FST_EUSAGE, "%s: is a directory, not a safetensors file",
				f->path);
	/* a block device too: stat gives it no size, and its bytes run to a
	 * whole sector, past any file's end */
	if (!S_ISREG(st.st_mode))
		return fsti_err(err, FST_EFORMAT,
				"%s: not a regular file (a pipe, socket or device cannot be "
				"loaded)",
				f->path);
	f->size = (uint64_t)st.st_size;
	f->dev = (uint64_t)st.st_dev;
	f->ino = (uint64_t)st.st_ino;
	f->mtime_ns = timespec_ns(&st.st_mtim);
	f->ctime_ns = timespec_ns(&st.st_ctim);
	f->nlink = (uint64_t)st.st_nlink;

	unsigned char prefix[8] = {0};
	int64_t got = fsti_pread_full(f->fd, prefix, 8, 0);
	if (got < 0)
		return fsti_err_sys(err, FST_EIO, (int)-got, "%s: cannot read the header length",
				    f->path);
	if ((uint64_t)got < FSTI_MIN(8, f->size))
		return fsti_err(err, FST_ECHANGED, "%s: file shrank while being opened", f->path);
	uint64_t hlen;
	rc = check_lengths(f->path, f->size, prefix, &hlen, err);
	if (rc)
		return rc;
	char *header = fsti_malloc(hlen ? hlen : 1);
	if (!header)
		return fsti_err(err, FST_ENOMEM, "%s: out of memory for a %" PRIu64 "-byte header",
				f->path, hlen);
	got = fsti_pread_full(f->fd, header, hlen, 8);
	if (got < 0 || (uint64_t)got != hlen) {
		fsti_free(header);
		if (got < 0)
			return fsti_err_sys(err, FST_EIO, (int)-got, "%s: cannot read the header",
					    f->path);
		return fsti_err(err, FST_ECHANGED, "%s: file shrank while being opened", f->path);
	}
	f->data_offset = 8 + hlen;
	rc = fsti_parse_header(f, f->path, header, hlen, f->size - f->data_offset, err);
	fsti_free(header);
	return rc;
}

/* A remote file's header: a first GET of HEAD_GUESS bytes holds it for
 * nearly every checkpoint (a large model's header is a few hundred KiB);
 * longer ones take a second GET of the rest. */
#define HEAD_GUESS (1u << 20)

int fsti_file_open_remote(const char *url, struct fsti_remote *r, struct fsti_conn *c,
			  fst_file **out, fst_error *err)
{
	*out = NULL;
	fst_file *f = file_new(url, err);
	if (!f)
		return FST_ENOMEM;
	pthread_mutex_init(&f->conn_lock, NULL);
	char *head = NULL;
	uint64_t got = 0, hlen = 0;
	int rc = fsti_object_open(c, r, url, HEAD_GUESS, &head, &got, &f->remote, err);
	if (rc) {
		pthread_mutex_destroy(&f->conn_lock);
		file_free(f);
		return rc;
	}
	f->size = f->remote->size;
	rc = check_lengths(f->path, f->size, (const unsigned char *)head, &hlen, err);
	if (!rc && 8 + hlen > got) {
		char *grown = fsti_realloc(head, (size_t)(8 + hlen));
		if (!grown)
			rc = fsti_err(err, FST_ENOMEM, "%s: out of memory for a %" PRIu64 "-byte header",
				      f->path, hlen);
		else
			head = grown;
		if (!rc)
			rc = fsti_object_read(c, f->remote, got, 8 + hlen - got, head + got, NULL, err);
	}
	if (!rc) {
		f->data_offset = 8 + hlen;
		rc = fsti_parse_header(f, f->path, head + 8, hlen, f->size - f->data_offset, err);
	}
	fsti_free(head);
	if (rc) {
		file_free(f);
		return rc;
	}
	*out = f;
	return 0;
}

/* A configuration and a connection for one URL opened on its own. */
static int open_url(const char *url, const fst_open_opts *opts, fst_file **out, fst_error *err)
{
	struct fsti_remote *r;
	struct fsti_conn *c;
	int rc = fsti_remote_new(opts, fsti_url_kind(url) == FSTI_URL_S3, &r, err);
	if (rc)
		return rc;
	rc = fsti_conn_new(&c, err);
	if (!rc) {
		rc = fsti_file_open_remote(url, r, c, out, err);
		if (!rc)
			(*out)->conn = c; /* kept for fst_file_read */
		else
			fsti_conn_free(c);
	}
	fsti_remote_unref(r);
	if (rc && err)
		fsti_url_hide(err->message, sizeof err->message, url);
	return rc;
}

int fst_file_open(const char *path, fst_file **out, fst_error *err)
{
	return fst_file_open_ex(path, NULL, out, err);
}

int fst_file_open_ex(const char *path, const fst_open_opts *opts, fst_file **out, fst_error *err)
{
	fsti_err_clear(err);
	if (!path || !out)
		return fsti_err(err, FST_EUSAGE, "fst_file_open: path and out are required");
	*out = NULL;
	if (fsti_url_kind(path))
		return open_url(path, opts, out, err);
	fst_file *f = file_new(path, err);
	if (!f)
		return FST_ENOMEM;
	int fault = fsti_fault("open");
	/* O_NONBLOCK: opening a FIFO must not hang; it is refused below. */
	f->fd = fault ? (errno = fault, -1) : open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (f->fd < 0) {
		int e = errno;
		file_free(f);
		return fsti_err_sys(err, FST_EIO, e, "%s: cannot open", path);
	}
	int rc = open_from_fd(f, err);
	if (rc) {
		file_free(f);
		return rc;
	}
	*out = f;
	return 0;
}

int fst_file_open_fd(int fd, const char *name, fst_file **out, fst_error *err)
{
	fsti_err_clear(err);
	if (!out || fd < 0)
		return fsti_err(err, FST_EUSAGE, "fst_file_open_fd: a descriptor and out are required");
	*out = NULL;
	char fallback[32];
	if (!name) {
		snprintf(fallback, sizeof fallback, "<fd %d>", fd);
		name = fallback;
	}
	fst_file *f = file_new(name, err);
	if (!f)
		return FST_ENOMEM;
	f->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (f->fd < 0) {
		int e = errno;
		file_free(f);
		return fsti_err_sys(err, FST_EIO, e, "%s: cannot duplicate descriptor %d", name, fd);
	}
	int rc = open_from_fd(f, err);
	if (rc) {
		file_free(f);
		return rc;
	}
	*out = f;
	return 0;
}

int fst_file_open_memory(const void *data, size_t size, const char *name, fst_file **out,
			 fst_error *err)
{
	fsti_err_clear(err);
	if (!out || (!data && size))
		return fsti_err(err, FST_EUSAGE, "fst_file_open_memory: data and out are required");
	*out = NULL;
	if (!name)
		name = "<memory>";
	fst_file *f = file_new(name, err);
	if (!f)
		return FST_ENOMEM;
	f->mem = data;
	f->size = size;
	uint64_t hlen;
	int rc = check_lengths(name, size, data, &hlen, err);
	if (!rc) {
		f->data_offset = 8 + hlen;
		rc = fsti_parse_header(f, name, (const char *)data + 8, hlen,
				       size - f->data_offset, err);
	}
	if (rc) {
		file_free(f);
		return rc;
	}
	*out = f;
	return 0;
}

int fst_file_is_remote(const fst_file *f) { return f && f->remote; }

int fst_file_read(const fst_file *f, uint64_t off, void *dst, uint64_t len, fst_error *err)
{
	fsti_err_clear(err);
	if (!f || (!dst && len))
		return fsti_err(err, FST_EUSAGE, "fst_file_read: file and dst are required");
	if (off > f->size || len > f->size - off)
		return fsti_err(err, FST_ECHANGED,
				"%s: read of %" PRIu64 " bytes at offset %" PRIu64
				" past the end of the %" PRIu64 "-byte file",
				f->path, len, off, f->size);
	if (f->mem) {
		memcpy(dst, f->mem + off, (size_t)len);
		return 0;
	}
	if (!f->remote) {
		int64_t got = fsti_pread_full(f->fd, dst, (size_t)len, off);
		if (got < 0)
			return fsti_err_sys(err, FST_EIO, (int)-got,
					    "%s: read of %" PRIu64 " bytes at offset %" PRIu64 " failed",
					    f->path, len, off);
		if ((uint64_t)got < len)
			return fsti_err(err, FST_ECHANGED,
					"%s: file ended at offset %" PRIu64 " while %" PRIu64
					" more bytes were expected (file truncated?)",
					f->path, off + (uint64_t)got, len - (uint64_t)got);
		return 0;
	}
	/* the file's connection while no other thread has it, else one of this
	 * call's own */
	fst_file *m = (fst_file *)f;
	if (!pthread_mutex_trylock(&m->conn_lock)) {
		int rc = 0;
		if (!m->conn)
			rc = fsti_conn_new(&m->conn, err);
		if (!rc)
			rc = fsti_object_read(m->conn, f->remote, off, len, dst, NULL, err);
		pthread_mutex_unlock(&m->conn_lock);
		return rc;
	}
	struct fsti_conn *c;
	int rc = fsti_conn_new(&c, err);
	if (!rc)
		rc = fsti_object_read(c, f->remote, off, len, dst, NULL, err);
	fsti_conn_free(c);
	return rc;
}

const char *fst_file_path(const fst_file *f) { return f->path; }
uint64_t fst_file_size(const fst_file *f) { return f->size; }
uint64_t fst_file_data_offset(const fst_file *f) { return f->data_offset; }
int fst_file_fd(const fst_file *f) { return f->fd; }
const void *fst_file_memory(const fst_file *f) { return f->mem; }
size_t fst_file_tensor_count(const fst_file *f) { return f->ntensors; }

int fst_file_tensor(const fst_file *f, size_t i, fst_tensor_info *out)
{
	if (!f || !out || i >= f->ntensors)
		return FST_EUSAGE;
	fsti_tensor_info(f, i, out);
	return 0;
}

long fst_file_find(const fst_file *f, const char *name)
{
	return fsti_names_find(&f->by_name, name, fsti_tensor_name_of, f);
}

size_t fst_file_metadata_count(const fst_file *f) { return f->nmeta; }
int fst_file_has_metadata(const fst_file *f) { return f->has_meta; }

int fst_file_metadata(const fst_file *f, size_t i, const char **key, const char **value)
{
	if (!f || i >= f->nmeta)
		return FST_EUSAGE;
	if (key)
		*key = f->meta_keys[i];
	if (value)
		*value = f->meta_values[i];
	return 0;
}

const char *fst_file_metadata_get(const fst_file *f, const char *key)
{
	for (size_t i = 0; key && i < f->nmeta; i++)
		if (!strcmp(f->meta_keys[i], key))
			return f->meta_values[i];
	return NULL;
}
