/*
 * ini.c - the little of INI that ~/.aws/credentials and ~/.aws/config use:
 * [section] lines, "key = value" lines, '#' and ';' comments. An indented
 * line continues the key above it (the config file's nested "s3 =" blocks),
 * and is skipped.
 */
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
		s[--n] = '\0';
	return s;
}

int fsti_ini_read(const char *path, const char *section, const char *const *keys,
		  char **values, size_t n, bool *found, fst_error *err)
{
	*found = false;
	for (size_t i = 0; i < n; i++)
		values[i] = NULL;
	FILE *fp = fopen(path, "re");
	if (!fp) {
		if (errno == ENOENT || errno == ENOTDIR)
			return 0;
		return fsti_err_sys(err, FST_EIO, errno, "%s: cannot open", path);
	}
	char line[4096];
	bool in = false;
	int rc = 0;
	while (!rc && fgets(line, sizeof line, fp)) {
		if (line[0] == ' ' || line[0] == '\t')
			continue;
		char *s = trim(line);
		if (!*s || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			char *end = strchr(s, ']');
			if (end)
				*end = '\0';
			in = !strcmp(trim(s + 1), section);
			*found = *found || in;
			continue;
		}
		char *eq = strchr(s, '=');
		if (!in || !eq)
			continue;
		*eq = '\0';
		const char *k = trim(s), *v = trim(eq + 1);
		for (size_t i = 0; i < n; i++) {
			if (strcmp(k, keys[i]))
				continue;
			fsti_free(values[i]);
			if (!(values[i] = fsti_strdup(v)))
				rc = fsti_err(err, FST_ENOMEM, "%s: out of memory", path);
		}
	}
	if (!rc && ferror(fp))
		rc = fsti_err_sys(err, FST_EIO, errno, "%s: cannot read", path);
	fclose(fp);
	if (rc)
		for (size_t i = 0; i < n; i++) {
			fsti_free(values[i]);
			values[i] = NULL;
		}
	return rc;
}
