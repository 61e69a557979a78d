/* helpers.c - temporary files, raw safetensors images and small checks for unit tests. */
#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[512];

static CMFixtureFunction group_teardown;
static int group_teardown_rc;

static int kept_teardown(void **state)
{
	group_teardown_rc = group_teardown(state);
	return group_teardown_rc;
}

int test_run_group(const char *name, const struct CMUnitTest *tests, size_t n,
		   CMFixtureFunction setup, CMFixtureFunction teardown)
{
	group_teardown = teardown;
	group_teardown_rc = 0;
	int rc = _cmocka_run_group_tests(name, tests, n, setup, teardown ? kept_teardown : NULL);
	if (!rc && group_teardown_rc)
		fprintf(stderr, "%s: the group's teardown failed\n", name);
	return rc ? rc : group_teardown_rc ? 1 : 0;
}

static void remove_tmpdir(void)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	if (system(cmd)) {
		/* best effort */
	}
}

const char *test_tmpdir(void)
{
	if (!tmpdir[0]) {
		const char *base = getenv("FST_TEST_TMP");
		if (!base)
			base = "/tmp";
		char mk[600];
		snprintf(mk, sizeof mk, "mkdir -p '%s'", base);
		if (system(mk)) {
			/* mkdtemp below reports the failure */
		}
		snprintf(tmpdir, sizeof tmpdir, "%s/fst-unit-XXXXXX", base);
		if (!mkdtemp(tmpdir)) {
			perror("mkdtemp");
			exit(1);
		}
		atexit(remove_tmpdir);
	}
	return tmpdir;
}

char *test_path(const char *name)
{
	static char bufs[8][700];
	static int next;
	char *b = bufs[next++ % 8];
	snprintf(b, sizeof bufs[0], "%s/%s", test_tmpdir(), name);
	return b;
}

void write_raw(const char *path, const char *header, size_t hlen, const void *data, size_t dlen)
{
	FILE *f = fopen(path, "wb");
	if (!f) {
		perror(path);
		exit(1);
	}
	unsigned char len[8];
	for (int i = 0; i < 8; i++)
		len[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
	fwrite(len, 1, 8, f);
	fwrite(header, 1, hlen, f);
	if (dlen)
		fwrite(data, 1, dlen, f);
	fclose(f);
}

int open_raw(const char *header, const void *data, size_t dlen, fst_error *err)
{
	size_t hlen = strlen(header);
	unsigned char *buf = malloc(8 + hlen + dlen);
	for (int i = 0; i < 8; i++)
		buf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
	memcpy(buf + 8, header, hlen);
	if (dlen)
		memcpy(buf + 8 + hlen, data, dlen);
	fst_file *f = NULL;
	int rc = fst_file_open_memory(buf, 8 + hlen + dlen, "t.safetensors", &f, err);
	fst_file_close(f);
	free(buf);
	return rc;
}

void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

void assert_has(const char *msg, const char *sub)
{
	if (!strstr(msg, sub))
		fail_msg("message \"%s\" lacks \"%s\"", msg, sub);
}

double test_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
