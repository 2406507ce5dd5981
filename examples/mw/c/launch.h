/* launch.h: the master's worker launches, each one `rsh HOST 'EXE' --worker …` in the
 * background (a request for one more host while tasks wait). */
#ifndef MW_LAUNCH_H
#define MW_LAUNCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
    L_STARTING,  /* rsh runs, its worker has not said hello: a host asked for */
    L_JOINED,    /* its worker said hello */
    L_CANCELLED, /* no longer wanted: rsh told to end (a waiting rsh cancels its request) */
    L_ENDED,     /* rsh exited and was reaped */
} launch_state;

typedef struct {
    pid_t pid;
    launch_state state;
} launch_t;

typedef struct {
    launch_t *v;
    size_t n, cap;
    char exe[4096];   /* this binary's absolute path (a granted host's PATH lacks it) */
    const char *host; /* the symbolic host name: anyLinux */
    char addrs[512];  /* the master's ADDR:PORT list */
    char token[33];   /* the job's secret for the worker's hello */
    unsigned failures;       /* launches in a row that ended before their worker said hello */
    uint64_t retry_at;       /* no new launch before this (ms, monotonic) after a failure */
} launcher;

int launcher_init(launcher *l, const char *host, const char *addrs, char *err, size_t errsize);
/* Starts one more launch; -1 when fork fails. */
int launch_one(launcher *l);
size_t launches_starting(const launcher *l);
/* Cancels the `n` newest launches whose worker has not said hello. */
void launches_cancel(launcher *l, size_t n);
/* The worker of launch `k` said hello; 0 if k is one of ours. */
int launch_joined(launcher *l, uint32_t k);
/* Reaps ended rsh processes; counts the failures (ended before hello, not cancelled). */
void launches_reap(launcher *l);
/* Ends every rsh still running (SIGTERM) and reaps them, waiting at most `ms`. */
void launches_end(launcher *l, int ms);

#endif
