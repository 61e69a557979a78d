/*
 * net.h - remote files (net/): libcurl opened at run time, URLs, the S3
 * configuration the AWS SDKs would find, ranged GETs with retries and
 * identity checks, S3 listings. Knows nothing of safetensors or loads;
 * depends on base/ only (src/README.md).
 */
#ifndef FST_NET_H
#define FST_NET_H

#include "base.h"
#include "curl_decls.h"

#include <stdatomic.h>

/* ---- libcurl (curl.c) */

/* The table, opened and curl_global_init'ed once per process: libcurl.so.4,
 * or FST_CURL_LIBRARY. Without it FST_EUNSUPPORTED naming the library. */
int fsti_curl_get(const struct fsti_curl **out, fst_error *err);

/* ---- URLs (url.c) */

enum fsti_url_kind { FSTI_URL_NONE = 0, FSTI_URL_HTTP = 1, FSTI_URL_S3 = 2 };
/* What path names, by its scheme (s3://, http://, https://; any case). */
int fsti_url_kind(const char *path);
/* s3://BUCKET/KEY into its parts (fsti_free both; key may be ""). A bucket
 * name that S3 would refuse is FST_EUSAGE. */
int fsti_s3_split(const char *url, char **bucket, char **key, fst_error *err);
/* s percent-encoded as S3's signatures want: all but A-Z a-z 0-9 - _ . ~,
 * and '/' where keep_slash (NULL when out of memory). */
char *fsti_url_encode(const char *s, bool keep_slash);
/* Where an http(s) URL's path ends: at its query or fragment, which are
 * not the path's (an S3 key may hold '?' and '#': the whole length). */
size_t fsti_url_path_len(const char *url);
/* Whether the URL names a folder: its path ends with '/', or it is
 * s3://BUCKET. */
bool fsti_url_is_folder(const char *url);
/* url as messages and logs show it: the password of its user info and its
 * query (a presigned URL's signature) as "***"; NULL when out of memory.
 * Those secrets are hidden from every later log line too (fsti_log_hide):
 * every URL the library is given comes through here before a message can
 * name it. */
char *fsti_url_display(const char *url);
/* The same secrets of url hidden where they stand as in a URL (":PASSWORD@",
 * "?QUERY") in text (size bytes, NUL-ended): for messages that named url,
 * or a URL made from it. */
void fsti_url_hide(char *text, size_t size, const char *url);
/* The URL of name in the folder of url (url's last segment replaced, or
 * appended after a folder's '/'). NULL when out of memory. */
char *fsti_url_beside(const char *url, const char *name);

/* ---- configuration (config.c, ini.c) */

/* What one open resolved, once, from its options and the environment:
 * endpoint, region, credentials, retries, timeouts. Immutable, shared by a
 * checkpoint's files and every worker that reads them. */
struct fsti_remote {
	atomic_long refs;
	char *endpoint; /* "http://127.0.0.1:9000", no trailing '/'; NULL: AWS */
	char *region;
	bool path_style;
	bool sign;
	char *key_id, *secret, *token;
	char *sigv4; /* CURLOPT_AWS_SIGV4: "aws:amz:REGION:s3" */
	char *ca_bundle;
	int retries;
	unsigned retry_time_ms, connect_timeout_ms, stall_timeout_ms;
	unsigned request_timeout_ms; /* 0: derived from each request's size */
	char why[256]; /* where the credentials came from, or why unsigned */
};

/* Resolve opts (NULL: defaults) with the environment; s3 says whether the
 * AWS configuration is wanted (http(s) URLs need only the CA bundle, the
 * retries and the timeouts). Bad options are FST_EUSAGE. */
int fsti_remote_new(const fst_open_opts *opts, bool s3, struct fsti_remote **out,
		    fst_error *err);
struct fsti_remote *fsti_remote_ref(struct fsti_remote *r);
void fsti_remote_unref(struct fsti_remote *r);
/* The request URL of bucket's key (already encoded) with query (or NULL):
 * path-style or virtual-hosted, on the endpoint or on AWS. */
