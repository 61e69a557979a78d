/*
 * list.c - the objects in an S3 folder, by ListObjectsV2 with a '/'
 * delimiter (only the folder's own objects, not those of its subfolders),
 * page after page. Of the XML only Contents/Key, IsTruncated and
 * NextContinuationToken are read; anything that is not a ListBucketResult
 * is an error naming the folder.
 */
#include "net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE_MAX (16u << 20) /* bytes of one page's XML: 1000 keys take ~300 KiB */
#define PAGES_MAX 10000      /* 10 million objects */

/* The text between <tag> and </tag> in [p, end), or NULL. */
static const char *element(const char *p, const char *end, const char *tag, size_t *n)
{
	char open[48], close[48];
	int a = snprintf(open, sizeof open, "<%s>", tag);
	snprintf(close, sizeof close, "</%s>", tag);
	for (const char *s = p; s + a <= end; s++) {
		if (memcmp(s, open, (size_t)a))
			continue;
		const char *v = s + a;
		size_t cl = strlen(close);
		for (const char *e = v; e + cl <= end; e++)
			if (!memcmp(e, close, cl)) {
				*n = (size_t)(e - v);
				return v;
			}
		return NULL;
	}
	return NULL;
}

static void put_utf8(char **o, unsigned long c)
{
	unsigned char *u = (unsigned char *)*o;
	if (c < 0x80) {
		*u++ = (unsigned char)c;
	} else if (c < 0x800) {
		*u++ = (unsigned char)(0xc0 | c >> 6);
		*u++ = (unsigned char)(0x80 | (c & 0x3f));
	} else if (c < 0x10000) {
		*u++ = (unsigned char)(0xe0 | c >> 12);
		*u++ = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
		*u++ = (unsigned char)(0x80 | (c & 0x3f));
	} else {
		*u++ = (unsigned char)(0xf0 | c >> 18);
		*u++ = (unsigned char)(0x80 | ((c >> 12) & 0x3f));
		*u++ = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
		*u++ = (unsigned char)(0x80 | (c & 0x3f));
	}
	*o = (char *)u;
}

/* XML text with its five entities and character references decoded; NULL
 * when out of memory or for a reference that is not one. */
static char *xml_decode(const char *v, size_t n, bool *bad)
{
	*bad = false;
	char *out = fsti_malloc(n + 1), *o = out;
	if (!out)
		return NULL;
	static const struct {
		const char *name;
		char ch;
	} named[] = {{"amp;", '&'}, {"lt;", '<'}, {"gt;", '>'}, {"quot;", '"'}, {"apos;", '\''}};
	for (size_t i = 0; i < n;) {
		if (v[i] != '&') {
			*o++ = v[i++];
			continue;
		}
		const char *semi = memchr(v + i, ';', n - i);
		size_t len = semi ? (size_t)(semi - (v + i)) + 1 : 0;
		bool done = false;
		for (size_t k = 0; semi && !done && k < sizeof named / sizeof named[0]; k++)
			if (len == strlen(named[k].name) + 1 && !memcmp(v + i + 1, named[k].name, len - 1)) {
				*o++ = named[k].ch;
				done = true;
			}
		if (!done && semi && len > 3 && v[i + 1] == '#') {
			char num[16];
			size_t digits = len - 3;
			if (digits < sizeof num) {
				bool hex = v[i + 2] == 'x';
				memcpy(num, v + i + (hex ? 3 : 2), digits - (hex ? 1 : 0) + 1);
				num[digits - (hex ? 1 : 0)] = '\0';
				/* digits only (strtoul would take a sign or spaces), and
				 * a character: no surrogate half */
				const char *allowed = hex ? "0123456789abcdefABCDEF" : "0123456789";
				bool digits_only = *num && !num[strspn(num, allowed)];
				unsigned long c = digits_only ? strtoul(num, NULL, hex ? 16 : 10) : 0;
				if (c && c <= 0x10ffff && (c < 0xd800 || c > 0xdfff)) {
					put_utf8(&o, c);
					done = true;
				}
			}
		}
		if (!done) {
			*bad = true;
			fsti_free(out);
			return NULL;
		}
		i += len;
	}
	*o = '\0';
	return out;
}

static int push(char ***names, size_t *n, size_t *cap, char *s)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 64;
		char **grown = fsti_realloc(*names, c * sizeof *grown);
		if (!grown)
			return -1;
		*names = grown;
		*cap = c;
	}
	(*names)[(*n)++] = s;
	return 0;
}

