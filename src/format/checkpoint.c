/*
 * checkpoint.c - one tensor table over one or more safetensors files: a
 * single file, a directory, or a model.safetensors.index.json; local, or
 * remote (an S3 folder is a directory, listed; shards of a remote index are
 * beside it, as they are locally).
 */
#include "format.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct entry {
	uint32_t file;
	uint32_t tensor;
};

struct fst_checkpoint {
	char *path;
	char *index_path;
	fst_file **files;
	size_t nfiles;
	struct entry *entries;
	size_t ntensors;
	uint64_t total_bytes;
	fsti_names by_name;
	/* while a remote checkpoint is being opened: its configuration and
	 * the one connection every request of the open goes through */
	struct fsti_remote *remote;
	struct fsti_conn *conn;
	/* a listed folder's names (S3's, or a directory's *.safetensors), for
	 * its index */
	char *const *present;
	size_t npresent;
};

static const char *entry_name(const void *ctx, size_t i)
{
	const struct fst_checkpoint *c = ctx;
	return c->files[c->entries[i].file]->tensors[c->entries[i].tensor].name;
}

void fst_checkpoint_close(fst_checkpoint *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nfiles; i++)
		fst_file_close(c->files[i]);
	fsti_free(c->files);
	fsti_free(c->entries);
	fsti_names_free(&c->by_name);
	fsti_free(c->path);
	fsti_free(c->index_path);
	fsti_free(c);
}

/* Build the combined table once c->files holds every file. */
static int build_table(fst_checkpoint *c, fst_error *err)
{
	size_t n = 0;
	for (size_t i = 0; i < c->nfiles; i++)
		n += c->files[i]->ntensors;
	if (n > UINT32_MAX)
		return fsti_err(err, FST_EUNSUPPORTED, "%s: more than 2^32 tensors", c->path);
	c->entries = fsti_calloc(n, sizeof *c->entries);
	if (!c->entries)
		return fsti_err(err, FST_ENOMEM, "%s: out of memory for %zu tensors", c->path, n);
	for (size_t i = 0; i < c->nfiles; i++)
		for (size_t j = 0; j < c->files[i]->ntensors; j++) {
			const struct fsti_tensor *t = &c->files[i]->tensors[j];
			c->entries[c->ntensors++] = (struct entry){(uint32_t)i, (uint32_t)j};
			c->total_bytes += t->end - t->begin;
		}
	size_t a, b;
	int dup = fsti_names_build(&c->by_name, c->ntensors, entry_name, c, &a, &b);
	if (dup < 0)
		return fsti_err(err, FST_ENOMEM, "%s: out of memory for the name table", c->path);
	if (dup > 0)
		return fsti_err(err, FST_EFORMAT, "tensor \"%s\" is in two files: %s and %s",
				entry_name(c, b), c->files[c->entries[a].file]->path,
				c->files[c->entries[b].file]->path);
	return 0;
}

static fst_checkpoint *checkpoint_new(const char *path, fst_error *err)
{
	fst_checkpoint *c = fsti_calloc(1, sizeof *c);
	/* a URL's secrets are not shown (fsti_url_display) */
	if (c && (c->path = fsti_url_display(path)))
		return c;
	fsti_free(c);
	fsti_err(err, FST_ENOMEM, "%s: out of memory", path);
	return NULL;
}

