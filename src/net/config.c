/*
 * config.c - what an open of a URL resolves once: the options, else the
 * AWS SDKs' environment variables and files, else the defaults
 * (docs/remote.md has the order). The result is immutable and shared.
 */
#include "net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEFAULT_RETRIES 5
#define DEFAULT_RETRY_TIME_MS 60000u
#define DEFAULT_CONNECT_TIMEOUT_MS 10000u
#define DEFAULT_STALL_TIMEOUT_MS 30000u

void fst_open_opts_init(fst_open_opts *o)
{
	memset(o, 0, sizeof *o);
	o->struct_size = sizeof *o;
}

struct fsti_remote *fsti_remote_ref(struct fsti_remote *r)
{
	if (r)
		atomic_fetch_add(&r->refs, 1);
	return r;
}

void fsti_remote_unref(struct fsti_remote *r)
{
	if (!r || atomic_fetch_sub(&r->refs, 1) != 1)
		return;
	fsti_free(r->endpoint);
	fsti_free(r->region);
	fsti_free(r->key_id);
	fsti_free(r->secret);
	fsti_free(r->token);
	fsti_free(r->sigv4);
	fsti_free(r->ca_bundle);
	fsti_free(r);
}

static const char *first(const char *a, const char *b)
{
	return a && *a ? a : b;
}

/* Duplicate s into *dst (NULL stays NULL); false when out of memory. */
static bool dup(char **dst, const char *s)
{
	*dst = s ? fsti_strdup(s) : NULL;
	return !s || *dst;
}

static bool truthy(const char *v)
{
	return v && (!strcmp(v, "1") || !strcasecmp(v, "true"));
}

/* The AWS files' path: the variable's, else ~/.aws/NAME (NULL without HOME). */
static char *aws_file(enum fsti_env var, const char *name)
{
	const char *v = fsti_env(var), *home = fsti_env(FSTI_ENV_HOME);
	if (v)
		return fsti_strdup(v);
	if (!home)
		return NULL;
	size_t n = strlen(home) + strlen(name) + 8;
	char *p = fsti_malloc(n);
	if (p)
		snprintf(p, n, "%s/.aws/%s", home, name);
	return p;
}

enum { K_ID, K_SECRET, K_TOKEN, K_REGION, K_ENDPOINT, NKEYS };
static const char *const keys[NKEYS] = {"aws_access_key_id", "aws_secret_access_key",
					"aws_session_token", "region", "endpoint_url"};

struct profile {
	char *cred_path, *config_path;
	char *cred[NKEYS], *config[NKEYS];
};

static void profile_free(struct profile *p)
{
	for (int i = 0; i < NKEYS; i++) {
		fsti_free(p->cred[i]);
		fsti_free(p->config[i]);
	}
	fsti_free(p->cred_path);
	fsti_free(p->config_path);
}

/* The profile's entries in both files. A profile named by the caller or
 * AWS_PROFILE must be in one of them; "default" may be in neither. */
static int read_profile(const char *name, bool named, struct profile *p, fst_error *err)
{
	memset(p, 0, sizeof *p);
	p->cred_path = aws_file(FSTI_ENV_AWS_SHARED_CREDENTIALS_FILE, "credentials");
	p->config_path = aws_file(FSTI_ENV_AWS_CONFIG_FILE, "config");
	/* the config file's profiles are [profile NAME], the default one also
	 * [default] (fsti_ini_read takes either for "profile default"); the
	 * credentials file's are [NAME] */
	char section[300];
	snprintf(section, sizeof section, "profile %s", name);
	bool in_cred = false, in_config = false;
	int rc = 0;
	if (p->cred_path)
		rc = fsti_ini_read(p->cred_path, name, keys, p->cred, NKEYS, &in_cred, err);
	if (!rc && p->config_path)
		rc = fsti_ini_read(p->config_path, section, keys, p->config, NKEYS, &in_config, err);
	if (!rc && named && !in_cred && !in_config)
		rc = fsti_err(err, FST_EUSAGE,
			      "AWS profile \"%s\" is in neither %s nor %s", name,
			      p->cred_path ? p->cred_path : "(no credentials file: HOME unset)",
			      p->config_path ? p->config_path : "(no config file: HOME unset)");
	return rc;
}

/* Credentials: the environment's, else the credentials file's, else the
 * config file's; a key without its secret is an error, not "none". */
