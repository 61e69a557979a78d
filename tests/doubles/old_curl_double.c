/*
 * old_curl_double.c - libcurl as one older than 7.85 is (Ubuntu 22.04's
 * 7.81): the real libcurl.so.4 behind every function libfst opens, except
 * that curl_easy_setopt answers CURLOPT_PROTOCOLS_STR and
 * CURLOPT_REDIR_PROTOCOLS_STR, which 7.85 brought, with
 * CURLE_UNKNOWN_OPTION. With OLD_CURL_DOUBLE_NO_MASKS=1 it refuses their
 * bit-mask forms too (a libcurl that has neither), read at each call.
 * Selected with FST_CURL_LIBRARY; never used otherwise.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

/* libcurl's numbers (include/curl/curl.h); src/net/curl_decls.h is
 * checked against them */
enum { PROTOCOLS = 181, REDIR_PROTOCOLS = 182, PROTOCOLS_STR = 10318,
       REDIR_PROTOCOLS_STR = 10319, UNKNOWN_OPTION = 48 };

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
	return ((void *(*)(void))real("curl_easy_init"))();
}

API void curl_easy_cleanup(void *h)
{
	((void (*)(void *))real("curl_easy_cleanup"))(h);
}

API int curl_easy_perform(void *h)
{
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
	const char *no_masks = getenv("OLD_CURL_DOUBLE_NO_MASKS");
	if (option == PROTOCOLS_STR || option == REDIR_PROTOCOLS_STR ||
	    ((option == PROTOCOLS || option == REDIR_PROTOCOLS) && no_masks &&
	     !strcmp(no_masks, "1")))
		return UNKNOWN_OPTION;
	return ((int (*)(void *, int, ...))real("curl_easy_setopt"))(h, option, v);
}
