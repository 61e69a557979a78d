/*
 * http.c - ranged GETs through libcurl: one easy handle per thread, kept
 * alive between requests; S3 requests signed by libcurl itself
 * (CURLOPT_AWS_SIGV4). Every response is checked before a byte of it is
 * kept: the status, Content-Range against the bytes asked for, and the
 * object's size, ETag and Last-Modified against what the first GET saw
 * (and If-Match asks the server to refuse a changed object). Failures that
 * may pass (HTTP 429 and 5xx, dropped, reset or stalled connections) are
 * retried with exponential backoff, resuming where the bytes stopped,
 * within a bounded count and time.
 */
#include "net.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_REDIRS 5L
#define ERROR_BODY 2048 /* of an error response, kept for its S3 <Code> and <Message> */
#define BACKOFF_FIRST_MS 100.0
#define BACKOFF_MAX_MS 5000.0
#define RECV_BUFFER (512L << 10) /* fewer, larger writes into the destination */
/* An answer short of the rest that brings fewer bytes than this counts as a
 * failed attempt (retried with backoff, within the retries' count and
 * time): a server answering a few bytes at a time would otherwise be asked
 * again without end, 8 million times for 8 MiB at a byte an answer. */
#define MIN_PROGRESS ((uint64_t)64 << 10)

struct fsti_conn {
	const struct fsti_curl *cu;
	fsti_curl_handle *h;
	bool signed_before; /* credentials set on the handle by an earlier request */
	/* the CA file set on the handle (NULL: libcurl's own), copied: a
	 * worker's connection serves every file of a load, and files opened
	 * with other options can be one checkpoint (fst_checkpoint_from_files) */
	char *ca_bundle;
	char error[FSTI_CURL_ERROR_SIZE];
	char agent[32];
};

/* One request and what its response said. */
struct request {
	/* asked */
	const char *url;
	bool ranged;
	uint64_t off, len; /* Range: bytes=off-(off+len-1) */
	char *dst;         /* ranged: the bytes land here, at most len */
	char **grow;       /* not ranged: a growing buffer of at most max bytes */
	size_t max, cap;
	const atomic_int *stop;
	/* answered */
	long status;
	bool has_range;
	uint64_t range_first, range_last, range_total; /* Content-Range */
	bool total_unknown;                            /* "bytes A-B/(star)" */
	bool has_total;                                /* range_total was said */
	bool has_length;                               /* Content-Length was said */
	uint64_t length;
	char *etag;              /* whole, as sent back in If-Match; NULL: none */
	bool out_of_memory;      /* for a header */
	char last_modified[64];  /* an HTTP date: 29 characters */
	uint64_t got; /* body bytes kept */
	bool ignored_range, bad_start, too_long, past_range;
	char body[ERROR_BODY + 1]; /* of a response that is not the one wanted */
	size_t body_len;
};

int fsti_conn_new(struct fsti_conn **out, fst_error *err)
{
	*out = NULL;
	const struct fsti_curl *cu;
	int rc = fsti_curl_get(&cu, err);
	if (rc)
		return rc;
	struct fsti_conn *c = fsti_calloc(1, sizeof *c);
	if (!c)
		return fsti_err(err, FST_ENOMEM, "out of memory for a connection");
	c->cu = cu;
	snprintf(c->agent, sizeof c->agent, "fst/%s", fst_version());
	if (!(c->h = cu->curl_easy_init())) {
		fsti_free(c);
		return fsti_err(err, FST_ENOMEM, "curl_easy_init failed (out of memory?)");
	}
	*out = c;
	return 0;
}

void fsti_conn_free(struct fsti_conn *c)
{
	if (!c)
		return;
	c->cu->curl_easy_cleanup(c->h);
	fsti_free(c->ca_bundle);
	fsti_free(c);
}

/* The handle set for r's CA file. Setting NULL would remove the CA file
 * rather than restore libcurl's own: a handle that had another CA file is
 * replaced by a new one (its connections go with it) for a remote of the
 * default. Returns libcurl's code (CURLE_OUT_OF_MEMORY where a handle or
 * the copy cannot be made). */
static int use_ca(struct fsti_conn *c, const struct fsti_remote *r)
{
	if (c->ca_bundle == r->ca_bundle ||
	    (c->ca_bundle && r->ca_bundle && !strcmp(c->ca_bundle, r->ca_bundle)))
		return 0;
	if (!r->ca_bundle) {
		fsti_curl_handle *h = c->cu->curl_easy_init();
		if (!h)
			return FSTI_CURLE_OUT_OF_MEMORY;
		c->cu->curl_easy_cleanup(c->h);
		c->h = h;
		c->signed_before = false;
		fsti_free(c->ca_bundle);
		c->ca_bundle = NULL;
		return 0;
	}
	char *copy = fsti_strdup(r->ca_bundle);
	if (!copy)
		return FSTI_CURLE_OUT_OF_MEMORY;
	int rc = c->cu->curl_easy_setopt(c->h, FSTI_CURLOPT_CAINFO, r->ca_bundle);
	if (rc) {
		fsti_free(copy);
		return rc;
	}
	fsti_free(c->ca_bundle);
	c->ca_bundle = copy;
	return 0;
}

