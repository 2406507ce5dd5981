/*
 * pvm_wait_hosts K TIMEOUT_MS: waits until the running virtual machine has at least K
 * hosts (pvm_config, polled every millisecond), prints the number of hosts it saw last,
 * and exits 0, or 1 when TIMEOUT_MS passed first, 2 when no pvmd runs. Used by the
 * Table 3 benchmark (rb-bench --only modules) to see a host join without a console.
 *
 * Build: gcc -O2 -Wall -o pvm_wait_hosts pvm_wait_hosts.c -lpvm3
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <pvm3.h>

static long elapsed_ms(const struct timespec *since) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - since->tv_sec) * 1000 + (now.tv_nsec - since->tv_nsec) / 1000000;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: pvm_wait_hosts K TIMEOUT_MS\n");
        return 2;
    }
    int want = atoi(argv[1]);
    long limit = atol(argv[2]);
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);
    pvm_setopt(PvmRoute, PvmDontRoute);
    if (pvm_mytid() < 0)
        return 2;
    int nhost = 0, narch = 0;
    struct pvmhostinfo *hosts;
    for (;;) {
        if (pvm_config(&nhost, &narch, &hosts) < 0) {
            pvm_exit();
            return 2;
        }
        if (nhost >= want || elapsed_ms(&started) >= limit)
            break;
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    printf("%d\n", nhost);
    pvm_exit();
    return nhost >= want ? 0 : 1;
}
