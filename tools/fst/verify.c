/*
 * verify.c - `fst verify`: load with the fast path, then compare every
 * tensor with an independent plain read of the file. The check shares
 * nothing with the engine but the header parser: its own descriptors, plain
 * sequential pread, its own offsets arithmetic. A remote file is read with
 * fst_file_read: one request after another on a connection of its own,
 * not the load's parallel workers.
 */
#include "cli.h"
#include "xxh3.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void help(FILE *out)
{
	fprintf(out,
		"usage: fst verify PATH [options]\n"
		"\n"
		"Loads PATH with the fast path, then compares every tensor's bytes with a\n"
		"plain read of the file.\n"
		"\n" CLI_LOAD_OPTIONS_HELP
		"  --hash          also print each tensor's XXH3-128 and each file's SHA-256\n"
		"  --manifest FILE also write them to FILE (JSON) for `fst load --check`\n"
		"  -h, --help      this help\n"
		"\n"
		"Exit: 0 all bytes equal, 3 a mismatch (the first differing tensor and\n"
		"offset are named), others as for fst load.\n");
}

/* A file as it was when the checkpoint was opened, to tell a mismatch from
 * a file that changed under the comparison. The status change time catches
 * an in-place write whose modification time was put back. */
struct ident {
	bool known;
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime, ctime;
};

static void ident_of(const struct stat *st, struct ident *id)
{
	*id = (struct ident){true, st->st_dev, st->st_ino, st->st_size, st->st_mtim, st->st_ctim};
}