void fsti_object_free(struct fsti_object *o)
{
	if (!o)
		return;
	fsti_free(o->name);
	fsti_free(o->url);
	fsti_free(o->etag);
	fsti_remote_unref(o->remote);
	fsti_free(o);
}

/* ---- the response, as it arrives */

static bool header_is(const char *line, size_t n, const char *name, const char **value,
		      size_t *vlen)
{
	size_t k = strlen(name);
	if (n <= k || strncasecmp(line, name, k) || line[k] != ':')
		return false;
	const char *v = line + k + 1, *end = line + n;
	while (v < end && (*v == ' ' || *v == '\t'))
		v++;
	while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
		end--;
	*value = v;
	*vlen = (size_t)(end - v);
	return true;
}

static void copy_value(char *dst, size_t size, const char *v, size_t n)
{
	n = FSTI_MIN(n, size - 1);
	memcpy(dst, v, n);
	dst[n] = '\0';
}

/* "bytes A-B/T", "bytes A-B/(star)" or "bytes (star)/T". */
static void parse_content_range(struct request *q, const char *v, size_t n)
{
	char buf[96];
	copy_value(buf, sizeof buf, v, n);
	unsigned long long a, b, t;
	char star[2];
	if (sscanf(buf, "bytes %llu-%llu/%llu", &a, &b, &t) == 3 && a <= b && b < t) {
		q->has_range = q->has_total = true;
		q->range_first = a;
		q->range_last = b;
		q->range_total = t;
	} else if (sscanf(buf, "bytes %llu-%llu/%1[*]", &a, &b, star) == 3 && a <= b) {
		q->has_range = true;
		q->total_unknown = true;
		q->range_first = a;
		q->range_last = b;
	} else if (sscanf(buf, "bytes */%llu", &t) == 1) {
		q->range_total = t; /* 416: the size, and no bytes */
		q->has_total = true;
	}
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *ctx)
{
	struct request *q = ctx;
	size_t n = size * nmemb;
	const char *v;
	size_t vlen;
	bool status_line = n > 5 && !strncmp(line, "HTTP/", 5);
	/* trailers, after the body: not the headers the body was judged by */
	if (q->got && !status_line)
		return n;
	if (status_line) {
		/* a new response (after a redirect or a 100): forget the last one's */
		const char *sp = memchr(line, ' ', n);
		q->status = sp ? strtol(sp + 1, NULL, 10) : 0;
		q->has_range = q->total_unknown = q->has_total = q->has_length = false;
		q->range_total = q->length = 0;
		fsti_free(q->etag);
		q->etag = NULL;
		q->last_modified[0] = '\0';
	} else if (header_is(line, n, "Content-Range", &v, &vlen)) {
		parse_content_range(q, v, vlen);
	} else if (header_is(line, n, "Content-Length", &v, &vlen)) {
		char buf[32];
		copy_value(buf, sizeof buf, v, vlen);
		unsigned long long len;
		char extra;
		q->has_length = sscanf(buf, "%llu%c", &len, &extra) == 1;
		q->length = q->has_length ? len : 0;
	} else if (header_is(line, n, "ETag", &v, &vlen)) {
		/* no bound on its length: a cut one would not match itself */
		fsti_free(q->etag);
		if (!(q->etag = fsti_malloc(vlen + 1))) {
			q->out_of_memory = true;
			return 0;
		}
		copy_value(q->etag, vlen + 1, v, vlen);
	} else if (header_is(line, n, "Last-Modified", &v, &vlen)) {
		copy_value(q->last_modified, sizeof q->last_modified, v, vlen);
	}
	return n;
}

static size_t keep_error_body(struct request *q, const char *p, size_t n)
{
	size_t k = FSTI_MIN(n, (size_t)ERROR_BODY - q->body_len);
	memcpy(q->body + q->body_len, p, k);
	q->body_len += k;
	q->body[q->body_len] = '\0';
	return n;
}

static size_t on_body(char *p, size_t size, size_t nmemb, void *ctx)
{
	struct request *q = ctx;
	size_t n = size * nmemb;
	if (q->ranged) {
		/* The whole object where the range covers it, which a server may
		 * send (RFC 9110, 14.2): all the range asked for, read as a 206
		 * of every byte. */
		if (q->status == 200 && !q->off && q->has_length && q->length &&
		    q->length <= q->len) {
			q->status = 206;
			q->has_range = q->has_total = true;
			q->range_first = 0;
			q->range_last = q->length - 1;
			q->range_total = q->length;
		}
		if (q->status == 200) {
			q->ignored_range = true; /* the whole object coming: stop it */
			return 0;
		}
		if (q->status != 206)
			return keep_error_body(q, p, n);
		if (!q->got && (!q->has_range || q->range_first != q->off)) {
			q->bad_start = true;
			return 0;
		}
		if (n > q->len - q->got) {
			q->too_long = true;
			return 0;
		}
		/* only bytes the Content-Range vouches for: a body longer than
		 * its range is some other bytes after them */
		if (n > q->range_last - q->range_first + 1 - q->got) {
			q->past_range = true;
			return 0;
		}
		memcpy(q->dst + q->got, p, n);
		q->got += n;
		return n;
	}
	if (q->status != 200)
		return keep_error_body(q, p, n);
	if (n > q->max - q->got) {
		q->too_long = true;
		return 0;
	}
	if (q->got + n + 1 > q->cap) {
		size_t cap = FSTI_MAX(q->cap * 2, (size_t)(q->got + n + 1));
		char *grown = fsti_realloc(*q->grow, cap);
		if (!grown)
			return 0;
		*q->grow = grown;
		q->cap = cap;
	}
	memcpy(*q->grow + q->got, p, n);
	q->got += n;
	(*q->grow)[q->got] = '\0';
	return n;
}