int fst_checkpoint_from_files(fst_file **files, size_t count, fst_checkpoint **out,
			      fst_error *err)
{
	fsti_err_clear(err);
	fst_checkpoint *c = checkpoint_new(count ? files[0]->path : "<no files>", err);
	if (!c) {
		for (size_t i = 0; i < count; i++)
			fst_file_close(files[i]);
		return FST_ENOMEM;
	}
	c->files = fsti_calloc(count, sizeof *c->files);
	if (!c->files) {
		for (size_t i = 0; i < count; i++)
			fst_file_close(files[i]);
		fst_checkpoint_close(c);
		return fsti_err(err, FST_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < count; i++)
		c->files[c->nfiles++] = files[i];
	int rc = build_table(c, err);
	if (rc) {
		fst_checkpoint_close(c);
		return rc;
	}
	*out = c;
	return 0;
}

static char *join_path(const char *dir, const char *name)
{
	if (fsti_url_kind(dir))
		return fsti_url_beside(dir, name);
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = fsti_malloc(n);
	bool slash = *dir && dir[strlen(dir) - 1] == '/'; /* "DIR/" given: no "DIR//x" */
	if (p)
		snprintf(p, n, "%s%s%s", dir, slash ? "" : "/", name);
	return p;
}

/* Whether s[0..a) ends with suffix. */
static bool ends_with_n(const char *s, size_t a, const char *suffix)
{
	size_t b = strlen(suffix);
	return a >= b && !memcmp(s + a - b, suffix, b);
}

static bool ends_with(const char *s, const char *suffix)
{
	return ends_with_n(s, strlen(s), suffix);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A shard name from an index must stay inside the checkpoint's directory. */
static bool shard_name_ok(const char *s)
{
	if (!*s || s[0] == '/')
		return false;
	for (const char *p = s; (p = strstr(p, "..")); p += 2)
		if ((p == s || p[-1] == '/') && (p[2] == '\0' || p[2] == '/'))
			return false;
	return true;
}

/* A shard name "PREFIX-K-of-N.safetensors" (K and N decimal, as
 * transformers and fst gen name shards), cut into its parts. */
struct shard_number {
	const char *name;
	size_t prefix_len;   /* PREFIX, without the '-' before K */
	const char *of;      /* "N.safetensors" */
	int kdigits;         /* K's width, for naming missing shards */
	unsigned long long k, n;
};

static bool parse_shard_number(const char *name, struct shard_number *out)
{
	static const char suffix[] = ".safetensors";
	size_t len = strlen(name), slen = sizeof suffix - 1;
	if (len <= slen || strcmp(name + len - slen, suffix))
		return false;
	const char *end = name + len - slen, *p = end;
	while (p > name && p[-1] >= '0' && p[-1] <= '9')
		p--;
	if (p == end || end - p > 18 || p - name < 4 || strncmp(p - 4, "-of-", 4))
		return false;
	const char *nstart = p;
	p -= 4;
	const char *kend = p;
	while (p > name && p[-1] >= '0' && p[-1] <= '9')
		p--;
	if (p == kend || kend - p > 18 || p == name || p[-1] != '-')
		return false;
	out->name = name;
	out->prefix_len = (size_t)(p - 1 - name);
	out->of = nstart;
	out->kdigits = (int)(kend - p);
	out->k = strtoull(p, NULL, 10);
	out->n = strtoull(nstart, NULL, 10);
	return true;
}

/* Same shard set: same prefix and same "-of-N" text. */
static int cmp_shard_set(const struct shard_number *a, const struct shard_number *b)
{
	if (a->prefix_len != b->prefix_len)
		return a->prefix_len < b->prefix_len ? -1 : 1;
	int c = memcmp(a->name, b->name, a->prefix_len);
	return c ? c : strcmp(a->of, b->of);
}

static int cmp_shard_number(const void *pa, const void *pb)
{
	const struct shard_number *a = pa, *b = pb;
	int c = cmp_shard_set(a, b);
	return c ? c : a->k < b->k ? -1 : a->k > b->k;
}

/*
 * Files named "-K-of-N" say how many belong together: with some missing (an
 * interrupted copy, download or write) the checkpoint is incomplete and
 * loading the rest would hand out part of a model as if it were whole.
 * names are the shard file names (as in the directory or the index); where
 * names them in messages.
 */
static int check_shard_sets(const char *where, char *const *names, size_t n,
			    char *const *beside, size_t nbeside, fst_error *err)
{
	struct shard_number *s = fsti_calloc(n + nbeside + 1, sizeof *s);
	if (!s)
		return fsti_err(err, FST_ENOMEM, "%s: out of memory", where);
	size_t m = 0;
	for (size_t i = 0; i < n; i++)
		if (parse_shard_number(names[i], &s[m]))
			m++;
	/* A file beside an index, of a set the index names, completes that set
	 * though the index maps no tensor to it (a stale or hand-edited index:
	 * it is reported as not loaded); only an absent one is missing. */
	size_t in_index = m;
	for (size_t i = 0; i < nbeside; i++) {
		if (!parse_shard_number(beside[i], &s[m]))
			continue;
		for (size_t k = 0; k < in_index; k++)
			if (!cmp_shard_set(&s[k], &s[m])) {
				m++;
				break;
			}
	}
	qsort(s, m, sizeof *s, cmp_shard_number);
	int rc = 0;
	for (size_t g = 0, next; g < m && !rc; g = next) {
		for (next = g + 1; next < m && !cmp_shard_set(&s[g], &s[next]); next++)
			;
		const struct shard_number *a = &s[g];
		if (a->k == 0 || s[next - 1].k > a->n) {
			const struct shard_number *bad = a->k == 0 ? a : &s[next - 1];
			rc = fsti_err(err, FST_EFORMAT,
				      "%s: shard \"%s\" says it is number %llu of %llu: numbers run "
				      "from 1 to the count",
				      where, bad->name, bad->k, bad->n);
			break;
		}
		/* The missing numbers lie in the gaps of the sorted present ones:
		 * each gap is counted whole, and the first three are named. */
		char list[600] = "";
		unsigned long long missing = 0, prev = 0;
		int named = 0;
		for (size_t i = g; i <= next; i++) {
			unsigned long long upto = i < next ? s[i].k : a->n + 1;
			if (upto > prev + 1)
				missing += upto - prev - 1;
			for (unsigned long long k = prev + 1; k < upto && named < 3; k++, named++) {
				size_t used = strlen(list);
				snprintf(list + used, sizeof list - used, "%s%.*s-%0*llu-of-%s",
					 used ? ", " : "", (int)a->prefix_len, a->name, a->kdigits,
					 k, a->of);
			}
			if (i < next)
				prev = s[i].k;
		}
		if (missing)
			rc = fsti_err(err, FST_EFORMAT,
				      "%s: incomplete checkpoint: %llu of the %llu \"%.*s-*-of-%s\" "
				      "shards %s missing: %s%s (an interrupted copy, download or "
				      "write?)",
				      where, missing, a->n, (int)a->prefix_len, a->name, a->of,
				      missing == 1 ? "is" : "are", list, missing > 3 ? ", ..." : "");
	}
	fsti_free(s);
	return rc;
}

/* What a directory holds: its *.safetensors files, and the index to use
 * (model.safetensors.index.json wins over other index files), of nindex. */
struct listing {
	char **names;
	size_t n, cap;
	char *index;
	size_t nindex;
};

static void listing_free(struct listing *l)
{
	for (size_t i = 0; i < l->n; i++)
		fsti_free(l->names[i]);
	fsti_free(l->names);
	fsti_free(l->index);
}

static int list_add(struct listing *l, const char *name, fst_error *err)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 16;
		char **grown = fsti_realloc(l->names, l->cap * sizeof *l->names);
		if (!grown)
			return fsti_err(err, FST_ENOMEM, "out of memory");
		l->names = grown;
	}
	if (!(l->names[l->n] = fsti_strdup(name)))
		return fsti_err(err, FST_ENOMEM, "out of memory");
	l->n++;
	return 0;
}

