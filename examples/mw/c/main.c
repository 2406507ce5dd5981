/* main.c: rb-mw's command line. The master's flags, the worker's (internal: the master
 * writes them), usage on stderr and exit 64 for anything else. */
#include "mw.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char USAGE[] =
    "usage: rb-mw --primes-below N --tasks T [--task-ms MS] [--max-workers W] [--host NAME]\n"
    "             [--address IP]\n"
    "  Counts the primes below N in T tasks on workers it starts with `rsh NAME` while tasks\n"
    "  wait (NAME: anyLinux), at most W at once (32); each task lasts at least MS ms (0).\n"
    "  Run it as a job:\n"
    "    agent --rsl '(adaptive=yes)' rb-mw --primes-below 1000000 --tasks 16\n"
    "  Workers reach the master on every IPv4 address of this host (or only IP).\n"
    "  The last line of stdout is primes=<count>. Limits: 0 <= N <= 10^12, 1 <= T <= 100000,\n"
    "  MS <= 3600000, 1 <= W <= 1000.\n";

static int usage(const char *why, const char *what) {
    fprintf(stderr, "rb-mw: %s%s%s\n%s", why, what ? " " : "", what ? what : "", USAGE);
    return MW_EXIT_USAGE;
}

/* A decimal number in [min, max]; -1 otherwise. */
static int number(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    char *end;
    if (!text || *text < '0' || *text > '9') return -1;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end || v < min || v > max) return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    master_opts m = {.host = "anyLinux", .max_workers = 32};
    worker_opts w = {0};
    uint64_t n = 0, tasks = 0, ms = 0, launch = 0;
    int have_n = 0, have_tasks = 0;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            fputs(USAGE, stdout);
            return 0;
        } else if (!strcmp(flag, "--primes-below"))
            bad = number(val, 0, 1000000000000ull, &n), have_n = 1;
        else if (!strcmp(flag, "--tasks"))
            bad = number(val, 1, 100000, &tasks), have_tasks = 1;
        else if (!strcmp(flag, "--task-ms"))
            bad = number(val, 0, 3600000, &ms);
        else if (!strcmp(flag, "--max-workers")) {
            uint64_t max = 0;
            bad = number(val, 1, 1000, &max);
            m.max_workers = (uint32_t)max;
        } else if (!strcmp(flag, "--host"))
            bad = !(m.host = val) || !*val;
        else if (!strcmp(flag, "--address"))
            bad = !(m.address = val);
        else if (!strcmp(flag, "--worker"))
            bad = !(w.master = val);
        else if (!strcmp(flag, "--token"))
            bad = !(w.token = val);
        else if (!strcmp(flag, "--launch"))
            bad = number(val, 0, 1u << 30, &launch);
        else
            return usage("unknown argument", flag);
        if (bad) return usage(val ? "bad value for" : "missing value for", flag);
        i++;
    }
    if (w.master) {
        if (!w.token) return usage("--worker needs", "--token");
        w.launch = (uint32_t)launch;
        return run_worker(&w);
    }
    if (!have_n || !have_tasks) return usage("missing", !have_n ? "--primes-below" : "--tasks");
    m.primes_below = n, m.tasks = (uint32_t)tasks, m.task_ms = (uint32_t)ms;
    return run_master(&m);
}