static int on_progress(void *ctx, fsti_curl_off_t a, fsti_curl_off_t b, fsti_curl_off_t c,
		       fsti_curl_off_t d)
{
	(void)a, (void)b, (void)c, (void)d;
	const struct request *q = ctx;
	return q->stop && atomic_load(q->stop);
}

/* ---- one request */

/* The time one attempt of q may take: the option, else the connect and
 * stall timeouts plus 1 s for every MIN_RATE bytes asked (a listing's or a
 * header's GET asks for at most q->max). */
#define MIN_RATE ((uint64_t)64 << 10)
static long attempt_limit_ms(const struct fsti_remote *r, const struct request *q)
{
	if (r->request_timeout_ms)
		return (long)r->request_timeout_ms;
	uint64_t bytes = q->ranged ? q->len : q->max;
	uint64_t ms = (uint64_t)r->connect_timeout_ms + r->stall_timeout_ms +
		      (bytes / MIN_RATE) * 1000 + (bytes % MIN_RATE) * 1000 / MIN_RATE;
	return (long)FSTI_MIN(ms, (uint64_t)LONG_MAX);
}

/* Every option of a request, set afresh: the handle is reused. Returns
 * libcurl's code (0 when all were taken). */
static int set_options(struct fsti_conn *c, const struct fsti_remote *r, bool sign,
		       struct request *q, const char *range, struct fsti_curl_slist *headers)
{
	const struct fsti_curl *cu = c->cu;
	int rc = use_ca(c, r);
	fsti_curl_handle *h = c->h; /* after use_ca, which may replace it */
#define SET(opt, val)                                           \
	do {                                                    \
		if (!rc)                                        \
			rc = cu->curl_easy_setopt(h, opt, val); \
	} while (0)
	SET(FSTI_CURLOPT_URL, q->url);
	SET(FSTI_CURLOPT_HTTPGET, 1L);
	SET(FSTI_CURLOPT_RANGE, range);
	SET(FSTI_CURLOPT_HTTPHEADER, headers);
	SET(FSTI_CURLOPT_WRITEFUNCTION, (fsti_curl_write_fn)on_body);
	SET(FSTI_CURLOPT_WRITEDATA, (void *)q);
	SET(FSTI_CURLOPT_HEADERFUNCTION, (fsti_curl_write_fn)on_header);
	SET(FSTI_CURLOPT_HEADERDATA, (void *)q);
	SET(FSTI_CURLOPT_NOPROGRESS, 0L);
	SET(FSTI_CURLOPT_XFERINFOFUNCTION, (fsti_curl_xferinfo_fn)on_progress);
	SET(FSTI_CURLOPT_XFERINFODATA, (void *)q);
	SET(FSTI_CURLOPT_ERRORBUFFER, c->error);
	/* threads: no signals for name resolution timeouts */
	SET(FSTI_CURLOPT_NOSIGNAL, 1L);
	/* the path as given: "a/../b" is an S3 key of its own, not "b"
	 * (libcurl would drop the dot segments, and sign the shorter path) */
	SET(FSTI_CURLOPT_PATH_AS_IS, 1L);
	/* A signed request stops at a redirect: libcurl would drop only its
	 * Authorization on the way to another host, not the session token
	 * header. S3 redirects to another region's endpoint, where the
	 * signature would not hold anyway. */
	SET(FSTI_CURLOPT_FOLLOWLOCATION, sign ? 0L : 1L);
	SET(FSTI_CURLOPT_MAXREDIRS, MAX_REDIRS);
	SET(FSTI_CURLOPT_TCP_KEEPALIVE, 1L);
	SET(FSTI_CURLOPT_BUFFERSIZE, RECV_BUFFER);
	SET(FSTI_CURLOPT_USERAGENT, c->agent);
	SET(FSTI_CURLOPT_CONNECTTIMEOUT_MS, (long)r->connect_timeout_ms);
	/* a connection that stalls fails (and is retried) instead of hanging */
	SET(FSTI_CURLOPT_LOW_SPEED_LIMIT, 1024L);
	SET(FSTI_CURLOPT_LOW_SPEED_TIME,
	    (long)FSTI_MAX(1u, ((uint64_t)r->stall_timeout_ms + 999) / 1000));
	/* and so does one that trickles just above that rate for hours */
	SET(FSTI_CURLOPT_TIMEOUT_MS, attempt_limit_ms(r, q));
	/* a handle that signed before keeps its credentials unless told */
	if (sign || c->signed_before) {
		SET(FSTI_CURLOPT_USERNAME, sign ? r->key_id : (char *)NULL);
		SET(FSTI_CURLOPT_PASSWORD, sign ? r->secret : (char *)NULL);
		SET(FSTI_CURLOPT_AWS_SIGV4, sign ? r->sigv4 : (char *)NULL);
		c->signed_before = sign;
	}
#undef SET
	if (rc)
		return rc;
	/* http and https only, redirects included, and never from https down
	 * to http, where anyone between could change the bytes */
	bool https = !strncasecmp(q->url, "https:", 6);
	if (cu->curl_easy_setopt(h, FSTI_CURLOPT_PROTOCOLS_STR, "http,https") ||
	    cu->curl_easy_setopt(h, FSTI_CURLOPT_REDIR_PROTOCOLS_STR,
				 https ? "https" : "http,https")) {
		/* a libcurl older than 7.85 (Ubuntu 22.04's 7.81) has the bit
		 * masks only; without them too, no redirect is followed */
		long any = FSTI_CURLPROTO_HTTP | FSTI_CURLPROTO_HTTPS;
		if (cu->curl_easy_setopt(h, FSTI_CURLOPT_PROTOCOLS, any) ||
		    cu->curl_easy_setopt(h, FSTI_CURLOPT_REDIR_PROTOCOLS,
					 https ? (long)FSTI_CURLPROTO_HTTPS : any))
			return cu->curl_easy_setopt(h, FSTI_CURLOPT_FOLLOWLOCATION, 0L);
	}
	return 0;
}

