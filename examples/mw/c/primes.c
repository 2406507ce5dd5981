/* primes.c: the work of one task (the primes in a range, by a segmented sieve) and its
 * minimum duration (--task-ms), both broken off by a SIGTERM flag. */
#define _GNU_SOURCE
#include "mw.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

void sleep_until_ms(uint64_t deadline_ms, volatile int *stop) {
    for (uint64_t now = now_ms(); now < deadline_ms && !*stop; now = now_ms()) {
        uint64_t left = deadline_ms - now;
        if (left > 50) left = 50; /* a signal interrupts it; this bounds a missed one */
        struct timespec d = {.tv_sec = 0, .tv_nsec = (long)(left * 1000000)};
        nanosleep(&d, NULL);
    }
}

static uint64_t isqrt(uint64_t n) {
    uint64_t r = 0;
    while ((r + 1) * (r + 1) <= n) r++;
    return r;
}

/* Sieves [lo, hi) in segments of SEG numbers with the primes up to sqrt(hi). */
#define SEG (1u << 18)
long count_primes(uint64_t lo, uint64_t hi, volatile int *stop) {
    if (lo < 2) lo = 2;
    if (hi <= lo) return 0;
    uint64_t root = isqrt(hi - 1);
    unsigned char *small = calloc(root + 1, 1), *seg = malloc(SEG);
    if (!small || !seg) {
        free(small);
        free(seg);
        return -1;
    }
    for (uint64_t i = 2; i * i <= root; i++)
        if (!small[i])
            for (uint64_t j = i * i; j <= root; j += i) small[j] = 1;
    long count = 0;
    for (uint64_t base = lo; base < hi && !*stop; base += SEG) {
        uint64_t end = base + SEG < hi ? base + SEG : hi;
        memset(seg, 0, end - base);
        for (uint64_t p = 2; p <= root; p++) {
            if (small[p]) continue;
            uint64_t first = (base + p - 1) / p * p;
            if (first < p * p) first = p * p;
            for (uint64_t j = first; j < end; j += p) seg[j - base] = 1;
        }
        for (uint64_t i = 0; i < end - base; i++) count += !seg[i];
    }
    free(small);
    free(seg);
    return *stop ? -1 : count;
}