static bool same_time(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* What changed between was and the file open as fd, as "size A -> B,
 * modification time changed", or "" when nothing did (or cannot be told). */
static void what_changed(const struct ident *was, int fd, char *out, size_t len)
{
	struct stat st;
	out[0] = '\0';
	if (!was->known || fstat(fd, &st))
		return;
	size_t n = 0;
	if (st.st_dev != was->dev || st.st_ino != was->ino)
		n += (size_t)snprintf(out + n, len - n, "%sanother file", n ? ", " : "");
	if (n < len && st.st_size != was->size)
		n += (size_t)snprintf(out + n, len - n, "%ssize %lld -> %lld", n ? ", " : "",
				      (long long)was->size, (long long)st.st_size);
	if (n < len && !same_time(st.st_mtim, was->mtime))
		n += (size_t)snprintf(out + n, len - n, "%smodification time changed",
				      n ? ", " : "");
	if (n < len && !same_time(st.st_ctim, was->ctime))
		snprintf(out + n, len - n, "%sstatus change time changed", n ? ", " : "");
}

/* FST_TEST_STOP=verify-compare: stop (SIGSTOP) after the load, before the
 * comparison, so that a test can change a file at that point and then
 * continue the process (SIGCONT). */
static void test_stop(const char *point)
{
	const char *s = getenv("FST_TEST_STOP");
	if (s && !strcmp(s, point))
		raise(SIGSTOP);
}

/* A manifest names files by their last component, as JSON keys: each must
 * be UTF-8 and unique, or an entry would be lost. */
static int manifest_names_ok(const fst_checkpoint *ck)
{
	for (size_t i = 0; i < fst_checkpoint_file_count(ck); i++) {
		const char *p = fst_file_path(fst_checkpoint_file(ck, i));
		const char *base = cli_basename(p);
		if (!cli_utf8_valid(base)) {
			cli_error("verify", "%s: a manifest names files by name, and this name is "
					    "not UTF-8",
				  p);
			return EXIT_UNSUPPORTED;
		}
		for (size_t j = 0; j < i; j++) {
			const char *q = fst_file_path(fst_checkpoint_file(ck, j));
			if (!strcmp(cli_basename(q), base)) {
				cli_error("verify", "%s and %s: a manifest names files by name, and "
						    "these two have the same",
					  q, p);
				return EXIT_UNSUPPORTED;
			}
		}
	}
	return EXIT_OK;
}

/* Each file's SHA-256 and each loaded tensor's XXH3-128; optionally a
 * manifest with both and each tensor's block tree (for `fst load --check`). */
static int print_hashes(const fst_checkpoint *ck, fst_buffer *buf, const char *manifest)
{
	int rc = manifest ? manifest_names_ok(ck) : EXIT_OK;
	if (rc)
		return rc;
	json_t *m = json_object();
	bool ok = cli_json_put(m, "format", json_string("fst-manifest-1")) &&
		  cli_json_put(m, "files", json_object()) &&
		  cli_json_put(m, "tensors", json_object()) &&
		  cli_json_put(m, "tree_block", json_integer((json_int_t)CLI_TREE_BLOCK)) &&
		  cli_json_put(m, "trees", json_object());
	json_t *files = json_object_get(m, "files"), *tensors = json_object_get(m, "tensors");
	json_t *trees = json_object_get(m, "trees");
	for (size_t fi = 0; fi < fst_checkpoint_file_count(ck) && rc == EXIT_OK; fi++) {
		const char *p = fst_file_path(fst_checkpoint_file(ck, fi));
		char hex[65];
		fst_error herr;
		int e = cli_file_sha256(fst_checkpoint_file(ck, fi), hex, &herr);
		if (e) {
			cli_error("verify", "%s", herr.message);
			rc = cli_exit_code(e);
			break;
		}
		printf("sha256 %s %s\n", hex, p);
		if (manifest)
			ok = ok && cli_json_put(files, cli_basename(p), json_string(hex));
	}
	for (size_t i = 0; i < fst_buffer_tensor_count(buf) && rc == EXIT_OK; i++) {
		fst_tensor_view v;
		fst_error err;
		char hex[33], tree[33];
		fst_buffer_tensor(buf, i, &v);
		int e = cli_tensor_digests(&v, hex, manifest ? tree : NULL, &err);
		if (e) {
			cli_error("verify", "tensor \"%s\": cannot hash: %s", v.name, err.message);
			rc = cli_exit_code(e);
		} else {
			char *name = cli_printable(v.name);
			printf("xxh3-128 %s %s\n", hex, name ? name : "?");
			free(name);
			/* tensor names are UTF-8 (the header is): a failure is memory */
			if (manifest)
				ok = ok && cli_json_put(tensors, v.name, json_string(hex)) &&
				     cli_json_put(trees, v.name, json_string(tree));
		}
		fst_view_release(&v);
	}
	if (rc == EXIT_OK && manifest) {
		int e = ok ? cli_write_json_file(manifest, m, JSON_INDENT(1) | JSON_SORT_KEYS)
			   : ENOMEM;
		if (e) {
			cli_error("verify", "%s: cannot write the manifest: %s", manifest,
				  strerror(e));
			rc = e == ENOMEM ? EXIT_NOMEM : EXIT_IO;
		}
	}
	json_decref(m);
	return rc;
}

struct verify_args {
	fst_load_opts lo;
	bool hash;
	const char *manifest, *path;
};

/* The command line into a; *done when the command ends here (help, or a
 * usage error). */
static int parse_args(int argc, char **argv, struct verify_args *a, bool *done)
{
	static const struct option opts[] = {
		CLI_LOAD_OPTIONS,
		{"hash", no_argument, NULL, 'H'},
		{"manifest", required_argument, NULL, 'M'},
		{"help", no_argument, NULL, 'h'},
		{0, 0, 0, 0},
	};
	fst_load_opts_init(&a->lo);
	a->hash = false;
	a->manifest = NULL;
	*done = true;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		int r = cli_load_option("verify", c, optarg, &a->lo);
		if (r == EXIT_USAGE)
			return r;
		if (r == EXIT_OK)
			continue;
		if (c == 'h') {
			help(stdout);
			return EXIT_OK;
		}
		if (c == 'H') {
			a->hash = true;
			continue;
		}
		if (c == 'M') {
			a->hash = true;
			a->manifest = optarg;
			continue;
		}
		help(stderr);
		return EXIT_USAGE;
	}
	if (optind != argc - 1) {
		cli_error("verify", optind >= argc ? "no PATH given" : "one PATH expected");
		help(stderr);
		return EXIT_USAGE;
	}
	a->path = argv[optind];
	/* hashes asked for: the kernel is checked now, not after the load and
	 * the comparison (nor never, for a checkpoint of no tensor) */
	const char *why = NULL;
	if (a->hash && !cli_xxh3(&why)) {
		cli_error("verify", "%s (FST_HASH_KERNEL=%s)", why, getenv("FST_HASH_KERNEL"));
		return EXIT_USAGE;
	}
	*done = false;
	return EXIT_OK;
}

/* Each file's identity as the checkpoint opened it (calloc'd, one spare;
 * NULL out of memory). */
