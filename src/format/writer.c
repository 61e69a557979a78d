/*
 * writer.c - write safetensors files the reference reader loads byte-exact.
 *
 * The header is padded with spaces (as the reference writer pads it) so the
 * data section starts at opts.data_align; tensors follow back to back, in the
 * order added or largest-alignment first.
 */
#include "format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

struct wtensor {
	char *name;
	fst_dtype dtype;
	uint32_t ndim;
	uint64_t *shape;
	uint64_t nbytes;
	const void *data;
	fst_fill_fn fill;
	void *ctx;
	uint64_t begin;
	size_t added; /* position of the add call, for stable ordering */
};

struct fst_writer {
	fst_writer_opts opts;
	struct wtensor *t;
	size_t n, cap;
	uint64_t total; /* the tensors' bytes, at most INT64_MAX */
	fsti_names names; /* t's names, for duplicates; stale once t is sorted */
	bool names_stale;
	json_t *meta;
	bool meta_always; /* __metadata__ written even with no entries */
};

void fst_writer_opts_init(fst_writer_opts *o)
{
	memset(o, 0, sizeof *o);
	o->struct_size = sizeof *o;
	o->data_align = 8;
	o->header_extra = 0;
	o->order = FST_ORDER_GIVEN;
}

int fst_writer_new(const fst_writer_opts *opts, fst_writer **out, fst_error *err)
{
	fsti_err_clear(err);
	if (!out)
		return fsti_err(err, FST_EUSAGE, "fst_writer_new: out is required");
	fst_writer_opts o;
	fst_writer_opts_init(&o);
	if (opts) {
		static const size_t released[] = {sizeof(fst_writer_opts)}; /* as in options.c */
		if (!fsti_struct_size_known(opts->struct_size, released, 1))
			return fsti_err(err, FST_EUSAGE, "fst_writer_new: opts not initialised "
							 "with fst_writer_opts_init");
		memcpy(&o, opts, opts->struct_size);
	}
	if (o.data_align < 8 || o.data_align > (1u << 20) || (o.data_align & (o.data_align - 1)))
		return fsti_err(err, FST_EUSAGE,
				"writer: data_align %u must be a power of two from 8 to 1 MiB",
				o.data_align);
	if (o.header_extra % 8)
		return fsti_err(err, FST_EUSAGE, "writer: header_extra %u must be a multiple of 8",
				o.header_extra);
	if (o.order != FST_ORDER_GIVEN && o.order != FST_ORDER_ALIGNMENT)
		return fsti_err(err, FST_EUSAGE, "writer: unknown order %d", o.order);
	fst_writer *w = fsti_calloc(1, sizeof *w);
	if (!w || !(w->meta = json_object())) {
		fsti_free(w);
		return fsti_err(err, FST_ENOMEM, "writer: out of memory");
	}
	w->opts = o;
	*out = w;
	return 0;
}

void fst_writer_free(fst_writer *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n; i++) {
		fsti_free(w->t[i].name);
		fsti_free(w->t[i].shape);
	}
	fsti_free(w->t);
	fsti_names_free(&w->names);
	json_decref(w->meta);
	fsti_free(w);
}

static const char *wtensor_name(const void *ctx, size_t i)
{
	return ((const fst_writer *)ctx)->t[i].name;
}

