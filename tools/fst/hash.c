/*
 * hash.c - integrity: XXH3-128 of each loaded tensor and its block tree
 * (xxh3.h), SHA-256 of each file (the hash model hubs publish for large
 * files), and manifests that record them.
 *
 * A manifest is JSON: {"format": "fst-manifest-1", "files": {"NAME":
 * "SHA256"}, "tensors": {"NAME": "XXH3-128"}, "tree_block": 1048576,
 * "trees": {"NAME": "XXH3-128 tree"}}, file names without their directory.
 * `fst verify --manifest FILE` writes one; `fst load --check FILE` checks a
 * load against its trees, hashing each block as it lands (opts.on_landed),
 * or against "tensors" after the load when the manifest has no trees.
 */
#include "cli.h"
#include "xxh3.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- choosing a kernel */

static const struct cli_xxh3 *chosen;
static const char *chosen_why;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

#ifdef FST_XXH3_X86
#include <cpuid.h>

/* Whether the CPU has AVX2 (or AVX-512F) and the OS saves its registers
 * (XCR0: SSE and YMM state; with AVX-512 also opmask and ZMM), which a
 * cpuid test alone would miss. Asked of cpuid and xgetbv themselves, not
 * __builtin_cpu_supports: the compiler runtime of the wheel's toolchain
 * (zig) answers no to every feature. */
static bool x86_runs(bool avx512)
{
	unsigned a, b, c, d, lo, hi;
	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX))
		return false;
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	const unsigned state = avx512 ? 0xe6 : 0x06;
	if ((lo & state) != state || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return false;
	return avx512 ? (b & bit_AVX512F) != 0 : (b & bit_AVX2) != 0;
}
#endif

static bool kernel_runs(const struct cli_xxh3 *k)
{
#ifdef FST_XXH3_X86
	if (k == &cli_xxh3_avx512)
		return x86_runs(true);
	if (k == &cli_xxh3_avx2)
		return x86_runs(false);
#endif
	return k == &cli_xxh3_generic;
}

static void choose(void)
{
	static const struct cli_xxh3 *const all[] = {
#ifdef FST_XXH3_X86
		&cli_xxh3_avx512,
		&cli_xxh3_avx2,
#endif
		&cli_xxh3_generic,
	};
	const size_t n = sizeof all / sizeof all[0];
	const char *want = getenv("FST_HASH_KERNEL");
	for (size_t i = 0; i < n; i++) {
		if (want && *want && strcmp(want, all[i]->name))
			continue;
		if (kernel_runs(all[i])) {
			chosen = all[i];
			return;
		}
		if (want && *want) {
			chosen_why = "FST_HASH_KERNEL names a kernel this CPU cannot run";
			return;
		}
	}
	chosen_why = "FST_HASH_KERNEL: expected generic, avx2 or avx512";
}

const struct cli_xxh3 *cli_xxh3(const char **why)
{
	pthread_once(&choose_once, choose);
	if (!chosen && why)
		*why = chosen_why;
	return chosen;
}

static int no_kernel(fst_error *err)
{
	const char *why = "";
	cli_xxh3(&why);
	snprintf(err->message, sizeof err->message, "%s (FST_HASH_KERNEL=%s)", why,
		 getenv("FST_HASH_KERNEL"));
	return err->code = FST_EUSAGE;
}

void cli_tree_root(const struct cli_xxh3 *x, const unsigned char (*blocks)[16], uint64_t nblocks,
		   uint64_t nbytes, unsigned char out[16])
{
	if (nblocks == 1)
		memcpy(out, blocks[0], 16);
	else
		x->hash128(blocks, (size_t)nblocks * 16, nbytes, out);
}

static void to_hex(const unsigned char *d, size_t n, char *hex)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		hex[2 * i] = digits[d[i] >> 4];
		hex[2 * i + 1] = digits[d[i] & 15];
	}
	hex[2 * n] = 0;
}

/* ---- digests of a loaded tensor */

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/*
 * Hash a tensor's blocks: feed all its bytes to the plain XXH3-128 stream
 * st (when not NULL), and put the digest of each block b with have[b] unset
 * (have NULL: every block) into blocks[b] (when not NULL). Bytes on a GPU
 * are fetched through host memory, up to 16 blocks at a time.
 */
