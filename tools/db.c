/*
 * db.c — which database the tool talks to, in this order:
 *   1. --dsn, else PAWL_DSN;
 *   2. libpq's own environment, when any of its connection variables is set (PGHOST, PGHOSTADDR,
 *      PGPORT, PGDATABASE, PGUSER, PGPASSWORD, PGPASSFILE, PGSERVICE, PGSERVICEFILE): the DSN is
 *      then the empty string, which makes libpq read them exactly as psql would;
 *   3. the embedded default: the private PostgreSQL run by the pawl-pg script installed next to
 *      the binary, one per user (or per project folder with PAWL_PG_KEY), never per working
 *      folder. It is started when it is not running, and then announced once on stderr, with
 *      where it lives and how to stop it (at debug when it was running already).
 * DSNs are always printed through the redactor: no password reaches a terminal or a log. A
 * password given in argv (--dsn) is visible to every local user in the process list: it is
 * warned about once.
 */
#include "tool.h"

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

/* libpq's connection variables: any one set means "connect where libpq's environment says". */
static const char *const libpq_vars[] = {"PGHOST",        "PGHOSTADDR", "PGPORT",     "PGDATABASE",
                                         "PGUSER",        "PGPASSWORD", "PGPASSFILE", "PGSERVICE",
                                         "PGSERVICEFILE", NULL};