static int credentials(struct fsti_remote *r, const struct profile *p, const char *profile,
		       fst_error *err)
{
	const char *id = fsti_env(FSTI_ENV_AWS_ACCESS_KEY_ID);
	const char *secret = fsti_env(FSTI_ENV_AWS_SECRET_ACCESS_KEY);
	const char *token = fsti_env(FSTI_ENV_AWS_SESSION_TOKEN);
	const char *from = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY";
	if (!id && !secret) {
		const char *const *src = NULL;
		if (p->cred[K_ID] || p->cred[K_SECRET]) {
			src = (const char *const *)p->cred;
			from = p->cred_path;
		} else if (p->config[K_ID] || p->config[K_SECRET]) {
			src = (const char *const *)p->config;
			from = p->config_path;
		}
		if (src) {
			id = src[K_ID];
			secret = src[K_SECRET];
			token = src[K_TOKEN];
		}
	}
	if (!id && !secret) {
		snprintf(r->why, sizeof r->why,
			 "unsigned requests: no credentials in the environment, %s or %s (profile "
			 "\"%s\")",
			 p->cred_path ? p->cred_path : "~/.aws/credentials",
			 p->config_path ? p->config_path : "~/.aws/config", profile);
		return 0;
	}
	if (!id || !secret || !*id || !*secret)
		return fsti_err(err, FST_EUSAGE,
				"AWS credentials from %s: an access key id needs its secret access "
				"key and the other way round",
				from);
	/* "aws_session_token =" with nothing after it is no token, as the
	 * AWS SDKs read it: an empty header would be signed and not sent */
	if (token && !*token)
		token = NULL;
	r->sign = true;
	snprintf(r->why, sizeof r->why, "signed (AWS SigV4, region %s) with access key %.8s... from %s",
		 r->region, id, from);
	return dup(&r->key_id, id) && dup(&r->secret, secret) && dup(&r->token, token)
		       ? 0
		       : fsti_err(err, FST_ENOMEM, "out of memory");
}

static int endpoint(struct fsti_remote *r, const char *e, fst_error *err)
{
	if (!e)
		return 0;
	if (fsti_url_kind(e) != FSTI_URL_HTTP || !e[strcspn(e, ":") + 3])
		return fsti_err(err, FST_EUSAGE,
				"S3 endpoint \"%s\": expected http://HOST[:PORT] or https://HOST[:PORT]",
				e);
	if (!dup(&r->endpoint, e))
		return fsti_err(err, FST_ENOMEM, "out of memory");
	size_t n = strlen(r->endpoint);
	while (n && r->endpoint[n - 1] == '/')
		r->endpoint[--n] = '\0';
	return 0;
}

static int resolve_s3(struct fsti_remote *r, const fst_open_opts *o, fst_error *err)
{
	const char *env_profile = fsti_env(FSTI_ENV_AWS_PROFILE);
	const char *profile = first(o->profile, first(env_profile, "default"));
	struct profile p;
	int rc = read_profile(profile, (o->profile && *o->profile) || env_profile, &p, err);
	const char *region = first(o->region, first(fsti_env(FSTI_ENV_AWS_REGION),
						    first(fsti_env(FSTI_ENV_AWS_DEFAULT_REGION),
							  first(p.config[K_REGION], "us-east-1"))));
	if (!rc && !dup(&r->region, region))
		rc = fsti_err(err, FST_ENOMEM, "out of memory");
	if (!rc)
		rc = endpoint(r,
			      first(o->endpoint,
				    first(fsti_env(FSTI_ENV_AWS_ENDPOINT_URL_S3),
					  first(fsti_env(FSTI_ENV_AWS_ENDPOINT_URL), p.config[K_ENDPOINT]))),
			      err);
	if (!rc && (o->addressing < FST_S3_AUTO || o->addressing > FST_S3_VIRTUAL))
		rc = fsti_err(err, FST_EUSAGE, "unknown S3 addressing %d", o->addressing);
	r->path_style = o->addressing == FST_S3_PATH || (o->addressing == FST_S3_AUTO && r->endpoint);
	if (!rc) {
		size_t n = strlen(r->region) + 16;
		if ((r->sigv4 = fsti_malloc(n)))
			snprintf(r->sigv4, n, "aws:amz:%s:s3", r->region);
		else
			rc = fsti_err(err, FST_ENOMEM, "out of memory");
	}
	if (!rc && (o->unsigned_requests || truthy(fsti_env(FSTI_ENV_AWS_NO_SIGN_REQUEST))))
		snprintf(r->why, sizeof r->why, "unsigned requests (%s)",
			 o->unsigned_requests ? "asked for" : "AWS_NO_SIGN_REQUEST");
	else if (!rc)
		rc = credentials(r, &p, profile, err);
	profile_free(&p);
	return rc;
}