#define EMPTY_BODY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* The request's headers: S3's payload hash and session token (both then
 * signed: libcurl signs every header it is given), If-Match. NULL with
 * *oom when out of memory. */
static struct fsti_curl_slist *make_headers(const struct fsti_curl *cu,
					    const struct fsti_remote *r, bool sign,
					    const char *if_match, bool *oom)
{
	struct fsti_curl_slist *l = NULL, *next;
	/* "NAME: VALUE" of values of any length (a session token or an ETag
	 * has no bound: a cut one would be another) */
	const char *names[3] = {NULL}, *values[3] = {NULL};
	size_t n = 0;
	if (sign) {
		/* the SHA-256 of the empty body of a GET, not UNSIGNED-PAYLOAD:
		 * libcurl before 7.87 signs the hash of the body it sends
		 * whatever this header says, so only this value matches it on
		 * every libcurl (Ubuntu 22.04 has 7.81) */
		names[n] = "x-amz-content-sha256";
		values[n++] = EMPTY_BODY_SHA256;
		if (r->token) {
			names[n] = "x-amz-security-token";
			values[n++] = r->token;
		}
	}
	if (if_match) {
		names[n] = "If-Match";
		values[n++] = if_match;
	}
	*oom = true;
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(names[i]) + 2 + strlen(values[i]) + 1;
		char *line = fsti_malloc(len);
		if (!line)
			goto fail;
		snprintf(line, len, "%s: %s", names[i], values[i]);
		next = cu->curl_slist_append(l, line); /* copies it */
		fsti_free(line);
		if (!next)
			goto fail;
		l = next;
	}
	/* no "Expect: 100-continue", no compression: the bytes as stored */
	if (!(next = cu->curl_slist_append(l, "Accept-Encoding: identity")))
		goto fail;
	*oom = false;
	return next;
fail:
	cu->curl_slist_free_all(l);
	return NULL;
}

static int perform(struct fsti_conn *c, const struct fsti_remote *r, bool sign, struct request *q,
		   const char *if_match, fst_error *err)
{
	char range[64];
	if (q->ranged)
		snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, q->off, q->off + q->len - 1);
	bool oom;
	struct fsti_curl_slist *headers = make_headers(c->cu, r, sign, if_match, &oom);
	if (oom)
		return fsti_err(err, FST_ENOMEM, "out of memory for a request's headers");
	c->error[0] = '\0';
	int code = set_options(c, r, sign, q, q->ranged ? range : NULL, headers);
	if (code) {
		c->cu->curl_slist_free_all(headers);
		return fsti_err_backend(err, FST_EUNSUPPORTED, code,
					"libcurl %s refused an option: %s (libcurl 7.75 or newer "
					"is needed, for AWS SigV4)",
					c->cu->path, c->cu->curl_easy_strerror(code));
	}
	code = c->cu->curl_easy_perform(c->h);
	c->cu->curl_easy_setopt(c->h, FSTI_CURLOPT_HTTPHEADER, (void *)NULL);
	c->cu->curl_slist_free_all(headers);
	return code; /* positive: libcurl's, for judge */
}

/* ---- what a response means */

enum verdict { DONE, RETRY, FAIL };

static const char *reason(long status)
{
	switch (status) {
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 408: return "Request Timeout";
	case 412: return "Precondition Failed";
	case 416: return "Range Not Satisfiable";
	case 429: return "Too Many Requests";
	case 500: return "Internal Server Error";
	case 502: return "Bad Gateway";
	case 503: return "Service Unavailable";
	case 504: return "Gateway Timeout";
	default: return "";
	}
}