static int hash_blocks(const struct cli_xxh3 *x, const fst_tensor_view *v, uint64_t block,
		       void *st, const unsigned char *have, unsigned char (*blocks)[16],
		       fst_error *err)
{
	const uint64_t nb = cli_tree_blocks(v->nbytes, block);
	const bool host = v->device_type == FST_DEVICE_CPU;
	const uint64_t batch = 16 * block;
	char *buf = NULL;
	for (uint64_t b = 0; b < nb;) {
		if (!st && have && have[b]) {
			b++;
			continue;
		}
		/* a run of blocks to hash, at most one batch */
		uint64_t e = b + 1;
		while (e < nb && (e - b) * block < batch && (st || !have || !have[e]))
			e++;
		uint64_t off = b * block, len = min_u64(e * block, v->nbytes) - off;
		const char *p = (const char *)v->data + off;
		if (!host && len) {
			if (!buf && !(buf = malloc(batch))) {
				snprintf(err->message, sizeof err->message,
					 "out of memory for a %llu-byte hashing buffer",
					 (unsigned long long)batch);
				return err->code = FST_ENOMEM;
			}
			int rc = fst_copy_to_host(v, off, buf, (size_t)len, err);
			if (rc) {
				free(buf);
				return rc;
			}
			p = buf;
		}
		for (uint64_t i = b; i < e; i++) {
			uint64_t o = (i - b) * block, n = min_u64(len - o, block);
			if (st)
				x->stream_update(st, p + o, (size_t)n);
			if (blocks && (!have || !have[i]))
				x->hash128(p + o, (size_t)n, 0, blocks[i]);
		}
		b = e;
	}
	free(buf);
	return 0;
}

int cli_tensor_digests(const fst_tensor_view *v, char plain[33], char tree[33], fst_error *err)
{
	const struct cli_xxh3 *x = cli_xxh3(NULL);
	if (!x)
		return no_kernel(err);
	const uint64_t nb = cli_tree_blocks(v->nbytes, CLI_TREE_BLOCK);
	void *st = plain ? x->stream_new() : NULL;
	unsigned char(*blocks)[16] = tree ? malloc(nb * 16) : NULL;
	int rc = 0;
	if ((plain && !st) || (tree && !blocks)) {
		snprintf(err->message, sizeof err->message, "out of memory for hashing");
		rc = err->code = FST_ENOMEM;
	}
	if (!rc)
		rc = hash_blocks(x, v, CLI_TREE_BLOCK, st, NULL, blocks, err);
	unsigned char d[16];
	if (!rc && plain) {
		x->stream_digest(st, d);
		to_hex(d, 16, plain);
	}
	if (!rc && tree) {
		cli_tree_root(x, (const unsigned char(*)[16])blocks, nb, v->nbytes, d);
		to_hex(d, 16, tree);
	}
	if (st)
		x->stream_free(st);
	free(blocks);
	return rc;
}

/* SHA-256 of a whole file, read sequentially, as 64 hex digits; a remote
 * file is read with fst_file_read, block after block. */
int cli_file_sha256(const fst_file *f, char hex[65], fst_error *err)
{
	const char *path = fst_file_path(f);
	bool remote = fst_file_is_remote(f);
	int fd = remote ? -1 : open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && !remote) {
		err->code = FST_EIO;
		snprintf(err->message, sizeof err->message, "%s: cannot hash: %s", path,
			 strerror(errno));
		return FST_EIO;
	}
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	const size_t block = 8u << 20;
	unsigned char *buf = malloc(block);
	int rc = ctx && buf && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 ? 0 : -ENOMEM;
	ssize_t n;
	for (uint64_t off = 0; remote && !rc && off < fst_file_size(f); off += (uint64_t)n) {
		n = (ssize_t)(fst_file_size(f) - off < block ? fst_file_size(f) - off : block);
		if (fst_file_read(f, off, buf, (uint64_t)n, err)) {
			free(buf);
			EVP_MD_CTX_free(ctx);
			return err->code;
		}
		EVP_DigestUpdate(ctx, buf, (size_t)n);
	}
	while (!remote && !rc && (n = read(fd, buf, block)) != 0) {
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
	if (!rc && EVP_DigestFinal_ex(ctx, md, &len) == 1 && len == 32)
		to_hex(md, 32, hex);
	else if (!rc)
		rc = -EIO;
	EVP_MD_CTX_free(ctx);
	free(buf);
	if (fd >= 0)
		close(fd);
	if (rc) {
		err->code = rc == -ENOMEM ? FST_ENOMEM : FST_EIO;
		snprintf(err->message, sizeof err->message, "%s: cannot hash: %s", path,
			 strerror(-rc));
		return err->code;
	}
	return 0;
}

