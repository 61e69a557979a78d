/* Description: runs a fuzz target's LLVMFuzzerTestOneInput over every file
 * of the given directories (or the given files), without libFuzzer: the
 * checked-in corpus, regressions included, becomes an ordinary test built
 * by the normal compiler (and its sanitizers in the sanitize build). Exits
 * non-zero when a directory is unreadable or empty; a failing input aborts
 * inside the target, as under the fuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		return -1;
	}
	size_t cap = 4096, len = 0;
	uint8_t *buf = malloc(cap);
	size_t n;
	while (buf && (n = fread(buf + len, 1, cap - len, f)) > 0) {
		len += n;
		if (len == cap) {
			uint8_t *grown = realloc(buf, cap *= 2);
			if (!grown)
				free(buf);
			buf = grown;
		}
	}
	int bad = ferror(f) || !buf;
	fclose(f);
	if (bad) {
		fprintf(stderr, "%s: cannot read\n", path);
		free(buf);
		return -1;
	}
	/* An exact-size copy, so ASan catches reads one past the input as the
	 * fuzzer would. */
	uint8_t *exact = malloc(len ? len : 1);
	if (!exact) {
		free(buf);
		return -1;
	}
	if (len)
		memcpy(exact, buf, len);
	free(buf);
	LLVMFuzzerTestOneInput(exact, len);
	free(exact);
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of dir, in name order (a stable log). Returns the count
 * run, or -1. */
static long run_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		perror(dir);
		return -1;
	}
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			char **grown = realloc(names, cap * sizeof *names);
			if (!grown)
				abort();
			names = grown;
		}
		names[n] = strdup(e->d_name);
		if (!names[n])
			abort();
		n++;
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof *names, cmp_names);
	long count = 0;
	for (size_t i = 0; i < n; i++) {
		char path[4096];
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		struct stat st;
		if (!stat(path, &st) && S_ISREG(st.st_mode)) {
			printf("%s\n", path);
			fflush(stdout);
			if (run_file(path))
				count = -1;
			else if (count >= 0)
				count++;
		}
		free(names[i]);
	}
	free(names);
	return count;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s DIR|FILE...\n", argv[0]);
		return 2;
	}
	int status = 0;
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st)) {
			perror(argv[i]);
			status = 1;
		} else if (S_ISDIR(st.st_mode)) {
			long n = run_dir(argv[i]);
			if (n <= 0) {
				fprintf(stderr, "%s: %s\n", argv[i],
					n < 0 ? "could not run every input" : "no inputs");
				status = 1;
			} else {
				printf("%s: %ld inputs ran\n", argv[i], n);
			}
		} else if (run_file(argv[i])) {
			status = 1;
		}
	}
	return status;
}
