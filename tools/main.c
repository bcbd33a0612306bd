/*
 * main.c — the `pawl` command-line tool (placeholder entry point until the flag table and
 * subcommands land).
 */
#include "pawl.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("pawl %s\n", PAWL_VERSION);
        return 0;
    }
    fprintf(stderr, "usage: pawl --version\n");
    return 2;
}
