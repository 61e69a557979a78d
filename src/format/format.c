/*
 * format.c - parse and validate a safetensors header.
 *
 * The rules are those the reference reader enforces (docs/design.md, "Format
 * rules"), plus one more: duplicate keys are rejected. Every message starts
 * with the file's name and, when a tensor is at fault, names it.
 */
#include "format.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fsti_format_shape(char *buf, size_t size, uint32_t ndim, const uint64_t *shape)
{
	size_t n = 0;
	n += (size_t)snprintf(buf + n, size - n, "[");
	for (uint32_t i = 0; i < ndim && n < size; i++) {
		if (n + 24 >= size) {
			snprintf(buf + n, size - n, "...");
			n = strlen(buf);
			break;
		}
		n += (size_t)snprintf(buf + n, size - n, "%s%" PRIu64, i ? ", " : "", shape[i]);
	}
	if (n < size)
		snprintf(buf + n, size - n, "]");
}

size_t fsti_utf8_check(const unsigned char *s, size_t len)
{
	size_t i = 0;
	while (i < len) {
		unsigned char c = s[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t n;
		uint32_t cp;
		if (c >= 0xC2 && c <= 0xDF) {
			n = 2;
			cp = c & 0x1F;
		} else if (c >= 0xE0 && c <= 0xEF) {
			n = 3;
			cp = c & 0x0F;
		} else if (c >= 0xF0 && c <= 0xF4) {
			n = 4;
			cp = c & 0x07;
		} else {
			return i;
		}
		if (i + n > len)
			return i;
		for (size_t k = 1; k < n; k++) {
			if ((s[i + k] & 0xC0) != 0x80)
				return i;
			cp = (cp << 6) | (s[i + k] & 0x3F);
		}
		if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
		    (cp >= 0xD800 && cp <= 0xDFFF))
			return i;
		i += n;
	}
	return len;
}

/* jansson does not say which key was duplicated; the key is the last string
 * token before the error position. Best effort: copies it into buf. */
static void duplicate_key_name(const char *text, size_t pos, char *buf, size_t size)
{
	buf[0] = '\0';
	size_t end = pos;
	while (end > 0 && text[end - 1] != '"')
		end--;
	if (end == 0)
		return;
	end--; /* at the closing quote */
	size_t begin = end;
	while (begin > 0 && !(text[begin - 1] == '"' && (begin < 2 || text[begin - 2] != '\\')))
		begin--;
	if (begin == 0)
		return;
	size_t n = FSTI_MIN(end - begin, size - 1);
	memcpy(buf, text + begin, n);
	buf[n] = '\0';
}

/* A JSON value that is a non-negative integer; jansson rejects integers
 * above INT64_MAX while parsing. */
