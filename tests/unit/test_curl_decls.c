/* Description: src/net/curl_decls.h, libfst's own declarations of libcurl,
 * checked against the real <curl/curl.h> (libcurl4-openssl-dev): every
 * FSTI_CURLOPT_*, FSTI_CURLINFO_*, FSTI_CURLE_* and flag equals the real
 * number of the same name; struct fsti_curl_slist has curl_slist's layout;
 * every function pointer of struct fsti_curl has the real function's type
 * (with the real enums for CURLcode, CURLoption and CURLINFO, which our
 * header writes as int, of the same size). All static assertions: a
 * mismatch fails the build. At run time, libcurl.so.4 has every symbol of
 * the table, as net/curl.c resolves them (opened, not linked). */
/* the bit-mask protocol options libfst falls back to on a libcurl older
 * than 7.85 are deprecated in newer headers, not removed: their numbers are
 * checked as the others are */
#define CURL_DISABLE_DEPRECATION
#include <curl/curl.h>

/* Ours, with the real types where ours are int or our own struct. */
#define FSTI_CURLCODE CURLcode
#define FSTI_CURLOPTION CURLoption
#define FSTI_CURLINFO CURLINFO
#define FSTI_CURL_SLIST struct curl_slist
#include "../../src/net/curl_decls.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <stdio.h>

#define SAME_TYPE(a, b) __builtin_types_compatible_p(a, b)
#define MEMBER(m) __typeof__(((struct fsti_curl *)0)->m)

#define CHECK_NUMBER(name, value)                                                    \
	_Static_assert((long)(name) == (long)(value) && FSTI_##name == (long)(name), \
		       #name " is not " #value);
FSTI_CURL_OPTIONS(CHECK_NUMBER)
FSTI_CURL_INFOS(CHECK_NUMBER)
FSTI_CURL_CODES(CHECK_NUMBER)
FSTI_CURL_FLAGS(CHECK_NUMBER)

_Static_assert(sizeof(CURLcode) == sizeof(int) && sizeof(CURLoption) == sizeof(int) &&
		       sizeof(CURLINFO) == sizeof(int),
	       "the enums we write as int have int's size");
_Static_assert(sizeof(curl_off_t) == sizeof(fsti_curl_off_t), "curl_off_t is 64 bits");
_Static_assert(SAME_TYPE(CURL, fsti_curl_handle), "CURL is void");
_Static_assert(sizeof(struct curl_slist) == sizeof(struct fsti_curl_slist) &&
		       offsetof(struct curl_slist, data) == offsetof(struct fsti_curl_slist, data) &&
		       offsetof(struct curl_slist, next) == offsetof(struct fsti_curl_slist, next),
	       "struct curl_slist");
_Static_assert(SAME_TYPE(curl_write_callback, __typeof__(size_t (*)(char *, size_t, size_t, void *))) &&
		       SAME_TYPE(fsti_curl_write_fn, curl_write_callback),
	       "CURLOPT_WRITEFUNCTION's type");
_Static_assert(SAME_TYPE(fsti_curl_xferinfo_fn, curl_xferinfo_callback),
	       "CURLOPT_XFERINFOFUNCTION's type");

#define CHECK_FN(f) _Static_assert(SAME_TYPE(MEMBER(f), __typeof__(&f)), #f "'s type");
CHECK_FN(curl_global_init)
CHECK_FN(curl_version)
CHECK_FN(curl_easy_init)
CHECK_FN(curl_easy_cleanup)
CHECK_FN(curl_easy_setopt)
CHECK_FN(curl_easy_perform)
CHECK_FN(curl_easy_getinfo)
CHECK_FN(curl_easy_strerror)
CHECK_FN(curl_slist_append)
CHECK_FN(curl_slist_free_all)

static void test_library_has_the_table(void **state)
{
	(void)state;
	static const char *const names[] = {
		"curl_global_init",  "curl_version",       "curl_easy_init",    "curl_easy_cleanup",
		"curl_easy_setopt",  "curl_easy_perform",  "curl_easy_getinfo", "curl_easy_strerror",
		"curl_slist_append", "curl_slist_free_all",
	};
	void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		skip();
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (!dlsym(h, names[i]))
			fail_msg("libcurl.so.4 lacks %s", names[i]);
	/* kept open, as libfst keeps it: what its constructors allocated stays
	 * reachable (LeakSanitizer) */
	printf("our declarations match <curl/curl.h> " LIBCURL_VERSION "\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_library_has_the_table)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
