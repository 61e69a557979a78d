/*
 * curl_double.c - the real libcurl.so.4 behind every function libfst
 * opens, with what a test asks of it in the environment (read at each
 * call). Selected with FST_CURL_LIBRARY; never used otherwise.
 *   CURL_DOUBLE_OLD=1       a libcurl older than 7.85 (Ubuntu 22.04's
 *                           7.81): CURLOPT_PROTOCOLS_STR and
 *                           CURLOPT_REDIR_PROTOCOLS_STR are
 *                           CURLE_UNKNOWN_OPTION
 *   CURL_DOUBLE_NO_MASKS=1  and their bit-mask forms too (a libcurl that
 *                           has neither)
 *   CURL_DOUBLE_LOG=FILE    one line per handle made ("init H") or freed
 *                           ("cleanup H"), CA file set ("cainfo H VALUE",
 *                           "-" for NULL), URL set ("url H URL") and
 *                           request sent ("perform H")
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

/* libcurl's numbers (include/curl/curl.h); src/net/curl_decls.h is
 * checked against them */
enum { URL = 10002, CAINFO = 10065, PROTOCOLS = 181, REDIR_PROTOCOLS = 182,
       PROTOCOLS_STR = 10318, REDIR_PROTOCOLS_STR = 10319, UNKNOWN_OPTION = 48 };

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static bool asked(const char *name)
{
	const char *v = getenv(name);
	return v && !strcmp(v, "1");
}

/* one line of CURL_DOUBLE_LOG, whole, whatever thread writes it */
static void note(const char *what, void *h, const char *value)
{
	const char *path = getenv("CURL_DOUBLE_LOG");
	if (!path)
		return;
	pthread_mutex_lock(&log_lock);
	FILE *f = fopen(path, "a");
	if (f) {
		fprintf(f, "%s %p%s%s\n", what, h, value ? " " : "", value ? value : "");
		fclose(f);
	}
	pthread_mutex_unlock(&log_lock);
}

static void *real_lib;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void open_real(void)
{
	real_lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
	if (!real_lib) {
		fprintf(stderr, "old_curl_double: %s\n", dlerror());
		abort();
	}
}

static void *real(const char *name)
{
	pthread_once(&once, open_real);
	void *f = dlsym(real_lib, name);
	if (!f) {
		fprintf(stderr, "old_curl_double: no %s in libcurl.so.4\n", name);
		abort();
	}
	return f;
}

API int curl_global_init(long flags)
{
	return ((int (*)(long))real("curl_global_init"))(flags);
}

API char *curl_version(void)
{
	return ((char *(*)(void))real("curl_version"))();
}

API void *curl_easy_init(void)
{
	void *h = ((void *(*)(void))real("curl_easy_init"))();
	note("init", h, NULL);
	return h;
}

API void curl_easy_cleanup(void *h)
{
	note("cleanup", h, NULL);
	((void (*)(void *))real("curl_easy_cleanup"))(h);
}

API int curl_easy_perform(void *h)
{
	note("perform", h, NULL);
	return ((int (*)(void *))real("curl_easy_perform"))(h);
}

API const char *curl_easy_strerror(int code)
{
	return ((const char *(*)(int))real("curl_easy_strerror"))(code);
}

API void *curl_slist_append(void *list, const char *s)
{
	return ((void *(*)(void *, const char *))real("curl_slist_append"))(list, s);
}

API void curl_slist_free_all(void *list)
{
	((void (*)(void *))real("curl_slist_free_all"))(list);
}

/* libfst asks for a long or a pointer's worth (CURLINFO_RESPONSE_CODE,
 * CURLINFO_EFFECTIVE_URL): one pointer argument, passed on */
API int curl_easy_getinfo(void *h, int info, ...)
{
	va_list ap;
	va_start(ap, info);
	void *p = va_arg(ap, void *);
	va_end(ap);
	return ((int (*)(void *, int, ...))real("curl_easy_getinfo"))(h, info, p);
}

/* libfst's values are longs and pointers, both one 64-bit argument where
 * this double is built (LP64): taken as a pointer's worth and passed on */
API int curl_easy_setopt(void *h, int option, ...)
{
	va_list ap;
	va_start(ap, option);
	void *v = va_arg(ap, void *);
	va_end(ap);
	bool no_masks = asked("CURL_DOUBLE_NO_MASKS");
	if (((option == PROTOCOLS_STR || option == REDIR_PROTOCOLS_STR) &&
	     (no_masks || asked("CURL_DOUBLE_OLD"))) ||
	    ((option == PROTOCOLS || option == REDIR_PROTOCOLS) && no_masks))
		return UNKNOWN_OPTION;
	if (option == URL || option == CAINFO)
		note(option == URL ? "url" : "cainfo", h, v ? (const char *)v : "-");
	return ((int (*)(void *, int, ...))real("curl_easy_setopt"))(h, option, v);
}