/* "<Tag>text</Tag>" of an S3 error body, into out. */
static void xml_text(const char *body, const char *tag, char *out, size_t size)
{
	char open[40], close[40];
	snprintf(open, sizeof open, "<%s>", tag);
	snprintf(close, sizeof close, "</%s>", tag);
	const char *a = strstr(body, open), *b = a ? strstr(a, close) : NULL;
	out[0] = '\0';
	if (a && b)
		snprintf(out, size, "%.*s", (int)FSTI_MIN((size_t)(b - a - strlen(open)), size - 1),
			 a + strlen(open));
}

struct target {
	const char *name; /* as given */
	const char *url;  /* as requested */
	uint64_t off, len; /* the whole read, which may take several requests */
};

/* "NAME: bytes A-B" (the whole read), or "NAME". */
static void where(char *buf, size_t size, const struct target *t, const struct request *q)
{
	if (q->ranged)
		snprintf(buf, size, "%s: bytes %" PRIu64 "-%" PRIu64, t->name, t->off,
			 t->off + t->len - 1);
	else
		snprintf(buf, size, "%s", t->name);
}

static int status_error(const struct target *t, const struct request *q, enum verdict *v,
			fst_error *err)
{
	char at[600], code[64], msg[200], detail[300] = "", via[600] = "", url[560];
	where(at, sizeof at, t, q);
	xml_text(q->body, "Code", code, sizeof code);
	xml_text(q->body, "Message", msg, sizeof msg);
	if (code[0])
		snprintf(detail, sizeof detail, " (%s%s%s)", code, msg[0] ? ": " : "", msg);
	/* the endpoint an s3:// name was asked at, without the secrets an
	 * endpoint's URL may hold (an http(s) name is its own URL, shown so) */
	if (fsti_url_kind(t->name) == FSTI_URL_S3) {
		fst_display_path(t->url, url, sizeof url);
		snprintf(via, sizeof via, " from %s", url);
	}
	long s = q->status;
	*v = s == 408 || s == 429 || s >= 500 ? RETRY : FAIL;
	int errnum = s == 404 ? ENOENT : s == 401 || s == 403 ? EACCES : 0;
	int rc = fsti_err(err, FST_EIO, "%s: HTTP %ld%s%s%s%s", at, s, *reason(s) ? " " : "",
			  reason(s), detail, via);
	if (err)
		err->sys_errno = errnum;
	return rc;
}

/* Transport failures that another attempt may get past. */
static bool transient(int code)
{
	switch (code) {
	case FSTI_CURLE_COULDNT_CONNECT:
	case FSTI_CURLE_WEIRD_SERVER_REPLY:
	case FSTI_CURLE_HTTP2:
	case FSTI_CURLE_PARTIAL_FILE:
	case FSTI_CURLE_OPERATION_TIMEDOUT:
	case FSTI_CURLE_GOT_NOTHING:
	case FSTI_CURLE_SEND_ERROR:
	case FSTI_CURLE_RECV_ERROR:
	case FSTI_CURLE_HTTP2_STREAM:
	/* a handshake cut short (a reset under load); a certificate that does
	 * not verify is another code, and final */
	case FSTI_CURLE_SSL_CONNECT_ERROR:
		return true;
	default:
		return false;
	}
}

/* at: the object and byte range (where()), as judge has it */
static int changed(const char *at, fst_error *err, const char *what, const char *was,
		   const char *now)
{
	return fsti_err(err, FST_ECHANGED,
			"%s: object changed during the load (its %s was %s, now %s); its bytes "
			"cannot be trusted",
			at, what, was, now);
}

/* The response's identity against o's; *learn: o's is taken from it (and
 * *learn cleared). at names the object and range in messages. */
static int check_identity(const char *at, struct fsti_object *o, bool *learn,
			  struct request *q, fst_error *err)
{
	if (!q->has_total)
		return fsti_err(err, FST_EUNSUPPORTED,
				"%s: the server answered HTTP %ld to a Range request without the "
				"object's size (Content-Range)",
				at, q->status);
	if (*learn) {
		*learn = false;
		o->size = q->range_total;
		o->etag = q->etag; /* taken: the request is done with it */
		q->etag = NULL;
		snprintf(o->last_modified, sizeof o->last_modified, "%s", q->last_modified);
		return 0;
	}
	char was[32], now[32];
	if (q->range_total != o->size) {
		snprintf(was, sizeof was, "%" PRIu64 " bytes", o->size);
		snprintf(now, sizeof now, "%" PRIu64, q->range_total);
		return changed(at, err, "size", was, now);
	}
	if (o->etag && (!q->etag || strcmp(o->etag, q->etag)))
		return changed(at, err, "ETag", o->etag, q->etag ? q->etag : "none");
	if (o->last_modified[0] && strcmp(o->last_modified, q->last_modified))
		return changed(at, err, "Last-Modified", o->last_modified,
			       q->last_modified[0] ? q->last_modified : "none");
	return 0;
}

