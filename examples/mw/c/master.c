/* master.c: the master. It joins the job's pool, stands in the uniform election `master`
 * (the winner is the master; a second rb-mw in the same job exits 1), splits [0, N) in T
 * tasks, listens on TCP and, while tasks wait, keeps one `rsh HOST rb-mw --worker …` asked
 * per waiting task (launch.c). Every task is counted exactly once: a result counts only
 * from the worker the task is assigned to now; a task goes back to the queue when its
 * worker's host is vacated (`vacate`: at once, before the SIGTERM), when its worker leaves
 * or dies (`left`, `died`), or when its connection drops; a late result is ignored. */
#define _GNU_SOURCE
#include "jel.h"
#include "launch.h"
#include "mw.h"
#include "watch.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { T_PENDING, T_RUNNING, T_DONE };

/* Why a task went back to the queue (counted apart in the summary): its worker's host was
 * vacated; its worker's pool member died or left; its worker's connection was lost. */
enum { BY_VACATE, BY_DEATH, BY_CONNECTION, CAUSES };

typedef struct {
    uint64_t lo, hi;
    int state;
    int worker; /* the slot it runs on (T_RUNNING) */
} task_t;

typedef struct {
    int used, hello, given_up; /* given_up: vacated, gone or told to quit: no more tasks */
    line_conn conn;
    uint64_t member;
    char host[256];
    int pid;
    int task;       /* -1: none */
    uint64_t since; /* accepted at (ms, monotonic) */
} worker_t;

#define MAX_WORKERS 1024
/* A connection that has not said hello within this many ms is not one of our workers. */
#define HELLO_MS 10000
/* A launch that failed this many times in a row, with no worker ever connected: give up. */
#define MAX_FAILURES 5