static bool get_uint(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

static int cmp_offsets(const void *pa, const void *pb)
{
	const struct fsti_tensor *a = pa, *b = pb;
	if (a->begin != b->begin)
		return a->begin < b->begin ? -1 : 1;
	if (a->end != b->end)
		return a->end < b->end ? -1 : 1;
	return strcmp(a->name, b->name);
}

const char *fsti_tensor_name_of(const void *ctx, size_t i)
{
	return ((const fst_file *)ctx)->tensors[i].name;
}

static int parse_metadata(fst_file *f, const char *name, json_t *meta, fst_error *err)
{
	if (json_is_null(meta))
		return 0;
	if (!json_is_object(meta))
		return fsti_err(err, FST_EFORMAT,
				"%s: __metadata__ must be an object of string values", name);
	f->has_meta = true;
	size_t n = json_object_size(meta);
	f->meta_keys = fsti_calloc(n, sizeof(char *));
	f->meta_values = fsti_calloc(n, sizeof(char *));
	if (!f->meta_keys || !f->meta_values)
		return fsti_err(err, FST_ENOMEM, "%s: out of memory for metadata", name);
	const char *key;
	json_t *v;
	json_object_foreach(meta, key, v) {
		if (!json_is_string(v))
			return fsti_err(err, FST_EFORMAT,
					"%s: __metadata__ \"%s\": value must be a string", name,
					key);
		f->meta_keys[f->nmeta] = fsti_strdup(key);
		f->meta_values[f->nmeta] = fsti_strdup(json_string_value(v));
		f->nmeta++;
		if (!f->meta_keys[f->nmeta - 1] || !f->meta_values[f->nmeta - 1])
			return fsti_err(err, FST_ENOMEM, "%s: out of memory for metadata", name);
	}
	return 0;
}

/* t's element count fits, makes whole bytes, and is what its data_offsets
 * span; sets t->numel. */
static int check_size(const char *name, const char *tname, struct fsti_tensor *t,
		      fst_error *err)
{
	char sh[128];
	fsti_format_shape(sh, sizeof sh, t->ndim, t->shape);
	uint64_t numel = 1;
	for (uint32_t i = 0; i < t->ndim; i++) {
		if (t->shape[i] && numel > UINT64_MAX / t->shape[i])
			return fsti_err(err, FST_EFORMAT,
					"%s: tensor \"%s\": shape %s has more elements than fit in "
					"64 bits",
					name, tname, sh);
		numel *= t->shape[i];
	}
	t->numel = numel;
	unsigned bits = fst_dtype_bits(t->dtype);
	if (numel > UINT64_MAX / bits)
		return fsti_err(err, FST_EFORMAT,
				"%s: tensor \"%s\": shape %s of %s has more bits than fit in 64 bits",
				name, tname, sh, fst_dtype_name(t->dtype));
	uint64_t total_bits = numel * bits;
	if (total_bits % 8)
		return fsti_err(err, FST_EFORMAT,
				"%s: tensor \"%s\": shape %s of %s is %" PRIu64
				" bits, not a whole number of bytes",
				name, tname, sh, fst_dtype_name(t->dtype), total_bits);
	if (t->end < t->begin)
		return fsti_err(err, FST_EFORMAT,
				"%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
				"] end before begin",
				name, tname, t->begin, t->end);
	if (t->end - t->begin != total_bits / 8)
		return fsti_err(err, FST_EFORMAT,
				"%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
				"] but shape %s of %s needs %" PRIu64 " bytes",
				name, tname, t->begin, t->end, sh, fst_dtype_name(t->dtype),
				total_bits / 8);
	return 0;
}

/* Check one tensor entry and fill t (name and shape already point into the
 * arena). */
static int parse_tensor(const char *name, const char *tname, json_t *info,
			struct fsti_tensor *t, fst_error *err)
{
	if (!json_is_object(info))
		return fsti_err(err, FST_EFORMAT,
				"%s: tensor \"%s\": expected an object with dtype, shape and "
				"data_offsets",
				name, tname);
	static const char *const fields[] = {"dtype", "shape", "data_offsets"};
	for (int i = 0; i < 3; i++)
		if (!json_object_get(info, fields[i]))
			return fsti_err(err, FST_EFORMAT, "%s: tensor \"%s\": missing \"%s\"",
					name, tname, fields[i]);

	json_t *dtype = json_object_get(info, "dtype");
	if (!json_is_string(dtype))
		return fsti_err(err, FST_EFORMAT, "%s: tensor \"%s\": dtype must be a string",
				name, tname);
	t->dtype = fst_dtype_from_name(json_string_value(dtype));
	if (t->dtype == FST_DTYPE_INVALID)
		return fsti_err(err, FST_EFORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", name,
				tname, json_string_value(dtype));

	json_t *shape = json_object_get(info, "shape");
	if (!json_is_array(shape))
		return fsti_err(err, FST_EFORMAT,
				"%s: tensor \"%s\": shape must be an array of non-negative integers",
				name, tname);
	t->ndim = (uint32_t)json_array_size(shape);
	for (uint32_t i = 0; i < t->ndim; i++) {
		if (!get_uint(json_array_get(shape, i), &t->shape[i]))
			return fsti_err(err, FST_EFORMAT,
					"%s: tensor \"%s\": shape[%u] must be a non-negative integer",
					name, tname, i);
	}

	json_t *offs = json_object_get(info, "data_offsets");
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    !get_uint(json_array_get(offs, 0), &t->begin) ||
	    !get_uint(json_array_get(offs, 1), &t->end))
		return fsti_err(err, FST_EFORMAT,
				"%s: tensor \"%s\": data_offsets must be [begin, end], two "
				"non-negative integers",
				name, tname);
	return check_size(name, tname, t, err);
}