int fsti_remote_new(const fst_open_opts *in, bool s3, struct fsti_remote **out, fst_error *err)
{
	*out = NULL;
	fst_open_opts o;
	fst_open_opts_init(&o);
	if (in) {
		static const size_t released[] = {sizeof(fst_open_opts)}; /* as in options.c */
		if (!fsti_struct_size_known(in->struct_size, released, 1))
			return fsti_err(err, FST_EUSAGE,
					"open options not initialised with fst_open_opts_init");
		memcpy(&o, in, in->struct_size);
	}
	if (o.retries < -1 || o.retries > 100)
		return fsti_err(err, FST_EUSAGE, "retries %d: expected -1 (none) to 100", o.retries);
	struct fsti_remote *r = fsti_calloc(1, sizeof *r);
	if (!r)
		return fsti_err(err, FST_ENOMEM, "out of memory");
	atomic_init(&r->refs, 1);
	r->retries = o.retries == 0 ? DEFAULT_RETRIES : o.retries < 0 ? 0 : o.retries;
	r->retry_time_ms = o.retry_time_ms ? o.retry_time_ms : DEFAULT_RETRY_TIME_MS;
	r->connect_timeout_ms = o.connect_timeout_ms ? o.connect_timeout_ms
						     : DEFAULT_CONNECT_TIMEOUT_MS;
	r->stall_timeout_ms = o.stall_timeout_ms ? o.stall_timeout_ms : DEFAULT_STALL_TIMEOUT_MS;
	r->request_timeout_ms = o.request_timeout_ms;
	snprintf(r->why, sizeof r->why, "unsigned requests (not S3)");
	const char *ca = first(o.ca_bundle,
			       first(fsti_env(FSTI_ENV_AWS_CA_BUNDLE),
				     first(fsti_env(FSTI_ENV_CURL_CA_BUNDLE), fsti_env(FSTI_ENV_SSL_CERT_FILE))));
	int rc = dup(&r->ca_bundle, ca) ? 0 : fsti_err(err, FST_ENOMEM, "out of memory");
	if (!rc && s3)
		rc = resolve_s3(r, &o, err);
	if (rc) {
		fsti_remote_unref(r);
		return rc;
	}
	*out = r;
	return 0;
}

static bool lower_alnum(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
}

/*
 * Whether bucket can be virtual-hosted, as botocore decides: it must be a
 * host name's labels, 3 to 63 of a-z, 0-9 and '-' with a letter or digit
 * at each end. Older buckets may hold capitals and '_', which no host name
 * carries (DNS has no case: the request would reach another bucket), so
 * only path-style reaches them. A '.' makes more labels than a wildcard
 * certificate covers, so it is taken only over plain http.
 */
static bool virtual_ok(const char *bucket, bool dots)
{
	size_t n = strlen(bucket);
	if (n < 3 || n > 63)
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = bucket[i];
		if (lower_alnum(ch))
			continue;
		/* each label begins and ends with a letter or digit */
		if (i == 0 || i == n - 1 || !(ch == '-' || (ch == '.' && dots)) ||
		    bucket[i - 1] == '.' || bucket[i + 1] == '.')
			return false;
	}
	return true;
}

char *fsti_remote_s3_url(const struct fsti_remote *r, const char *bucket, const char *key,
			 const char *query)
{
	/* scheme and host (with port and any base path) of the endpoint */
	char scheme[16] = "https://", aws[300];
	const char *base = aws;
	if (r->endpoint) {
		base = strstr(r->endpoint, "://") + 3;
		snprintf(scheme, sizeof scheme, "%.*s", (int)(base - r->endpoint), r->endpoint);
	} else {
		snprintf(aws, sizeof aws, "s3.%s.amazonaws.com", r->region);
	}
	bool path = r->path_style ||
		    !virtual_ok(bucket, r->endpoint && !strncasecmp(r->endpoint, "http://", 7));
	size_t n = strlen(scheme) + strlen(base) + strlen(bucket) + strlen(key) +
		   (query ? strlen(query) : 0) + 8;
	char *url = fsti_malloc(n);
	if (!url)
		return NULL;
	if (path)
		snprintf(url, n, "%s%s/%s%s%s%s%s", scheme, base, bucket, *key ? "/" : "", key,
			 query ? "?" : "", query ? query : "");
	else
		snprintf(url, n, "%s%s.%s/%s%s%s", scheme, bucket, base, key, query ? "?" : "",
			 query ? query : "");
	return url;
}
