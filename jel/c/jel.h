/* jel.h: the JEL (Join-Elect-Leave) client of ResourceBroker jobs, in C with nothing but libc
 * (libjel.so). It speaks the protocol of PROTOCOL.md, section "JEL", over the Unix socket
 * named by $RB_JEL, after checking with SO_PEERCRED that it is served by our own uid.
 *
 * Every call is blocking. On failure a call returns -1 (or NULL) and jel_error() says what
 * happened and what to do; jel_exit_code() is what a program should exit with: 2 outside a
 * job ("not inside a ResourceBroker job"), 1 when the pool refused the request, 77 when the
 * socket is served by another uid, 69 when the pool cannot be reached or talked to.
 *
 *   jel_conn *me = jel_connect(NULL);              // a connection to the job's pool
 *   jel_member self, boss; uint64_t epoch;
 *   jel_join(me, "worker", &self);                 // it now carries the member
 *   jel_elect(me, "master", &boss, &epoch);        // 1: boss is the winner
 *   jel_conn *w = jel_connect(NULL);               // watch on a connection of its own
 *   jel_watch(w, 1);
 *   jel_event ev;
 *   while (jel_next_event(w, &ev) == 0) { puts(ev.json); jel_event_free(&ev); }
 */
#ifndef JEL_H
#define JEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct jel_conn jel_conn;

/* A member: {"id", "name" (a string or null), "host", "pid"}. */
typedef struct {
    uint64_t id;
    int has_name;
    char name[257];
    char host[256];
    uint32_t pid;
} jel_member;

/* One event of the stream: its seq, its kind ("joined", "died"…) and the whole line as the
 * pool sent it (without the newline), malloc'd: free it with jel_event_free. */
typedef struct {
    uint64_t seq;
    char kind[32];
    char *json;
} jel_event;

/* Connects to the pool at `path`, or at $RB_JEL when `path` is NULL, and says hello. */
jel_conn *jel_connect(const char *path);
/* Closes the connection (a member's without leave: the pool reports it died, exited). */
void jel_close(jel_conn *c);

/* Joins with `name` (NULL: none); `self` (may be NULL) receives the member. */
int jel_join(jel_conn *c, const char *name, jel_member *self);
/* Leaves the pool (the connection stays open for requests). */
int jel_leave(jel_conn *c);
/* Stands as a candidate; returns 1 and fills `winner` (may be NULL) when there is a winner,
 * 0 when none; `epoch` (may be NULL) receives the election's epoch. */
int jel_elect(jel_conn *c, const char *name, jel_member *winner, uint64_t *epoch);
/* The winner of `name`, as jel_elect returns it, without standing. */
int jel_result(jel_conn *c, const char *name, jel_member *winner, uint64_t *epoch);
/* Signals `name` to the `nto` members `to` (0: everybody); `payload_json` is a JSON value or
 * NULL. Returns 0. */
int jel_signal(jel_conn *c, const char *name, const uint64_t *to, size_t nto,
               const char *payload_json);

/* Turns the connection into the stream of events with seq >= from. */
int jel_watch(jel_conn *c, uint64_t from);
/* The next event (waiting for it). When the pool cut the connection (a slow reader) it
 * reconnects and resumes at the next seq, once per cut. Returns -1 at the end. */
int jel_next_event(jel_conn *c, jel_event *ev);
void jel_event_free(jel_event *ev);

/* The last error of this thread, and the exit code it calls for. */
const char *jel_error(void);
int jel_exit_code(void);

#ifdef __cplusplus
}
#endif

#endif