static enum verdict shorter(const char *at, const struct fsti_object *o, int *rc, fst_error *err)
{
	*rc = fsti_err(err, FST_ECHANGED,
		       "%s: object changed during the load (HTTP 416: it is shorter than the "
		       "%" PRIu64 " bytes it had)",
		       at, o->size);
	return FAIL;
}

/* What the attempt q (libcurl's code) came to: DONE (q->got bytes kept),
 * RETRY or FAIL, with err set for the last two. */
static enum verdict judge(struct fsti_conn *c, const struct target *t, struct fsti_object *o,
			  bool *learnp, struct request *q, int code, int *rc, fst_error *err)
{
	char at[600];
	where(at, sizeof at, t, q);
	*rc = 0;
	bool learn = *learnp;
	if (code == FSTI_CURLE_ABORTED_BY_CALLBACK && q->stop && atomic_load(q->stop)) {
		*rc = fsti_err(err, FST_ECANCELED, "%s: cancelled", at);
		return FAIL;
	}
	if (q->ignored_range) {
		*rc = fsti_err(err, FST_EUNSUPPORTED,
			       "%s: the server ignored the Range request (HTTP 200 with the whole "
			       "object): fst reads remote files by byte ranges",
			       at);
		return FAIL;
	}
	if (q->out_of_memory) {
		*rc = fsti_err(err, FST_ENOMEM, "%s: out of memory for the response's headers", at);
		return FAIL;
	}
	if (q->ranged && q->status == 206 && !q->has_range) {
		*rc = fsti_err(err, FST_EIO,
			       "%s: the server answered HTTP 206 without a Content-Range naming "
			       "its bytes: not the bytes asked for",
			       at);
		return FAIL;
	}
	/* past the end it had: shorter now, whether or not its size is said */
	if (q->ranged && q->status == 416 && !learn && !q->has_total)
		return shorter(at, o, rc, err);
	if (q->ranged && (q->status == 206 || q->status == 416)) {
		*rc = check_identity(at, o, learnp, q, err);
		if (*rc)
			return FAIL;
	}
	if (!q->ranged && q->too_long) {
		*rc = fsti_err(err, FST_EIO, "%s: response longer than %zu bytes", at, q->max);
		return FAIL;
	}
	if (q->bad_start || q->too_long || q->past_range) {
		*rc = fsti_err(err, FST_EIO,
			       "%s: the server answered with %s (Content-Range %" PRIu64 "-%" PRIu64
			       "): not the bytes asked for",
			       at,
			       q->bad_start	 ? "other bytes"
			       : q->too_long ? "more bytes than asked"
					     : "more bytes than its Content-Range says",
			       q->range_first, q->range_last);
		return FAIL;
	}
	if (q->status == 412) {
		*rc = fsti_err(err, FST_ECHANGED,
			       "%s: object changed during the load (HTTP 412 Precondition Failed: "
			       "its ETag is no longer %s); its bytes cannot be trusted",
			       at, o->etag ? o->etag : "what it was");
		return FAIL;
	}
	if (q->status == 416 && !learn)
		return shorter(at, o, rc, err);
	if (code == FSTI_CURLE_TOO_MANY_REDIRECTS) {
		*rc = fsti_err(err, FST_EIO, "%s: more than %ld redirects (a redirect loop?)", at,
			       MAX_REDIRS);
		return FAIL;
	}
	if (code == FSTI_CURLE_URL_MALFORMAT) {
		/* the caller's URL, never the server: a usage error (a
		 * password's '/', '?' or '#' must be percent-encoded) */
		*rc = fsti_err_backend(err, FST_EUSAGE, code,
				       "%s: not a URL libcurl can request: %s (libcurl error %d; "
				       "a '/', '?', '#' or '@' in a user name or password is "
				       "written %%2F, %%3F, %%23, %%40)",
				       at, c->error[0] ? c->error : c->cu->curl_easy_strerror(code),
				       code);
		return FAIL;
	}
	if (code && code != FSTI_CURLE_WRITE_ERROR) {
		enum verdict v = transient(code) ? RETRY : FAIL;
		/* a stall or an attempt past its time: say which settings bound them */
		bool timed_out = code == FSTI_CURLE_OPERATION_TIMEDOUT;
		*rc = fsti_err_backend(err, FST_EIO, code, "%s: %s (libcurl error %d%s)", at,
				       c->error[0] ? c->error : c->cu->curl_easy_strerror(code), code,
				       timed_out ? "; the limits are the open options' "
						   "stall_timeout_ms and request_timeout_ms"
						 : "");
		return v;
	}
	if (code == FSTI_CURLE_WRITE_ERROR) {
		*rc = fsti_err(err, FST_ENOMEM, "%s: out of memory for the response", at);
		return FAIL;
	}
	bool wanted = q->ranged ? q->status == 206 || (learn && q->status == 416) : q->status == 200;
	if (!wanted) {
		enum verdict v;
		*rc = status_error(t, q, &v, err);
		if (q->status < 400 && err)
			snprintf(err->message + strlen(err->message),
				 sizeof err->message - strlen(err->message),
				 " (expected %s%s)", q->ranged ? "206 Partial Content" : "200 OK",
				 q->status >= 300 && o->sign
					 ? "; a signed request does not follow redirects: give "
					   "the bucket's region or endpoint"
					 : "");
		return v;
	}
	if (q->ranged && q->status == 206 && q->got != q->range_last - q->range_first + 1) {
		*rc = fsti_err(err, FST_EIO,
			       "%s: the server sent %" PRIu64 " of the %" PRIu64
			       " bytes its Content-Range promised",
			       at, q->got, q->range_last - q->range_first + 1);
		return RETRY;
	}
	return DONE;
}