const char *cli_basename(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

/* ---- checking a load against a manifest */

/* A block that reached host memory in pieces (it straddles two reads): its
 * bytes are gathered here until the last piece arrives. */
struct partial {
	uint64_t index; /* block, in the checker's numbering */
	_Atomic uint64_t filled;
	unsigned char *bytes;
	struct partial *next;
};

struct checker {
	const struct cli_xxh3 *x;
	const fst_checkpoint *ck;
	fst_loader *ld;
	json_t *want;   /* name -> hex: trees, or plain digests (trees false) */
	bool trees;
	uint64_t block;
	/* per checkpoint tensor: its size and its first block in the arrays */
	uint64_t *nbytes, *first;
	unsigned char (*digest)[16];
	unsigned char *have; /* set when the block was hashed on its way */
	pthread_mutex_t lock;
	struct partial *partials;
	int rc;
	fst_error err;
	size_t checked;
};

static void set_error(struct checker *k, int rc, const fst_error *e)
{
	pthread_mutex_lock(&k->lock);
	if (!k->rc) {
		k->rc = rc;
		k->err = *e;
	}
	pthread_mutex_unlock(&k->lock);
}

/* Gather piece [off, off + len) of block b (of blen bytes); returns the
 * block's bytes when this piece completed it (the caller frees them), NULL
 * otherwise, and when no buffer could be had (the block is then hashed
 * after the load instead). */
static unsigned char *gather(struct checker *k, uint64_t b, uint64_t blen, uint64_t off,
			     const void *bytes, uint64_t len)
{
	pthread_mutex_lock(&k->lock);
	struct partial *p = k->partials;
	while (p && p->index != b)
		p = p->next;
	if (!p && (p = calloc(1, sizeof *p))) {
		if ((p->bytes = malloc(blen))) {
			p->index = b;
			p->next = k->partials;
			k->partials = p;
		} else {
			free(p);
			p = NULL;
		}
	}
	pthread_mutex_unlock(&k->lock);
	if (!p)
		return NULL;
	memcpy(p->bytes + off, bytes, len);
	if (atomic_fetch_add(&p->filled, len) + len != blen)
		return NULL;
	/* complete: every other piece was copied before its fetch_add */
	pthread_mutex_lock(&k->lock);
	struct partial **pp = &k->partials;
	while (*pp != p)
		pp = &(*pp)->next;
	*pp = p->next;
	pthread_mutex_unlock(&k->lock);
	unsigned char *out = p->bytes;
	free(p);
	return out;
}

/* opts.on_landed: hash each block while it is still in the caches. */
static int on_landed(void *ctx, size_t t, uint64_t off, const void *bytes, uint64_t len)
{
	struct checker *k = ctx;
	uint64_t i = off / k->block, b = k->first[t] + i;
	uint64_t blen = min_u64(k->block, k->nbytes[t] - i * k->block);
	if (off % k->block == 0 && len == blen) {
		k->x->hash128(bytes, (size_t)len, 0, k->digest[b]);
		k->have[b] = 1;
		return 0;
	}
	unsigned char *whole = gather(k, b, blen, off % k->block, bytes, len);
	if (whole) {
		k->x->hash128(whole, (size_t)blen, 0, k->digest[b]);
		k->have[b] = 1;
		free(whole);
	}
	return 0;
}

/* The digest of a ready tensor: its tree from the blocks hashed on the way
 * and the rest hashed now, or its plain XXH3-128. */
static int tensor_digest(struct checker *k, const fst_tensor_view *v, char hex[33],
			 fst_error *e)
{
	if (!k->trees)
		return cli_tensor_digests(v, hex, NULL, e);
	/* the checkpoint index of the view (views are numbered by the buffer) */
	long t = fst_checkpoint_find(k->ck, v->name);
	if (t < 0 || k->nbytes[t] != v->nbytes) {
		snprintf(e->message, sizeof e->message, "tensor \"%s\": not in the checkpoint",
			 v->name);
		return e->code = FST_EUSAGE;
	}
	uint64_t f = k->first[t], nb = cli_tree_blocks(v->nbytes, k->block);
	int rc = hash_blocks(k->x, v, k->block, NULL, k->have + f, k->digest + f, e);
	if (rc)
		return rc;
	unsigned char d[16];
	cli_tree_root(k->x, (const unsigned char(*)[16])(k->digest + f), nb, v->nbytes, d);
	to_hex(d, 16, hex);
	return 0;
}

/* The path of the file that holds the tensor called name. */
static const char *shard_of(const fst_checkpoint *ck, const char *name)
{
	long t = fst_checkpoint_find(ck, name);
	fst_tensor_info info;
	size_t fi = 0;
	if (t < 0 || fst_checkpoint_tensor(ck, (size_t)t, &info, &fi))
		return "?";
	return fst_file_path(fst_checkpoint_file(ck, fi));
}

/* One checking thread: takes tensors as the loader hands them out. */
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
			rc = tensor_digest(k, &v, hex, &e);
			if (!rc && (!json_is_string(w) || strcmp(json_string_value(w), hex))) {
				snprintf(e.message, sizeof e.message,
					 "%s: tensor \"%s\": XXH3-128%s %s but the manifest %s%s",
					 shard_of(k->ck, v.name), v.name, k->trees ? " tree" : "", hex,
					 w ? "says " : "does not list it",
					 w ? json_string_value(w) : "");
				e.code = rc = FST_EMISMATCH;
			}
			fst_view_release(&v);
		}
		if (rc) {
			set_error(k, rc, &e);
			fst_loader_cancel(k->ld); /* the others stop too */
			break;
		}
		pthread_mutex_lock(&k->lock);
		k->checked++;
		pthread_mutex_unlock(&k->lock);
	}
	return NULL;
}

