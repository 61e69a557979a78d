/*
 * fault.c - deterministic fault injection for tests (FST_FAULT).
 *
 * Spec: "SITE:N[:ERRNO][,SITE:N...]" fails the N-th call at SITE (1-based);
 * "SITE:N+" fails the N-th and every later call. ERRNO is a number or a name
 * such as ENOSPC (default EIO). Sites are listed in fault_sites below and in
 * docs/testing.md. When nothing is armed the cost is one atomic load.
 */
#include "base.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const fault_sites[] = {
	"open", "read", "short_read", "uring_submit", "uring_complete", "mmap", "alloc",
	"host_alloc", "pin", "device_alloc", "h2d", "event", "cufile_register", "cufile_read",
	"nccl", "prefetch", "presence", "thread",
};
#define NSITES (sizeof fault_sites / sizeof fault_sites[0])

struct rule {
	long nth;
	bool persistent;
	int errnum;
	long calls;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct rule rules[NSITES];
/* What was injected since the rules were set (under lock): an error
 * message can then say that its failure was a test's, and where. */
static long injected, last_call;
static int last_site;
static atomic_int armed;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static int site_index(const char *name, size_t len)
{
	for (size_t i = 0; i < NSITES; i++)
		if (strlen(fault_sites[i]) == len && !strncmp(fault_sites[i], name, len))
			return (int)i;
	return -1;
}

static int parse_errno(const char *s)
{
	static const struct { const char *name; int value; } names[] = {
		{"EIO", EIO}, {"ENOMEM", ENOMEM}, {"ENOSPC", ENOSPC}, {"EINTR", EINTR},
		{"EAGAIN", EAGAIN}, {"EACCES", EACCES}, {"ENOENT", ENOENT}, {"EINVAL", EINVAL},
		{"EBADF", EBADF}, {"EFAULT", EFAULT}, {"ENODEV", ENODEV}, {"EOPNOTSUPP", EOPNOTSUPP},
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (!strcmp(s, names[i].name))
			return names[i].value;
	char *end;
	long v = strtol(s, &end, 10);
	return (*s && !*end && v > 0 && v < 4096) ? (int)v : -1;
}

int fst_fault_set(const char *spec, fst_error *err)
{
	struct rule fresh[NSITES];
	memset(fresh, 0, sizeof fresh);
	int any = 0;
	char buf[512];
	if (spec && strlen(spec) >= sizeof buf)
		return fsti_err(err, FST_EUSAGE, "FST_FAULT: spec too long");
	snprintf(buf, sizeof buf, "%s", spec ? spec : "");
	for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
	     item = strtok_r(NULL, ",", &save)) {
		char *c1 = strchr(item, ':');
		if (!c1)
			return fsti_err(err, FST_EUSAGE,
					"FST_FAULT: \"%s\" is not SITE:N[:ERRNO]", item);
		int site = site_index(item, (size_t)(c1 - item));
		if (site < 0) {
			*c1 = '\0';
			char list[400] = "";
			for (size_t i = 0; i < NSITES; i++) {
				strcat(list, i ? ", " : "");
				strcat(list, fault_sites[i]);
			}
			return fsti_err(err, FST_EUSAGE,
					"FST_FAULT: unknown fault site \"%s\" (sites: %s)", item,
					list);
		}
		char *c2 = strchr(c1 + 1, ':');
		if (c2)
			*c2 = '\0';
		char *end;
		long nth = strtol(c1 + 1, &end, 10);
		bool persistent = false;
		if (*end == '+') {
			persistent = true;
			end++;
		}
		if (end == c1 + 1 || *end || nth < 1)
			return fsti_err(err, FST_EUSAGE,
					"FST_FAULT: call number \"%s\" must be a positive integer",
					c1 + 1);
		int errnum = EIO;
		if (c2 && (errnum = parse_errno(c2 + 1)) < 0)
			return fsti_err(err, FST_EUSAGE, "FST_FAULT: unknown errno \"%s\"",
					c2 + 1);
		fresh[site] = (struct rule){nth, persistent, errnum, 0};
		any = 1;
	}
	pthread_mutex_lock(&lock);
	memcpy(rules, fresh, sizeof rules);
	injected = last_call = 0;
	last_site = 0;
	atomic_store(&armed, any);
	pthread_mutex_unlock(&lock);
	return 0;
}

long fst_fault_last(char *buf, size_t size)
{
	pthread_mutex_lock(&lock);
	long n = injected, call = last_call;
	int site = last_site;
	pthread_mutex_unlock(&lock);
	if (buf && size) {
		if (n)
			snprintf(buf, size, "site %s, call %ld", fault_sites[site], call);
		else
			buf[0] = '\0';
	}
	return n;
}

static void read_env(void)
{
	const char *spec = fsti_env(FSTI_ENV_FAULT);
	fst_error e;
	if (spec && fst_fault_set(spec, &e))
		fsti_log(FST_LOG_ERROR, "%s; fault injection disabled", e.message);
}

int fsti_fault(const char *site)
{
	pthread_once(&env_once, read_env);
	if (!atomic_load_explicit(&armed, memory_order_relaxed))
		return 0;
	int i = site_index(site, strlen(site));
	if (i < 0)
		return 0;
	int fail = 0;
	pthread_mutex_lock(&lock);
	struct rule *r = &rules[i];
	if (r->nth) {
		r->calls++;
		if (r->calls == r->nth || (r->persistent && r->calls > r->nth)) {
			fail = r->errnum;
			injected++;
			last_site = i;
			last_call = r->calls;
		}
	}
	pthread_mutex_unlock(&lock);
	if (fail)
		fsti_log(FST_LOG_DEBUG, "injected fault at site %s", site);
	return fail;
}
