/* mw.h: the parts of rb-mw, the master-worker example application of ResourceBroker
 * (README, "Example applications"). One binary, two roles:
 *   master (the process the agent starts): elected `master` in the job's JEL pool, owns the
 *     task queue, listens on TCP, grows with `rsh anyLinux` while tasks wait, re-queues the
 *     task of a worker that is vacated, dies or leaves;
 *   worker (`--worker ADDRS --token T --launch K`, started by the master on a granted
 *     host): joins the pool as `worker`, connects to the master, runs tasks one at a time.
 * Files: main.c (flags), master.c, worker.c, net.c (TCP lines), json.c (reading JEL
 * events), primes.c (the work). */
#ifndef MW_H
#define MW_H

#include <stddef.h>
#include <stdint.h>

/* Exit codes: 0 done, 1 failed at run time, 64 bad usage; 2/69/77 from libjel. */
#define MW_EXIT_FAIL 1
#define MW_EXIT_USAGE 64

/* The master's arguments. */
typedef struct {
    uint64_t primes_below;
    uint32_t tasks;
    uint32_t task_ms;
    uint32_t max_workers; /* most workers alive or being started at once */
    const char *address; /* advertise only this IPv4 address (NULL: every interface's) */
    const char *host;    /* the symbolic host name workers are started on */
} master_opts;

/* A worker's arguments. */
typedef struct {
    const char *master; /* ADDR:PORT[,ADDR:PORT…] */
    const char *token;
    uint32_t launch;
} worker_opts;

int run_master(const master_opts *o);
int run_worker(const worker_opts *o);

/* primes.c: the number of primes p with lo <= p < hi; 0 and a set *stop break off early
 * (returns -1 then). */
long count_primes(uint64_t lo, uint64_t hi, volatile int *stop);
/* Sleeps until `deadline_ms` (CLOCK_MONOTONIC, ms) or until *stop is set. */
void sleep_until_ms(uint64_t deadline_ms, volatile int *stop);
uint64_t now_ms(void);

/* net.c: newline-terminated lines over a TCP socket. */
typedef struct {
    int fd;
    char buf[1024];
    size_t len;
} line_conn;
/* Reads what is there into the buffer (non-blocking socket): 1 data, 0 EOF, -1 error
 * (EAGAIN included as 1). */
int line_fill(line_conn *c);
/* Takes the next complete line out of the buffer into `out` (without the newline):
 * 1 taken, 0 none yet, -1 an over-long line. */
int line_take(line_conn *c, char *out, size_t size);
/* Writes the whole line (adds the newline); -1 on error. */
int line_send(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A TCP connection to the first of `addrs` (ADDR:PORT[,…]) that answers, each tried for
 * at most `each_ms`; -1 with a message in `err`. */
int tcp_connect_any(const char *addrs, int each_ms, char *err, size_t errsize);
/* A listening socket on all IPv4 interfaces (or `only`), port chosen by the system; its
 * advertised ADDR:PORT list (non-loopback interfaces first) in `addrs`. */
int tcp_listen(const char *only, char *addrs, size_t size, char *err, size_t errsize);

/* json.c: just enough JSON to read JEL events (PROTOCOL.md, "JEL"). */
const char *json_key(const char *obj, const char *key);
const char *json_skip(const char *v);
int json_u64(const char *v, uint64_t *out);
int json_str(const char *v, char *out, size_t size);
/* The id of the member object at `v`; -1 if it is not one. */
int json_member_id(const char *v, uint64_t *id);

#endif
