/*
 * lam_wait_nodes K TIMEOUT_MS: waits until the running LAM universe has at least K nodes,
 * prints the number of nodes it saw last, and exits 0, or 1 when TIMEOUT_MS passed first,
 * 2 when no lamd of this user runs here. Used by the Table 3 benchmark (rb-bench --only
 * modules) to see a node join without `lamnodes`.
 *
 * LAM has no join notification, so this polls, but cheaply: one getnall() request to the
 * local lamd every millisecond from one process. A shell loop of `lamnodes | wc -l` costs
 * three processes per poll and, on a 2-CPU machine, competed with the very lamgrow it
 * timed.
 *
 * Build: gcc -O2 -Wall -I/usr/include/lam -o lam_wait_nodes lam_wait_nodes.c -llam
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <lam.h>
#include <net.h>
#include <priority.h>
#include <kreq.h>

static long elapsed_ms(const struct timespec *since) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - since->tv_sec) * 1000 + (now.tv_nsec - since->tv_nsec) / 1000000;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: lam_wait_nodes K TIMEOUT_MS\n");
        return 2;
    }
    int want = atoi(argv[1]);
    long timeout_ms = atol(argv[2]);
    if (kinit(PRCMD)) {
        fprintf(stderr, "lam_wait_nodes: no LAM universe here (kinit failed)\n");
        return 2;
    }
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    const struct timespec pause = {0, 1000000};
    int nodes = getnall();
    while (nodes < want && elapsed_ms(&start) < timeout_ms) {
        nanosleep(&pause, NULL);
        nodes = getnall();
    }
    printf("%d\n", nodes);
    kexit(nodes >= want ? 0 : 1);
    return nodes >= want ? 0 : 1;
}