/* The first libpq connection variable set (non-empty), or NULL. */
static const char *libpq_env_var(void)
{
    for (int i = 0; libpq_vars[i]; i++) {
        const char *v = getenv(libpq_vars[i]);
        if (v && v[0])
            return libpq_vars[i];
    }
    return NULL;
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

/* Run `script arg`, capturing the first line of stdout into out (may be NULL); the exit status.
 * stdout of the script never reaches ours (the tool's stdout carries results). */
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

/* How to stop the private cluster, as a command line. */
static void stop_command(const char *script, char *out, size_t outlen)
{
    const char *dir = getenv("PAWL_PG_DIR"), *key = getenv("PAWL_PG_KEY");
    if (dir && dir[0])
        snprintf(out, outlen, "PAWL_PG_DIR=%s %s stop", dir, script);
    else if (key && key[0])
        snprintf(out, outlen, "PAWL_PG_KEY=%s %s stop", key, script);
    else
        snprintf(out, outlen, "%s stop", script);
}

void tool_dsn_warn_argv(const struct tool_config *cfg)
{
    static int warned;
    if (warned || cfg->lib.dsn == NULL || tool_config_source_of(cfg, "dsn") != PAWL_SRC_FLAG ||
        !pawl_dsn_has_password(cfg->lib.dsn))
        return;
    warned = 1;
    fprintf(stderr,
            "pawl: warning: the password in --dsn is visible to every local user in the process "
            "list (ps); give it through PGPASSWORD, a password file (PGPASSFILE, or passfile= in "
            "the DSN) or PAWL_DSN instead\n");
}

void tool_dsn_explain_nodb(const struct tool_config *cfg)
{
    if ((cfg->lib.dsn && cfg->lib.dsn[0]) || libpq_env_var() == NULL)
        return;
    char vars[256] = "";
    size_t used = 0;
    for (int i = 0; libpq_vars[i] && used < sizeof vars; i++) {
        const char *v = getenv(libpq_vars[i]);
        if (v && v[0]) {
            int w =
                snprintf(vars + used, sizeof vars - used, "%s%s", used ? ", " : "", libpq_vars[i]);
            used += w > 0 ? (size_t)w : 0;
        }
    }
    tool_err("%s from the environment chose the database (no --dsn or PAWL_DSN given): check "
             "them, or give --dsn",
             vars);
}

const char *tool_dsn(struct tool_config *cfg)
{
    static char dsn[2048];
    static int announced;
    if (cfg->lib.dsn && cfg->lib.dsn[0]) {
        pawl_log(PAWL_LOG_DEBUG, "tool", "database: %s (%s)", tool_dsn_printable(cfg->lib.dsn),
                 tool_config_source_of(cfg, "dsn") == PAWL_SRC_FLAG ? "--dsn" : "PAWL_DSN");
        return cfg->lib.dsn;
    }
    const char *var = libpq_env_var();
    if (var) {
        pawl_log(PAWL_LOG_DEBUG, "tool", "database: libpq's environment (%s is set): %s", var,
                 tool_dsn_printable(""));
        return "";
    }
    char script[PATH_MAX + 16];
    find_pg_script(script, sizeof script);
    int started = 0;
    if (run_script(script, "status", NULL, 0) != 0) {
        if (run_script(script, "start", NULL, 0) != 0) {
            tool_err("no --dsn, PAWL_DSN or PG* variable given, and the private PostgreSQL did "
                     "not start (%s start failed; see its message above)",
                     script);
            return NULL;
        }
        started = 1;
    }
    char dir[PATH_MAX];
    if (run_script(script, "dsn", dsn, sizeof dsn) != 0 || dsn[0] == '\0' ||
        run_script(script, "dir", dir, sizeof dir) != 0) {
        tool_err("cannot get the private PostgreSQL's DSN from %s", script);
        return NULL;
    }
    if (!announced) {
        /* Said when this command started the cluster (with how to stop it); otherwise at debug
         * (`pawl config` says which database every command uses, and why). */
        char stop[PATH_MAX * 2 + 64];
        stop_command(script, stop, sizeof stop);
        if (started)
            tool_note("no --dsn or PAWL_DSN: started the private PostgreSQL at %s (%s); stop it "
                      "with: %s",
                      dir, tool_dsn_printable(dsn), stop);
        else
            pawl_log(PAWL_LOG_DEBUG, "tool",
                     "database: no --dsn or PAWL_DSN: the private PostgreSQL at %s (%s)", dir,
                     tool_dsn_printable(dsn));
        announced = 1;
    }
    return dsn;
}

/* JSON string body: escape what JSON requires. */
static void put_json(FILE *out, const char *s)
{
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
}

void tool_dsn_config(const struct tool_config *cfg, FILE *out, int json)
{
    char shown[1024], from[PATH_MAX + 160];
    if (cfg->lib.dsn && cfg->lib.dsn[0]) {
        pawl_dsn_redact(cfg->lib.dsn, shown, sizeof shown);
        snprintf(from, sizeof from, "%s",
                 tool_config_source_of(cfg, "dsn") == PAWL_SRC_FLAG ? "--dsn" : "PAWL_DSN");
    } else if (libpq_env_var()) {
        pawl_dsn_redact("", shown, sizeof shown);
        snprintf(from, sizeof from, "libpq environment (%s is set)", libpq_env_var());
    } else {
        /* Nothing is started here: only where the cluster lives and whether it runs. */
        char script[PATH_MAX + 16], dsn[2048], dir[PATH_MAX];
        find_pg_script(script, sizeof script);
        if (run_script(script, "dsn", dsn, sizeof dsn) != 0 ||
            run_script(script, "dir", dir, sizeof dir) != 0) {
            snprintf(shown, sizeof shown, "(unknown)");
            snprintf(from, sizeof from, "private cluster (%s did not answer)", script);
        } else {
            int running = run_script(script, "status", NULL, 0) == 0;
            pawl_dsn_redact(dsn, shown, sizeof shown);
            snprintf(from, sizeof from, "private cluster at %s (%s)", dir,
                     running ? "running" : "not running; started on first use");
        }
    }
    if (json) {
        fprintf(out, ",\n  \"database\": {\"dsn\": \"");
        put_json(out, shown);
        fprintf(out, "\", \"source\": \"");
        put_json(out, from);
        fprintf(out, "\"}");
    } else {
        fprintf(out, "\ndatabase: %s\n  from: %s\n", shown, from);
    }
}
