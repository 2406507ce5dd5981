/* launch.c: starting workers with `rsh HOST CMD` (the job's shim: a host chosen by the
 * broker now, the command under a subagent there) and following those rsh processes. The
 * worker's command names this binary by its absolute path (/proc/self/exe). rsh gets
 * /dev/null for stdin and the master's stderr for its stdout, so the master's stdout
 * carries nothing but its answer. */
#define _GNU_SOURCE
#include "launch.h"
#include "mw.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int random_token(char *out, size_t size) {
    unsigned char raw[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, raw, sizeof raw) != (ssize_t)sizeof raw) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    for (size_t i = 0; i < sizeof raw && 2 * i + 2 < size; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

int launcher_init(launcher *l, const char *host, const char *addrs, char *err, size_t errsize) {
    memset(l, 0, sizeof *l);
    ssize_t n = readlink("/proc/self/exe", l->exe, sizeof l->exe - 1);
    if (n <= 0 || (size_t)n >= sizeof l->exe - 1) {
        snprintf(err, errsize, "cannot read /proc/self/exe: %s", strerror(errno));
        return -1;
    }
    l->exe[n] = 0;
    if (strpbrk(l->exe, "'\n")) {
        snprintf(err, errsize, "the path of rb-mw (%s) has a quote or newline: move it", l->exe);
        return -1;
    }
    if (random_token(l->token, sizeof l->token)) {
        snprintf(err, errsize, "cannot read /dev/urandom: %s", strerror(errno));
        return -1;
    }
    l->host = host;
    snprintf(l->addrs, sizeof l->addrs, "%s", addrs);
    return 0;
}

/* In the child: stdio set up, then exec rsh (the job's shim is first on PATH). */
static void exec_rsh(const launcher *l, size_t k) {
    char cmd[5000];
    snprintf(cmd, sizeof cmd, "'%s' --worker %s --token %s --launch %zu", l->exe, l->addrs,
             l->token, k);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    dup2(2, 1);
    signal(SIGPIPE, SIG_DFL);
    execlp("rsh", "rsh", l->host, cmd, (char *)NULL);
    fprintf(stderr, "rb-mw: cannot run rsh: %s (is this inside a ResourceBroker job?)\n",
            strerror(errno));
    _exit(127);
}

int launch_one(launcher *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        launch_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v, l->cap = cap;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) exec_rsh(l, l->n);
    l->v[l->n++] = (launch_t){.pid = pid, .state = L_STARTING};
    return 0;
}

size_t launches_starting(const launcher *l) {
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++) n += l->v[i].state == L_STARTING;
    return n;
}

void launches_cancel(launcher *l, size_t n) {
    for (size_t i = l->n; i-- > 0 && n > 0;) {
        if (l->v[i].state != L_STARTING) continue;
        kill(l->v[i].pid, SIGTERM);
        l->v[i].state = L_CANCELLED;
        n--;
    }
}

int launch_joined(launcher *l, uint32_t k) {
    if (k >= l->n) return -1;
    if (l->v[k].state == L_STARTING) l->v[k].state = L_JOINED;
    l->failures = 0;
    return 0;
}

static launch_t *by_pid(launcher *l, pid_t pid) {
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].pid == pid) return &l->v[i];
    return NULL;
}

void launches_reap(launcher *l) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        launch_t *x = by_pid(l, pid);
        if (!x) continue;
        if (x->state == L_STARTING) {
            l->failures++;
            l->retry_at = now_ms() + (500u << (l->failures < 4 ? l->failures : 4));
            fprintf(stderr, "rb-mw: rsh %s ended (%s %d) before its worker reached the master\n",
                    l->host, WIFEXITED(status) ? "exit" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        }
        x->state = L_ENDED;
    }
}

void launches_end(launcher *l, int ms) {
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].state == L_STARTING || l->v[i].state == L_CANCELLED) {
            l->v[i].state = L_CANCELLED;
            kill(l->v[i].pid, SIGTERM);
        }
    uint64_t deadline = now_ms() + (uint64_t)ms;
    volatile int never = 0;
    for (;;) {
        size_t alive = 0;
        launches_reap(l);
        for (size_t i = 0; i < l->n; i++) alive += l->v[i].state != L_ENDED;
        if (!alive || now_ms() >= deadline) return;
        sleep_until_ms(now_ms() + 20, &never);
    }
}
