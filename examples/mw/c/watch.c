/* watch.c: the master's view of the job's JEL stream. A thread reads the stream (a
 * connection of its own, from seq 1) and writes what the master acts on to a pipe, one
 * short line per fact, so the master's poll loop reads it like any socket:
 *   vacate HOST        the broker takes HOST back (a worker there is given up at once)
 *   vacated ID         member ID was on that host
 *   gone ID KIND       member ID left, or died (KIND: left, exited, killed, vacated, …)
 *   end                the stream ended (the pool is gone)                              */
#define _GNU_SOURCE
#include "watch.h"
#include "jel.h"
#include "mw.h"

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int say(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int say(int fd, const char *fmt, ...) {
    char line[400];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line) return -1;
    return write(fd, line, (size_t)n) == n ? 0 : -1; /* < PIPE_BUF: one atomic write */
}

/* Forwards one event; -1 when the master is gone (the pipe is closed). */
static int forward(int fd, const jel_event *ev) {
    const char *json = ev->json;
    char text[257];
    uint64_t id;
    if (!strcmp(ev->kind, "vacate")) {
        if (json_str(json_key(json, "host"), text, sizeof text) || say(fd, "vacate %s\n", text))
            return -1;
        const char *p = json_key(json, "members");
        if (!p || *p != '[') return 0;
        for (p++; *p == '{' || *p == ',' || *p == ' ';) {
            if (*p != '{') {
                p++;
                continue;
            }
            if (!json_member_id(p, &id) && say(fd, "vacated %" PRIu64 "\n", id)) return -1;
            if (!(p = json_skip(p))) break;
        }
        return 0;
    }
    if (!strcmp(ev->kind, "left") || !strcmp(ev->kind, "died")) {
        if (json_member_id(json_key(json, "member"), &id)) return 0;
        if (json_str(json_key(json, "reason"), text, sizeof text)) strcpy(text, ev->kind);
        return say(fd, "gone %" PRIu64 " %s\n", id, text);
    }
    return 0;
}

typedef struct {
    jel_conn *conn;
    int fd;
} watch_arg;

static void *watch_thread(void *raw) {
    watch_arg *a = raw;
    jel_event ev;
    while (jel_next_event(a->conn, &ev) == 0) {
        int ok = forward(a->fd, &ev);
        jel_event_free(&ev);
        if (ok) return NULL;
    }
    say(a->fd, "end\n");
    return NULL;
}

int watch_start(int *read_fd) {
    static watch_arg arg;
    int fds[2];
    jel_conn *conn = jel_connect(NULL);
    if (!conn || jel_watch(conn, 1)) return -1;
    if (pipe2(fds, O_CLOEXEC)) return -1;
    arg.conn = conn;
    arg.fd = fds[1];
    pthread_t t;
    if (pthread_create(&t, NULL, watch_thread, &arg)) return -1;
    pthread_detach(t);
    *read_fd = fds[0];
    return 0;
}
