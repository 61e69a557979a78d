/* Description: net/'s pure parts, no server: URLs (kinds, S3 bucket and key,
 * encoding, names beside an index), the INI reader of ~/.aws files, the
 * configuration an open resolves (options over the AWS variables over the
 * files; a key without its secret, an unknown profile and a bad endpoint
 * refused; unsigned without credentials or when asked), the request URLs
 * (path-style with an endpoint, virtual-hosted on AWS), and ListObjectsV2
 * pages (entities, subfolders, truncation, what is no listing). */
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
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *got = fsti_url_beside(cases[i].url, cases[i].name);
		assert_string_equal(got, cases[i].want);
		fsti_free(got);
	}
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
			 "aws_session_token = t2\n");
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
		cmocka_unit_test(test_ini),
		cmocka_unit_test(test_config_env),
		cmocka_unit_test(test_config_refused),
		cmocka_unit_test(test_config_files),
		cmocka_unit_test(test_request_urls),
		cmocka_unit_test(test_listing_pages),
	};
	return cmocka_run_group_tests(tests, clean_env, NULL);
}
