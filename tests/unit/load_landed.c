/* load_landed.c - the recorder of on_landed calls (lh_landed, see
 * load_helpers.h): every rule of fst_load_opts.on_landed checked as pieces
 * arrive, from any reader thread. */
#include "load_helpers.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t lh_block_of(uint64_t landed_block)
{
	return landed_block ? landed_block : 256u << 10;
}

void lh_landed_init(lh_landed *l, const fst_checkpoint *ck, unsigned char *const *bytes,
		    const lh_filter *flt, uint64_t block, bool whole_blocks)
{
	memset(l, 0, sizeof *l);
	pthread_mutex_init(&l->lock, NULL);
	l->n = fst_checkpoint_tensor_count(ck);
	l->want = calloc(l->n + 1, sizeof *l->want);
	l->nbytes = calloc(l->n + 1, sizeof *l->nbytes);
	l->selected = calloc(l->n + 1, sizeof *l->selected);
	l->cov = calloc(l->n + 1, sizeof *l->cov);
	l->reported = calloc(l->n + 1, sizeof *l->reported);
	l->names = calloc(l->n + 1, sizeof *l->names);
	l->block = block;
	l->whole_blocks = whole_blocks;
	l->failed_tensor = SIZE_MAX;
	for (size_t i = 0; i < l->n; i++) {
		fst_tensor_info info;
		size_t file;
		assert_int_equal(fst_checkpoint_tensor(ck, i, &info, &file), 0);
		l->want[i] = bytes[file] + info.file_offset;
		l->nbytes[i] = info.nbytes;
		l->selected[i] = !flt || lh_keeps(flt, info.name);
		l->names[i] = strdup(info.name);
		if (l->selected[i])
			l->cov[i] = calloc(info.nbytes + 1, 1);
	}
}

void lh_landed_free(lh_landed *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->cov[i]);
		free(l->names[i]);
	}
	free(l->want);
	free(l->nbytes);
	free(l->selected);
	free(l->cov);
	free(l->reported);
	free(l->names);
	pthread_mutex_destroy(&l->lock);
	memset(l, 0, sizeof *l);
}

static void lh_landed_problem(lh_landed *l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void lh_landed_problem(lh_landed *l, const char *fmt, ...)
{
	if (l->problem[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->problem, sizeof l->problem, fmt, ap);
	va_end(ap);
}

int lh_on_landed(void *ctx, size_t tensor, uint64_t offset, const void *bytes, uint64_t len)
{
	lh_landed *l = ctx;
	pthread_mutex_lock(&l->lock);
	unsigned long k = ++l->calls;
	pthread_mutex_unlock(&l->lock);
	if (l->sleep_every && k % l->sleep_every == 0)
		usleep(200);
	pthread_mutex_lock(&l->lock);
	const uint64_t b = lh_block_of(l->block);
	if (tensor >= l->n || !l->selected[tensor]) {
		lh_landed_problem(l, "call %lu: tensor %zu %s", k, tensor,
				  tensor >= l->n ? "out of range" : "not selected");
	} else if (!len || !bytes) {
		lh_landed_problem(l, "call %lu: tensor %s: empty piece at byte %" PRIu64, k,
				  l->names[tensor], offset);
	} else if (offset > l->nbytes[tensor] || len > l->nbytes[tensor] - offset) {
		lh_landed_problem(l, "call %lu: tensor %s: [%" PRIu64 ", +%" PRIu64
				     ") past its %" PRIu64 " bytes",
				  k, l->names[tensor], offset, len, l->nbytes[tensor]);
	} else if (offset / b != (offset + len - 1) / b) {
		lh_landed_problem(l, "call %lu: tensor %s: [%" PRIu64 ", +%" PRIu64
				     ") crosses a multiple of the block %" PRIu64,
				  k, l->names[tensor], offset, len, b);
	} else if (l->whole_blocks &&
		   (offset % b || len != (l->nbytes[tensor] - offset < b
					     ? l->nbytes[tensor] - offset : b))) {
		lh_landed_problem(l, "call %lu: tensor %s: [%" PRIu64 ", +%" PRIu64
				     ") is not a whole block of %" PRIu64 " (%" PRIu64 " bytes)",
				  k, l->names[tensor], offset, len, b, l->nbytes[tensor]);
	} else {
		const unsigned char *got = bytes, *want = l->want[tensor] + offset;
		unsigned char *cov = l->cov[tensor] + offset;
		for (uint64_t i = 0; i < len; i++) {
			if (cov[i]++) {
				lh_landed_problem(l, "call %lu: tensor %s: byte %" PRIu64
						     " reported twice",
						  k, l->names[tensor], offset + i);
				break;
			}
			if (got[i] != want[i]) {
				lh_landed_problem(l, "call %lu: tensor %s: byte %" PRIu64
						     " reported as 0x%02x, the file has 0x%02x",
						  k, l->names[tensor], offset + i, got[i], want[i]);
				break;
			}
		}
		l->reported[tensor] += len;
	}
	int rc = 0;
	if (l->fail_at && k == l->fail_at) {
		l->failed_tensor = tensor;
		rc = l->fail_rc;
	}
	pthread_mutex_unlock(&l->lock);
	return rc;
}

bool lh_landed_complete(lh_landed *l, size_t i)
{
	pthread_mutex_lock(&l->lock);
	bool done = l->reported[i] == l->nbytes[i];
	pthread_mutex_unlock(&l->lock);
	return done;
}

void lh_landed_check(lh_landed *l, const char *ctx)
{
	if (l->problem[0])
		fail_msg("%s: on_landed: %s", ctx, l->problem);
	for (size_t i = 0; i < l->n; i++) {
		uint64_t want = l->selected[i] ? l->nbytes[i] : 0;
		if (l->reported[i] != want)
			fail_msg("%s: on_landed: tensor %s: %" PRIu64 " bytes reported, %" PRIu64
				 " expected",
				 ctx, l->names[i], l->reported[i], want);
		for (uint64_t k = 0; l->selected[i] && k < l->nbytes[i]; k++)
			if (l->cov[i][k] != 1)
				fail_msg("%s: on_landed: tensor %s: byte %" PRIu64
					 " reported %u times",
					 ctx, l->names[i], k, l->cov[i][k]);
	}
}

void lh_landed_check_failed(lh_landed *l, fst_load_opts *o, int rc, int want,
			    const fst_error *err, const fst_buffer *buf, const char *ctx)
{
	if (rc != want)
		fail_msg("%s: %d (%s), expected %d", ctx, rc, err->message, want);
	assert_int_equal(err->code, want);
	assert_null(buf);
	if (l->failed_tensor >= l->n)
		fail_msg("%s: the failing call was never made", ctx);
	char needle[96];
	snprintf(needle, sizeof needle, "tensor \"%s\"", l->names[l->failed_tensor]);
	assert_has(err->message, needle);
	assert_has(err->message, "on_landed");
	if (l->problem[0])
		fail_msg("%s: %s", ctx, l->problem);
	lh_landed_free(l);
	o->on_landed = NULL;
	o->on_landed_ctx = NULL;
}