/* Attempts failed since the last one that brought bytes, and when the
 * request's first attempt failed (0: none has). The time is not reset by
 * progress: a connection that drops after every few bytes ends the request
 * within retry_time_ms, not after one attempt per byte. */
struct retry {
	const struct fsti_remote *r;
	int failures;
	double since;
};

/* Wait before another attempt (exponential, jittered), unless the count
 * or the time is spent, or stop is set: false then. */
static bool backoff(struct retry *t, const atomic_int *stop)
{
	double now = fsti_now();
	t->failures++;
	if (!t->since)
		t->since = now;
	if (t->failures > t->r->retries)
		return false;
	double ms = BACKOFF_FIRST_MS * (double)(1u << FSTI_MIN(t->failures - 1, 16));
	ms = FSTI_MIN(ms, BACKOFF_MAX_MS) * (0.5 + 0.5 * ((double)rand() / RAND_MAX));
	if ((now - t->since) * 1000 + ms > t->r->retry_time_ms)
		return false;
	for (double end = now + ms / 1000; fsti_now() < end;) {
		if (stop && atomic_load(stop))
			return false;
		struct timespec ts = {0, 10 * 1000000};
		nanosleep(&ts, NULL);
	}
	return true;
}

static void note_spent(const struct retry *t, fst_error *err)
{
	if (!err || !t->failures)
		return;
	size_t n = strlen(err->message);
	snprintf(err->message + n, sizeof err->message - n, " (after %d attempt%s over %.1f s)",
		 t->failures, t->failures == 1 ? "" : "s", fsti_now() - t->since);
}

/*
 * Bytes [off, off + len) of o into dst, *got of them (all, unless learn and
 * the object is shorter). learn: o's size and identity come from the first
 * response, and no If-Match is sent.
 */
static int get_range(struct fsti_conn *c, struct fsti_object *o, bool learn, uint64_t off,
		     uint64_t len, char *dst, uint64_t *got, const atomic_int *stop, fst_error *err)
{
	const struct target t = {o->name, o->url, off, len};
	struct retry tries = {o->remote, 0, 0};
	/* a weak ETag cannot be matched byte for byte: compared only */
	const char *if_match = o->etag && strncmp(o->etag, "W/", 2) ? o->etag : NULL;
	uint64_t done = 0;
	while (done < len) {
		struct request q = {.url = o->url, .ranged = true, .off = off + done,
				    .len = len - done, .dst = dst + done, .stop = stop};
		int code = perform(c, o->remote, o->sign, &q, learn ? NULL : if_match, err);
		if (code < 0)
			return code;
		int rc;
		bool was_learning = learn;
		enum verdict v = judge(c, &t, o, &learn, &q, code, &rc, err);
		fsti_free(q.etag); /* o has it, where it was learnt */
		if (v == FAIL) {
			note_spent(&tries, err);
			return rc;
		}
		/* bytes that passed every check stay, whatever came after them */
		done += q.got;
		bool progress = q.got >= MIN_PROGRESS || (q.got && done >= len);
		if (progress)
			tries.failures = 0;
		if (was_learning && !learn) {
			if_match = o->etag && strncmp(o->etag, "W/", 2) ? o->etag : NULL;
			if (off >= o->size)
				break;
			len = FSTI_MIN(len, o->size - off);
		}
		/* every byte asked for, checked: a transport error after them
		 * (a connection closed short of a longer Content-Length) leaves
		 * nothing to retry */
		if ((v == RETRY || !progress) && done < len) {
			char at[600];
			where(at, sizeof at, &t, &q);
			if (v == DONE && !q.got)
				fsti_err(err, FST_EIO, "%s: the server answered with no bytes", at);
			else if (v == DONE)
				fsti_err(err, FST_EIO,
					 "%s: the server answered with %" PRIu64 " of the %" PRIu64
					 " bytes asked, fewer than the %" PRIu64 " an answer must bring",
					 at, q.got, len - (done - q.got), MIN_PROGRESS);
			if (!backoff(&tries, stop)) {
				if (stop && atomic_load(stop))
					return fsti_err(err, FST_ECANCELED, "%s: cancelled", at);
				note_spent(&tries, err);
				return err ? err->code : FST_EIO;
			}
		}
	}
	*got = done;
	return 0;
}

