/* Description: fst_load_sharded checks its options with the one check
 * fst_load makes, before anything else: an options struct that was not
 * initialised (struct_size 0, garbage, or larger than this library's) is
 * refused with fst_load's status and message, before the communicator is
 * used (here there is none), and no buffer is handed out. */
#include "helpers.h"

#include "base.h"

#include <stdio.h>
#include <string.h>

static fst_checkpoint *small_checkpoint(void)
{
	fst_writer *w;
	fst_error err;
	assert_int_equal(fst_writer_new(NULL, &w, &err), 0);
	static const unsigned char data[16];
	uint64_t shape[2] = {2, 2};
	assert_int_equal(fst_writer_add(w, "w", FST_DTYPE_F32, 2, shape, data, sizeof data, &err),
			 0);
	const char *path = test_path("sharded_opts.safetensors");
	assert_int_equal(fst_writer_finish(w, path, &err), 0);
	fst_writer_free(w);
	fst_checkpoint *ck;
	assert_int_equal(fst_checkpoint_open(path, &ck, &err), 0);
	return ck;
}

/* fst_load_sharded (with no comm) fails as fst_load does with o. */
static void expect_same_refusal(const fst_checkpoint *ck, const fst_load_opts *o)
{
	fst_error lerr, serr;
	fst_buffer *lbuf = NULL, *sbuf = (fst_buffer *)&sbuf; /* must be cleared */
	int lrc = fst_load(ck, o, &lbuf, &lerr);
	long allocs = fsti_live_allocations();
	int src = fst_load_sharded(ck, o, NULL, NULL, &sbuf, &serr);
	assert_int_equal(lrc, FST_EUSAGE);
	assert_null(lbuf);
	assert_int_equal(src, lrc);
	assert_int_equal(serr.code, lrc);
	assert_string_equal(serr.message, lerr.message);
	assert_non_null(strstr(serr.message, "fst_load_opts_init"));
	assert_null(sbuf);
	assert_int_equal(fsti_live_allocations(), allocs);
}

static void test_uninitialised_options(void **state)
{
	(void)state;
	fst_checkpoint *ck = small_checkpoint();
	fst_load_opts o;
	memset(&o, 0, sizeof o);
	expect_same_refusal(ck, &o); /* zeroed: struct_size 0 */
	memset(&o, 0xA5, sizeof o);
	expect_same_refusal(ck, &o); /* stack garbage */
	fst_load_opts_init(&o);
	o.struct_size = sizeof o + 8;
	expect_same_refusal(ck, &o); /* a newer library's struct */
	fst_checkpoint_close(ck);
}

/* Options that pass the check go on to the argument checks: the missing
 * comm is named, not the options. */
static void test_good_options_reach_the_comm_check(void **state)
{
	(void)state;
	fst_checkpoint *ck = small_checkpoint();
	fst_load_opts o;
	fst_load_opts_init(&o);
	const fst_load_opts *cases[] = {&o, NULL};
	for (size_t i = 0; i < 2; i++) {
		fst_error err;
		fst_buffer *buf = NULL;
		assert_int_equal(fst_load_sharded(ck, cases[i], NULL, NULL, &buf, &err), FST_EUSAGE);
		assert_non_null(strstr(err.message, "checkpoint, comm and out are required"));
		assert_null(buf);
	}
	/* the rest of the one check applies too */
	o.align = 3;
	fst_error err;
	fst_buffer *buf = NULL;
	assert_int_equal(fst_load_sharded(ck, &o, NULL, NULL, &buf, &err), FST_EUSAGE);
	assert_non_null(strstr(err.message, "align 3 is not a power of two"));
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_uninitialised_options),
		cmocka_unit_test(test_good_options_reach_the_comm_check),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