char *fsti_remote_s3_url(const struct fsti_remote *r, const char *bucket, const char *key,
			 const char *query);

/* A small INI reader for ~/.aws/credentials and ~/.aws/config: the values
 * of keys[0..n) in section, into values (fsti_free each; NULL where absent).
 * *found says whether the section exists. A file that does not exist has
 * no sections; one that cannot be read is FST_EIO naming it. */
int fsti_ini_read(const char *path, const char *section, const char *const *keys,
		  char **values, size_t n, bool *found, fst_error *err);

/* ---- requests (http.c) */

/* One connection's worth of libcurl state (an easy handle, kept alive
 * between requests): one per thread, never shared. */
struct fsti_conn;
int fsti_conn_new(struct fsti_conn **out, fst_error *err);
void fsti_conn_free(struct fsti_conn *c);

/* A remote object as first seen: what later reads check every response
 * against. */
struct fsti_object {
	char *name; /* the URL as given, for messages */
	char *url;  /* the http(s) URL requested */
	bool sign;
	uint64_t size;
	char *etag;             /* NULL when the server sends none */
	char last_modified[64]; /* "" when the server sends none */
	struct fsti_remote *remote;
};

/*
 * The first GET of name (s3:// or http(s)://): bytes [0, want), fewer when
 * the object is smaller, into *head (fsti_free it), *got of them, and the
 * object's size and identity into *out. A server that ignores Range is
 * FST_EUNSUPPORTED; 404 is FST_EIO with ENOENT, 401 and 403 with EACCES.
 */
int fsti_object_open(struct fsti_conn *c, struct fsti_remote *r, const char *name, uint64_t want,
		     char **head, uint64_t *got, struct fsti_object **out, fst_error *err);
/*
 * Bytes [off, off + len) of o into dst, by ranged GETs with If-Match and
 * every response checked against o (size, ETag, Last-Modified: a change is
 * FST_ECHANGED); a dropped transfer resumes where it stopped, with
 * exponential backoff, within o's retries and time. *stop (may be NULL)
 * turning nonzero aborts the transfer in flight: FST_ECANCELED.
 */
int fsti_object_read(struct fsti_conn *c, const struct fsti_object *o, uint64_t off,
		     uint64_t len, void *dst, const atomic_int *stop, fst_error *err);
void fsti_object_free(struct fsti_object *o);
/* The whole object name (an index), NUL-ended, in two ranged GETs at most;
 * one over max bytes is FST_EFORMAT. */
int fsti_object_fetch(struct fsti_conn *c, struct fsti_remote *r, const char *name, size_t max,
		      char **body, size_t *len, fst_error *err);
/* A whole response body of at most max bytes (a listing page), NUL-ended:
 * GET url (signed with sign), 200 wanted, retried as ranged reads are. */
int fsti_http_get_all(struct fsti_conn *c, struct fsti_remote *r, bool sign, const char *name,
		      const char *url, size_t max, char **body, size_t *len, fst_error *err);

/* ---- S3 listings (list.c) */

/* The names of the objects directly in the folder url (s3://BUCKET/PREFIX/),
 * relative to it, in S3's order (sorted): *names (fsti_free each and the
 * array), *n of them. */
int fsti_s3_list(struct fsti_conn *c, struct fsti_remote *r, const char *url, char ***names,
		 size_t *n, fst_error *err);
/* One ListObjectsV2 page, xml[0..len): the keys under prefix appended to
 * *names (grown, *n and *cap updated), stripped of prefix; *next the
 * continuation token when the listing is truncated, else NULL. A page
 * that is not a ListBucketResult is FST_EIO naming what (for the tests). */
int fsti_s3_parse_page(const char *what, const char *xml, size_t len, const char *prefix,
		       char ***names, size_t *n, size_t *cap, char **next, fst_error *err);

#endif
