/* A C client for tests/c.rs: `member watch N` prints the first N events from seq 1;
 * `member NAME` joins as NAME, stands in "master", prints "WINNER EPOCH MYID", then watches
 * from 1 until a "go" signal addressed to it, prints that line, leaves and exits 0. Any
 * failure: jel_error() on stderr, exit jel_exit_code(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jel.h"

static int die(void) {
    fprintf(stderr, "member: %s\n", jel_error());
    return jel_exit_code();
}

static int watch(long n) {
    jel_conn *w = jel_connect(NULL);
    if (!w || jel_watch(w, 1)) return die();
    jel_event ev;
    for (long i = 0; i < n; i++) {
        if (jel_next_event(w, &ev)) return die();
        printf("%s\n", ev.json);
        fflush(stdout); /* a line at a time: the test reads the first before going on */
        jel_event_free(&ev);
    }
    jel_close(w);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "watch")) return watch(atol(argv[2]));
    if (argc != 2) return 64;
    jel_conn *me = jel_connect(NULL);
    if (!me) return die();
    jel_member self, winner;
    uint64_t epoch;
    if (jel_join(me, argv[1], &self)) return die();
    if (jel_elect(me, "master", &winner, &epoch) != 1) return die();
    printf("%s %llu %llu\n", winner.has_name ? winner.name : "-", (unsigned long long)epoch,
           (unsigned long long)self.id);
    fflush(stdout);
    jel_conn *w = jel_connect(NULL);
    if (!w || jel_watch(w, 1)) return die();
    jel_event ev;
    char mine[64];
    snprintf(mine, sizeof mine, "\"to\":[%llu]", (unsigned long long)self.id);
    while (jel_next_event(w, &ev) == 0) {
        int go = !strcmp(ev.kind, "signal") && strstr(ev.json, mine);
        if (go) printf("%s\n", ev.json);
        jel_event_free(&ev);
        if (go) {
            fflush(stdout);
            if (jel_leave(me)) return die();
            jel_close(me);
            jel_close(w);
            return 0;
        }
    }
    return die();
}
