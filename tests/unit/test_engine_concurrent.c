/* Description: concurrent loads of one checkpoint: four threads, one per io
 * method, each loading it five times with two reader threads of its own;
 * every tensor equals the file. */
#include "format.h"
#include "load_helpers.h"

#include <pthread.h>

struct concurrent {
	const fst_checkpoint *ck;
	const lh_files *fs;
	int io;
	int rc;
	char msg[FST_ERROR_MSG_MAX];
};

static void *load_thread(void *arg)
{
	struct concurrent *c = arg;
	for (int i = 0; i < 5 && !c->rc; i++) {
		fst_load_opts o;
		fst_load_opts_init(&o);
		/* the probe ran before the threads */
		o.io = lh_io_skipped(c->io) ? FST_IO_PREAD : c->io;
		o.threads = 2;
		o.chunk_bytes = 8192;
		fst_buffer *buf;
		fst_error err;
		if ((c->rc = fst_load(c->ck, &o, &buf, &err))) {
			snprintf(c->msg, sizeof c->msg, "%s", err.message);
			break;
		}
		for (size_t t = 0; t < fst_buffer_tensor_count(buf); t++) {
			fst_tensor_view v;
			fst_buffer_tensor(buf, t, &v);
			fst_tensor_info info;
			const unsigned char *want = lh_expected(c->ck, c->fs, t, &info);
			if (memcmp(v.data, want, info.nbytes)) {
				c->rc = -100;
				snprintf(c->msg, sizeof c->msg, "tensor %s differs", info.name);
			}
			fst_view_release(&v);
		}
		fst_buffer_release(buf);
	}
	return NULL;
}

static void test_concurrent_loads(void **state)
{
	(void)state;
	lh_shape sh = {3, 12, 200000, 20, 5, false};
	lh_ckpt lc;
	lh_write_random("concurrent", lh_base_seed() + 99, &sh, &lc);
	fst_checkpoint *ck = lh_open(lc.path);
	lh_files fs;
	lh_files_read(ck, &fs);
	struct concurrent c[4];
	pthread_t th[4];
	lh_uring_probe();
	for (int i = 0; i < 4; i++) {
		c[i] = (struct concurrent){ck, &fs, i, 0, ""};
		assert_int_equal(pthread_create(&th[i], NULL, load_thread, &c[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		if (c[i].rc)
			fail_msg("io=%s: %d: %s", lh_io_name(c[i].io), c[i].rc, c[i].msg);
	}
	lh_files_free(&fs);
	fst_checkpoint_close(ck);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_concurrent_loads),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