static int add(fst_writer *w, const char *name, fst_dtype dtype, uint32_t ndim,
	       const uint64_t *shape, const void *data, uint64_t nbytes, fst_fill_fn fill,
	       void *ctx, fst_error *err)
{
	fsti_err_clear(err);
	if (!w || !name || (ndim && !shape))
		return fsti_err(err, FST_EUSAGE, "writer: name and shape are required");
	if (!strcmp(name, "__metadata__"))
		return fsti_err(err, FST_EUSAGE, "writer: \"__metadata__\" is not a tensor name");
	size_t len = strlen(name), bad = fsti_utf8_check((const unsigned char *)name, len);
	if (bad != len)
		return fsti_err(err, FST_EUSAGE,
				"writer: tensor \"%s\": name is not valid UTF-8 (byte %zu of it)", name,
				bad);
	if (fst_dtype_bits(dtype) == 0)
		return fsti_err(err, FST_EUSAGE, "writer: tensor \"%s\": unknown dtype %d", name,
				(int)dtype);
	/* the reader's rule (format.c's check_size): the count, multiplied out
	 * in order, and then its bits fit in 64 bits; so a file written here
	 * reads back, and an empty tensor of huge other dimensions is written */
	uint64_t numel = 1;
	for (uint32_t i = 0; i < ndim; i++) {
		if (shape[i] > INT64_MAX || (shape[i] && numel > UINT64_MAX / shape[i]))
			return fsti_err(err, FST_EUSAGE, "writer: tensor \"%s\": shape too large",
					name);
		numel *= shape[i];
	}
	if (numel > UINT64_MAX / fst_dtype_bits(dtype))
		return fsti_err(err, FST_EUSAGE, "writer: tensor \"%s\": shape too large", name);
	uint64_t bits = numel * fst_dtype_bits(dtype);
	char sh[128];
	fsti_format_shape(sh, sizeof sh, ndim, shape);
	if (bits % 8)
		return fsti_err(err, FST_EUSAGE,
				"writer: tensor \"%s\": shape %s of %s is not a whole number of bytes",
				name, sh, fst_dtype_name(dtype));
	if (!fill && nbytes != bits / 8)
		return fsti_err(err, FST_EUSAGE,
				"writer: tensor \"%s\": %" PRIu64 " bytes given but shape %s of %s "
				"needs %" PRIu64,
				name, nbytes, sh, fst_dtype_name(dtype), bits / 8);
	if (!fill && nbytes && !data)
		return fsti_err(err, FST_EUSAGE, "writer: tensor \"%s\": data is NULL", name);
	if (bits / 8 > INT64_MAX - w->total)
		return fsti_err(err, FST_EUSAGE,
				"writer: tensor \"%s\": the tensors would total more than 2^63 - 1 "
				"bytes",
				name);
	if (w->names_stale) { /* finished before: t was sorted since */
		size_t a, b;
		fsti_names_free(&w->names);
		if (fsti_names_build(&w->names, w->n, wtensor_name, w, &a, &b) < 0)
			return fsti_err(err, FST_ENOMEM, "writer: out of memory");
		w->names_stale = false;
	}
	if (fsti_names_find(&w->names, name, wtensor_name, w) >= 0)
		return fsti_err(err, FST_EUSAGE, "writer: tensor \"%s\" added twice", name);
	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 64;
		struct wtensor *grown = fsti_realloc(w->t, cap * sizeof *grown);
		if (!grown)
			return fsti_err(err, FST_ENOMEM, "writer: out of memory");
		w->t = grown;
		w->cap = cap;
	}
	struct wtensor *t = &w->t[w->n];
	memset(t, 0, sizeof *t);
	t->name = fsti_strdup(name);
	t->shape = fsti_malloc((ndim ? ndim : 1) * sizeof *t->shape);
	if (!t->name || !t->shape) {
		fsti_free(t->name);
		fsti_free(t->shape);
		return fsti_err(err, FST_ENOMEM, "writer: out of memory");
	}
	size_t unused;
	if (fsti_names_insert(&w->names, w->n, wtensor_name, w, &unused)) {
		fsti_free(t->name);
		fsti_free(t->shape);
		return fsti_err(err, FST_ENOMEM, "writer: out of memory");
	}
	if (ndim)
		memcpy(t->shape, shape, ndim * sizeof *shape);
	t->dtype = dtype;
	t->ndim = ndim;
	t->nbytes = bits / 8;
	t->data = data;
	t->fill = fill;
	t->ctx = ctx;
	t->added = w->n++;
	w->total += t->nbytes;
	return 0;
}

