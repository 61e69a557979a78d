/* main.c - the fst command: dispatch to one subcommand per file. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const struct {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} commands[] = {
	{"inspect", cmd_inspect, "list the tensors of safetensors files and check them"},
	{"gen", cmd_gen, "write a synthetic checkpoint shaped like a decoder LLM"},
	{"load", cmd_load, "load a checkpoint into CPU or GPU memory and report the speed"},
	{"verify", cmd_verify, "load, then compare every byte with a plain read of the files"},
	{"bench", cmd_bench, "compare fst with the machine's limits and the reference loader"},
	{"doctor", cmd_doctor, "what this machine offers fst, and what a load would do and why"},
};

static void usage(FILE *out)
{
	fprintf(out, "usage: fst [--version] [--help] COMMAND [ARGS]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].summary);
	fprintf(out, "\n'fst COMMAND --help' describes a command. Exit codes: docs/cli.md.\n");
}

int main(int argc, char **argv)
{
	cli_init_output();
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	const char *cmd = argv[1];
	if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
		usage(stdout);
		return cli_finish_output("help", EXIT_OK);
	}
	if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
		/* the distribution that ships the command, as pip knows it */
		printf("fst %s (fst-loader)\n", fst_version());
		return cli_finish_output("version", EXIT_OK);
	}
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		if (!strcmp(cmd, commands[i].name)) {
			/* getopt names its errors by argv[0]: "fst load: ...", as
			 * the command's own errors are */
			char prog[32];
			snprintf(prog, sizeof prog, "fst %s", cmd);
			argv[1] = prog;
			return cli_finish_output(cmd, commands[i].run(argc - 1, argv + 1));
		}
	fprintf(stderr, "fst: unknown command \"%s\"\n", cmd);
	usage(stderr);
	return EXIT_USAGE;
}
