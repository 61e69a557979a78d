/* Description: the CPU's cache sizes as sysfs lists them (base/cpu.c), on
 * folders laid out like a CPU's .../cache: the level asked for, data and
 * unified caches but not instruction ones, the largest of a level, entries
 * after a gap, sizes in K, M, G and bytes, and 0 (unknown) for a missing
 * folder, a missing or malformed size and a size past 64 bits. */
#include "base.h"
#include "helpers.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* One cache entry, dir/indexN/{level,type,size}; a NULL field is left out. */
static void entry(const char *dir, int n, const char *level, const char *type, const char *size)
{
	char path[512];
	snprintf(path, sizeof path, "%s/index%d", dir, n);
	mkdir(path, 0700);
	const char *names[] = {"level", "type", "size"};
	const char *texts[] = {level, type, size};
	for (int i = 0; i < 3; i++) {
		if (!texts[i])
			continue;
		char file[600], line[64];
		snprintf(file, sizeof file, "%s/%s", path, names[i]);
		snprintf(line, sizeof line, "%s\n", texts[i]);
		write_text(file, line);
	}
}

/* A fresh folder under the test's temporary one. */
static const char *folder(const char *name)
{
	const char *dir = test_path(name);
	assert_int_equal(mkdir(dir, 0700), 0);
	return dir;
}

static void test_levels(void **state)
{
	(void)state;
	/* what a Xeon with a 105 MiB L3 lists */
	const char *dir = folder("xeon");
	entry(dir, 0, "1", "Data", "48K");
	entry(dir, 1, "1", "Instruction", "64K");
	entry(dir, 2, "2", "Unified", "2048K");
	entry(dir, 3, "3", "Unified", "107520K");
	assert_int_equal(fsti_cache_bytes_in(dir, 3), 105ull << 20);
	assert_int_equal(fsti_cache_bytes_in(dir, 2), 2ull << 20);
	/* the instruction cache is larger, but holds no data */
	assert_int_equal(fsti_cache_bytes_in(dir, 1), 48ull << 10);
	assert_int_equal(fsti_cache_bytes_in(dir, 4), 0);
}

static void test_largest_and_gaps(void **state)
{
	(void)state;
	const char *dir = folder("gaps");
	entry(dir, 0, "3", "Unified", "32M");
	entry(dir, 5, "3", "Unified", "1G"); /* index1-4 missing */
	entry(dir, 6, "3", NULL, "4096");    /* no type: counted */
	assert_int_equal(fsti_cache_bytes_in(dir, 3), 1ull << 30);
	const char *bytes = folder("bytes");
	entry(bytes, 0, "3", "Unified", "4096");
	assert_int_equal(fsti_cache_bytes_in(bytes, 3), 4096);
}

static void test_unknown(void **state)
{
	(void)state;
	assert_int_equal(fsti_cache_bytes_in(test_path("no-such-folder"), 3), 0);
	static const char *bad[] = {"", "K", "12X", "12KB", "-4K", " 4K", "99999999999999999999",
				    "17179869184G"};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		char name[32];
		snprintf(name, sizeof name, "bad%zu", i);
		const char *dir = folder(name);
		entry(dir, 0, "3", "Unified", bad[i]);
		if (fsti_cache_bytes_in(dir, 3))
			fail_msg("size \"%s\" read as %llu bytes", bad[i],
				 (unsigned long long)fsti_cache_bytes_in(dir, 3));
	}
	/* no size file, or no level file */
	const char *dir = folder("nosize");
	entry(dir, 0, "3", "Unified", NULL);
	entry(dir, 1, NULL, "Unified", "8M");
	assert_int_equal(fsti_cache_bytes_in(dir, 3), 0);
}

/* This machine's own: what its sysfs folder says, or 0 where it has none. */
static void test_this_machine(void **state)
{
	(void)state;
	const char *dir = "/sys/devices/system/cpu/cpu0/cache";
	assert_int_equal(fsti_l3_cache_bytes(), fsti_cache_bytes_in(dir, 3));
	if (access(dir, R_OK))
		assert_int_equal(fsti_l3_cache_bytes(), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_levels),
		cmocka_unit_test(test_largest_and_gaps),
		cmocka_unit_test(test_unknown),
		cmocka_unit_test(test_this_machine),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