int fsti_s3_parse_page(const char *what, const char *xml, size_t len, const char *prefix,
		       char ***names, size_t *n, size_t *cap, char **next, fst_error *err)
{
	*next = NULL;
	const char *end = xml + len;
	const char *root = NULL;
	for (const char *s = xml; s + 17 <= end && !root; s++)
		if (!memcmp(s, "<ListBucketResult", 17))
			root = s;
	if (!root)
		return fsti_err(err, FST_EIO,
				"%s: the listing is not an S3 ListBucketResult (an S3 endpoint? "
				"first bytes: \"%.60s\")",
				what, xml);
	/* a page cut short (a body with no length, a dropped connection that
	 * still ended the transfer) would list fewer keys without a word */
	bool closed = false;
	for (const char *s = root; s + 19 <= end && !closed; s++)
		closed = !memcmp(s, "</ListBucketResult>", 19);
	if (!closed)
		return fsti_err(err, FST_EIO,
				"%s: the listing ends before </ListBucketResult>: cut short", what);
	size_t plen = strlen(prefix), vn;
	const char *p = root, *v;
	while ((v = element(p, end, "Contents", &vn))) {
		const char *cend = v + vn;
		size_t kn;
		const char *k = element(v, cend, "Key", &kn);
		p = cend;
		if (!k)
			return fsti_err(err, FST_EIO, "%s: the listing has an entry without a Key", what);
		bool bad;
		char *key = xml_decode(k, kn, &bad);
		if (!key)
			return bad ? fsti_err(err, FST_EIO, "%s: the listing has a Key with a bad XML "
							    "reference: \"%.*s\"",
					      what, (int)FSTI_MIN(kn, (size_t)100), k)
				   : fsti_err(err, FST_ENOMEM, "out of memory");
		/* keys outside the prefix, the folder's own marker and keys in
		 * subfolders are not the folder's files */
		if (strncmp(key, prefix, plen) || !key[plen] || strchr(key + plen, '/')) {
			fsti_free(key);
			continue;
		}
		memmove(key, key + plen, strlen(key + plen) + 1);
		if (push(names, n, cap, key)) {
			fsti_free(key);
			return fsti_err(err, FST_ENOMEM, "out of memory");
		}
	}
	size_t tn;
	const char *t = element(root, end, "IsTruncated", &tn);
	if (t && tn == 4 && !memcmp(t, "true", 4)) {
		const char *tok = element(root, end, "NextContinuationToken", &tn);
		bool bad;
		if (!tok || !tn)
			return fsti_err(err, FST_EIO,
					"%s: the listing is truncated but has no NextContinuationToken",
					what);
		if (!(*next = xml_decode(tok, tn, &bad)))
			return bad ? fsti_err(err, FST_EIO, "%s: bad NextContinuationToken", what)
				   : fsti_err(err, FST_ENOMEM, "out of memory");
	}
	return 0;
}

int fsti_s3_list(struct fsti_conn *c, struct fsti_remote *r, const char *url, char ***names,
		 size_t *n, fst_error *err)
{
	*names = NULL;
	*n = 0;
	char *bucket, *prefix;
	int rc = fsti_s3_split(url, &bucket, &prefix, err);
	if (rc)
		return rc;
	char *eprefix = fsti_url_encode(prefix, false), *token = NULL;
	/* every token asked with: a server whose listing comes back to one
	 * (a bug of its own) would have us fetch and keep its pages again
	 * and again, up to PAGES_MAX of them */
	char **seen = NULL;
	size_t cap = 0, nseen = 0, seen_cap = 0;
	if (!eprefix)
		rc = fsti_err(err, FST_ENOMEM, "out of memory");
	for (int page = 0; !rc; page++) {
		if (page == PAGES_MAX) {
			rc = fsti_err(err, FST_EUNSUPPORTED, "%s: more than %d pages of objects", url,
				      PAGES_MAX);
			break;
		}
		/* the query in its canonical (sorted, encoded) form: what libcurl
		 * signs is the query as written */
		char *etoken = token ? fsti_url_encode(token, false) : NULL;
		size_t qn = strlen(eprefix) + (etoken ? strlen(etoken) : 0) + 96;
		char *query = fsti_malloc(qn), *req = NULL, *body = NULL;
		if (query && (!token || etoken)) {
			snprintf(query, qn, "%s%s%sdelimiter=%%2F&list-type=2&prefix=%s",
				 etoken ? "continuation-token=" : "", etoken ? etoken : "",
				 etoken ? "&" : "", eprefix);
			req = fsti_remote_s3_url(r, bucket, "", query);
		}
		size_t len = 0;
		rc = req ? fsti_http_get_all(c, r, r->sign, url, req, PAGE_MAX, &body, &len, err)
			 : fsti_err(err, FST_ENOMEM, "out of memory");
		if (token && push(&seen, &nseen, &seen_cap, token)) {
			fsti_free(token);
			rc = rc ? rc : fsti_err(err, FST_ENOMEM, "out of memory");
		}
		token = NULL;
		if (!rc)
			rc = fsti_s3_parse_page(url, body, len, prefix, names, n, &cap, &token, err);
		fsti_free(body);
		fsti_free(req);
		fsti_free(query);
		fsti_free(etoken);
		for (size_t i = 0; token && !rc && i < nseen; i++)
			if (!strcmp(seen[i], token))
				rc = fsti_err(err, FST_EIO,
					      "%s: page %d of the listing hands back the continuation "
					      "token that asked for page %zu: the server's listing goes "
					      "round in a loop",
					      url, page + 1, i + 2);
		if (!token || rc)
			break;
	}
	for (size_t i = 0; i < nseen; i++)
		fsti_free(seen[i]);
	fsti_free(seen);
	fsti_free(token);
	fsti_free(eprefix);
	fsti_free(bucket);
	fsti_free(prefix);
	if (rc) {
		for (size_t i = 0; i < *n; i++)
			fsti_free((*names)[i]);
		fsti_free(*names);
		*names = NULL;
		*n = 0;
	}
	return rc;
}