/* After sorting: tensors must tile [0, data_len) with no hole or overlap. */
static int check_coverage(const fst_file *f, const char *name, uint64_t data_len,
			  fst_error *err)
{
	uint64_t expected = 0;
	for (size_t i = 0; i < f->ntensors; i++) {
		const struct fsti_tensor *t = &f->tensors[i];
		if (t->end > data_len)
			return fsti_err(err, FST_EFORMAT,
					"%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
					"] run past the data section's %" PRIu64
					" bytes (file not fully covered: truncated?)",
					name, t->name, t->begin, t->end, data_len);
		if (t->begin > expected)
			return fsti_err(err, FST_EFORMAT,
					"%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
					"] leave a gap: bytes [%" PRIu64 ", %" PRIu64
					") belong to no tensor",
					name, t->name, t->begin, t->end, expected, t->begin);
		if (t->begin < expected) {
			const struct fsti_tensor *p = &f->tensors[i - 1];
			return fsti_err(err, FST_EFORMAT,
					"%s: tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
					"] overlap tensor \"%s\" [%" PRIu64 ", %" PRIu64 "]",
					name, t->name, t->begin, t->end, p->name, p->begin, p->end);
		}
		expected = t->end;
	}
	if (expected != data_len)
		return fsti_err(err, FST_EFORMAT,
				"%s: data section is %" PRIu64 " bytes but tensors cover %" PRIu64
				": %" PRIu64 " trailing bytes (file not fully covered)",
				name, data_len, expected, data_len - expected);
	return 0;
}

/* The message for a header jansson would not parse. */
static int json_failure(const char *name, const char *header, size_t len,
			const json_error_t *jerr, fst_error *err)
{
	if (json_error_code(jerr) == json_error_duplicate_key) {
		char key[256];
		duplicate_key_name(header, (size_t)jerr->position, key, sizeof key);
		return fsti_err(err, FST_EFORMAT,
				"%s: duplicate key \"%s\" in header (line %d, column %d)", name, key,
				jerr->line, jerr->column);
	}
	/* jansson's own text for this case ("end of file expected near end of
	 * file" for NUL padding) hides the cause: say it is padding or garbage
	 * after the object, and show the byte. */
	size_t at = jerr->position > 0 ? (size_t)jerr->position - 1 : 0;
	/* position is past the whole offending character: back up to its
	 * first byte. */
	while (at > 0 && at < len && ((unsigned char)header[at] & 0xC0) == 0x80)
		at--;
	if (json_error_code(jerr) == json_error_end_of_input_expected && at < len)
		return fsti_err(err, FST_EFORMAT,
				"%s: header is not valid JSON: byte %zu of the header (0x%02x) "
				"follows the JSON object, where only whitespace may (NUL "
				"padding is not allowed)",
				name, at, (unsigned char)header[at]);
	return fsti_err(err, FST_EFORMAT, "%s: header is not valid JSON: %s (line %d, column %d)",
			name, jerr->text, jerr->line, jerr->column);
}

/* The shape array of a tensor entry, when it is one. */
static json_t *entry_shape(json_t *v)
{
	json_t *shape = json_is_object(v) ? json_object_get(v, "shape") : NULL;
	return json_is_array(shape) ? shape : NULL;
}

/* One arena for names and shapes, sized first, and the tensor table;
 * *shape_bytes is the part of the arena that holds shapes. */
