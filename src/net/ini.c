/*
 * ini.c - the little of INI that ~/.aws/credentials and ~/.aws/config use,
 * read as botocore's configparser reads them: [section] lines, "key = value"
 * and "key: value" lines (split at whichever comes first), key names in any
 * case, '#' and ';' comments. An indented line continues the key above it
 * (the config file's nested "s3 =" blocks), and is skipped. Lines have no
 * length limit: a session token from STS has none either.
 *
 * A wanted section "profile NAME" is named as botocore finds profiles in
 * the config file: the words "profile" and NAME with any blanks between
 * (it splits the header as a shell would), and for "profile default" a
 * plain [default] too. When several sections name the wanted one, the last
 * is read alone, as botocore's profile map keeps the last.
 */
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static bool blank(char ch)
{
	return ch == ' ' || ch == '\t';
}

static char *trim(char *s)
{
	while (blank(*s))
		s++;
	size_t n = strlen(s);
	while (n && (blank(s[n - 1]) || s[n - 1] == '\r' || s[n - 1] == '\n'))
		s[--n] = '\0';
	return s;
}

/* Whether a header (trimmed) names section. */
static bool section_is(const char *header, const char *section)
{
	if (!strcmp(header, section))
		return true;
	if (strncmp(section, "profile ", 8))
		return false;
	const char *name = section + 8;
	if (!strcmp(name, "default") && !strcmp(header, "default"))
		return true;
	if (strncmp(header, "profile", 7) || !blank(header[7]))
		return false;
	header += 7;
	while (blank(*header))
		header++;
	return !strcmp(header, name);
}

static void clear(char **values, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		fsti_free(values[i]);
		values[i] = NULL;
	}
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
	char *line = NULL; /* getline's: free(), not fsti_free() */
	size_t cap = 0;
	bool in = false;
	int rc = 0;
	while (!rc && getline(&line, &cap, fp) >= 0) {
		if (line[0] == ' ' || line[0] == '\t')
			continue;
		char *s = trim(line);
		if (!*s || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			/* configparser's header runs to the line's last ']'; a line
			 * without one is no header, and what follows it must not be
			 * taken for the section before it either */
			char *end = strrchr(s, ']');
			in = false;
			if (!end)
				continue;
			*end = '\0';
			in = section_is(trim(s + 1), section);
			if (in)
				clear(values, n);
			*found = *found || in;
			continue;
		}
		size_t at = strcspn(s, "=:");
		if (!in || !s[at])
			continue;
		s[at] = '\0';
		const char *k = trim(s), *v = trim(s + at + 1);
		for (size_t i = 0; i < n; i++) {
			if (strcasecmp(k, keys[i]))
				continue;
			fsti_free(values[i]);
			if (!(values[i] = fsti_strdup(v)))
				rc = fsti_err(err, FST_ENOMEM, "%s: out of memory", path);
		}
	}
	/* getline's -1 is the end, a read error, or no memory for the line */
	int e = errno;
	if (!rc && !feof(fp))
		rc = e == ENOMEM && !ferror(fp)
			     ? fsti_err(err, FST_ENOMEM, "%s: out of memory", path)
			     : fsti_err_sys(err, FST_EIO, e, "%s: cannot read", path);
	free(line);
	fclose(fp);
	if (rc)
		clear(values, n);
	return rc;
}