/* One entry of a directory into l; names starting with '.' are skipped. */
static int list_entry(struct listing *l, const char *name, fst_error *err)
{
	if (name[0] == '.')
		return 0;
	if (ends_with(name, ".safetensors.index.json")) {
		l->nindex++;
		if (!l->index || !strcmp(name, "model.safetensors.index.json")) {
			fsti_free(l->index);
			l->index = fsti_strdup(name);
			if (!l->index)
				return fsti_err(err, FST_ENOMEM, "out of memory");
		}
	} else if (ends_with(name, ".safetensors")) {
		return list_add(l, name, err);
	}
	return 0;
}

/* d's entries into l; d closed. */
static int list_dir(DIR *d, struct listing *l, fst_error *err)
{
	int rc = 0;
	struct dirent *e;
	while (!rc && (e = readdir(d)))
		rc = list_entry(l, e->d_name, err);
	closedir(d);
	return rc;
}

/* Shards beside an index that the index does not name are not loaded: say
 * so, since a stale or hand-edited index would otherwise drop them unseen. */
static void count_unlisted(const char *name, char *const *listed, size_t nlisted, size_t *extra,
			   char *first, size_t size)
{
	if (name[0] == '.' || !ends_with(name, ".safetensors") ||
	    bsearch(&name, listed, nlisted, sizeof *listed, cmp_str))
		return;
	if (!(*extra)++)
		snprintf(first, size, "%s", name);
}