int fst_writer_add(fst_writer *w, const char *name, fst_dtype dtype, uint32_t ndim,
		   const uint64_t *shape, const void *data, uint64_t nbytes, fst_error *err)
{
	return add(w, name, dtype, ndim, shape, data, nbytes, NULL, NULL, err);
}

int fst_writer_add_fill(fst_writer *w, const char *name, fst_dtype dtype, uint32_t ndim,
			const uint64_t *shape, fst_fill_fn fill, void *ctx, fst_error *err)
{
	if (!fill)
		return fsti_err(err, FST_EUSAGE, "writer: tensor \"%s\": fill is NULL",
				name ? name : "");
	return add(w, name, dtype, ndim, shape, NULL, 0, fill, ctx, err);
}

int fst_writer_metadata(fst_writer *w, const char *key, const char *value, fst_error *err)
{
	fsti_err_clear(err);
	if (w && !key && !value) {
		w->meta_always = true;
		return 0;
	}
	if (!w || !key || !value)
		return fsti_err(err, FST_EUSAGE, "writer: metadata key and value are required");
	if (json_object_set_new(w->meta, key, json_string(value)))
		return fsti_err(err, FST_EUSAGE,
				"writer: metadata \"%s\": key and value must be valid UTF-8", key);
	return 0;
}

static unsigned size_alignment(uint64_t nbytes)
{
	if (!nbytes)
		return 64; /* empty tensors never misalign anything */
	unsigned a = 0;
	while (a < 63 && !(nbytes & (1ull << a)))
		a++;
	return a;
}

static int cmp_alignment(const void *pa, const void *pb)
{
	const struct wtensor *a = pa, *b = pb;
	unsigned x = size_alignment(a->nbytes), y = size_alignment(b->nbytes);
	if (x != y)
		return x > y ? -1 : 1;
	return strcmp(a->name, b->name);
}

static int cmp_added(const void *pa, const void *pb)
{
	const struct wtensor *a = pa, *b = pb;
	return a->added < b->added ? -1 : a->added > b->added;
}

