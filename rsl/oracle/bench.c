/*
 * bench.c -- time globus_rsl_parse() (+ globus_rsl_free_recursive()) on one
 * input, for rsl/bench/run.sh. Same interface as `cargo run --example
 * rsl_bench -- time`:
 *
 *   bench FILE RUNS ITERS   ->  "min median max" nanoseconds per parse
 *
 * Each run parses the input ITERS times; the per-parse time of a run is its
 * total divided by ITERS.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "globus_common.h"
#include "globus_rsl.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e9 + (double) ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bench FILE RUNS ITERS\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (f == NULL) {
        perror(argv[1]);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *input = malloc((size_t) len + 1);
    if (input == NULL || fread(input, 1, (size_t) len, f) != (size_t) len) {
        fprintf(stderr, "bench: cannot read %s\n", argv[1]);
        return 2;
    }
    input[len] = '\0';
    fclose(f);
    int runs = atoi(argv[2]), iters = atoi(argv[3]);
    if (runs < 1 || iters < 1) {
        fprintf(stderr, "bench: RUNS and ITERS must be positive\n");
        return 2;
    }
    globus_module_activate(GLOBUS_RSL_MODULE);
    double *per_parse = malloc(sizeof(double) * (size_t) runs);
    for (int r = 0; r < runs; r++) {
        double start = now_ns();
        for (int i = 0; i < iters; i++) {
            globus_rsl_t *rsl = globus_rsl_parse(input);
            if (rsl == NULL) {
                fprintf(stderr, "bench: libglobus-rsl rejects %s\n", argv[1]);
                return 1;
            }
            globus_rsl_free_recursive(rsl);
        }
        per_parse[r] = (now_ns() - start) / iters;
    }
    qsort(per_parse, (size_t) runs, sizeof(double), cmp);
    printf("%.0f %.0f %.0f\n", per_parse[0], per_parse[runs / 2], per_parse[runs - 1]);
    globus_module_deactivate(GLOBUS_RSL_MODULE);
    return 0;
}
