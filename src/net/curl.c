/*
 * curl.c - libcurl.so.4, opened with dlopen the first time a URL is met;
 * FST_CURL_LIBRARY names another file (the tests name a missing one). So
 * libfst loads, and reads local files, where libcurl is absent, and the
 * wheel never links it.
 */
#include "dl.h"
#include "net.h"


static struct fsti_curl table;
static struct fsti_dl_once loaded = FSTI_DL_ONCE_INIT;

#define SYM(f) FSTI_DL_SYM(struct fsti_curl, f)
static const struct fsti_dl_sym syms[] = {
	SYM(curl_global_init),  SYM(curl_version),      SYM(curl_easy_init),
	SYM(curl_easy_cleanup), SYM(curl_easy_setopt),  SYM(curl_easy_perform),
	SYM(curl_easy_getinfo), SYM(curl_easy_strerror), SYM(curl_slist_append),
	SYM(curl_slist_free_all),
};
#undef SYM

static void load(void)
{
	const struct fsti_dl_lib lib = {"libcurl (needed for URLs)", fsti_env(FSTI_ENV_CURL_LIBRARY),
					"libcurl.so.4", FST_EUNSUPPORTED};
	loaded.status = fsti_dl_load(&lib, syms, sizeof syms / sizeof syms[0], &table, &table.lib,
				    table.path, sizeof table.path, &loaded.error);
	if (loaded.status)
		return;
	/* Not thread safe before libcurl 7.84: hence here, once. */
	int rc = table.curl_global_init(FSTI_CURL_GLOBAL_DEFAULT);
	if (rc)
		loaded.status = fsti_err(&loaded.error, FST_EUNSUPPORTED,
				        "libcurl %s: curl_global_init failed: %s", table.path,
				        table.curl_easy_strerror(rc));
}

int fsti_curl_get(const struct fsti_curl **out, fst_error *err)
{
	int rc = fsti_dl_once(&loaded, load, err);
	*out = rc ? NULL : &table;
	return rc;
}