static void report_unlisted_shards(const char *index_path, const char *dir,
				   char *const *listed, size_t nlisted, char *const *beside,
				   size_t nbeside)
{
	size_t extra = 0;
	char first[256] = "";
	for (size_t i = 0; i < nbeside; i++)
		count_unlisted(beside[i], listed, nlisted, &extra, first, sizeof first);
	if (extra)
		fsti_log(FST_LOG_WARN,
			 "%s: %zu *.safetensors file%s in %s %s not in the index and %s not "
			 "loaded (first: %s)",
			 index_path, extra, extra == 1 ? "" : "s", dir, extra == 1 ? "is" : "are",
			 extra == 1 ? "is" : "are", first);
}

static int add_file(fst_checkpoint *c, const char *path, size_t cap, fst_error *err)
{
	if (!c->files && !(c->files = fsti_calloc(cap, sizeof *c->files)))
		return fsti_err(err, FST_ENOMEM, "out of memory");
	fst_file *f;
	int rc = c->remote ? fsti_file_open_remote(path, c->remote, c->conn, &f, err)
			   : fst_file_open(path, &f, err);
	if (rc)
		return rc;
	c->files[c->nfiles++] = f;
	return 0;
}

/* The index's JSON. Opened here rather than by json_load_file, which keeps
 * no errno: the caller tells a missing index from an unreadable one by
 * sys_errno. */
/* An index larger than this is no index (a 100,000-tensor one is ~10 MB). */
#define INDEX_MAX (256u << 20)

/* A local index's bytes: a regular file (a FIFO would block the open, a
 * directory read as empty JSON) of at most INDEX_MAX bytes, read whole
 * into *text (fsti_free it), *len of them. */
