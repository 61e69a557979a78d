/*
 * curl_decls.h - our own declarations of the few libcurl types, numbers and
 * functions libfst uses. libcurl is opened at run time (net/curl.c), so the
 * library and the wheel build without <curl/curl.h> and never link it.
 * Kept free of every other header of ours so that tests/unit/test_curl_decls.c
 * can compile it beside the real <curl/curl.h> and check every number and
 * every function type. The numbers are libcurl's stable ABI: options and
 * codes are never renumbered.
 */
#ifndef FST_CURL_DECLS_H
#define FST_CURL_DECLS_H

#include <stddef.h>
#include <stdint.h>

/* Each list entry is (real name, value); FSTI_<real name> is ours. */
#define FSTI_CURL_OPTIONS(X)                                                   \
	X(CURLOPT_WRITEDATA, 10001) X(CURLOPT_URL, 10002) X(CURLOPT_RANGE, 10007)   \
	X(CURLOPT_ERRORBUFFER, 10010) X(CURLOPT_WRITEFUNCTION, 20011)               \
	X(CURLOPT_USERAGENT, 10018) X(CURLOPT_LOW_SPEED_LIMIT, 19)                  \
	X(CURLOPT_LOW_SPEED_TIME, 20) X(CURLOPT_HTTPHEADER, 10023)                  \
	X(CURLOPT_HEADERDATA, 10029) X(CURLOPT_NOPROGRESS, 43)                      \
	X(CURLOPT_FOLLOWLOCATION, 52) X(CURLOPT_XFERINFODATA, 10057)                \
	X(CURLOPT_CAINFO, 10065) X(CURLOPT_MAXREDIRS, 68)                           \
	X(CURLOPT_HEADERFUNCTION, 20079) X(CURLOPT_HTTPGET, 80)                     \
	X(CURLOPT_BUFFERSIZE, 98) X(CURLOPT_NOSIGNAL, 99)                           \
	X(CURLOPT_CONNECTTIMEOUT_MS, 156) X(CURLOPT_USERNAME, 10173)                \
	X(CURLOPT_PASSWORD, 10174) X(CURLOPT_TCP_KEEPALIVE, 213)                    \
	X(CURLOPT_XFERINFOFUNCTION, 20219) X(CURLOPT_AWS_SIGV4, 10305)              \
	X(CURLOPT_PROTOCOLS_STR, 10318) X(CURLOPT_REDIR_PROTOCOLS_STR, 10319)       \
	X(CURLOPT_PATH_AS_IS, 234) X(CURLOPT_PROTOCOLS, 181)                        \
	X(CURLOPT_REDIR_PROTOCOLS, 182) X(CURLOPT_TIMEOUT_MS, 155)

#define FSTI_CURL_INFOS(X) X(CURLINFO_RESPONSE_CODE, 0x200002) X(CURLINFO_EFFECTIVE_URL, 0x100001)

#define FSTI_CURL_CODES(X)                                                            \
	X(CURLE_OK, 0) X(CURLE_UNSUPPORTED_PROTOCOL, 1) X(CURLE_URL_MALFORMAT, 3)         \
	X(CURLE_COULDNT_RESOLVE_HOST, 6) X(CURLE_COULDNT_CONNECT, 7)                      \
	X(CURLE_WEIRD_SERVER_REPLY, 8) X(CURLE_HTTP2, 16) X(CURLE_PARTIAL_FILE, 18)        \
	X(CURLE_WRITE_ERROR, 23) X(CURLE_OUT_OF_MEMORY, 27) X(CURLE_OPERATION_TIMEDOUT, 28) \
	X(CURLE_SSL_CONNECT_ERROR, 35)                                                    \
	X(CURLE_ABORTED_BY_CALLBACK, 42) X(CURLE_TOO_MANY_REDIRECTS, 47)                  \
	X(CURLE_UNKNOWN_OPTION, 48) X(CURLE_GOT_NOTHING, 52) X(CURLE_SEND_ERROR, 55)      \
	X(CURLE_RECV_ERROR, 56) X(CURLE_HTTP2_STREAM, 92)

#define FSTI_CURL_FLAGS(X)                                                        \
	X(CURL_GLOBAL_DEFAULT, 3) X(CURL_ERROR_SIZE, 256) X(CURLPROTO_HTTP, 1)        \
	X(CURLPROTO_HTTPS, 2)

#define FSTI_CURL_ENUM(name, value) FSTI_##name = value,
enum { FSTI_CURL_OPTIONS(FSTI_CURL_ENUM) FSTI_CURL_INFOS(FSTI_CURL_ENUM)
	       FSTI_CURL_CODES(FSTI_CURL_ENUM) FSTI_CURL_FLAGS(FSTI_CURL_ENUM) };
#undef FSTI_CURL_ENUM

/* CURLcode, CURLoption and CURLINFO are enums of int's size; ours are int.
 * The check compiles this header with them defined as the real enums, so it
 * can compare each function's whole type with the real prototype. */
#ifndef FSTI_CURLCODE
#define FSTI_CURLCODE int
#endif
#ifndef FSTI_CURLOPTION
#define FSTI_CURLOPTION int
#endif
#ifndef FSTI_CURLINFO
#define FSTI_CURLINFO int
#endif

/* struct curl_slist: a header list; the check compares the layout. */
struct fsti_curl_slist {
	char *data;
	struct fsti_curl_slist *next;
};
#ifndef FSTI_CURL_SLIST
#define FSTI_CURL_SLIST struct fsti_curl_slist
#endif

typedef void fsti_curl_handle;   /* CURL */
typedef int64_t fsti_curl_off_t; /* curl_off_t: 64 bits on every 64-bit Linux */

/* CURLOPT_WRITEFUNCTION and CURLOPT_HEADERFUNCTION: return less than
 * size * nmemb to abort the transfer. */
typedef size_t (*fsti_curl_write_fn)(char *ptr, size_t size, size_t nmemb, void *ctx);
/* CURLOPT_XFERINFOFUNCTION: nonzero aborts (CURLE_ABORTED_BY_CALLBACK). */
typedef int (*fsti_curl_xferinfo_fn)(void *ctx, fsti_curl_off_t dltotal, fsti_curl_off_t dlnow,
				     fsti_curl_off_t ultotal, fsti_curl_off_t ulnow);

/* The table net/curl.c fills, each field spelled as its symbol. */
struct fsti_curl {
	FSTI_CURLCODE (*curl_global_init)(long flags);
	char *(*curl_version)(void);
	fsti_curl_handle *(*curl_easy_init)(void);
	void (*curl_easy_cleanup)(fsti_curl_handle *h);
	FSTI_CURLCODE (*curl_easy_setopt)(fsti_curl_handle *h, FSTI_CURLOPTION option, ...);
	FSTI_CURLCODE (*curl_easy_perform)(fsti_curl_handle *h);
	FSTI_CURLCODE (*curl_easy_getinfo)(fsti_curl_handle *h, FSTI_CURLINFO info, ...);
	const char *(*curl_easy_strerror)(FSTI_CURLCODE code);
	FSTI_CURL_SLIST *(*curl_slist_append)(FSTI_CURL_SLIST *list, const char *s);
	void (*curl_slist_free_all)(FSTI_CURL_SLIST *list);
	void *lib;      /* the dlopen handle */
	char path[256]; /* the library opened, for messages */
};

#endif
