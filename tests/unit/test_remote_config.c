/* Description: net/'s pure parts, no server: URLs (kinds, S3 bucket and key,
 * encoding, names beside an index: encoded for http(s), the index's query
 * dropped), the INI reader of ~/.aws files (lines of any length, the forms
 * botocore takes: keys in any case, ':', [profile  NAME], [profile default]),
 * the configuration an open resolves (options over the AWS variables over
 * the files; a key without its secret, an unknown profile and a bad endpoint
 * refused; unsigned without credentials or when asked), the request URLs
 * (path-style with an endpoint, virtual-hosted on AWS, path-style for a
 * bucket name no host name can carry), and ListObjectsV2 pages (entities,
 * subfolders, truncation, what is no listing). */
#include "helpers.h"
#include "net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const aws_vars[] = {
	"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
	"AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
	"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_NO_SIGN_REQUEST", "AWS_CA_BUNDLE",
	"CURL_CA_BUNDLE", "SSL_CERT_FILE",
};

/* got is want (a NULL got fails cleanly, where strcmp would crash). */
static void assert_str(const char *got, const char *want)
{
	if (!got)
		fail_msg("NULL, not \"%s\"", want);
	assert_string_equal(got, want);
}

/* No AWS variable, and HOME where no ~/.aws is. */
static int clean_env(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof aws_vars / sizeof aws_vars[0]; i++)
		unsetenv(aws_vars[i]);
	setenv("HOME", test_tmpdir(), 1);
	return 0;
}

static void test_url_kinds(void **state)
{
	(void)state;
	assert_int_equal(fsti_url_kind("s3://b/k"), FSTI_URL_S3);
	assert_int_equal(fsti_url_kind("S3://b/k"), FSTI_URL_S3);
	assert_int_equal(fsti_url_kind("https://h/x"), FSTI_URL_HTTP);
	assert_int_equal(fsti_url_kind("http://h/x"), FSTI_URL_HTTP);
	assert_int_equal(fsti_url_kind("/tmp/x.safetensors"), FSTI_URL_NONE);
	assert_int_equal(fsti_url_kind("s3:/b"), FSTI_URL_NONE);
	assert_int_equal(fsti_url_kind(NULL), FSTI_URL_NONE);
	assert_true(fsti_url_is_folder("s3://bucket"));
	assert_true(fsti_url_is_folder("s3://bucket/prefix/"));
	assert_false(fsti_url_is_folder("s3://bucket/model.safetensors"));
	assert_true(fsti_url_is_folder("https://h/ckpt/"));
	assert_false(fsti_url_is_folder("https://h/ckpt"));
	/* an http(s) path ends at its query; an S3 key does not */
	assert_true(fsti_url_is_folder("https://h/ckpt/?X-Amz-Signature=ab"));
	assert_false(fsti_url_is_folder("https://h/ckpt?prefix=m/"));
	assert_true(fsti_url_is_folder("s3://b/p?x/"));
}

static void test_s3_split(void **state)
{
	(void)state;
	char *b, *k;
	fst_error err;
	assert_int_equal(fsti_s3_split("s3://my-bucket/a/b c.safetensors", &b, &k, &err), 0);
	assert_string_equal(b, "my-bucket");
	assert_string_equal(k, "a/b c.safetensors");
	fsti_free(b);
	fsti_free(k);
	assert_int_equal(fsti_s3_split("s3://bucket", &b, &k, &err), 0);
	assert_string_equal(k, "");
	fsti_free(b);
	fsti_free(k);
	assert_int_equal(fsti_s3_split("s3://ab/k", &b, &k, &err), FST_EUSAGE);
	assert_has(err.message, "s3://ab/k: \"ab\" is no S3 bucket name");
	assert_int_equal(fsti_s3_split("s3://bad%bucket/k", &b, &k, &err), FST_EUSAGE);
	assert_null(b);
}

