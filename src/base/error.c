/* error.c - status strings and filling fst_error. */
#include "base.h"

#include <stdio.h>
#include <string.h>

const char *fst_strerror(int code)
{
	switch (code) {
	case FST_OK: return "success";
	case FST_EUSAGE: return "invalid argument";
	case FST_EFORMAT: return "invalid safetensors input";
	case FST_EIO: return "I/O error";
	case FST_ENOMEM: return "out of memory";
	case FST_EDEVICE: return "GPU error";
	case FST_EUNSUPPORTED: return "not supported on this platform";
	case FST_ECANCELED: return "cancelled";
	case FST_EMISMATCH: return "loaded bytes differ from the file";
	case FST_ECHANGED: return "file changed during the load";
	default: return "unknown error";
	}
}

void fsti_err_clear(fst_error *err)
{
	if (!err)
		return;
	err->code = 0;
	err->sys_errno = 0;
	err->backend_code = 0;
	err->message[0] = '\0';
}

static void fill(fst_error *err, int code, const char *fmt, va_list ap) FSTI_PRINTF(3, 0);
static void fill(fst_error *err, int code, const char *fmt, va_list ap)
{
	err->code = code;
	err->sys_errno = 0;
	err->backend_code = 0;
	vsnprintf(err->message, sizeof err->message, fmt, ap);
}

int fsti_err(fst_error *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		fill(err, code, fmt, ap);
		va_end(ap);
	}
	fsti_log(FST_LOG_DEBUG, "error %d: %s", code, err ? err->message : fmt);
	return code;
}

int fsti_err_sys(fst_error *err, int code, int errnum, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		fill(err, code, fmt, ap);
		va_end(ap);
		err->sys_errno = errnum;
		size_t n = strlen(err->message);
		snprintf(err->message + n, sizeof err->message - n, ": %s", strerror(errnum));
	}
	return code;
}

int fsti_err_backend(fst_error *err, int code, int backend_code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		fill(err, code, fmt, ap);
		va_end(ap);
		err->backend_code = backend_code;
	}
	return code;
}

const char *fst_version(void)
{
#define FSTI_STR2(x) #x
#define FSTI_STR(x) FSTI_STR2(x)
	return FSTI_STR(FST_VERSION_MAJOR) "." FSTI_STR(FST_VERSION_MINOR) "." FSTI_STR(
		FST_VERSION_PATCH);
}

unsigned fst_version_number(void)
{
	return FST_VERSION_NUMBER;
}
