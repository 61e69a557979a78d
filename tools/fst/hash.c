/*
 * hash.c - integrity: XXH3-128 of each loaded tensor (fast enough to run
 * while a load streams) and SHA-256 of each file (the hash model hubs
 * publish for large files), and manifests that record them.
 *
 * A manifest is JSON: {"format": "fst-manifest-1", "files": {"NAME":
 * "SHA256"}, "tensors": {"NAME": "XXH3-128"}}, file names without their
 * directory. `fst verify --manifest FILE` writes one; `fst load --check FILE`
 * checks a load against it.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* xxhash's header-only mode: the hashing loops are compiled here, with
 * inlining, and run about twice as fast as Debian's libxxhash build. */
#define XXH_INLINE_ALL
#include <xxhash.h>

/* XXH3-128 of a loaded tensor, as 32 hex digits; bytes on a GPU are
 * fetched through a host block. */
int cli_tensor_xxh3(const fst_tensor_view *v, char hex[33], fst_error *err)
{
	XXH3_state_t *st = XXH3_createState();
	if (!st)
		return FST_ENOMEM;
	XXH3_128bits_reset(st);
	int rc = 0;
	if (v->device_type == FST_DEVICE_CPU) {
		XXH3_128bits_update(st, v->data, (size_t)v->nbytes);
	} else {
		const size_t block = 16u << 20;
		char *buf = malloc(block);
		if (!buf)
			rc = FST_ENOMEM;
		for (uint64_t off = 0; !rc && off < v->nbytes; off += block) {
			size_t n = (size_t)(v->nbytes - off < block ? v->nbytes - off : block);
			rc = fst_copy_to_host(v, off, buf, n, err);
			if (!rc)
				XXH3_128bits_update(st, buf, n);
		}
		free(buf);
	}
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));
	XXH3_freeState(st);
	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", c.digest[i]);
	return rc;
}

/* SHA-256 of a whole file, read sequentially, as 64 hex digits. */
int cli_file_sha256(const char *path, char hex[65])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	const size_t block = 8u << 20;
	unsigned char *buf = malloc(block);
	int rc = ctx && buf && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 ? 0 : -ENOMEM;
	ssize_t n;
	while (!rc && (n = read(fd, buf, block)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			break;
		}
		EVP_DigestUpdate(ctx, buf, (size_t)n);
	}
	unsigned char md[32];
	unsigned len = 0;
	if (!rc && EVP_DigestFinal_ex(ctx, md, &len) == 1 && len == 32) {
		for (int i = 0; i < 32; i++)
			snprintf(hex + 2 * i, 3, "%02x", md[i]);
	} else if (!rc) {
		rc = -EIO;
	}
	EVP_MD_CTX_free(ctx);
	free(buf);
	close(fd);
	return rc;
}

const char *cli_basename(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

/* The streaming load, hashing each tensor as it is handed out (while the
 * readers go on with the next ones) and comparing with the manifest. */
struct checker {
	fst_loader *ld;
	json_t *want;
	pthread_mutex_t lock;
	int rc;
	fst_error err;
	size_t checked;
};

/* One hashing thread: takes tensors as the loader hands them out. */
static void *check_main(void *arg)
{
	struct checker *k = arg;
	for (;;) {
		fst_tensor_view v;
		fst_error e;
		int r = fst_loader_next(k->ld, &v, &e);
		if (r == 0)
			break;
		int rc = r < 0 ? r : 0;
		if (r == 1) {
			char hex[33];
			json_t *w = json_object_get(k->want, v.name);
			rc = cli_tensor_xxh3(&v, hex, &e);
			if (!rc && (!json_is_string(w) || strcmp(json_string_value(w), hex))) {
				snprintf(e.message, sizeof e.message,
					 "tensor \"%s\": XXH3-128 %s but the manifest %s%s", v.name,
					 hex, w ? "says " : "does not list it",
					 w ? json_string_value(w) : "");
				e.code = rc = FST_EMISMATCH;
			}
			fst_view_release(&v);
		}
		pthread_mutex_lock(&k->lock);
		if (rc && !k->rc) {
			k->rc = rc;
			k->err = e;
		}
		if (!rc)
			k->checked++;
		pthread_mutex_unlock(&k->lock);
		if (rc) {
			fst_loader_cancel(k->ld); /* the others stop too */
			break;
		}
	}
	return NULL;
}

int cli_load_checked(const fst_checkpoint *ck, const fst_load_opts *lo, const char *manifest,
		     fst_buffer **out, size_t *checked, fst_error *err)
{
	json_error_t jerr;
	json_t *m = json_load_file(manifest, 0, &jerr);
	json_t *want = m ? json_object_get(m, "tensors") : NULL;
	if (!json_is_object(want)) {
		json_decref(m);
		snprintf(err->message, sizeof err->message,
			 "%s: not a manifest written by `fst verify --manifest`%s%s", manifest,
			 m ? "" : ": ", m ? "" : jerr.text);
		err->code = FST_EUSAGE;
		return FST_EUSAGE;
	}
	struct checker k = {.want = want, .rc = 0, .checked = 0};
	pthread_mutex_init(&k.lock, NULL);
	int rc = fst_load_start(ck, lo, &k.ld, err);
	if (rc) {
		json_decref(m);
		return rc;
	}
	/* Hashing threads beside the readers: as many as there are CPUs. */
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int n = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu;
	pthread_t t[16];
	int started = 0;
	for (int i = 0; i < n; i++)
		if (pthread_create(&t[i], NULL, check_main, &k) == 0)
			started++;
	if (!started)
		check_main(&k);
	for (int i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	*checked = k.checked;
	if (k.rc) {
		fst_loader_free(k.ld);
		*err = k.err;
		json_decref(m);
		return k.rc;
	}
	rc = fst_loader_finish(k.ld, out, err);
	if (!rc && *checked != json_object_size(want)) {
		const char *name;
		json_t *val;
		json_object_foreach(want, name, val)
			if (fst_buffer_find(*out, name) < 0)
				break;
		snprintf(err->message, sizeof err->message,
			 "%s lists %zu tensors but the load has %zu (first missing: \"%s\")", manifest,
			 json_object_size(want), *checked, name ? name : "?");
		err->code = rc = FST_EMISMATCH;
		fst_buffer_release(*out);
		*out = NULL;
	}
	json_decref(m);
	return rc;
}