static int alloc_tables(fst_file *f, const char *name, json_t *root, size_t *shape_bytes,
			fst_error *err)
{
	size_t ntensors = 0, name_bytes = 0, shape_words = 0;
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if (!strcmp(key, "__metadata__"))
			continue;
		ntensors++;
		name_bytes += strlen(key) + 1;
		json_t *shape = entry_shape(v);
		if (shape)
			shape_words += json_array_size(shape) + 1;
	}
	*shape_bytes = shape_words * sizeof(uint64_t);
	f->tensors = fsti_calloc(ntensors, sizeof *f->tensors);
	f->arena = fsti_malloc(*shape_bytes + name_bytes);
	if (!f->tensors || !f->arena)
		return fsti_err(err, FST_ENOMEM, "%s: out of memory for %zu tensors", name,
				ntensors);
	return 0;
}

/* Every entry of the header: the metadata, and each tensor, its name and
 * shape placed in the arena (shapes first, 8-byte aligned; names after). */
static int parse_entries(fst_file *f, const char *name, json_t *root, size_t shape_bytes,
			 fst_error *err)
{
	uint64_t *shapes = (uint64_t *)(void *)f->arena;
	char *names = f->arena + shape_bytes;
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		int rc;
		if (!strcmp(key, "__metadata__")) {
			rc = parse_metadata(f, name, v, err);
			if (rc)
				return rc;
			continue;
		}
		struct fsti_tensor *t = &f->tensors[f->ntensors++];
		size_t klen = strlen(key) + 1;
		memcpy(names, key, klen);
		t->name = names;
		names += klen;
		t->shape = shapes;
		json_t *shape = entry_shape(v);
		if (shape)
			shapes += json_array_size(shape) + 1;
		rc = parse_tensor(name, key, v, t, err);
		if (rc)
			return rc;
	}
	return 0;
}

/* The tensors of a parsed header object, checked and indexed. */
static int parse_root(fst_file *f, const char *name, json_t *root, uint64_t data_len,
		      fst_error *err)
{
	if (!json_is_object(root))
		return fsti_err(err, FST_EFORMAT, "%s: header must be a JSON object", name);
	size_t shape_bytes;
	int rc = alloc_tables(f, name, root, &shape_bytes, err);
	if (!rc)
		rc = parse_entries(f, name, root, shape_bytes, err);
	if (rc)
		return rc;
	qsort(f->tensors, f->ntensors, sizeof *f->tensors, cmp_offsets);
	rc = check_coverage(f, name, data_len, err);
	if (rc)
		return rc;
	size_t a, b;
	int dup = fsti_names_build(&f->by_name, f->ntensors, fsti_tensor_name_of, f, &a, &b);
	if (dup < 0)
		return fsti_err(err, FST_ENOMEM, "%s: out of memory for the name table", name);
	if (dup > 0)
		return fsti_err(err, FST_EFORMAT, "%s: duplicate key \"%s\" in header", name,
				f->tensors[b].name);
	return 0;
}

int fsti_parse_header(fst_file *f, const char *name, const char *header, size_t len,
		      uint64_t data_len, fst_error *err)
{
	size_t bad = fsti_utf8_check((const unsigned char *)header, len);
	if (bad != len)
		return fsti_err(err, FST_EFORMAT,
				"%s: header is not valid UTF-8 (byte %zu of the header)", name, bad);
	json_error_t jerr;
	json_t *root = json_loadb(header, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return json_failure(name, header, len, &jerr, err);
	int rc = parse_root(f, name, root, data_len, err);
	json_decref(root);
	return rc;
}

void fsti_tensor_info(const fst_file *f, size_t i, fst_tensor_info *out)
{
	const struct fsti_tensor *t = &f->tensors[i];
	out->name = t->name;
	out->dtype = t->dtype;
	out->ndim = t->ndim;
	out->shape = t->ndim ? t->shape : NULL;
	out->numel = t->numel;
	out->nbytes = t->end - t->begin;
	out->begin = t->begin;
	out->end = t->end;
	out->file_offset = f->data_offset + t->begin;
}