/* The per-block arrays, for every tensor of the checkpoint. */
static int checker_blocks(struct checker *k, const fst_checkpoint *ck, fst_error *err)
{
	size_t n = fst_checkpoint_tensor_count(ck);
	k->nbytes = calloc(n + 1, sizeof *k->nbytes);
	k->first = calloc(n + 1, sizeof *k->first);
	uint64_t total = 0;
	for (size_t i = 0; k->nbytes && k->first && i < n; i++) {
		fst_tensor_info info;
		fst_checkpoint_tensor(ck, i, &info, NULL);
		k->nbytes[i] = info.nbytes;
		k->first[i] = total;
		total += cli_tree_blocks(info.nbytes, k->block);
	}
	k->digest = k->first ? calloc(total + 1, 16) : NULL;
	k->have = k->digest ? calloc(total + 1, 1) : NULL;
	if (!k->have) {
		snprintf(err->message, sizeof err->message,
			 "out of memory for the digests of %zu tensors", n);
		return err->code = FST_ENOMEM;
	}
	return 0;
}

static void checker_free(struct checker *k)
{
	while (k->partials) {
		struct partial *p = k->partials;
		k->partials = p->next;
		free(p->bytes);
		free(p);
	}
	free(k->nbytes);
	free(k->first);
	free(k->digest);
	free(k->have);
	pthread_mutex_destroy(&k->lock);
}

/* Read the manifest: its trees when it has them, else its plain digests. */
static json_t *read_manifest(const char *manifest, struct checker *k, fst_error *err)
{
	/* A manifest that cannot be read is an I/O error with its reason;
	 * jansson would only say "unable to open". */
	FILE *fp = fopen(manifest, "r");
	if (!fp) {
		int e = errno;
		snprintf(err->message, sizeof err->message, "%s: cannot open the manifest: %s",
			 manifest, strerror(e));
		err->sys_errno = e;
		err->code = e == ENOMEM ? FST_ENOMEM : FST_EIO;
		return NULL;
	}
	json_error_t jerr;
	errno = 0;
	json_t *m = json_loadf(fp, 0, &jerr);
	int read_errno = ferror(fp) ? (errno ? errno : EIO) : 0;
	fclose(fp);
	if (read_errno) {
		json_decref(m);
		snprintf(err->message, sizeof err->message, "%s: cannot read the manifest: %s",
			 manifest, strerror(read_errno));
		err->sys_errno = read_errno;
		err->code = FST_EIO;
		return NULL;
	}
	json_t *tensors = m ? json_object_get(m, "tensors") : NULL;
	json_t *trees = m ? json_object_get(m, "trees") : NULL;
	json_t *block = m ? json_object_get(m, "tree_block") : NULL;
	if (!json_is_object(tensors) || (trees && !json_is_object(trees)) ||
	    (trees && !json_is_integer(block))) {
		snprintf(err->message, sizeof err->message,
			 "%s: not a manifest written by `fst verify --manifest`%s%s", manifest,
			 m ? "" : ": ", m ? "" : jerr.text);
		json_decref(m);
		err->code = FST_EUSAGE;
		return NULL;
	}
	k->trees = trees != NULL;
	k->want = trees ? trees : tensors;
	if (trees) {
		json_int_t b = json_integer_value(block);
		if (b < 4096 || b > (1 << 30) || (b & (b - 1))) {
			snprintf(err->message, sizeof err->message,
				 "%s: tree_block %lld is not a power of two from 4 KiB to 1 GiB",
				 manifest, (long long)b);
			json_decref(m);
			err->code = FST_EUSAGE;
			return NULL;
		}
		k->block = (uint64_t)b;
	}
	/* every digest a string of 32 hex digits: a mismatch is then told with
	 * both digests, and the manifest's shape is its own error (exit 1) */
	const char *name;
	json_t *d;
	json_object_foreach(k->want, name, d) {
		const char *hex = json_string_value(d);
		if (!hex || strlen(hex) != 32 || strspn(hex, "0123456789abcdef") != 32) {
			snprintf(err->message, sizeof err->message,
				 "%s: tensor \"%s\": the %s is not 32 lower-case hex digits",
				 manifest, name, k->trees ? "tree digest" : "digest");
			json_decref(m);
			err->code = FST_EUSAGE;
			return NULL;
		}
	}
	return m;
}

