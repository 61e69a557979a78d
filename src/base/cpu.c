/*
 * cpu.c - what the host says about itself in sysfs: the first line of one
 * of its small files, and the size of a level of the CPU's caches. A load
 * from the page cache onto a GPU sizes its staging by the last-level cache
 * (load/engine.c, io/io.h).
 *
 * Unreadable, missing or malformed entries give 0 ("unknown"), never an
 * error: the caller then keeps its default.
 */
#include "base.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Cache entries a CPU lists in sysfs: index0, index1, ... (a handful; the
 * bound only keeps a strange tree from being walked for long). */
#define MAX_CACHE_ENTRIES 32

bool fsti_read_first_line(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	bool ok = fgets(buf, (int)size, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = 0;
	return ok;
}

/* sysfs writes sizes as "266240K"; "105M", "1G" and a bare number of bytes
 * are read too. 0 for anything else. */
static uint64_t size_from_text(const char *s)
{
	if (!isdigit((unsigned char)*s))
		return 0;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno)
		return 0; /* past 64 bits */
	static const char units[] = "KMG"; /* 2^10, 2^20, 2^30 */
	const char *unit = *end ? strchr(units, *end) : NULL;
	int shift = unit ? 10 * (int)(unit - units + 1) : 0;
	if (unit)
		end++;
	if (*end || v > (UINT64_MAX >> shift))
		return 0;
	return (uint64_t)v << shift;
}

uint64_t fsti_cache_bytes_in(const char *dir, int level)
{
	uint64_t largest = 0;
	for (int i = 0; i < MAX_CACHE_ENTRIES; i++) {
		char path[512], text[64];
		snprintf(path, sizeof path, "%s/index%d/level", dir, i);
		if (!fsti_read_first_line(path, text, sizeof text) || atoi(text) != level)
			continue;
		/* an instruction cache holds no data we copy */
		snprintf(path, sizeof path, "%s/index%d/type", dir, i);
		if (fsti_read_first_line(path, text, sizeof text) && !strcmp(text, "Instruction"))
			continue;
		snprintf(path, sizeof path, "%s/index%d/size", dir, i);
		if (fsti_read_first_line(path, text, sizeof text))
			largest = FSTI_MAX(largest, size_from_text(text));
	}
	return largest;
}

uint64_t fsti_l3_cache_bytes(void)
{
	return fsti_cache_bytes_in("/sys/devices/system/cpu/cpu0/cache", 3);
}