static struct ident *identities(const fst_checkpoint *ck)
{
	size_t nfiles = fst_checkpoint_file_count(ck);
	struct ident *was = calloc(nfiles + 1, sizeof *was);
	for (size_t fi = 0; was && fi < nfiles; fi++) {
		const fst_file *f = fst_checkpoint_file(ck, fi);
		struct stat st;
		int fd = fst_file_fd(f);
		if (fd >= 0 ? fstat(fd, &st) == 0 : stat(fst_file_path(f), &st) == 0)
			ident_of(&st, &was[fi]);
	}
	return was;
}

/* The comparison's state: the load, two blocks, the counts so far. */
struct compare {
	fst_buffer *buf;
	char *want;         /* the file's bytes */
	unsigned char *got; /* the loaded ones */
	size_t block;
	uint64_t checked;
	size_t ntensors;
	const fst_file *remote; /* the file being compared, when it is remote */
};

/* The plain read of n bytes at file offset at ended short (errnum: its
 * error, or 0): a file that changed, or an I/O error. */
static int short_read(const char *path, int fd, const struct ident *was, int errnum, size_t n,
		      uint64_t at)
{
	char changed[256];
	what_changed(was, fd, changed, sizeof changed);
	if (changed[0]) {
		cli_error("verify", "%s: file changed during the comparison (%s); its bytes cannot "
				    "be trusted",
			  path, changed);
		return EXIT_CHANGED;
	}
	cli_error("verify", "%s: plain read of %zu bytes at offset %" PRIu64 " failed: %s", path, n,
		  at, errnum ? strerror(errnum) : "the file ended early");
	return EXIT_IO;
}

/* The loaded bytes of info at tensor offset off differ from the file's. */
static int difference(const struct compare *c, const char *path, int fd, const struct ident *was,
		      const fst_tensor_info *info, uint64_t off)
{
	size_t k = 0;
	while (c->got[k] == (unsigned char)c->want[k])
		k++;
	/* a file written to since it was opened differs for that reason: not a
	 * mismatch of the load */
	char changed[256];
	what_changed(was, fd, changed, sizeof changed);
	if (changed[0]) {
		cli_error("verify",
			  "%s: file changed during the comparison (%s): tensor \"%s\" differs at "
			  "byte %" PRIu64 " of the tensor, but that says nothing of the load",
			  path, changed, info->name, off + k);
		return EXIT_CHANGED;
	}
	cli_error("verify",
		  "%s: tensor \"%s\" differs at byte %" PRIu64 " of the tensor (file offset %" PRIu64
		  "): loaded 0x%02x, file 0x%02x",
		  path, info->name, off + k, info->file_offset + off + k, c->got[k],
		  (unsigned char)c->want[k]);
	return EXIT_MISMATCH;
}

/* Bytes [off, off + n) of tensor info: read plainly from fd, compared with
 * the loaded view v. */
static int compare_block(struct compare *c, const char *path, int fd, const struct ident *was,
			 const fst_tensor_info *info, const fst_tensor_view *v, uint64_t off,
			 size_t n)
{
	fst_error err;
	if (c->remote) {
		if (fst_file_read(c->remote, info->file_offset + off, c->want, n, &err)) {
			cli_error("verify", "%s", err.message);
			return cli_exit_code(err.code);
		}
	} else {
		ssize_t r = pread(fd, c->want, n, (off_t)(info->file_offset + off));
		if (r != (ssize_t)n)
			return short_read(path, fd, was, r < 0 ? errno : 0, n,
					  info->file_offset + off);
	}
	/* the loaded bytes, fetched from wherever they are */
	if (fst_copy_to_host(v, off, c->got, n, &err)) {
		cli_error("verify", "%s", err.message);
		return cli_exit_code(err.code);
	}
	if (memcmp(c->got, c->want, n))
		return difference(c, path, fd, was, info, off);
	return EXIT_OK;
}

