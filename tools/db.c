/*
 * db.c — which database the tool talks to: --dsn / PAWL_DSN, or the embedded default, the
 * private PostgreSQL of the working directory run by the pawl-pg script installed next to the
 * binary. The default is started when it is not running and announced once on stderr, with the
 * DSN it resolved to (DSNs are always printed through the redactor: no password reaches a
 * terminal or a log).
 */
#include "tool.h"

#include "dsn.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const char *tool_dsn_printable(const char *dsn)
{
    static char out[1024];
    return pawl_dsn_redact(dsn, out, sizeof out);
}

/* The pawl-pg script beside this executable, else the one on PATH. */
static void find_pg_script(char *out, size_t outlen)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(out, outlen, "%s/pawl-pg", self);
            if (access(out, X_OK) == 0)
                return;
        }
    }
    snprintf(out, outlen, "pawl-pg");
}

/* Run `script arg`, capturing the first line of stdout into out (may be NULL); the exit status. */
static int run_script(const char *script, const char *arg, char *out, size_t outlen)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execlp(script, script, arg, (char *)NULL);
        fprintf(stderr, "pawl: cannot run %s: %s\n", script, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    char buf[2048];
    size_t used = 0;
    ssize_t r;
    while ((r = read(fds[0], buf + used, sizeof buf - 1 - used)) > 0 || (r < 0 && errno == EINTR))
        if (r > 0)
            used += (size_t)r;
    buf[used] = '\0';
    close(fds[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (out && outlen) {
        char *nl = strchr(buf, '\n');
        if (nl)
            *nl = '\0';
        snprintf(out, outlen, "%s", buf);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

const char *tool_dsn(struct pawl_config *cfg)
{
    static char dsn[2048];
    static int announced;
    if (cfg->dsn && cfg->dsn[0]) {
        PAWL_DEBUG("tool", "database: %s", tool_dsn_printable(cfg->dsn));
        return cfg->dsn;
    }
    char script[PATH_MAX + 16];
    find_pg_script(script, sizeof script);
    int started = 0;
    if (run_script(script, "status", NULL, 0) != 0) {
        if (run_script(script, "start", NULL, 0) != 0) {
            tool_err("no --dsn or PAWL_DSN given, and the private PostgreSQL did not start (%s "
                     "start failed; see its message above)",
                     script);
            return NULL;
        }
        started = 1;
    }
    if (run_script(script, "dsn", dsn, sizeof dsn) != 0 || dsn[0] == '\0') {
        tool_err("cannot get the private PostgreSQL's DSN from %s", script);
        return NULL;
    }
    if (!announced) {
        char cwd[PATH_MAX];
        const char *key = getenv("PAWL_PG_KEY");
        if (key == NULL || key[0] == '\0')
            key = getcwd(cwd, sizeof cwd) ? cwd : ".";
        fprintf(stderr, "pawl: no --dsn or PAWL_DSN: using the private PostgreSQL of %s (%s)%s\n",
                key, tool_dsn_printable(dsn), started ? ", started it" : "");
        announced = 1;
    }
    return dsn;
}