int fsti_object_read(struct fsti_conn *c, const struct fsti_object *o, uint64_t off,
		     uint64_t len, void *dst, const atomic_int *stop, fst_error *err)
{
	if (off > o->size || len > o->size - off)
		return fsti_err(err, FST_ECHANGED,
				"%s: read of %" PRIu64 " bytes at offset %" PRIu64
				" past the end of the %" PRIu64 "-byte object",
				o->name, len, off, o->size);
	uint64_t got;
	return len ? get_range(c, (struct fsti_object *)o, false, off, len, dst, &got, stop, err)
		   : 0;
}

/* The http(s) URL that name is requested at, and whether it is signed. */
static int request_url(struct fsti_remote *r, const char *name, char **url, bool *sign,
		       fst_error *err)
{
	*sign = false;
	if (fsti_url_kind(name) != FSTI_URL_S3) {
		*url = fsti_strdup(name);
		return *url ? 0 : fsti_err(err, FST_ENOMEM, "out of memory");
	}
	char *bucket, *key;
	int rc = fsti_s3_split(name, &bucket, &key, err);
	if (rc)
		return rc;
	char *enc = fsti_url_encode(key, true);
	*url = enc ? fsti_remote_s3_url(r, bucket, enc, NULL) : NULL;
	*sign = r->sign;
	fsti_free(enc);
	fsti_free(bucket);
	fsti_free(key);
	return *url ? 0 : fsti_err(err, FST_ENOMEM, "out of memory");
}

int fsti_object_open(struct fsti_conn *c, struct fsti_remote *r, const char *name, uint64_t want,
		     char **head, uint64_t *got, struct fsti_object **out, fst_error *err)
{
	*out = NULL;
	*head = NULL;
	struct fsti_object *o = fsti_calloc(1, sizeof *o);
	char *buf = fsti_malloc(want ? want : 1);
	if (!o || !buf || !(o->name = fsti_url_display(name))) {
		fsti_free(buf);
		fsti_object_free(o);
		return fsti_err(err, FST_ENOMEM, "%s: out of memory", name);
	}
	o->remote = fsti_remote_ref(r);
	int rc = request_url(r, name, &o->url, &o->sign, err);
	if (!rc)
		rc = get_range(c, o, true, 0, want, buf, got, NULL, err);
	if (rc) {
		fsti_free(buf);
		fsti_object_free(o);
		return rc;
	}
	/* asked at an endpoint's URL, shown without its secrets */
	char at[600] = "";
	if (fsti_url_kind(name) == FSTI_URL_S3) {
		size_t n = (size_t)snprintf(at, sizeof at, ", at ");
		fst_display_path(o->url, at + n, sizeof at - n);
	}
	fsti_log(FST_LOG_DEBUG, "%s: %" PRIu64 " bytes, ETag %s, Last-Modified %s%s (%s)", o->name,
		 o->size, o->etag ? o->etag : "none",
		 o->last_modified[0] ? o->last_modified : "none", at, o->sign ? r->why : "unsigned");
	*head = buf;
	*out = o;
	return 0;
}

int fsti_http_get_all(struct fsti_conn *c, struct fsti_remote *r, bool sign, const char *name,
		      const char *url, size_t max, char **body, size_t *len, fst_error *err)
{
	const struct target t = {name, url, 0, 0};
	struct retry tries = {r, 0, 0};
	struct fsti_object none = {.name = (char *)name, .url = (char *)url, .sign = sign,
				   .remote = r};
	*body = NULL;
	for (;;) {
		char *buf = NULL;
		struct request q = {.url = url, .grow = &buf, .max = max};
		int code = perform(c, r, sign, &q, NULL, err);
		if (code < 0)
			return code;
		int rc;
		bool learn = true;
		enum verdict v = judge(c, &t, &none, &learn, &q, code, &rc, err);
		fsti_free(q.etag);
		if (v == DONE) {
			*body = buf ? buf : fsti_strdup("");
			*len = (size_t)q.got;
			return *body ? 0 : fsti_err(err, FST_ENOMEM, "out of memory");
		}
		fsti_free(buf);
		if (v == FAIL || !backoff(&tries, NULL)) {
			note_spent(&tries, err);
			return rc;
		}
	}
}

int fsti_object_fetch(struct fsti_conn *c, struct fsti_remote *r, const char *name, size_t max,
		      char **body, size_t *len, fst_error *err)
{
	*body = NULL;
	char *buf;
	uint64_t got;
	struct fsti_object *o;
	int rc = fsti_object_open(c, r, name, FSTI_MIN((uint64_t)max, (uint64_t)1 << 20), &buf, &got,
				  &o, err);
	if (rc)
		return rc;
	if (o->size > max) {
		rc = fsti_err(err, FST_EFORMAT, "%s: %" PRIu64 " bytes, more than the %zu read of such a file",
			      name, o->size, max);
	} else {
		char *grown = fsti_realloc(buf, (size_t)o->size + 1);
		if (!grown) {
			rc = fsti_err(err, FST_ENOMEM, "%s: out of memory", name);
		} else {
			buf = grown;
			rc = fsti_object_read(c, o, got, o->size - got, buf + got, NULL, err);
			buf[o->size] = '\0';
			*len = (size_t)o->size;
		}
	}
	fsti_object_free(o);
	if (rc)
		fsti_free(buf);
	else
		*body = buf;
	return rc;
}
