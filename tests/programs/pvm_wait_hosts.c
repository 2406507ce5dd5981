/*
 * pvm_wait_hosts K TIMEOUT_MS: waits until the running virtual machine has at least K
 * hosts, prints the number of hosts it saw last, and exits 0, or 1 when TIMEOUT_MS passed
 * first, 2 when no pvmd runs. Used by the Table 3 benchmark (rb-bench --only modules) to
 * see a host join without a console.
 *
 * It does not poll: it asks the master pvmd for a PvmHostAdd notification and sleeps in
 * pvm_trecv until one comes (re-reading pvm_config then, and once right after asking, so
 * a host that joined meanwhile is not missed). A poller would compete with the very add it
 * times, for the master pvmd and for the CPUs.
 *
 * Build: gcc -O2 -Wall -o pvm_wait_hosts pvm_wait_hosts.c -lpvm3
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <pvm3.h>

#define HOST_ADDED_TAG 7377

static long elapsed_ms(const struct timespec *since) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - since->tv_sec) * 1000 + (now.tv_nsec - since->tv_nsec) / 1000000;
}

/* The number of hosts now, or -1 when the pvmd is gone. */
static int host_count(void) {
    int nhost = 0, narch = 0;
    struct pvmhostinfo *hosts;
    if (pvm_config(&nhost, &narch, &hosts) < 0)
        return -1;
    return nhost;
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
    int nhost = host_count();
    if (nhost >= 0 && nhost < want && limit > 0) {
        pvm_notify(PvmHostAdd, HOST_ADDED_TAG, -1, NULL);
        nhost = host_count();
        while (nhost >= 0 && nhost < want) {
            long left = limit - elapsed_ms(&started);
            if (left <= 0)
                break;
            struct timeval wait = {left / 1000, (left % 1000) * 1000};
            int got = pvm_trecv(-1, HOST_ADDED_TAG, &wait);
            if (got < 0)
                break;
            nhost = host_count();
        }
    }
    if (nhost < 0) {
        pvm_exit();
        return 2;
    }
    printf("%d\n", nhost);
    pvm_exit();
    return nhost >= want ? 0 : 1;
}
