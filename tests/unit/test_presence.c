/* Description: other loads of the same files (io/presence.c). A load alone
 * sees no other, its own lock included; a second join in this process, and
 * one in a child process, are seen on every file, and no longer once they
 * leave, or once the child exits without leaving (the lock goes with its
 * descriptors). A lock refused, or too few descriptors under RLIMIT_NOFILE
 * for three a file, leaves a load alone. One that only looks (hold false,
 * as fst_load_explain does) sees the others and is seen by none. */
#include "io.h"
#include "load_helpers.h"

#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static lh_ckpt w;
static struct {
	fst_checkpoint *ck;
} c;

static int group_setup(void **state)
{
	(void)state;
	const lh_shape sh = {3, 6, 4096, 0, 0, false};
	lh_write_random("presence", lh_base_seed() + 3, &sh, &w);
	c.ck = lh_open(w.path);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	fst_checkpoint_close(c.ck);
	return 0;
}

static void assert_seen(const struct fsti_presence *p, bool seen, const char *when)
{
	for (size_t i = 0; i < fst_checkpoint_file_count(c.ck); i++)
		if (fsti_presence_others(p, i) != seen)
			fail_msg("%s: file %zu: another load %s", when, i, seen ? "not seen" : "seen");
	size_t which = 99;
	assert_int_equal(fsti_presence_any(p, &which), seen);
	if (seen)
		assert_int_equal(which, 0);
}

static void test_in_process(void **state)
{
	(void)state;
	struct fsti_presence *a = fsti_presence_join(c.ck, true);
	assert_non_null(a);
	assert_seen(a, false, "alone");
	struct fsti_presence *b = fsti_presence_join(c.ck, true);
	assert_seen(a, true, "a second load");
	assert_seen(b, true, "the second load looking");
	fsti_presence_leave(b);
	assert_seen(a, false, "the second load gone");
	fsti_presence_leave(a);
	assert_false(fsti_presence_any(NULL, NULL));
}

static void test_other_process(void **state)
{
	(void)state;
	struct fsti_presence *a = fsti_presence_join(c.ck, true);
	int ready[2], done[2];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(done), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct fsti_presence *p = fsti_presence_join(c.ck, true);
		char x = fsti_presence_any(p, NULL) ? 'y' : 'n'; /* sees the parent */
		if (write(ready[1], &x, 1) != 1)
			_exit(2);
		if (read(done[0], &x, 1) < 0)
			_exit(2);
		_exit(0); /* without leaving: the exit drops the locks */
	}
	char seen = 0;
	assert_int_equal(read(ready[0], &seen, 1), 1);
	assert_int_equal(seen, 'y');
	assert_seen(a, true, "a load in another process");
	assert_int_equal(write(done[1], "x", 1), 1);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_seen(a, false, "the other process exited");
	fsti_presence_leave(a);
	close(ready[0]);
	close(ready[1]);
	close(done[0]);
	close(done[1]);
}

static void test_looking_without_holding(void **state)
{
	(void)state;
	struct fsti_presence *a = fsti_presence_join(c.ck, true);
	struct fsti_presence *look = fsti_presence_join(c.ck, false);
	assert_non_null(look);
	assert_seen(look, true, "looking at a load");
	assert_seen(a, false, "a load, looked at");
	fsti_presence_leave(a);
	assert_seen(look, false, "looking, the load gone");
	fsti_presence_leave(look);
}

static void test_lock_refused(void **state)
{
	(void)state;
	struct fsti_presence *a = fsti_presence_join(c.ck, true);
	fst_error err;
	assert_int_equal(fst_fault_set("presence:1+", &err), 0);
	struct fsti_presence *b = fsti_presence_join(c.ck, true); /* no lock had */
	assert_int_equal(fst_fault_set(NULL, NULL), 0);
	assert_non_null(b);
	assert_seen(a, false, "the other's lock refused");
	assert_false(fsti_presence_any(b, NULL)); /* without a lock, alone */
	fsti_presence_leave(b);
	fsti_presence_leave(a);
}

/* Descriptors short (RLIMIT_NOFILE too low for three a file): no lock
 * taken, so the load is alone and no other sees it. */
static void test_descriptors_short(void **state)
{
	(void)state;
	struct rlimit old;
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
	struct fsti_presence *a = fsti_presence_join(c.ck, true);
	struct rlimit low = old;
	low.rlim_cur = 3 * fst_checkpoint_file_count(c.ck) + 63;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	struct fsti_presence *b = fsti_presence_join(c.ck, true);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
	assert_false(fsti_presence_any(b, NULL));
	assert_seen(a, false, "a load without room for its locks");
	fsti_presence_leave(b);
	fsti_presence_leave(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_in_process),
		cmocka_unit_test(test_other_process),
		cmocka_unit_test(test_looking_without_holding),
		cmocka_unit_test(test_lock_refused),
		cmocka_unit_test(test_descriptors_short),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
