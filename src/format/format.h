/*
 * format.h - the safetensors format: header parsing and validation, files
 * and their identity, checkpoints (format/). Depends on base/ only.
 */
#ifndef FST_FORMAT_H
#define FST_FORMAT_H

#include "base.h"
#include "net.h"

#include <pthread.h>

/* ---- format (format.c) */

struct fsti_tensor {
	const char *name;
	fst_dtype dtype;
	uint32_t ndim;
	uint64_t *shape;
	uint64_t numel;
	uint64_t begin, end;
};

struct fst_file {
	char *path;
	int fd;               /* -1 for memory files */
	const uint8_t *mem;   /* memory files only */
	uint64_t size;        /* whole file */
	uint64_t data_offset; /* 8 + header length */
	/* identity, to detect a file replaced or changed during a load: the
	 * status change time moves on every write, even one that puts the
	 * modification time back (rsync --inplace -t, touch -d) */
	uint64_t dev, ino, mtime_ns, ctime_ns, nlink;
	/* a remote file (fd -1, mem NULL): the object and its identity, the
	 * size, ETag and Last-Modified that every response is checked against;
	 * a connection kept for fst_file_read (the loader's workers have their
	 * own) */
	struct fsti_object *remote;
	struct fsti_conn *conn;
	pthread_mutex_t conn_lock;
	size_t ntensors;
	struct fsti_tensor *tensors; /* sorted by (begin, end) */
	size_t nmeta;
	char **meta_keys, **meta_values;
	bool has_meta; /* a __metadata__ object, even an empty one */
	fsti_names by_name;
	char *arena; /* names, shapes: one allocation */
};

/* Strict UTF-8 (no overlongs, no surrogates, max U+10FFFF). Returns the
 * offset of the first bad byte, or len when all is well. */
size_t fsti_utf8_check(const unsigned char *s, size_t len);

/*
 * Parse and validate a header. header/len is the JSON text (without the
 * 8-byte length), data_len the size of the data section. Fills f's tensor
 * table and metadata. name is used in messages.
 */
int fsti_parse_header(fst_file *f, const char *name, const char *header, size_t len,
		      uint64_t data_len, fst_error *err);

void fsti_tensor_info(const fst_file *f, size_t i, fst_tensor_info *out);

/* FST_ECHANGED (naming the file, when, and what moved) unless f's descriptor
 * still shows the size, modification and status change times it had when
 * it was opened; memory images always pass (file.c). */
int fsti_file_check_unchanged(const fst_file *f, const char *when, fst_error *err);
/* Whether an open waits for the clock to pass a file's status change at
 * ctime_ns (the coarse clock reads now_ns): the change is at most a few
 * ticks ahead, not a clock skewed into the future. */
bool fsti_ctime_unsettled(uint64_t ctime_ns, uint64_t now_ns);
/* pread until len bytes or the end of the file (the "read" fault site);
 * the bytes read, or -errno. */
int64_t fsti_pread_full(int fd, void *buf, size_t len, uint64_t off);
/* Open the remote file url with r's configuration over connection c. */
int fsti_file_open_remote(const char *url, struct fsti_remote *r, struct fsti_conn *c,
			  fst_file **out, fst_error *err);

/* fsti_name_of over an fst_file's tensors (ctx is the file). */
const char *fsti_tensor_name_of(const void *ctx, size_t i);

/* Format "[3, 4]" into buf (truncated with "..." if long). */
void fsti_format_shape(char *buf, size_t size, uint32_t ndim, const uint64_t *shape);

#endif
