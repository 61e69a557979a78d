/* inspect.c - `fst inspect`: list and check the tensors of checkpoints. */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *out)
{
	fprintf(out,
		"usage: fst inspect [--json] [REMOTE OPTIONS] PATH...\n"
		"\n"
		"PATH is a .safetensors file, a directory, or a model.safetensors.index.json;\n"
		"or a URL of one: s3://BUCKET/KEY, s3://BUCKET/PREFIX/, http(s)://... .\n"
		"Prints each tensor (name, dtype, shape, bytes, file offset, the offset's\n"
		"alignment) and a summary; checks every rule of the format.\n"
		"\n"
		"  --json     one JSON document on stdout: a list with one object per file\n"
		"  -h, --help this help\n"
		CLI_REMOTE_OPTIONS_HELP
		"\n"
		"Exit: 0 all inputs valid; else that of the first failing input (one message\n"
		"each on stderr): 2 invalid, 4 cannot be read (HTTP 403, 404, other failures of\n"
		"a URL), 5 out of memory, 7 unsupported (no libcurl for a URL), 8 changed while\n"
		"read; 1 usage.\n");
}

/* Largest power of two dividing off, capped at 4096 ("4096" means 4096 or more). */
static uint64_t alignment_of(uint64_t off)
{
	uint64_t a = 1;
	while (a < 4096 && !(off & a))
		a <<= 1;
	return a;
}

/* Appends one file's object to out; false when any part of it could not
 * be built. Containers go into their parent first and are filled after, so
 * that nothing leaks when a step fails. */
static bool file_json(json_t *out, const fst_file *f)
{
	json_t *o = json_object();
	bool ok = cli_json_push(out, o) && cli_json_put_path(o, "path", fst_file_path(f)) &&
		  cli_json_put(o, "ok", json_true()) &&
		  cli_json_put(o, "data_offset", json_integer((json_int_t)fst_file_data_offset(f)));
	if (ok && fst_file_metadata_count(f)) {
		ok = cli_json_put(o, "metadata", json_object());
		json_t *meta = json_object_get(o, "metadata");
		for (size_t i = 0; ok && i < fst_file_metadata_count(f); i++) {
			const char *k, *v;
			fst_file_metadata(f, i, &k, &v);
			ok = cli_json_put(meta, k, cli_json_text(v));
		}
	} else {
		ok = ok && cli_json_put(o, "metadata", json_null());
	}
	ok = ok && cli_json_put(o, "tensors", json_array());
	json_t *tensors = ok ? json_object_get(o, "tensors") : NULL;
	for (size_t i = 0; ok && i < fst_file_tensor_count(f); i++) {
		fst_tensor_info t;
		fst_file_tensor(f, i, &t);
		json_t *tj = json_object();
		/* names are UTF-8 (the header is): a NULL here is memory */
		ok = cli_json_push(tensors, tj) && cli_json_put(tj, "name", json_string(t.name)) &&
		     cli_json_put(tj, "dtype", json_string(fst_dtype_name(t.dtype))) &&
		     cli_json_put(tj, "shape", json_array());
		json_t *shape = ok ? json_object_get(tj, "shape") : NULL;
		for (uint32_t d = 0; ok && d < t.ndim; d++)
			ok = cli_json_push(shape, json_integer((json_int_t)t.shape[d]));
		ok = ok && cli_json_put(tj, "data_offsets", json_pack("[I, I]", (json_int_t)t.begin,
									(json_int_t)t.end));
	}
	return ok;
}

/* A failed input's object, named as fst names it (a URL's secrets hidden). */
static bool error_json(json_t *out, const char *path, const char *message)
{
	size_t n = fst_display_path(path, NULL, 0) + 1;
	char *shown = malloc(n);
	if (!shown)
		return false;
	fst_display_path(path, shown, n);
	json_t *o = json_object();
	bool ok = cli_json_push(out, o) && cli_json_put_path(o, "path", shown) &&
		  cli_json_put(o, "ok", json_false()) &&
		  cli_json_put(o, "error", cli_json_text(message));
	free(shown);
	return ok;
}

struct summary {
	uint64_t tensors, bytes, misaligned_dtype, misaligned_256;
	uint64_t dtype_count[FST_DTYPE_COUNT];
};