static int read_local_index(const char *index_path, char **text, size_t *len, fst_error *err)
{
	*text = NULL;
	int fault = fsti_fault("open");
	int fd = fault ? (errno = fault, -1) : open(index_path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return fsti_err_sys(err, FST_EIO, errno, "%s: cannot open", index_path);
	struct stat st;
	int rc = 0;
	if (fstat(fd, &st))
		rc = fsti_err_sys(err, FST_EIO, errno, "%s: cannot stat", index_path);
	else if (!S_ISREG(st.st_mode))
		rc = fsti_err(err, FST_EFORMAT, "%s: is %s, not an index file", index_path,
			      S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
	else if ((uint64_t)st.st_size > INDEX_MAX)
		rc = fsti_err(err, FST_EFORMAT,
			      "%s: %" PRIu64 " bytes, more than the %u read of an index",
			      index_path, (uint64_t)st.st_size, INDEX_MAX);
	if (!rc && !(*text = fsti_malloc((size_t)st.st_size + 1)))
		rc = fsti_err(err, FST_ENOMEM, "%s: out of memory", index_path);
	/* shorter now: what there is, as JSON */
	int64_t got = rc ? 0 : fsti_pread_full(fd, *text, (size_t)st.st_size, 0);
	if (got < 0)
		rc = fsti_err_sys(err, FST_EIO, (int)-got, "%s: cannot read", index_path);
	close(fd);
	if (rc) {
		fsti_free(*text);
		*text = NULL;
	}
	*len = rc ? 0 : (size_t)got;
	return rc;
}

static int load_index(const fst_checkpoint *c, const char *index_path, json_t **root,
		      fst_error *err)
{
	char *text;
	size_t len;
	int rc = c->remote ? fsti_object_fetch(c->conn, c->remote, index_path, INDEX_MAX, &text,
					       &len, err)
			   : read_local_index(index_path, &text, &len, err);
	if (rc)
		return rc;
	json_error_t jerr;
	*root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	fsti_free(text);
	if (!*root)
		return fsti_err(err, FST_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)",
				index_path, jerr.text, jerr.line, jerr.column);
	return 0;
}

/* The index's weight_map: an object that maps at least one tensor. */
static int weight_map(const char *index_path, json_t *root, json_t **map, fst_error *err)
{
	*map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
	if (!json_is_object(*map))
		return fsti_err(err, FST_EFORMAT,
				"%s: must be an object with a \"weight_map\" object of tensor name "
				"to shard file name",
				index_path);
	if (!json_object_size(*map))
		return fsti_err(err, FST_EFORMAT,
				"%s: \"weight_map\" is empty: the index maps no tensor to a shard",
				index_path);
	return 0;
}

/* name without "." parts and empty ones ("./a", "sub//a"): one file, one
 * spelling, so that it is opened once. NULL when out of memory. */
static char *plain_shard_name(const char *name)
{
	char *out = fsti_malloc(strlen(name) + 1), *o = out;
	if (!out)
		return NULL;
	for (const char *p = name; *p;) {
		size_t len = strcspn(p, "/");
		if (len && !(len == 1 && *p == '.')) {
			if (o > out)
				*o++ = '/';
			memcpy(o, p, len);
			o += len;
		}
		p += len + (p[len] == '/');
	}
	*o = '\0';
	return out;
}

/* The shard names of map, each once, sorted, into *out (fsti_free it; the
 * names are map's). */
static int shard_names(const char *index_path, json_t *map, char ***out, size_t *n,
		       fst_error *err)
{
	/* the map's names in their plain spelling first: every check after
	 * compares them */
	const char *key;
	json_t *value;
	json_object_foreach(map, key, value) {
		const char *name = json_is_string(value) ? json_string_value(value) : NULL;
		/* as written: refused below ("/etc/x" would read "etc/x"), or a
		 * folder (".", "sub/", "x/.") said to be one there: "x/." is a
		 * folder's name, never the file x */
		size_t len = name ? strlen(name) : 0;
		if (!name || !shard_name_ok(name) || name[len - 1] == '/' ||
		    (name[len - 1] == '.' && (len == 1 || name[len - 2] == '/')))
			continue;
		char *plain = plain_shard_name(name);
		if (!plain || (*plain && strcmp(plain, name) &&
			       json_string_set(value, plain))) {
			fsti_free(plain);
			return fsti_err(err, FST_ENOMEM, "%s: out of memory", index_path);
		}
		fsti_free(plain);
	}

	char **shards = fsti_calloc(json_object_size(map) + 1, sizeof *shards);
	if (!shards)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	size_t nshards = 0;
	const char *tname;
	json_t *v;
	json_object_foreach(map, tname, v) {
		if (!json_is_string(v) || !shard_name_ok(json_string_value(v))) {
			fsti_free(shards);
			return fsti_err(err, FST_EFORMAT,
					"%s: weight_map \"%s\": shard must be %s",
					index_path, tname,
					json_is_string(v) ? "a relative file name inside the "
							    "checkpoint's directory"
							  : "a file name (a JSON string)");
		}
		shards[nshards++] = (char *)json_string_value(v);
	}
	qsort(shards, nshards, sizeof *shards, cmp_str);
	size_t unique = 0;
	for (size_t i = 0; i < nshards; i++)
		if (!unique || strcmp(shards[unique - 1], shards[i]))
			shards[unique++] = shards[i];
	*out = shards;
	*n = unique;
	return 0;
}

/* Open the index's shard named shard, which must be a file beside it. */
static int open_shard(fst_checkpoint *c, const char *index_path, const char *dir, json_t *map,
		      const char *shard, size_t cap, fst_error *err)
{
	char *p = join_path(dir, shard);
	if (!p)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	int rc;
	struct stat st;
	fst_error gone;
	/* a remote shard is missing when its GET says so (404) */
	int missing = c->remote ? 0 : stat(p, &st) ? errno : 0;
	if (c->remote) {
		rc = add_file(c, p, cap, &gone);
		if (rc == FST_EIO && gone.sys_errno == ENOENT)
			missing = ENOENT;
		else if (rc && err)
			*err = gone;
	}
	if (missing) {
		const char *example = "", *tname;
		json_t *v;
		json_object_foreach(map, tname, v)
			if (!strcmp(json_string_value(v), shard)) {
				example = tname;
				break;
			}
		rc = fsti_err_sys(err, FST_EFORMAT, missing,
				  "%s: shard \"%s\" (of tensor \"%s\") is missing: %s", index_path,
				  shard, example, c->remote ? gone.message : p);
	} else if (c->remote) {
		/* opened above */
	} else if (S_ISDIR(st.st_mode)) {
		/* "." or a subdirectory: the index is at fault (FST_EFORMAT), not
		 * the caller, as fst_file_open's FST_EUSAGE would say. */
		rc = fsti_err(err, FST_EFORMAT,
			      "%s: shard \"%s\" is a directory, not a safetensors file: %s",
			      index_path, shard, p);
	} else {
		rc = add_file(c, p, cap, err);
	}
	fsti_free(p);
	return rc;
}

/* Every mapped tensor must be in the shard the map names (shards: c's
 * files' names, in order). */
static int check_mapped(const fst_checkpoint *c, const char *index_path, json_t *map,
			char *const *shards, size_t nshards, fst_error *err)
{
	const char *tname;
	json_t *v;
	json_object_foreach(map, tname, v) {
		const char *shard = json_string_value(v);
		size_t k = 0;
		while (k < nshards && strcmp(shards[k], shard))
			k++;
		if (fst_file_find(c->files[k], tname) < 0)
			return fsti_err(err, FST_EFORMAT,
					"%s: tensor \"%s\" is mapped to shard \"%s\" but that shard "
					"has no such tensor",
					index_path, tname, shard);
	}
	return 0;
}

/* Tensors in the shards that the map does not name are kept: say so. */
static void report_unmapped(const fst_checkpoint *c, json_t *map)
{
	size_t nmap = json_object_size(map);
	if (c->ntensors <= nmap)
		return;
	for (size_t i = 0; i < c->ntensors; i++)
		if (!json_object_get(map, entry_name(c, i))) {
			fsti_log(FST_LOG_WARN,
				 "%s: %zu tensors are in shards but not in weight_map (first: "
				 "\"%s\" in %s); they are kept",
				 c->index_path, c->ntensors - nmap, entry_name(c, i),
				 c->files[c->entries[i].file]->path);
			break;
		}
}

/* The names in an index's folder: a listed S3 folder's, else (a local
 * index) its directory's; none for an index opened by its URL, which has
 * no listing. */
static int names_beside(const fst_checkpoint *c, const char *dir, struct listing *own,
			char *const **names, size_t *n, fst_error *err)
{
	*names = c->present;
	*n = c->npresent;
	if (c->present || c->remote)
		return 0;
	DIR *d = opendir(dir);
	if (!d)
		return 0; /* nothing beside it to tell of */
	int rc = list_dir(d, own, err);
	*names = own->names;
	*n = own->n;
	return rc;
}

/* The shards an index's JSON names, opened and checked against it. */
static int open_mapped(fst_checkpoint *c, const char *index_path, const char *dir, json_t *root,
		       fst_error *err)
{
	json_t *map;
	int rc = weight_map(index_path, root, &map, err);
	if (rc)
		return rc;
	char **shards = NULL;
	size_t n = 0;
	rc = shard_names(index_path, map, &shards, &n, err);
	if (rc)
		return rc;
	struct listing own = {0};
	char *const *beside;
	size_t nbeside;
	rc = names_beside(c, dir, &own, &beside, &nbeside, err);
	if (!rc)
		rc = check_shard_sets(index_path, shards, n, beside, nbeside, err);
	if (!rc)
		report_unlisted_shards(index_path, dir, shards, n, beside, nbeside);
	listing_free(&own);
	for (size_t i = 0; i < n && !rc; i++)
		rc = open_shard(c, index_path, dir, map, shards[i], n, err);
	if (!rc)
		rc = check_mapped(c, index_path, map, shards, n, err);
	if (!rc)
		rc = build_table(c, err);
	if (!rc)
		report_unmapped(c, map);
	fsti_free(shards);
	return rc;
}

static int open_index(fst_checkpoint *c, const char *index_path, const char *dir, fst_error *err)
{
	if (!(c->index_path = fsti_url_display(index_path)))
		return fsti_err(err, FST_ENOMEM, "out of memory");
	json_t *root;
	int rc = load_index(c, index_path, &root, err);
	if (rc)
		return rc;
	rc = open_mapped(c, index_path, dir, root, err);
	json_decref(root);
	return rc;
}

/* A folder's entries into l: readdir, or an S3 listing. */
static int list_folder(fst_checkpoint *c, const char *dir, struct listing *l, char ***names,
		       size_t *n, fst_error *err)
{
	int rc = 0;
	*names = NULL;
	*n = 0;
	if (c->remote) {
		rc = fsti_s3_list(c->conn, c->remote, dir, names, n, err);
		for (size_t i = 0; i < *n && !rc; i++)
			rc = list_entry(l, (*names)[i], err);
		c->present = *names;
		c->npresent = *n;
		return rc;
	}
	DIR *d = opendir(dir);
	if (!d)
		return fsti_err_sys(err, FST_EIO, errno, "%s: cannot open directory", dir);
	rc = list_dir(d, l, err);
	/* its *.safetensors names, for an index in it (names_beside) */
	c->present = l->names;
	c->npresent = l->n;
	return rc;
}

/* A directory with an index: the index says what is loaded. */
static int open_listed_index(fst_checkpoint *c, const char *dir, const struct listing *l,
			     fst_error *err)
{
	if (l->nindex > 1 && strcmp(l->index, "model.safetensors.index.json"))
		return fsti_err(err, FST_EFORMAT,
				"%s: %zu *.safetensors.index.json files and none is "
				"model.safetensors.index.json: name the one to use",
				dir, l->nindex);
	char *p = join_path(dir, l->index);
	if (!p)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	int rc = open_index(c, p, dir, err);
	fsti_free(p);
	return rc;
}

static int open_directory(fst_checkpoint *c, const char *dir, fst_error *err)
{
	struct listing l = {0};
	char **names;
	size_t nnames;
	int rc = list_folder(c, dir, &l, &names, &nnames, err);
	if (!rc && l.index) {
		rc = open_listed_index(c, dir, &l, err);
	} else if (!rc && !l.n) {
		rc = fsti_err(err, FST_EFORMAT, "%s: %s holds no *.safetensors files", dir,
			      c->remote ? "the S3 folder" : "directory");
	} else if (!rc) {
		qsort(l.names, l.n, sizeof *l.names, cmp_str);
		rc = check_shard_sets(dir, l.names, l.n, NULL, 0, err);
		for (size_t i = 0; i < l.n && !rc; i++) {
			char *p = join_path(dir, l.names[i]);
			struct stat st;
			if (!p)
				rc = fsti_err(err, FST_ENOMEM, "%s: out of memory", dir);
			else if (!c->remote && !stat(p, &st) && S_ISDIR(st.st_mode))
				/* the folder's content is at fault, not the caller (whom
				 * fst_file_open's FST_EUSAGE would blame) */
				rc = fsti_err(err, FST_EFORMAT,
					      "%s: is a directory, not a safetensors file", p);
			else
				rc = add_file(c, p, l.n, err);
			fsti_free(p);
		}
		if (!rc)
			rc = build_table(c, err);
	}
	listing_free(&l);
	for (size_t i = 0; i < nnames; i++)
		fsti_free(names[i]);
	fsti_free(names);
	c->present = NULL;
	c->npresent = 0;
	return rc;
}

/* The folder of an index, where its shards are. */
static int open_index_path(fst_checkpoint *c, const char *path, fst_error *err)
{
	if (c->remote)
		return open_index(c, path, path, err); /* shards beside it: fsti_url_beside */
	char *dir = fsti_strdup(path);
	if (!dir)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	char *slash = strrchr(dir, '/');
	if (slash)
		slash[slash == dir ? 1 : 0] = '\0';
	int rc = open_index(c, path, slash ? dir : ".", err);
	fsti_free(dir);
	return rc;
}

/* A checkpoint at a URL: one configuration and one connection for every
 * request of the open. Folders can be listed on S3 only. */
static int open_remote(fst_checkpoint *c, const char *url, const fst_open_opts *opts,
		       fst_error *err)
{
	bool s3 = fsti_url_kind(url) == FSTI_URL_S3;
	if (!s3 && fsti_url_is_folder(url))
		return fsti_err(err, FST_EUSAGE,
				"%s: an http(s) URL names a .safetensors file or an index (.json); "
				"only S3 folders (s3://BUCKET/PREFIX/) can be listed",
				url);
	int rc = fsti_remote_new(opts, s3, &c->remote, err);
	if (!rc)
		rc = fsti_conn_new(&c->conn, err);
	if (!rc) {
		fsti_log(FST_LOG_INFO, "%s: %s", c->path, c->remote->why);
		if (fsti_url_is_folder(url))
			rc = open_directory(c, url, err);
		else if (ends_with_n(url, fsti_url_path_len(url), ".json")) /* not its query */
			rc = open_index_path(c, url, err);
		else if (!(rc = add_file(c, url, 1, err)))
			rc = build_table(c, err);
	}
	/* each file keeps its own reference to the configuration */
	fsti_conn_free(c->conn);
	fsti_remote_unref(c->remote);
	c->conn = NULL;
	c->remote = NULL;
	return rc;
}

int fst_checkpoint_open(const char *path, fst_checkpoint **out, fst_error *err)
{
	return fst_checkpoint_open_ex(path, NULL, out, err);
}

int fst_checkpoint_open_ex(const char *path, const fst_open_opts *opts, fst_checkpoint **out,
			   fst_error *err)
{
	fsti_err_clear(err);
	if (!path || !out)
		return fsti_err(err, FST_EUSAGE, "fst_checkpoint_open: path and out are required");
	*out = NULL;
	fst_checkpoint *c = checkpoint_new(path, err);
	if (!c)
		return FST_ENOMEM;
	struct stat st;
	int rc;
	if (fsti_url_kind(path)) {
		rc = open_remote(c, path, opts, err);
	} else if (stat(path, &st)) {
		rc = fsti_err_sys(err, FST_EIO, errno, "%s: cannot open", path);
	} else if (S_ISDIR(st.st_mode)) {
		rc = open_directory(c, path, err);
	} else if (ends_with(path, ".json")) {
		rc = open_index_path(c, path, err);
	} else {
		rc = add_file(c, path, 1, err);
		if (!rc)
			rc = build_table(c, err);
	}
	if (rc) {
		fst_checkpoint_close(c);
		/* messages name the URL, its index and shards as given */
		if (err && fsti_url_kind(path))
			fsti_url_hide(err->message, sizeof err->message, path);
		return rc;
	}
	*out = c;
	return 0;
}

const char *fst_checkpoint_path(const fst_checkpoint *c) { return c->path; }
const char *fst_checkpoint_index_path(const fst_checkpoint *c) { return c->index_path; }
size_t fst_checkpoint_file_count(const fst_checkpoint *c) { return c->nfiles; }
size_t fst_checkpoint_tensor_count(const fst_checkpoint *c) { return c->ntensors; }
uint64_t fst_checkpoint_total_bytes(const fst_checkpoint *c) { return c->total_bytes; }

const fst_file *fst_checkpoint_file(const fst_checkpoint *c, size_t i)
{
	return i < c->nfiles ? c->files[i] : NULL;
}

int fst_checkpoint_tensor(const fst_checkpoint *c, size_t i, fst_tensor_info *out,
			  size_t *file_index)
{
	if (!c || !out || i >= c->ntensors)
		return FST_EUSAGE;
	fsti_tensor_info(c->files[c->entries[i].file], c->entries[i].tensor, out);
	if (file_index)
		*file_index = c->entries[i].file;
	return 0;
}

long fst_checkpoint_find(const fst_checkpoint *c, const char *name)
{
	return fsti_names_find(&c->by_name, name, entry_name, c);
}
