/*
 * util.c — the tool's shared bits: exit codes, error printing, the stop flag.
 */
#include "tool.h"

#include <stdarg.h>

volatile sig_atomic_t tool_stop;

const struct tool_exit_code tool_exit_codes[] = {
    {TOOL_OK, "success"},
    {TOOL_FAILED, "the operation failed (a database or I/O error; the message says which)"},
    {TOOL_USAGE, "usage: unknown command or flag, a value of the wrong type or out of range"},
    {TOOL_NODB, "cannot reach the database, or cannot start the private PostgreSQL"},
    {TOOL_REFUSED, "refused: segments of the processor are claimed (the message names the "
                   "owners), or a merge is still in progress"},
    {TOOL_NOTFOUND, "not found: no such processor or segment, or no pawl schema (run pawl init)"},
    {TOOL_BADINPUT, "append: an input line is not a valid event (the message names the line)"},
    {-1, NULL},
};

void tool_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("pawl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int tool_exit_for(int rc)
{
    switch (rc) {
    case 0:
        return TOOL_OK;
    case PAWL_EINVAL:
    case PAWL_ERANGE:
        return TOOL_USAGE;
    case PAWL_ECONN:
        return TOOL_NODB;
    case PAWL_EBUSY:
    case PAWL_ECLAIM:
        return TOOL_REFUSED;
    case PAWL_ENOTFOUND:
    case PAWL_ESCHEMA:
        return TOOL_NOTFOUND;
    default:
        return TOOL_FAILED;
    }
}
