/* util.c - helpers shared by the subcommands. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int cli_exit_code(int status)
{
	switch (status) {
	case FST_OK: return EXIT_OK;
	case FST_EUSAGE: return EXIT_USAGE;
	case FST_EFORMAT: return EXIT_INVALID;
	case FST_EMISMATCH: return EXIT_MISMATCH;
	case FST_EIO: return EXIT_IO;
	case FST_ENOMEM: return EXIT_NOMEM;
	case FST_EDEVICE: return EXIT_DEVICE;
	case FST_EUNSUPPORTED: return EXIT_UNSUPPORTED;
	case FST_ECHANGED: return EXIT_CHANGED;
	case FST_ECANCELED: return EXIT_CANCELED;
	default: return EXIT_IO;
	}
}

bool cli_parse_uint(const char *s, uint64_t max, uint64_t *out)
{
	if (!s || !*s || *s == '-' || *s == '+')
		return false;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		return false;
	*out = v;
	return true;
}

bool cli_parse_size(const char *s, uint64_t *out)
{
	if (!s || !*s || *s == '-')
		return false;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !(v >= 0))
		return false;
	static const struct {
		const char *unit;
		double mult;
	} units[] = {
		{"", 1},        {"B", 1},       {"K", 0x1p10},  {"KiB", 0x1p10}, {"KB", 1e3},
		{"M", 0x1p20},  {"MiB", 0x1p20}, {"MB", 1e6},   {"G", 0x1p30},  {"GiB", 0x1p30},
		{"GB", 1e9},    {"T", 0x1p40},  {"TiB", 0x1p40}, {"TB", 1e12},
	};
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
		if (strcasecmp(end, units[i].unit) || (strlen(end) > 1 && strcmp(end, units[i].unit)))
			continue;
		double bytes = v * units[i].mult;
		if (bytes >= 0x1p63 || bytes != floor(bytes))
			return false;
		*out = (uint64_t)bytes;
		return true;
	}
	return false;
}

const char *cli_human_bytes(char *buf, size_t size, uint64_t bytes)
{
	static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)bytes;
	int u = 0;
	while (v >= 1024 && u < 5) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, size, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, size, "%.2f %s", v, units[u]);
	return buf;
}

double cli_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "fst %s: ", cmd);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}