typedef struct {
    const master_opts *o;
    task_t *tasks;
    uint32_t done, runs, redone, redone_by[CAUSES];
    long total;
    worker_t w[MAX_WORKERS];
    launcher launch;
    int listen_fd, events_fd;
    line_conn events;
    int ever_joined;
} master;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("rb-mw: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- tasks ---- */

static void assign(master *m, int slot) {
    worker_t *w = &m->w[slot];
    if (!w->hello || w->given_up || w->task >= 0) return;
    for (uint32_t i = 0; i < m->o->tasks; i++) {
        task_t *t = &m->tasks[i];
        if (t->state != T_PENDING) continue;
        t->state = T_RUNNING, t->worker = slot, w->task = (int)i, m->runs++;
        say("task %u [%" PRIu64 ",%" PRIu64 ") to worker pid %d (member %" PRIu64 ") on %s", i,
            t->lo, t->hi, w->pid, w->member, w->host);
        if (line_send(w->conn.fd, "task %u %" PRIu64 " %" PRIu64 " %u", i, t->lo, t->hi,
                      m->o->task_ms) == 0)
            return;
        t->state = T_PENDING, w->task = -1;
        return; /* its connection is broken: the poll loop drops it */
    }
    /* Nothing waits: the worker quits and its host goes back to the broker. */
    w->given_up = 1;
    line_send(w->conn.fd, "quit");
}

/* The worker in `slot` no longer holds its task: back to the queue, unless it is done. */
static void requeue(master *m, int slot, int cause, const char *why) {
    worker_t *w = &m->w[slot];
    if (w->task < 0) return;
    task_t *t = &m->tasks[w->task];
    if (t->state == T_RUNNING && t->worker == slot) {
        t->state = T_PENDING, m->redone++, m->redone_by[cause]++;
        say("task %d re-queued: worker pid %d (member %" PRIu64 ") %s", w->task, w->pid,
            w->member, why);
    }
    w->task = -1;
}

static void drop(master *m, int slot, int cause, const char *why) {
    requeue(m, slot, cause, why);
    close(m->w[slot].conn.fd);
    m->w[slot].used = 0;
}

static void on_result(master *m, int slot, unsigned id, long count) {
    worker_t *w = &m->w[slot];
    task_t *t = id < m->o->tasks ? &m->tasks[id] : NULL;
    if (!t || w->given_up || t->state != T_RUNNING || t->worker != slot || w->task != (int)id) {
        say("result of task %u from worker pid %d ignored (not its task now)", id, w->pid);
        if (w->task < 0) assign(m, slot); /* a worker still wanted gets work (or quit) */
        return;
    }
    t->state = T_DONE, w->task = -1, m->done++, m->total += count;
    assign(m, slot);
}

/* ---- workers' lines ---- */

static void on_hello(master *m, int slot, const char *line) {
    worker_t *w = &m->w[slot];
    char token[64];
    unsigned launch;
    if (sscanf(line, "hello %63s %u %" SCNu64 " %255s %d", token, &launch, &w->member, w->host,
               &w->pid) != 5 ||
        strcmp(token, m->launch.token) || launch_joined(&m->launch, launch)) {
        say("a connection that is not one of our workers: dropped");
        drop(m, slot, BY_CONNECTION, "refused");
        return;
    }
    w->hello = 1, m->ever_joined = 1;
    say("worker pid %d (member %" PRIu64 ", host %s) joined", w->pid, w->member, w->host);
    assign(m, slot);
}

static void on_worker_line(master *m, int slot, const char *line) {
    unsigned id;
    long count;
    if (!m->w[slot].hello)
        on_hello(m, slot, line);
    else if (sscanf(line, "result %u %ld", &id, &count) == 2)
        on_result(m, slot, id, count);
    else
        drop(m, slot, BY_CONNECTION, "sent a bad line");
}

static void read_worker(master *m, int slot) {
    char line[512];
    int got = line_fill(&m->w[slot].conn), took = 0;
    while (m->w[slot].used && (took = line_take(&m->w[slot].conn, line, sizeof line)) > 0)
        on_worker_line(m, slot, line);
    if (m->w[slot].used && (got <= 0 || took < 0))
        drop(m, slot, BY_CONNECTION, got == 0 ? "disconnected" : "broke the protocol");
}

static void accept_worker(master *m) {
    int fd = accept4(m->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    for (int i = 0; i < MAX_WORKERS; i++)
        if (!m->w[i].used) {
            m->w[i] = (worker_t){.used = 1, .task = -1, .conn = {.fd = fd}, .since = now_ms()};
            return;
        }
    close(fd);
}

/* Drops the connections that did not say hello in time (they hold a slot otherwise). */
static void drop_silent(master *m) {
    uint64_t now = now_ms();
    for (int i = 0; i < MAX_WORKERS; i++)
        if (m->w[i].used && !m->w[i].hello && now - m->w[i].since > HELLO_MS) {
            say("a connection that said no hello in %d ms: dropped", HELLO_MS);
            drop(m, i, BY_CONNECTION, "said no hello");
        }
}

/* ---- the pool's events (watch.c) ---- */

static void give_up(master *m, int slot, const char *why) {
    requeue(m, slot, BY_VACATE, why);
    if (!m->w[slot].given_up) line_send(m->w[slot].conn.fd, "quit");
    m->w[slot].given_up = 1;
}

static void on_event(master *m, const char *line) {
    char host[257], kind[64];
    uint64_t id;
    if (!strncmp(line, "vacate ", 7) && sscanf(line + 7, "%256s", host) == 1) {
        say("the broker takes %s back", host);
        for (int i = 0; i < MAX_WORKERS; i++)
            if (m->w[i].used && m->w[i].hello && !strcmp(m->w[i].host, host))
                give_up(m, i, "is on a vacated host");
    } else if (!strncmp(line, "vacated ", 8) && sscanf(line + 8, "%" SCNu64, &id) == 1) {
        for (int i = 0; i < MAX_WORKERS; i++)
            if (m->w[i].used && m->w[i].hello && m->w[i].member == id)
                give_up(m, i, "is on a vacated host");
    } else if (!strncmp(line, "gone ", 5) && sscanf(line + 5, "%" SCNu64 " %63s", &id, kind) == 2) {
        for (int i = 0; i < MAX_WORKERS; i++) {
            if (!m->w[i].used || !m->w[i].hello || m->w[i].member != id) continue;
            read_worker(m, i); /* a result it sent before it left still counts */
            if (m->w[i].used)
                drop(m, i, BY_DEATH, !strcmp(kind, "left") ? "left the pool" : "died");
        }
    }
}

static int read_events(master *m) {
    char line[512];
    int got = line_fill(&m->events), took = 0;
    while ((took = line_take(&m->events, line, sizeof line)) > 0) {
        if (!strcmp(line, "end")) return -1;
        on_event(m, line);
    }
    return got <= 0 || took < 0 ? -1 : 0;
}

/* ---- growing ---- */

static void grow(master *m) {
    long waiting = 0, idle = 0;
    for (uint32_t i = 0; i < m->o->tasks; i++) waiting += m->tasks[i].state == T_PENDING;
    for (int i = 0; i < MAX_WORKERS; i++)
        idle += m->w[i].used && m->w[i].hello && !m->w[i].given_up && m->w[i].task < 0;
    long starting = (long)launches_starting(&m->launch), alive = 0;
    for (int i = 0; i < MAX_WORKERS; i++) alive += m->w[i].used && !m->w[i].given_up;
    long want = waiting - idle - starting;
    if (want < 0) launches_cancel(&m->launch, (size_t)-want);
    /* Never more than --max-workers alive or asked for: T waiting tasks are not T rsh. */
    long room = (long)m->o->max_workers - alive - starting;
    if (want > room) want = room;
    for (; want > 0 && now_ms() >= m->launch.retry_at; want--)
        if (launch_one(&m->launch)) {
            say("cannot start rsh: %s", strerror(errno));
            break;
        }
}

/* ---- the loop ---- */

static int loop(master *m) {
    struct pollfd fds[MAX_WORKERS + 2];
    int slot_of[MAX_WORKERS + 2];
    while (m->done < m->o->tasks) {
        launches_reap(&m->launch);
        if (!m->ever_joined && m->launch.failures >= MAX_FAILURES) {
            say("%u worker launches in a row failed and none ever reached the master: giving "
                "up (see the errors above)", m->launch.failures);
            return MW_EXIT_FAIL;
        }
        grow(m);
        drop_silent(m);
        int n = 0;
        fds[n++] = (struct pollfd){.fd = m->listen_fd, .events = POLLIN};
        fds[n++] = (struct pollfd){.fd = m->events_fd, .events = POLLIN};
        for (int i = 0; i < MAX_WORKERS; i++)
            if (m->w[i].used) slot_of[n] = i, fds[n++] = (struct pollfd){.fd = m->w[i].conn.fd, .events = POLLIN};
        if (poll(fds, (nfds_t)n, 100) < 0 && errno != EINTR) return MW_EXIT_FAIL;
        if (fds[0].revents) accept_worker(m);
        if (fds[1].revents && read_events(m)) {
            say("the job's pool ended the stream before the tasks were done");
            return MW_EXIT_FAIL;
        }
        for (int i = 2; i < n; i++)
            if (fds[i].revents && m->w[slot_of[i]].used) read_worker(m, slot_of[i]);
    }
    return 0;
}

/* Every task is done: tells the workers to quit and waits (at most FINISH_MS) for their
 * connections to close, reading what they still send (a given-up worker's late result is
 * ignored, and said so), then for the rsh processes. */
#define FINISH_MS 5000
static void finish(master *m) {
    struct pollfd fds[MAX_WORKERS];
    int slot_of[MAX_WORKERS];
    uint64_t deadline = now_ms() + FINISH_MS;
    for (int i = 0; i < MAX_WORKERS; i++)
        if (m->w[i].used && !m->w[i].hello)
            drop(m, i, BY_CONNECTION, "said no hello");
        else if (m->w[i].used && !m->w[i].given_up)
            line_send(m->w[i].conn.fd, "quit");
    for (uint64_t now = now_ms(); now < deadline; now = now_ms()) {
        int n = 0;
        for (int i = 0; i < MAX_WORKERS; i++)
            if (m->w[i].used) slot_of[n] = i, fds[n++] = (struct pollfd){.fd = m->w[i].conn.fd, .events = POLLIN};
        if (!n) break;
        if (poll(fds, (nfds_t)n, (int)(deadline - now)) < 0 && errno != EINTR) break;
        for (int i = 0; i < n; i++)
            if (fds[i].revents && m->w[slot_of[i]].used) read_worker(m, slot_of[i]);
    }
    launches_end(&m->launch, (int)(deadline > now_ms() ? deadline - now_ms() : 0) + 1000);
    say("%u tasks done in %u runs (%u re-queued): %u at a vacate, %u at a death, %u at a lost "
        "connection", m->o->tasks, m->runs, m->redone, m->redone_by[BY_VACATE],
        m->redone_by[BY_DEATH], m->redone_by[BY_CONNECTION]);
}

/* Joins and wins the election; -1 (message said) otherwise. */
static int elect(jel_conn *me, int *code) {
    jel_member self, winner;
    uint64_t epoch;
    int won;
    if (jel_join(me, "master", &self) || (won = jel_elect(me, "master", &winner, &epoch)) < 0) {
        say("%s", jel_error());
        *code = jel_exit_code();
        return -1;
    }
    if (!won || winner.id != self.id) {
        say("member %" PRIu64 " (pid %u on %s) is this job's master already; one rb-mw master "
            "per job", winner.id, winner.pid, winner.host);
        *code = MW_EXIT_FAIL;
        return -1;
    }
    say("elected master (member %" PRIu64 ", epoch %" PRIu64 ")", self.id, epoch);
    return 0;
}

int run_master(const master_opts *o) {
    static master m;
    int code = MW_EXIT_FAIL;
    char addrs[512], err[256];
    signal(SIGPIPE, SIG_IGN);
    jel_conn *me = jel_connect(NULL);
    if (!me) {
        say("%s", jel_error());
        return jel_exit_code();
    }
    if (elect(me, &code)) return code;
    if (watch_start(&m.events_fd)) {
        say("cannot watch the job's pool: %s", jel_error());
        return jel_exit_code() ? jel_exit_code() : MW_EXIT_FAIL;
    }
    fcntl(m.events_fd, F_SETFL, O_NONBLOCK);
    m.events.fd = m.events_fd;
    if ((m.listen_fd = tcp_listen(o->address, addrs, sizeof addrs, err, sizeof err)) < 0 ||
        launcher_init(&m.launch, o->host, addrs, err, sizeof err)) {
        say("%s", err);
        return MW_EXIT_FAIL;
    }
    say("master listening on %s; %u tasks", addrs, o->tasks);
    m.o = o;
    if (!(m.tasks = calloc(o->tasks, sizeof *m.tasks))) return MW_EXIT_FAIL;
    for (uint32_t i = 0; i < o->tasks; i++)
        m.tasks[i] = (task_t){.lo = o->primes_below * i / o->tasks,
                              .hi = o->primes_below * (i + 1) / o->tasks};
    if ((code = loop(&m))) {
        launches_end(&m.launch, 2000);
        return code;
    }
    finish(&m);
    printf("primes=%ld\n", m.total);
    fflush(stdout);
    jel_leave(me);
    jel_close(me);
    return 0;
}
