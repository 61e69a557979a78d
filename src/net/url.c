/* url.c - the URLs fst takes for remote files: which kind, their parts. */
#include "net.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

int fsti_url_kind(const char *path)
{
	if (!path)
		return FSTI_URL_NONE;
	if (!strncasecmp(path, "s3://", 5))
		return FSTI_URL_S3;
	if (!strncasecmp(path, "http://", 7) || !strncasecmp(path, "https://", 8))
		return FSTI_URL_HTTP;
	return FSTI_URL_NONE;
}

/* S3's rule for new buckets, loosely: 3 to 63 characters of lowercase
 * letters, digits, '.' and '-'; older buckets may also have '_' and
 * capitals, which path-style requests still reach. */
static bool bucket_ok(const char *b, size_t n)
{
	if (n < 3 || n > 63)
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = b[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '-' || ch == '_'))
			return false;
	}
	return true;
}

int fsti_s3_split(const char *url, char **bucket, char **key, fst_error *err)
{
	*bucket = *key = NULL;
	const char *b = url + 5, *slash = strchr(b, '/');
	size_t n = slash ? (size_t)(slash - b) : strlen(b);
	if (!bucket_ok(b, n))
		return fsti_err(err, FST_EUSAGE,
				"%s: \"%.*s\" is no S3 bucket name (3 to 63 letters, digits, '.', "
				"'-'): expected s3://BUCKET/KEY",
				url, (int)FSTI_MIN(n, (size_t)80), b);
	*bucket = fsti_malloc(n + 1);
	*key = fsti_strdup(slash ? slash + 1 : "");
	if (!*bucket || !*key) {
		fsti_free(*bucket);
		fsti_free(*key);
		*bucket = *key = NULL;
		return fsti_err(err, FST_ENOMEM, "%s: out of memory", url);
	}
	memcpy(*bucket, b, n);
	(*bucket)[n] = '\0';
	return 0;
}

char *fsti_url_encode(const char *s, bool keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";
	char *out = fsti_malloc(strlen(s) * 3 + 1), *o = out;
	if (!out)
		return NULL;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned char ch = *p;
		if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
		    ch == '-' || ch == '_' || ch == '.' || ch == '~' || (ch == '/' && keep_slash)) {
			*o++ = (char)ch;
		} else {
			*o++ = '%';
			*o++ = hex[ch >> 4];
			*o++ = hex[ch & 15];
		}
	}
	*o = '\0';
	return out;
}

size_t fsti_url_path_len(const char *url)
{
	return fsti_url_kind(url) == FSTI_URL_HTTP ? strcspn(url, "?#") : strlen(url);
}

bool fsti_url_is_folder(const char *url)
{
	size_t n = fsti_url_path_len(url);
	if (n && url[n - 1] == '/')
		return true;
	return fsti_url_kind(url) == FSTI_URL_S3 && !strchr(url + 5, '/');
}

char *fsti_url_beside(const char *url, const char *name)
{
	/* the folder: up to the last '/' of the path after the scheme's "//"
	 * (s3://BUCKET alone is a folder too). An http(s) index's query is
	 * its own, a presigned URL's signature of it, and no shard's. */
	const char *start = strstr(url, "//");
	start = start ? start + 2 : url;
	size_t end = fsti_url_path_len(url), keep = end;
	for (const char *p = start; p < url + end; p++)
		if (*p == '/')
			keep = (size_t)(p - url);
	/* a name is a file's, not a URL's: a ' ' would break the URL and a '#'
	 * or '?' end its path; an S3 key is encoded when it is requested */
	char *enc = NULL;
	if (fsti_url_kind(url) == FSTI_URL_HTTP && !(name = enc = fsti_url_encode(name, true)))
		return NULL;
	size_t n = keep + 1 + strlen(name) + 1;
	char *out = fsti_malloc(n);
	if (out)
		snprintf(out, n, "%.*s/%s", (int)keep, url, name);
	fsti_free(enc);
	return out;
}

/* Whether the authority host[0, n) has no port, or a port of digits (an
 * IPv6 address's ':'s are inside its brackets). */
static bool port_ok(const char *host, size_t n)
{
	const char *from = host;
	if (*host == '[') {
		const char *close = memchr(host, ']', n);
		from = close ? close : host;
	}
	const char *colon = memchr(from, ':', n - (size_t)(from - host));
	if (!colon)
		return true;
	for (const char *p = colon + 1; p < host + n; p++)
		if (*p < '0' || *p > '9')
			return false;
	return true;
}

