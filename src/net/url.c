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

bool fsti_url_is_folder(const char *url)
{
	size_t n = strlen(url);
	if (n && url[n - 1] == '/')
		return true;
	return fsti_url_kind(url) == FSTI_URL_S3 && !strchr(url + 5, '/');
}

char *fsti_url_beside(const char *url, const char *name)
{
	/* the folder: up to the last '/' after the scheme's "//" (s3://BUCKET
	 * alone is a folder too) */
	const char *start = strstr(url, "//");
	start = start ? start + 2 : url;
	const char *slash = strrchr(start, '/');
	size_t keep = slash ? (size_t)(slash - url) : strlen(url);
	size_t n = keep + 1 + strlen(name) + 1;
	char *out = fsti_malloc(n);
	if (out)
		snprintf(out, n, "%.*s/%s", (int)keep, url, name);
	return out;
}