static int write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* jansson writes a control character as \u001B, the reference writer (and
 * JSON's own examples) as \u001b: the same bytes as the reference's need
 * the hex digits in lower case. A backslash of the text is written \\, so
 * pairs are skipped whole and every \u found is an escape. */
static void lower_escapes(char *text, size_t n)
{
	for (size_t i = 0; i + 1 < n; i++) {
		if (text[i] != '\\')
			continue;
		if (text[i + 1] == 'u')
			for (size_t k = i + 2; k < i + 6 && k < n; k++)
				if (text[k] >= 'A' && text[k] <= 'F')
					text[k] = (char)(text[k] - 'A' + 'a');
		i++;
	}
}

/* Returns 0 and the padded header in *out (fsti_free it), or the status:
 * the caller may pass no fst_error, so the code cannot be read back from
 * err. */
static int build_header(fst_writer *w, char **out, size_t *len, fst_error *err)
{
	json_t *root = json_object();
	if (!root)
		return fsti_err(err, FST_ENOMEM, "writer: out of memory");
	int bad = 0;
	if (json_object_size(w->meta) || w->meta_always)
		bad |= json_object_set(root, "__metadata__", w->meta);
	for (size_t i = 0; i < w->n && !bad; i++) {
		struct wtensor *t = &w->t[i];
		json_t *shape = json_array();
		for (uint32_t d = 0; d < t->ndim && shape; d++)
			bad |= json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
		json_t *info = json_pack("{s:s, s:o, s:[I, I]}", "dtype", fst_dtype_name(t->dtype),
					 "shape", shape, "data_offsets", (json_int_t)t->begin,
					 (json_int_t)(t->begin + t->nbytes));
		if (!info || json_object_set_new(root, t->name, info))
			bad = 1;
	}
	char *text = bad ? NULL : json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (!text) /* names and metadata were checked as they came */
		return fsti_err(err, FST_ENOMEM, "writer: out of memory for the header");
	size_t n = strlen(text);
	lower_escapes(text, n);
	size_t align = w->opts.data_align;
	size_t total = (8 + n + align - 1) / align * align + w->opts.header_extra;
	size_t hlen = total - 8;
	if (hlen > FST_HEADER_MAX) {
		free(text);
		return fsti_err(err, FST_EUSAGE,
				"writer: header of %zu bytes exceeds the %u-byte limit", hlen,
				FST_HEADER_MAX);
	}
	char *buf = fsti_malloc(total);
	if (!buf) {
		free(text);
		return fsti_err(err, FST_ENOMEM, "writer: out of memory");
	}
	for (int i = 0; i < 8; i++)
		buf[i] = (char)((uint64_t)hlen >> (8 * i));
	memcpy(buf + 8, text, n);
	memset(buf + 8 + n, ' ', hlen - n);
	free(text);
	*out = buf;
	*len = total;
	return 0;
}

/* Orders the tensors, gives them their offsets and builds the header: what
 * every way of finishing shares. *total is the whole file's size. */
static int layout(fst_writer *w, char **header, size_t *hlen, uint64_t *total, fst_error *err)
{
	/* w->t is NULL until the first add, and qsort's pointer must not be
	 * NULL even for zero elements. */
	if (w->n) {
		qsort(w->t, w->n, sizeof *w->t,
		      w->opts.order == FST_ORDER_ALIGNMENT ? cmp_alignment : cmp_added);
		w->names_stale = true;
	}
	/* add kept the sum within INT64_MAX: no offset wraps */
	uint64_t off = 0;
	for (size_t i = 0; i < w->n; i++) {
		w->t[i].begin = off;
		off += w->t[i].nbytes;
	}
	int rc = build_header(w, header, hlen, err);
	if (!rc)
		*total = *hlen + off;
	return rc;
}

/* Where the bytes go: a descriptor (path names it in messages), or memory
 * the caller sized. */
struct sink {
	int fd;
	const char *path;
	char *mem;
	uint64_t at;
};

static int sink_write(struct sink *s, const void *buf, size_t len, fst_error *err)
{
	if (s->mem) {
		memcpy(s->mem + s->at, buf, len);
		s->at += len;
		return 0;
	}
	int e = write_full(s->fd, buf, len);
	return e ? fsti_err_sys(err, FST_EIO, -e, "%s: write failed", s->path) : 0;
}

/* The header, then every tensor's bytes. */
static int emit(fst_writer *w, const char *header, size_t hlen, struct sink *s, fst_error *err)
{
	int rc = sink_write(s, header, hlen, err);
	const size_t chunk_size = 4u << 20;
	char *chunk = NULL;
	for (size_t i = 0; i < w->n && !rc; i++) {
		struct wtensor *t = &w->t[i];
		if (!t->fill) {
			rc = sink_write(s, t->data, t->nbytes, err);
			continue;
		}
		if (!chunk && !(chunk = fsti_malloc(chunk_size))) {
			rc = fsti_err(err, FST_ENOMEM, "writer: out of memory");
			break;
		}
		for (uint64_t o = 0; o < t->nbytes && !rc; o += chunk_size) {
			size_t len = (size_t)FSTI_MIN((uint64_t)chunk_size, t->nbytes - o);
			rc = t->fill(t->ctx, chunk, o, len);
			if (rc) {
				rc = fsti_err(err, rc, "writer: tensor \"%s\": fill failed (%s)",
					      t->name, fst_strerror(rc));
				break;
			}
			rc = sink_write(s, chunk, len, err);
		}
	}
	fsti_free(chunk);
	return rc;
}

int fst_writer_size(fst_writer *w, uint64_t *size, fst_error *err)
{
	fsti_err_clear(err);
	if (!w || !size)
		return fsti_err(err, FST_EUSAGE, "writer: size is required");
	char *header = NULL;
	size_t hlen = 0;
	int rc = layout(w, &header, &hlen, size, err);
	fsti_free(header);
	return rc;
}

int fst_writer_finish_memory(fst_writer *w, void *dst, uint64_t size, fst_error *err)
{
	fsti_err_clear(err);
	if (!w || (!dst && size))
		return fsti_err(err, FST_EUSAGE, "writer: destination memory is required");
	char *header = NULL;
	size_t hlen = 0;
	uint64_t total = 0;
	int rc = layout(w, &header, &hlen, &total, err);
	if (rc)
		return rc;
	if (total != size) {
		fsti_free(header);
		return fsti_err(err, FST_EUSAGE,
				"writer: %" PRIu64 " bytes given for a file of %" PRIu64 " bytes", size,
				total);
	}
	struct sink s = {.fd = -1, .mem = dst};
	rc = emit(w, header, hlen, &s, err);
	fsti_free(header);
	return rc;
}

/* A file of our own beside path, PATH.tmp.XXXXXXXX: never one another
 * writer (a rank saving the same file) or a link put there is using. Where
 * the file's own name is within NAME_MAX but that one would not be, the
 * name's start is kept, cut short so the temporary name fits (a save the
 * file system allows must not fail on our name). */
static int create_temp(const char *path, char *tmp, size_t size, int *fd)
{
	static atomic_uint counter;
	const char *slash = strrchr(path, '/');
	size_t base = strlen(slash ? slash + 1 : path), keep = strlen(path);
	if (base + sizeof ".tmp.01234567" - 1 > NAME_MAX && base <= NAME_MAX)
		keep -= base + sizeof ".tmp.01234567" - 1 - NAME_MAX;
	for (int attempt = 0; attempt < 100; attempt++) {
		uint32_t r;
		if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
			r = (uint32_t)getpid() * 2654435761u + atomic_fetch_add(&counter, 1);
		snprintf(tmp, size, "%.*s.tmp.%08" PRIx32, (int)keep, path, r);
		*fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (*fd >= 0)
			return 0;
		if (errno != EEXIST)
			return errno;
	}
	return EEXIST;
}

int fst_writer_finish(fst_writer *w, const char *path, fst_error *err)
{
	fsti_err_clear(err);
	if (!w || !path)
		return fsti_err(err, FST_EUSAGE, "writer: path is required");
	size_t hlen = 0;
	uint64_t total = 0;
	char *header = NULL;
	int hrc = layout(w, &header, &hlen, &total, err);
	if (hrc)
		return hrc;

	size_t plen = strlen(path) + sizeof ".tmp.01234567";
	char *tmp = fsti_malloc(plen);
	int fd = -1, rc = 0;
	if (!tmp) {
		rc = fsti_err(err, FST_ENOMEM, "writer: out of memory");
		goto out;
	}
	int e = create_temp(path, tmp, plen, &fd);
	if (e) {
		rc = fsti_err_sys(err, FST_EIO, e, "%s: cannot create", tmp);
		fsti_free(tmp);
		tmp = NULL; /* not ours to unlink */
		goto out;
	}
	struct sink s = {.fd = fd, .path = tmp};
	rc = emit(w, header, hlen, &s, err);
	if (rc)
		goto out;
	if (close(fd)) {
		fd = -1;
		rc = fsti_err_sys(err, FST_EIO, errno, "%s: write failed", tmp);
		goto out;
	}
	fd = -1;
	if (rename(tmp, path))
		rc = fsti_err_sys(err, FST_EIO, errno, "%s: cannot rename to %s", tmp, path);
out:
	if (fd >= 0)
		close(fd);
	if (rc && tmp)
		unlink(tmp);
	fsti_free(tmp);
	fsti_free(header);
	return rc;
}