/*
 * The parts of an http(s) URL that are secrets: the password of its user
 * info, or the user info whole where it has no ':' (a token given as the
 * user, as in https://TOKEN@host/), and its query (a presigned URL's
 * signature and credential). Each as [at, at + len) of url, after the
 * character lead; len 0 where there is none. An S3 URL has neither (its
 * key may hold '?', '@' and ':').
 */
static void secrets(const char *url, size_t at[2], size_t len[2], char lead[2])
{
	at[0] = at[1] = len[0] = len[1] = 0;
	lead[0] = ':';
	lead[1] = '?';
	if (fsti_url_kind(url) != FSTI_URL_HTTP)
		return;
	const char *host = strstr(url, "://") + 3;
	size_t authority = strcspn(host, "/?#");
	const char *userinfo_end = NULL;
	for (const char *p = host; p < host + authority; p++)
		if (*p == '@')
			userinfo_end = p;
	if (!userinfo_end && !port_ok(host, authority))
		/* a password with a '/', '?' or '#' not percent-encoded ends the
		 * authority early ("user:pa/ss@host" reads as host "user", port
		 * "pa"): no URL parser takes it, and its user info runs to the
		 * URL's last '@' (more hidden, never less, of a URL that cannot
		 * be requested) */
		userinfo_end = strrchr(host, '@');
	const char *colon = userinfo_end ? memchr(host, ':', (size_t)(userinfo_end - host)) : NULL;
	if (colon) {
		at[0] = (size_t)(colon + 1 - url);
		len[0] = (size_t)(userinfo_end - colon - 1);
	} else if (userinfo_end) {
		at[0] = (size_t)(host - url);
		len[0] = (size_t)(userinfo_end - host);
		lead[0] = '/';
	}
	/* the query after the user info, where a '?' was in the password */
	size_t path = userinfo_end ? (size_t)(userinfo_end - url) : 0;
	path += strcspn(url + path, "?#");
	if (url[path] == '?') {
		at[1] = path + 1;
		len[1] = strcspn(url + path + 1, "#");
	}
}

/* A secret of a URL as it stands in text that names the URL: after its
 * lead, and the user info's before the '@' that ends it (":PASSWORD@",
 * "//USER@", "?QUERY"), as fsti_text_hide and fsti_log_hide take it. */
struct secret_in_text {
	const char *text;
	size_t len;
	char lead, trail;
};

static void secrets_in_text(const char *url, struct secret_in_text out[2])
{
	size_t at[2], len[2];
	char lead[2];
	secrets(url, at, len, lead);
	for (int i = 0; i < 2; i++)
		out[i] = (struct secret_in_text){url + at[i], len[i], lead[i], i ? '\0' : '@'};
}

size_t fst_display_path(const char *path, char *out, size_t size)
{
	if (!path)
		path = "";
	if (!out)
		size = 0;
	size_t at[2], len[2];
	char lead[2];
	secrets(path, at, len, lead);
	size_t n = 0, from = 0;
	for (int i = 0; i < 2; i++) {
		if (!len[i])
			continue;
		n += (size_t)snprintf(size > n ? out + n : NULL, size > n ? size - n : 0, "%.*s***",
				      (int)(at[i] - from), path + from);
		from = at[i] + len[i];
	}
	return n + (size_t)snprintf(size > n ? out + n : NULL, size > n ? size - n : 0, "%s",
				    path + from);
}

char *fsti_url_display(const char *url)
{
	/* every URL the library is given is shown through here first: from
	 * now on no log line shows its secrets either */
	struct secret_in_text s[2];
	secrets_in_text(url, s);
	for (int i = 0; i < 2; i++)
		if (!fsti_log_hide(s[i].lead, s[i].text, s[i].len, s[i].trail))
			return NULL;
	size_t n = fst_display_path(url, NULL, 0) + 1;
	char *out = fsti_malloc(n);
	if (out)
		fst_display_path(url, out, n);
	return out;
}

void fsti_url_hide(char *text, size_t size, const char *url)
{
	struct secret_in_text s[2];
	secrets_in_text(url, s);
	for (int i = 0; i < 2; i++)
		fsti_text_hide(text, size, s[i].lead, s[i].text, s[i].len, s[i].trail);
}
