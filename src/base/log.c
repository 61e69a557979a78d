/* log.c - leveled log lines to stderr or a caller's callback. */
#include "base.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static fst_log_fn log_fn;
static void *log_ctx;
static int log_level = -1; /* -1: not read from the environment yet */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void read_env(void)
{
	const char *v = fsti_env(FSTI_ENV_LOG);
	int level = FST_LOG_WARN;
	if (v) {
		if (!strcmp(v, "error")) level = FST_LOG_ERROR;
		else if (!strcmp(v, "warn")) level = FST_LOG_WARN;
		else if (!strcmp(v, "info")) level = FST_LOG_INFO;
		else if (!strcmp(v, "debug")) level = FST_LOG_DEBUG;
	}
	if (log_level < 0)
		log_level = level;
}

void fst_log_set_callback(fst_log_fn fn, void *ctx)
{
	log_fn = fn;
	log_ctx = ctx;
}

void fst_log_set_level(int level)
{
	pthread_once(&env_once, read_env);
	log_level = level;
}

int fst_log_get_level(void)
{
	pthread_once(&env_once, read_env);
	return log_level;
}

bool fsti_log_enabled(int level)
{
	return level <= fst_log_get_level();
}

void fsti_text_hide(char *text, size_t size, char lead, const char *secret, size_t len,
		    char trail)
{
	if (!len || !size)
		return;
	for (char *p = text; *p;) {
		if (p == text || p[-1] != lead || strncmp(p, secret, len) ||
		    (trail && p[len] != trail)) {
			p++;
			continue;
		}
		/* "***" in its place, the rest after it, within size */
		size_t room = size - 1 - (size_t)(p - text);
		size_t rest = strlen(p + len);
		size_t star = FSTI_MIN((size_t)3, room);
		size_t keep = FSTI_MIN(rest, room - star);
		memmove(p + star, p + len, keep);
		memcpy(p, "***", star);
		p[star + keep] = '\0';
		p += star;
	}
}

/* The secrets of fsti_log_hide, for the process's life: a line can name a
 * URL long after it was opened. As many as the distinct URLs with secrets
 * the process was given. Plain malloc, not fsti_malloc: a URL's first open
 * allocates here and later ones do not, which the tests that fail each
 * allocation of an open in turn must not see. */
struct secret {
	char lead, trail;
	size_t len;
	char *text;
};
static struct secret *secrets;
static size_t nsecrets, secrets_cap;
static pthread_mutex_t secrets_lock = PTHREAD_MUTEX_INITIALIZER;

bool fsti_log_hide(char lead, const char *secret, size_t len, char trail)
{
	if (!len)
		return true;
	bool ok = true;
	pthread_mutex_lock(&secrets_lock);
	for (size_t i = 0; i < nsecrets; i++)
		if (secrets[i].lead == lead && secrets[i].trail == trail &&
		    secrets[i].len == len && !memcmp(secrets[i].text, secret, len))
			goto out;
	if (nsecrets == secrets_cap) {
		size_t cap = secrets_cap ? 2 * secrets_cap : 8;
		struct secret *grown = realloc(secrets, cap * sizeof *grown);
		if (!grown) {
			ok = false;
			goto out;
		}
		secrets = grown;
		secrets_cap = cap;
	}
	char *text = malloc(len + 1);
	if (!text) {
		ok = false;
		goto out;
	}
	memcpy(text, secret, len);
	text[len] = '\0';
	secrets[nsecrets++] = (struct secret){lead, trail, len, text};
out:
	pthread_mutex_unlock(&secrets_lock);
	return ok;
}

void fsti_log(int level, const char *fmt, ...)
{
	static const char *names[] = {"error", "warning", "info", "debug"};
	if (!fsti_log_enabled(level))
		return;
	char line[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&secrets_lock);
	for (size_t i = 0; i < nsecrets; i++)
		fsti_text_hide(line, sizeof line, secrets[i].lead, secrets[i].text, secrets[i].len,
			       secrets[i].trail);
	pthread_mutex_unlock(&secrets_lock);
	if (log_fn) {
		log_fn(log_ctx, level, line);
		return;
	}
	/* one line, whatever a tensor's or file's name holds: control
	 * characters as \xNN (a newline would forge another line, an escape
	 * sequence drive the terminal) */
	flockfile(stderr);
	fprintf(stderr, "fst: %s: ", names[level < 0 ? 0 : level > 3 ? 3 : level]);
	for (const unsigned char *p = (const unsigned char *)line; *p; p++) {
		if (*p < 0x20 || *p == 0x7f)
			fprintf(stderr, "\\x%02x", *p);
		else
			putc_unlocked(*p, stderr);
	}
	putc_unlocked('\n', stderr);
	funlockfile(stderr);
}

double fsti_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fsti_size_text(char *buf, size_t size, uint64_t bytes)
{
	if (bytes % (1u << 20))
		snprintf(buf, size, "%llu KiB", (unsigned long long)(bytes >> 10));
	else
		snprintf(buf, size, "%llu MiB", (unsigned long long)(bytes >> 20));
}