/* Tensor info of the file path (open as fd) against its loaded view. */
static int compare_tensor(struct compare *c, const char *path, int fd, const struct ident *was,
			  const fst_tensor_info *info)
{
	long bi = fst_buffer_find(c->buf, info->name);
	fst_tensor_view v;
	if (bi < 0 || fst_buffer_tensor(c->buf, (size_t)bi, &v)) {
		cli_error("verify", "%s: tensor \"%s\" is missing from the load", path, info->name);
		return EXIT_MISMATCH;
	}
	int rc = EXIT_OK;
	if (v.nbytes != info->nbytes || v.dtype != info->dtype) {
		cli_error("verify",
			  "%s: tensor \"%s\": loaded %" PRIu64 " bytes of %s, the file has %" PRIu64
			  " of %s",
			  path, info->name, v.nbytes, fst_dtype_name(v.dtype), info->nbytes,
			  fst_dtype_name(info->dtype));
		rc = EXIT_MISMATCH;
	}
	for (uint64_t off = 0; off < info->nbytes && rc == EXIT_OK;) {
		size_t n = (size_t)(info->nbytes - off < c->block ? info->nbytes - off : c->block);
		rc = compare_block(c, path, fd, was, info, &v, off, n);
		if (rc == EXIT_OK) {
			off += n;
			c->checked += n;
		}
	}
	fst_view_release(&v);
	c->ntensors++;
	return rc;
}

/* Every tensor of file f, read plainly through a descriptor of its own. */
static int compare_file(struct compare *c, const fst_file *f, const struct ident *was)
{
	const char *path = fst_file_path(f);
	c->remote = fst_file_is_remote(f) ? f : NULL;
	int fd = c->remote ? -2 : open(path, O_RDONLY | O_CLOEXEC);
	if (fd == -1) {
		cli_error("verify", "%s: cannot open: %s", path, strerror(errno));
		return EXIT_IO;
	}
	/* the path must still name the file that was loaded */
	struct stat st;
	if (was->known && fstat(fd, &st) == 0 && (st.st_dev != was->dev || st.st_ino != was->ino)) {
		cli_error("verify", "%s: file changed during the comparison (the path now names "
				    "another file than the one loaded); its bytes cannot be trusted",
			  path);
		close(fd);
		return EXIT_CHANGED;
	}
	int rc = EXIT_OK;
	for (size_t ti = 0; ti < fst_file_tensor_count(f) && rc == EXIT_OK; ti++) {
		fst_tensor_info info;
		fst_file_tensor(f, ti, &info);
		rc = compare_tensor(c, path, fd, was, &info);
	}
	if (fd >= 0)
		close(fd);
	return rc;
}

int cmd_verify(int argc, char **argv)
{
	struct verify_args a;
	bool done;
	int rc = parse_args(argc, argv, &a, &done);
	if (done)
		return rc;
	rc = cli_check_fault_env("verify");
	if (rc)
		return rc;
	fst_checkpoint *ck;
	fst_error err;
	if (cli_open_checkpoint(a.path, &ck, &err)) {
		cli_error("verify", "%s", err.message);
		return cli_exit_code(err.code);
	}
	struct ident *was = identities(ck);
	if (!was) {
		cli_error("verify", "out of memory");
		fst_checkpoint_close(ck);
		return EXIT_NOMEM;
	}
	double t0 = cli_now();
	fst_buffer *buf;
	if ((rc = fst_load(ck, &a.lo, &buf, &err))) {
		cli_error("verify", "%s", err.message);
		fst_checkpoint_close(ck);
		free(was);
		return cli_exit_code(rc);
	}
	double t1 = cli_now();
	test_stop("verify-compare");

	struct compare c = {.buf = buf, .block = 8u << 20};
	c.want = malloc(c.block);
	c.got = malloc(c.block);
	if (!c.want || !c.got) {
		cli_error("verify", "out of memory");
		rc = EXIT_NOMEM;
	}
	for (size_t fi = 0; fi < fst_checkpoint_file_count(ck) && rc == EXIT_OK; fi++)
		rc = compare_file(&c, fst_checkpoint_file(ck, fi), &was[fi]);
	if (rc == EXIT_OK) {
		char hb[32];
		printf("verified %s: %zu tensors, %s byte-identical to the files (load %.3f s, "
		       "%s)\n",
		       fst_checkpoint_path(ck), c.ntensors, cli_human_bytes(hb, sizeof hb, c.checked),
		       t1 - t0,
		       fst_buffer_describe(buf));
	}
	if (rc == EXIT_OK && a.hash)
		rc = print_hashes(ck, buf, a.manifest);
	free(was);
	free(c.want);
	free(c.got);
	fst_buffer_release(buf);
	fst_checkpoint_close(ck);
	return rc;
}