static void test_encode_and_beside(void **state)
{
	(void)state;
	char *e = fsti_url_encode("a b/c~d_e.f-g+h=&", true);
	assert_string_equal(e, "a%20b/c~d_e.f-g%2Bh%3D%26");
	fsti_free(e);
	e = fsti_url_encode("llm/", false);
	assert_string_equal(e, "llm%2F");
	fsti_free(e);
	e = fsti_url_encode("\xc3\xa9", false);
	assert_string_equal(e, "%C3%A9");
	fsti_free(e);
	struct {
		const char *url, *name, *want;
	} cases[] = {
		{"https://h/ckpt/model.safetensors.index.json", "a.safetensors", "https://h/ckpt/a.safetensors"},
		{"s3://b/p/", "a.safetensors", "s3://b/p/a.safetensors"},
		{"s3://b/p/index.json", "sub/a.safetensors", "s3://b/p/sub/a.safetensors"},
		{"s3://b", "a.safetensors", "s3://b/a.safetensors"},
		{"http://h:8080", "x", "http://h:8080/x"},
		/* an http(s) shard's name is encoded, '/' kept */
		{"https://h/c/i.json", "sp ace.safetensors", "https://h/c/sp%20ace.safetensors"},
		{"https://h/c/i.json", "hash#1.safetensors", "https://h/c/hash%231.safetensors"},
		{"https://h/c/i.json", "sub/a?b.safetensors", "https://h/c/sub/a%3Fb.safetensors"},
		/* the index's query (a presigned URL's) is not the shards' */
		{"https://h/c/model.safetensors.index.json?X-Amz-Credential=AK%2F1/s3&sig=x",
		 "a.safetensors", "https://h/c/a.safetensors"},
		{"https://h/c/i.json?sig=x", "a.safetensors", "https://h/c/a.safetensors"},
		{"http://h:8080?x=1/2", "a", "http://h:8080/a"},
		{"https://h/c/i.json#part/2", "a", "https://h/c/a"},
		/* an S3 key stays raw (encoded when requested), '?' and '#' in it */
		{"s3://b/p/index.json", "sp ace#1.safetensors", "s3://b/p/sp ace#1.safetensors"},
		{"s3://b/p?x/index.json", "a", "s3://b/p?x/a"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *got = fsti_url_beside(cases[i].url, cases[i].name);
		assert_string_equal(got, cases[i].want);
		fsti_free(got);
	}
}

struct log_capture {
	int n;
	char lines[4][256];
};

static void capture_log(void *ctx, int level, const char *line)
{
	(void)level;
	struct log_capture *cap = ctx;
	if (cap->n < 4)
		snprintf(cap->lines[cap->n++], sizeof cap->lines[0], "%s", line);
}

/* The secrets of an http(s) URL (its password, its query) hidden from what
 * fst shows; S3 URLs and paths shown whole. */
static void test_url_display_and_hide(void **state)
{
	(void)state;
	static const char *const cases[][2] = {
		{"http://u:pw@h/x.safetensors", "http://u:***@h/x.safetensors"},
		{"https://u:p@h:8443/a?X-Amz-Signature=s/x#f", "https://u:***@h:8443/a?***#f"},
		{"http://u@h/x", "http://***@h/x"}, /* a token given as the user */
		{"https://ghp_T0KEN@h:8443/x?q", "https://***@h:8443/x?***"},
		{"http://u:@h/x", "http://u:@h/x"},
		{"http://[::1]:8080/x", "http://[::1]:8080/x"},
		{"http://h/x?a", "http://h/x?***"},
		{"http://u:p@h", "http://u:***@h"},
		{"http://h/a@b:c/x", "http://h/a@b:c/x"}, /* '@' in the path: no user info */
		{"s3://b/k?v:w@x", "s3://b/k?v:w@x"},
		{"/local/path?x", "/local/path?x"},
		/* a password's '/', '#' or '?' not encoded: no URL libcurl takes,
		 * its user info up to the last '@' hidden (more, never less) */
		{"http://u:pa/ss@h/x", "http://u:***@h/x"},
		{"http://u:pa#ss@h/x?q", "http://u:***@h/x?***"},
		{"http://u:pa?ss@h/x", "http://u:***@h/x"},
		{"http://u:a/b@c/d@h/x", "http://u:***@h/x"},
		{"http://h:8080/a@b/x", "http://h:8080/a@b/x"}, /* a port: '@' in the path */
		{"http://[::1]:80/a@b", "http://[::1]:80/a@b"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *d = fsti_url_display(cases[i][0]);
		assert_non_null(d);
		assert_string_equal(d, cases[i][1]);
		fsti_free(d);
	}
	/* the public form: the same text, cut to fit as snprintf cuts, its
	 * whole length returned */
	char out[32];
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		size_t want = strlen(cases[i][1]);
		assert_int_equal(fst_display_path(cases[i][0], NULL, 0), want);
		assert_int_equal(fst_display_path(cases[i][0], out, sizeof out), want);
		assert_true(strncmp(out, cases[i][1], sizeof out - 1) == 0);
		assert_int_equal(strlen(out), want < sizeof out ? want : sizeof out - 1);
	}
	assert_int_equal(fst_display_path("http://u:pw@h/x?s", out, 12), 20);
	assert_string_equal(out, "http://u:**");
	assert_int_equal(fst_display_path("http://u:pw@h/x?s", out, 1), 20);
	assert_string_equal(out, "");
	assert_int_equal(fst_display_path(NULL, out, sizeof out), 0);
	assert_string_equal(out, "");
	/* every occurrence, a shard's URL made from it too; a 1-character
	 * password grows to "***" within the buffer's size */
	char text[64] = "http://u:p@h/a.json?q=1: shard http://u:p@h/b: q=1 bad";
	fsti_url_hide(text, sizeof text, "http://u:p@h/a.json?q=1");
	assert_string_equal(text, "http://u:***@h/a.json?***: shard http://u:***@h/b: q=1 bad");
	char small[16] = "x u:p@h y";
	fsti_url_hide(small, 12, "http://u:p@h");
	assert_string_equal(small, "x u:***@h y");
	char token[48] = "GET http://T0K@h/x: shard http://T0K@h/y";
	fsti_url_hide(token, sizeof token, "http://T0K@h/x");
	assert_string_equal(token, "GET http://***@h/x: shard http://***@h/y");
	char tight[8] = "ab:p@cd";
	fsti_url_hide(tight, sizeof tight, "http://x:p@c");
	assert_string_equal(tight, "ab:***@");
}

/* A URL shown once (every URL given to the library is) keeps its secrets
 * out of every later log line, whatever builds the line. */
static void test_url_secrets_hidden_from_logs(void **state)
{
	(void)state;
	struct log_capture cap = {0};
	fst_log_set_callback(capture_log, &cap);
	int level = fst_log_get_level();
	fst_log_set_level(FST_LOG_DEBUG);
	fsti_log(FST_LOG_DEBUG, "before: http://u:Pw0rd9@h/x?S1gn");
	char *d = fsti_url_display("http://u:Pw0rd9@h/x?S1gn");
	fsti_free(d);
	fsti_log(FST_LOG_DEBUG, "after: http://u:Pw0rd9@h/y?S1gn and Pw0rd9 alone");
	fst_error err;
	fsti_err(&err, FST_EIO, "built: http://u:Pw0rd9@h/z");
	fst_log_set_level(level);
	fst_log_set_callback(NULL, NULL);
	assert_int_equal(cap.n, 3);
	assert_string_equal(cap.lines[0], "before: http://u:Pw0rd9@h/x?S1gn");
	assert_string_equal(cap.lines[1], "after: http://u:***@h/y?*** and Pw0rd9 alone");
	assert_non_null(strstr(cap.lines[2], "built: http://u:***@h/z"));
	/* the message itself is the caller's to hide (fsti_url_hide) */
	assert_string_equal(err.message, "built: http://u:Pw0rd9@h/z");
}

static void test_ini(void **state)
{
	(void)state;
	const char *p = test_path("config");
	write_text(p, "# comment\n[default]\nregion = eu-west-1\n\n[profile dev]\n"
		      "  ; indented comment\nregion=us-west-2  \ns3 =\n  addressing_style = path\n"
		      "aws_access_key_id = AKID\n[other]\nregion = nowhere\n");
	const char *keys[] = {"region", "aws_access_key_id", "addressing_style"};
	char *v[3];
	bool found;
	fst_error err;
	assert_int_equal(fsti_ini_read(p, "profile dev", keys, v, 3, &found, &err), 0);
	assert_true(found);
	assert_string_equal(v[0], "us-west-2");
	assert_string_equal(v[1], "AKID");
	assert_null(v[2]); /* nested under s3 = */
	for (int i = 0; i < 3; i++)
		fsti_free(v[i]);
	assert_int_equal(fsti_ini_read(p, "absent", keys, v, 3, &found, &err), 0);
	assert_false(found);
	assert_null(v[0]);
	assert_int_equal(fsti_ini_read(test_path("no-such-file"), "default", keys, v, 3, &found, &err),
			 0);
	assert_false(found);
	/* a directory cannot be read as a file */
	assert_int_not_equal(fsti_ini_read(test_tmpdir(), "default", keys, v, 3, &found, &err), 0);
}

/* A session token longer than any line buffer: STS does not bound it. */
static void test_ini_long_line(void **state)
{
	(void)state;
	enum { LEN = 5000 };
	char *token = malloc(LEN + 1), *text = malloc(LEN + 200);
	assert_non_null(token);
	assert_non_null(text);
	for (int i = 0; i < LEN; i++)
		token[i] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ/+="[i % 29];
	token[LEN] = '\0';
	snprintf(text, LEN + 200, "[default]\naws_session_token = %s\naws_access_key_id = AKID\n",
		 token);
	const char *p = test_path("long-credentials");
	write_text(p, text);
	const char *keys[] = {"aws_session_token", "aws_access_key_id"};
	char *v[2];
	bool found;
	fst_error err;
	assert_int_equal(fsti_ini_read(p, "default", keys, v, 2, &found, &err), 0);
	assert_true(found);
	assert_non_null(v[0]);
	assert_int_equal(strlen(v[0]), LEN);
	assert_str(v[0], token);
	assert_str(v[1], "AKID");
	for (int i = 0; i < 2; i++)
		fsti_free(v[i]);
	free(token);
	free(text);
}

/* What botocore's configparser takes: keys in any case, ':' as well as
 * '=' (the first of them splits), no section without its ']'. */
static void test_ini_forms(void **state)
{
	(void)state;
	const char *p = test_path("forms");
	write_text(p, "[default]\nAWS_Access_Key_ID = AKIDUP\naws_secret_access_key: s:e=c\n"
		      "endpoint_url = http://h:9000\nRegion=eu-west-1\n");
	const char *keys[] = {"aws_access_key_id", "aws_secret_access_key", "endpoint_url",
			      "region"};
	char *v[4];
	bool found;
	fst_error err;
	assert_int_equal(fsti_ini_read(p, "default", keys, v, 4, &found, &err), 0);
	assert_true(found);
	assert_str(v[0], "AKIDUP");
	assert_str(v[1], "s:e=c");
	assert_str(v[2], "http://h:9000");
	assert_str(v[3], "eu-west-1");
	for (int i = 0; i < 4; i++)
		fsti_free(v[i]);
	/* an unclosed header is none, and ends the section before it */
	write_text(p, "[dev]\nregion = us-west-2\n[default\nregion = nowhere\n");
	assert_int_equal(fsti_ini_read(p, "default", keys, v, 4, &found, &err), 0);
	assert_false(found);
	assert_null(v[3]);
	assert_int_equal(fsti_ini_read(p, "dev", keys, v, 4, &found, &err), 0);
	assert_str(v[3], "us-west-2");
	fsti_free(v[3]);
}

/* The config file's profile headers as botocore reads them: [profile NAME]
 * with any blanks between, the default one also [profile default]; of two
 * sections for one profile the last alone counts. */
static void test_ini_profiles(void **state)
{
	(void)state;
	const char *p = test_path("profiles");
	const char *keys[] = {"region", "output"};
	char *v[2];
	bool found;
	fst_error err;
	struct {
		const char *text, *section, *region;
	} cases[] = {
		{"[profile \t  dev]\nregion = a\n", "profile dev", "a"},
		{"[profiledev]\nregion = a\n", "profile dev", NULL},
		{"[profile default]\nregion = a\n", "profile default", "a"},
		{"[default]\nregion = a\n", "profile default", "a"},
		/* the credentials file's [NAME]: no "profile " there */
		{"[profile default]\nregion = a\n", "default", NULL},
		{"[default]\nregion = a\n", "profile dev", NULL},
		{"[default]\nregion = a\noutput = json\n[profile default]\nregion = b\n",
		 "profile default", "b"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		write_text(p, cases[i].text);
		assert_int_equal(fsti_ini_read(p, cases[i].section, keys, v, 2, &found, &err), 0);
		if (found != !!cases[i].region)
			fail_msg("case %zu: [%s] %sfound", i, cases[i].section,
				 found ? "" : "not ");
		if (!cases[i].region) {
			assert_null(v[0]);
			continue;
		}
		assert_str(v[0], cases[i].region);
		assert_null(v[1]); /* the last case's output is its first section's */
		fsti_free(v[0]);
	}
}

static struct fsti_remote *resolve(const fst_open_opts *o, int want_rc, fst_error *err)
{
	struct fsti_remote *r = NULL;
	int rc = fsti_remote_new(o, true, &r, err);
	if (rc != want_rc)
		fail_msg("fsti_remote_new: %d, not %d: %s", rc, want_rc, rc ? err->message : "");
	return r;
}

static void test_config_env(void **state)
{
	clean_env(state);
	fst_error err;
	/* nothing at all: unsigned, us-east-1, AWS */
	struct fsti_remote *r = resolve(NULL, 0, &err);
	assert_false(r->sign);
	assert_string_equal(r->region, "us-east-1");
	assert_null(r->endpoint);
	assert_false(r->path_style);
	assert_has(r->why, "unsigned requests: no credentials");
	assert_int_equal(r->retries, 5);
	fsti_remote_unref(r);

	setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
	setenv("AWS_SESSION_TOKEN", "tok", 1);
	setenv("AWS_DEFAULT_REGION", "eu-north-1", 1);
	setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/", 1);
	r = resolve(NULL, 0, &err);
	assert_true(r->sign);
	assert_string_equal(r->key_id, "AKIDENV");
	assert_string_equal(r->token, "tok");
	assert_string_equal(r->region, "eu-north-1");
	assert_string_equal(r->sigv4, "aws:amz:eu-north-1:s3");
	assert_string_equal(r->endpoint, "http://127.0.0.1:9000");
	assert_true(r->path_style);
	fsti_remote_unref(r);

	/* AWS_REGION over AWS_DEFAULT_REGION, the S3 endpoint over the
	 * general one, options over both */
	setenv("AWS_REGION", "ap-south-1", 1);
	setenv("AWS_ENDPOINT_URL_S3", "https://s3.example:8443", 1);
	r = resolve(NULL, 0, &err);
	assert_string_equal(r->region, "ap-south-1");
	assert_string_equal(r->endpoint, "https://s3.example:8443");
	fsti_remote_unref(r);
	fst_open_opts o;
	fst_open_opts_init(&o);
	o.region = "sa-east-1";
	o.endpoint = "http://localhost:1";
	o.addressing = FST_S3_VIRTUAL;
	o.retries = -1;
	r = resolve(&o, 0, &err);
	assert_string_equal(r->region, "sa-east-1");
	assert_string_equal(r->endpoint, "http://localhost:1");
	assert_false(r->path_style);
	assert_int_equal(r->retries, 0);
	char *url = fsti_remote_s3_url(r, "bkt", "a/b.safetensors", NULL);
	assert_string_equal(url, "http://bkt.localhost:1/a/b.safetensors");
	fsti_free(url);
	fsti_remote_unref(r);

	/* unsigned: asked, or AWS_NO_SIGN_REQUEST */
	o = (fst_open_opts){0};
	fst_open_opts_init(&o);
	o.unsigned_requests = 1;
	r = resolve(&o, 0, &err);
	assert_false(r->sign);
	assert_has(r->why, "asked for");
	fsti_remote_unref(r);
	setenv("AWS_NO_SIGN_REQUEST", "true", 1);
	r = resolve(NULL, 0, &err);
	assert_false(r->sign);
	assert_has(r->why, "AWS_NO_SIGN_REQUEST");
	fsti_remote_unref(r);
	clean_env(state);
}

static void test_config_refused(void **state)
{
	clean_env(state);
	fst_error err;
	setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
	resolve(NULL, FST_EUSAGE, &err);
	assert_has(err.message, "an access key id needs its secret access key");
	unsetenv("AWS_ACCESS_KEY_ID");
	setenv("AWS_PROFILE", "nope", 1);
	resolve(NULL, FST_EUSAGE, &err);
	assert_has(err.message, "AWS profile \"nope\" is in neither");
	unsetenv("AWS_PROFILE");
	fst_open_opts o;
	fst_open_opts_init(&o);
	o.endpoint = "ftp://h";
	resolve(&o, FST_EUSAGE, &err);
	assert_has(err.message, "S3 endpoint \"ftp://h\": expected http://HOST[:PORT]");
	o.endpoint = "http://";
	resolve(&o, FST_EUSAGE, &err);
	o.endpoint = NULL;
	o.retries = 101;
	resolve(&o, FST_EUSAGE, &err);
	assert_has(err.message, "retries 101");
	o.retries = 0;
	o.addressing = 7;
	resolve(&o, FST_EUSAGE, &err);
	o.struct_size = 3;
	resolve(&o, FST_EUSAGE, &err);
	assert_has(err.message, "fst_open_opts_init");
	o.struct_size = sizeof o - 1; /* ends inside the last field */
	resolve(&o, FST_EUSAGE, &err);
	assert_has(err.message, "fst_open_opts_init");
}

static void test_config_files(void **state)
{
	clean_env(state);
	/* a home of its own, so that the other tests see no ~/.aws */
	char home[512], aws[600];
	snprintf(home, sizeof home, "%s/home", test_tmpdir());
	snprintf(aws, sizeof aws, "%s/.aws", home);
	mkdir(home, 0700);
	mkdir(aws, 0700);
	setenv("HOME", home, 1);
	char cred[700], conf[700];
	snprintf(cred, sizeof cred, "%s/credentials", aws);
	snprintf(conf, sizeof conf, "%s/config", aws);
	write_text(cred, "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s1\n"
			 "[dev]\naws_access_key_id = AKIDDEV\naws_secret_access_key = s2\n"
			 "aws_session_token = t2\n[blank]\naws_access_key_id = AKIDBLANK\n"
			 "aws_secret_access_key = s4\naws_session_token =\n");
	write_text(conf, "[default]\nregion = eu-west-3\n[profile dev]\nregion = us-west-1\n"
			 "endpoint_url = http://127.0.0.1:4566\n[profile conly]\n"
			 "aws_access_key_id = AKIDCONF\naws_secret_access_key = s3\n");
	fst_error err;
	struct fsti_remote *r = resolve(NULL, 0, &err);
	assert_string_equal(r->key_id, "AKIDDEFAULT");
	assert_string_equal(r->region, "eu-west-3");
	assert_null(r->endpoint);
	assert_has(r->why, "credentials");
	fsti_remote_unref(r);
	setenv("AWS_PROFILE", "dev", 1);
	r = resolve(NULL, 0, &err);
	assert_string_equal(r->key_id, "AKIDDEV");
	assert_string_equal(r->token, "t2");
	assert_string_equal(r->region, "us-west-1");
	assert_string_equal(r->endpoint, "http://127.0.0.1:4566");
	fsti_remote_unref(r);
	/* the option over AWS_PROFILE; credentials from the config file */
	fst_open_opts o;
	fst_open_opts_init(&o);
	o.profile = "conly";
	r = resolve(&o, 0, &err);
	assert_string_equal(r->key_id, "AKIDCONF");
	fsti_remote_unref(r);
	/* an empty session token is none (else its header is signed, not sent) */
	o.profile = "blank";
	r = resolve(&o, 0, &err);
	assert_string_equal(r->key_id, "AKIDBLANK");
	assert_null(r->token);
	fsti_remote_unref(r);
	/* the environment's credentials over the files' */
	setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "s", 1);
	r = resolve(NULL, 0, &err);
	assert_string_equal(r->key_id, "AKIDENV");
	assert_null(r->token);
	fsti_remote_unref(r);
	/* the files the variables name */
	clean_env(state);
	setenv("HOME", home, 1);
	const char *mine = test_path("my-config");
	write_text(mine, "[profile mine]\naws_access_key_id = AKIDMINE\naws_secret_access_key = s4\n");
	setenv("AWS_SHARED_CREDENTIALS_FILE", test_path("no-credentials"), 1);
	setenv("AWS_CONFIG_FILE", mine, 1);
	setenv("AWS_PROFILE", "mine", 1);
	r = resolve(NULL, 0, &err);
	assert_string_equal(r->key_id, "AKIDMINE");
	assert_has(r->why, "my-config");
	fsti_remote_unref(r);
	clean_env(state);
}

/* The forms botocore takes in the files, through a whole resolve. */
static void test_config_file_forms(void **state)
{
	clean_env(state);
	char cred[700], conf[700];
	snprintf(cred, sizeof cred, "%s", test_path("forms-credentials"));
	snprintf(conf, sizeof conf, "%s", test_path("forms-config"));
	setenv("AWS_SHARED_CREDENTIALS_FILE", cred, 1);
	setenv("AWS_CONFIG_FILE", conf, 1);
	write_text(cred, "[default]\nAWS_ACCESS_KEY_ID: AKIDUPPER\nAWS_SECRET_ACCESS_KEY = s1\n");
	write_text(conf, "[profile default]\nregion = eu-central-1\n[profile\t  dev]\n"
			 "region = us-west-1\naws_access_key_id = AKIDDEV\n"
			 "aws_secret_access_key = s2\n");
	fst_error err;
	struct fsti_remote *r = resolve(NULL, 0, &err);
	assert_str(r->key_id, "AKIDUPPER");
	assert_str(r->secret, "s1");
	assert_str(r->region, "eu-central-1");
	fsti_remote_unref(r);
	setenv("AWS_PROFILE", "dev", 1);
	r = resolve(NULL, 0, &err);
	assert_str(r->key_id, "AKIDDEV");
	assert_str(r->region, "us-west-1");
	fsti_remote_unref(r);
	clean_env(state);
}

static void test_request_urls(void **state)
{
	clean_env(state);
	fst_error err;
	struct fsti_remote *r = resolve(NULL, 0, &err);
	char *u = fsti_remote_s3_url(r, "bkt", "m/a.safetensors", NULL);
	assert_string_equal(u, "https://bkt.s3.us-east-1.amazonaws.com/m/a.safetensors");
	fsti_free(u);
	u = fsti_remote_s3_url(r, "dotted.bucket", "k", NULL);
	assert_string_equal(u, "https://s3.us-east-1.amazonaws.com/dotted.bucket/k");
	fsti_free(u);
	/* a name that is no host name's label is reached path-style */
	const char *bad[] = {"My_Legacy_Bucket", "Upper", "under_score", "-lead", "trail-",
			     "x..y", "ab"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char want[200];
		snprintf(want, sizeof want, "https://s3.us-east-1.amazonaws.com/%s/k", bad[i]);
		u = fsti_remote_s3_url(r, bad[i], "k", NULL);
		assert_string_equal(u, want);
		fsti_free(u);
	}
	u = fsti_remote_s3_url(r, "a-b--c9", "k", NULL);
	assert_string_equal(u, "https://a-b--c9.s3.us-east-1.amazonaws.com/k");
	fsti_free(u);
	u = fsti_remote_s3_url(r, "bkt", "", "list-type=2");
	assert_string_equal(u, "https://bkt.s3.us-east-1.amazonaws.com/?list-type=2");
	fsti_free(u);
	fsti_remote_unref(r);
	fst_open_opts o;
	fst_open_opts_init(&o);
	o.endpoint = "http://127.0.0.1:9000";
	r = resolve(&o, 0, &err);
	u = fsti_remote_s3_url(r, "bkt", "", "delimiter=%2F");
	assert_string_equal(u, "http://127.0.0.1:9000/bkt?delimiter=%2F");
	fsti_free(u);
	u = fsti_remote_s3_url(r, "bkt", "a%20b", NULL);
	assert_string_equal(u, "http://127.0.0.1:9000/bkt/a%20b");
	fsti_free(u);
	fsti_remote_unref(r);
	/* virtual-hosted asked for: still path-style for such a name, and for
	 * a '.' under https (one certificate label), as botocore does */
	o.addressing = FST_S3_VIRTUAL;
	o.endpoint = "http://h:9000";
	r = resolve(&o, 0, &err);
	u = fsti_remote_s3_url(r, "My_Legacy_Bucket", "k", NULL);
	assert_string_equal(u, "http://h:9000/My_Legacy_Bucket/k");
	fsti_free(u);
	u = fsti_remote_s3_url(r, "dotted.bucket", "k", NULL);
	assert_string_equal(u, "http://dotted.bucket.h:9000/k");
	fsti_free(u);
	fsti_remote_unref(r);
	o.endpoint = "https://h:9443";
	r = resolve(&o, 0, &err);
	u = fsti_remote_s3_url(r, "dotted.bucket", "k", NULL);
	assert_string_equal(u, "https://h:9443/dotted.bucket/k");
	fsti_free(u);
	u = fsti_remote_s3_url(r, "bkt", "k", NULL);
	assert_string_equal(u, "https://bkt.h:9443/k");
	fsti_free(u);
	fsti_remote_unref(r);
}

static void free_names(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		fsti_free(names[i]);
	fsti_free(names);
}

static void test_listing_pages(void **state)
{
	(void)state;
	const char *page =
		"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult "
		"xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix>m/</Prefix>"
		"<Contents><Key>m/</Key><Size>0</Size></Contents>"
		"<Contents><Key>m/a&amp;b.safetensors</Key><Size>10</Size></Contents>"
		"<Contents><ETag>&quot;x&quot;</ETag><Key>m/caf&#233;&#x21;.json</Key></Contents>"
		"<Contents><Key>m/sub/c.safetensors</Key></Contents>"
		"<CommonPrefixes><Prefix>m/sub/</Prefix></CommonPrefixes>"
		"<IsTruncated>true</IsTruncated><NextContinuationToken>t&amp;1</NextContinuationToken>"
		"</ListBucketResult>";
	char **names = NULL, *next;
	size_t n = 0, cap = 0;
	fst_error err;
	assert_int_equal(fsti_s3_parse_page("s3://b/m/", page, strlen(page), "m/", &names, &n, &cap,
					    &next, &err),
			 0);
	assert_int_equal(n, 2);
	assert_string_equal(names[0], "a&b.safetensors");
	assert_string_equal(names[1], "caf\xc3\xa9!.json");
	assert_string_equal(next, "t&1");
	fsti_free(next);
	const char *last = "<ListBucketResult><Contents><Key>m/z</Key></Contents>"
			   "<IsTruncated>false</IsTruncated></ListBucketResult>";
	assert_int_equal(fsti_s3_parse_page("s3://b/m/", last, strlen(last), "m/", &names, &n, &cap,
					    &next, &err),
			 0);
	assert_int_equal(n, 3);
	assert_null(next);
	free_names(names, n);

	struct {
		const char *xml, *msg;
	} bad[] = {
		{"<html>no</html>", "the listing is not an S3 ListBucketResult"},
		{"<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
		 "an entry without a Key"},
		{"<ListBucketResult><Contents><Key>m/&bogus;</Key></Contents></ListBucketResult>",
		 "a Key with a bad XML reference"},
		/* a sign, a space or a surrogate half is no character reference */
		{"<ListBucketResult><Contents><Key>m/&#+65;</Key></Contents></ListBucketResult>",
		 "a Key with a bad XML reference"},
		{"<ListBucketResult><Contents><Key>m/&# 65;</Key></Contents></ListBucketResult>",
		 "a Key with a bad XML reference"},
		{"<ListBucketResult><Contents><Key>m/&#x-41;</Key></Contents></ListBucketResult>",
		 "a Key with a bad XML reference"},
		{"<ListBucketResult><Contents><Key>m/&#xD800;</Key></Contents></ListBucketResult>",
		 "a Key with a bad XML reference"},
		{"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
		 "truncated but has no NextContinuationToken"},
		{"<ListBucketResult><Contents><Key>m/a</Key></Contents><Contents><Ke",
		 "ends before </ListBucketResult>: cut short"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		names = NULL;
		n = cap = 0;
		assert_int_equal(fsti_s3_parse_page("s3://b/m/", bad[i].xml, strlen(bad[i].xml), "m/",
						    &names, &n, &cap, &next, &err),
				 FST_EIO);
		assert_has(err.message, "s3://b/m/: ");
		assert_has(err.message, bad[i].msg);
		free_names(names, n);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_url_kinds),
		cmocka_unit_test(test_s3_split),
		cmocka_unit_test(test_encode_and_beside),
		cmocka_unit_test(test_url_display_and_hide),
		cmocka_unit_test(test_url_secrets_hidden_from_logs),
		cmocka_unit_test(test_ini),
		cmocka_unit_test(test_ini_long_line),
		cmocka_unit_test(test_ini_forms),
		cmocka_unit_test(test_ini_profiles),
		cmocka_unit_test(test_config_env),
		cmocka_unit_test(test_config_refused),
		cmocka_unit_test(test_config_files),
		cmocka_unit_test(test_config_file_forms),
		cmocka_unit_test(test_request_urls),
		cmocka_unit_test(test_listing_pages),
	};
	return cmocka_run_group_tests(tests, clean_env, NULL);
}
