/* worker.c: a worker (`rb-mw --worker ADDRS --token T --launch K`), started by the master
 * with `rsh anyLinux` on a granted host. It joins the job's pool as `worker` (through
 * $RB_JEL, wherever the job puts it), connects to the master, says who it is, and runs
 * the tasks it is given one at a time. SIGTERM (the host is taken back) breaks off the
 * task at hand, but the worker keeps its connection until the master says `quit` (or
 * goes), then leaves the pool and exits 0. The job's stream has the host's `vacate` before
 * the subagent sends SIGTERM, and the master, having re-queued the task at that vacate,
 * says quit: a worker that closed its connection at SIGTERM would race the vacate to the
 * master (which then re-queued the task for a lost connection instead). Without a master
 * to say quit, the SIGKILL at the grace's end ends it. Never writes stdout (through rsh
 * that is the master's stdout, whose last line is the answer). */
#define _GNU_SOURCE
#include "mw.h"
#include "jel.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile int terminated;

static void on_term(int sig) {
    (void)sig;
    terminated = 1;
}

static void catch_term(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term; /* no SA_RESTART: a blocking read returns EINTR */
    sigaction(SIGTERM, &sa, NULL);
}

/* Reads one line from the master (blocking); 1 a line, 0 EOF or SIGTERM, -1 error. */
static int next_line(line_conn *c, char *line, size_t size) {
    for (;;) {
        int took = line_take(c, line, size);
        if (took) return took;
        if (terminated) return 0;
        int got = line_fill(c);
        if (got <= 0) return got;
    }
}

/* After SIGTERM: waits for the master's `quit` (or its loss), running no task it is sent
 * meanwhile (one given before the master saw the vacate; the vacate re-queues it). */
static void await_quit(line_conn *c) {
    char line[256];
    for (;;) {
        int took = line_take(c, line, sizeof line);
        if (took < 0) return;
        if (took && !strcmp(line, "quit")) return;
        if (!took && line_fill(c) <= 0) return; /* EINTR reads as 1: read again */
    }
}

/* Runs one task line ("task ID LO HI MS"); 1 done (result sent), 0 broken off, -1 error. */
static int run_task(int fd, const char *line) {
    unsigned id, ms;
    uint64_t lo, hi;
    if (sscanf(line, "task %u %" SCNu64 " %" SCNu64 " %u", &id, &lo, &hi, &ms) != 4) {
        fprintf(stderr, "rb-mw worker: the master sent `%s`, not a task\n", line);
        return -1;
    }
    uint64_t deadline = now_ms() + ms;
    long count = count_primes(lo, hi, &terminated);
    if (count < 0 && !terminated) {
        fprintf(stderr, "rb-mw worker: out of memory for task %u\n", id);
        return -1;
    }
    sleep_until_ms(deadline, &terminated);
    if (terminated) return 0;
    return line_send(fd, "result %u %ld", id, count) ? -1 : 1;
}

int run_worker(const worker_opts *o) {
    catch_term();
    jel_conn *me = jel_connect(NULL);
    jel_member self;
    if (!me || jel_join(me, "worker", &self)) {
        fprintf(stderr, "rb-mw worker: %s\n", jel_error());
        return jel_exit_code();
    }
    if (terminated) { /* taken back before it had any work: nothing to hand on */
        jel_leave(me);
        jel_close(me);
        return 0;
    }
    char err[256];
    int fd = tcp_connect_any(o->master, 2000, err, sizeof err);
    if (fd < 0 || line_send(fd, "hello %s %u %" PRIu64 " %s %d", o->token, o->launch, self.id,
                            self.host, (int)getpid())) {
        fprintf(stderr, "rb-mw worker: %s\n", fd < 0 ? err : "cannot write to the master");
        jel_leave(me);
        return MW_EXIT_FAIL;
    }
    line_conn conn = {.fd = fd};
    char line[256];
    int status = 0, got, told_quit = 0;
    while ((got = next_line(&conn, line, sizeof line)) > 0) {
        if ((told_quit = !strcmp(line, "quit"))) break;
        int ran = run_task(fd, line);
        if (ran <= 0) {
            status = ran < 0 ? MW_EXIT_FAIL : 0;
            break;
        }
    }
    if (got < 0) status = MW_EXIT_FAIL;
    if (terminated && !told_quit && status == 0) await_quit(&conn);
    close(fd);
    jel_leave(me);
    jel_close(me);
    return status;
}