int cli_check_manifest(const char *manifest, fst_error *err)
{
	struct checker k = {.x = cli_xxh3(NULL)};
	if (!k.x)
		return no_kernel(err);
	json_t *m = read_manifest(manifest, &k, err);
	json_decref(m);
	return m ? 0 : err->code;
}

int cli_load_checked(const fst_checkpoint *ck, const fst_load_opts *lo, const char *manifest,
		     fst_buffer **out, size_t *checked, fst_error *err)
{
	*out = NULL;
	*checked = 0;
	struct checker k = {.x = cli_xxh3(NULL), .ck = ck};
	if (!k.x)
		return no_kernel(err);
	json_t *m = read_manifest(manifest, &k, err);
	if (!m)
		return err->code;
	pthread_mutex_init(&k.lock, NULL);
	fst_load_opts opts = *lo;
	int rc = 0;
	if (k.trees) {
		rc = checker_blocks(&k, ck, err);
		opts.on_landed = on_landed;
		opts.on_landed_ctx = &k;
		opts.landed_block = k.block;
	}
	if (!rc)
		rc = fst_load_start(ck, &opts, &k.ld, err);
	if (rc) {
		checker_free(&k);
		json_decref(m);
		return rc;
	}
	/* Checking threads beside the readers: they sleep until tensors are
	 * ready and then mostly combine block digests already made. */
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int n = ncpu < 1 ? 1 : ncpu > 16 ? 16 : (int)ncpu;
	pthread_t t[16];
	int started = 0;
	for (int i = 0; i < n; i++)
		if (pthread_create(&t[started], NULL, check_main, &k) == 0)
			started++;
	if (!started)
		check_main(&k);
	/* the progress the caller asked for, meanwhile (fst_loader_finish
	 * reports only its own wait, which comes after) */
	for (int i = 0; i < started; i++) {
		if (!lo->progress) {
			pthread_join(t[i], NULL);
			continue;
		}
		for (;;) {
			struct timespec until;
			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_nsec += 100 * 1000000;
			if (until.tv_nsec >= 1000000000) {
				until.tv_sec++;
				until.tv_nsec -= 1000000000;
			}
			if (pthread_timedjoin_np(t[i], NULL, &until) != ETIMEDOUT)
				break;
			uint64_t done, total;
			fst_loader_progress(k.ld, &done, &total);
			lo->progress(lo->progress_ctx, done, total);
		}
	}
	*checked = k.checked;
	if (k.rc) {
		fst_loader_free(k.ld);
		*err = k.err;
		rc = k.rc;
	} else {
		rc = fst_loader_finish(k.ld, out, err);
	}
	if (!rc && *checked != json_object_size(k.want)) {
		const char *name;
		json_t *val;
		json_object_foreach(k.want, name, val)
			if (fst_buffer_find(*out, name) < 0)
				break;
		snprintf(err->message, sizeof err->message,
			 "%s lists %zu tensors but the load has %zu (first missing: \"%s\")", manifest,
			 json_object_size(k.want), *checked, name ? name : "?");
		err->code = rc = FST_EMISMATCH;
		fst_buffer_release(*out);
		*out = NULL;
	}
	checker_free(&k);
	json_decref(m);
	return rc;
}