static void print_file(const fst_file *f, struct summary *s)
{
	printf("%s: %zu tensors, data at offset %" PRIu64 "\n", fst_file_path(f),
	       fst_file_tensor_count(f), fst_file_data_offset(f));
	for (size_t i = 0; i < fst_file_metadata_count(f); i++) {
		const char *k, *v;
		fst_file_metadata(f, i, &k, &v);
		char *pk = cli_printable(k), *pv = cli_printable(v);
		printf("  metadata %s = %s\n", pk ? pk : "?", pv ? pv : "?");
		free(pk);
		free(pv);
	}
	printf("  %-48s %-11s %-20s %14s %14s %6s\n", "name", "dtype", "shape", "bytes", "offset",
	       "align");
	for (size_t i = 0; i < fst_file_tensor_count(f); i++) {
		fst_tensor_info t;
		fst_file_tensor(f, i, &t);
		char shape[64] = "[";
		for (uint32_t d = 0; d < t.ndim; d++) {
			char part[24];
			snprintf(part, sizeof part, "%s%" PRIu64, d ? ", " : "", t.shape[d]);
			if (strlen(shape) + strlen(part) + 5 >= sizeof shape) {
				strcat(shape, "...");
				break;
			}
			strcat(shape, part);
		}
		strcat(shape, "]");
		char *name = cli_printable(t.name);
		printf("  %-48s %-11s %-20s %14" PRIu64 " %14" PRIu64 " %6" PRIu64 "\n",
		       name ? name : "?", fst_dtype_name(t.dtype), shape, t.nbytes, t.file_offset,
		       alignment_of(t.file_offset));
		free(name);
		unsigned elem = fst_dtype_bits(t.dtype) / 8;
		s->tensors++;
		s->bytes += t.nbytes;
		s->dtype_count[t.dtype]++;
		if (elem > 1 && t.file_offset % elem)
			s->misaligned_dtype++;
		if (t.file_offset % 256)
			s->misaligned_256++;
	}
}

static void print_summary(const struct summary *s, size_t files)
{
	char hb[32];
	printf("summary: %zu file%s, %" PRIu64 " tensors, %" PRIu64 " bytes (%s)\n", files,
	       files == 1 ? "" : "s", s->tensors, s->bytes,
	       cli_human_bytes(hb, sizeof hb, s->bytes));
	printf("  dtypes:");
	for (int d = 1; d < FST_DTYPE_COUNT; d++)
		if (s->dtype_count[d])
			printf(" %s=%" PRIu64, fst_dtype_name((fst_dtype)d), s->dtype_count[d]);
	printf("\n  misaligned in the file: %" PRIu64 " for their dtype, %" PRIu64
	       " for 256 B\n",
	       s->misaligned_dtype, s->misaligned_256);
}

int cmd_inspect(int argc, char **argv)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		CLI_REMOTE_OPTIONS,
		{0, 0, 0, 0},
	};
	bool as_json = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
		if (cli_remote_option(c, optarg) == EXIT_OK)
			continue;
		switch (c) {
		case 'j': as_json = true; break;
		case 'h': help(stdout); return EXIT_OK;
		default: help(stderr); return EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		cli_error("inspect", "no PATH given");
		help(stderr);
		return EXIT_USAGE;
	}
	int rc = EXIT_OK;
	json_t *out = as_json ? json_array() : NULL;
	struct summary sum;
	memset(&sum, 0, sizeof sum);
	size_t files = 0;
	bool complete = true;
	for (int i = optind; i < argc; i++) {
		fst_checkpoint *ck;
		fst_error err;
		if (cli_open_checkpoint(argv[i], &ck, &err)) {
			cli_error("inspect", "%s", err.message);
			/* The first failing input decides: 4 for one that cannot be
			 * read, 5 out of memory, 7 unsupported (no libcurl), 8 changed
			 * while read (cli.h), 1 for a URL's bad options; any other
			 * failure (a shard that is a directory, say) is 2. */
			if (rc == EXIT_OK) {
				bool url = strstr(argv[i], "://") != NULL;
				bool own = err.code == FST_EIO || err.code == FST_ENOMEM ||
					   err.code == FST_ECHANGED || err.code == FST_EUNSUPPORTED ||
					   (url && err.code == FST_EUSAGE);
				rc = own ? cli_exit_code(err.code) : EXIT_INVALID;
			}
			if (out)
				complete = complete && error_json(out, argv[i], err.message);
			continue;
		}
		for (size_t k = 0; k < fst_checkpoint_file_count(ck); k++) {
			const fst_file *f = fst_checkpoint_file(ck, k);
			if (out)
				complete = complete && file_json(out, f);
			else
				print_file(f, &sum);
			files++;
		}
		fst_checkpoint_close(ck);
	}
	if (as_json) {
		int jrc = cli_print_json("inspect", out, complete);
		if (rc == EXIT_OK)
			rc = jrc;
		json_decref(out);
	} else if (files) {
		print_summary(&sum, files);
	}
	return rc;
}
