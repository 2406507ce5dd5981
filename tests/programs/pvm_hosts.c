/*
 * pvm_hosts: a PVM 3.4 master/worker pair in one binary, to show on which hosts a
 * virtual machine runs tasks.
 *
 *   pvm_hosts [N]
 *
 * Master (started by hand, no PVM parent): spawns N copies of itself (default: the
 * number of hosts in pvm_config()) with PvmTaskDefault, so PVM places them round-robin
 * over the hosts of the virtual machine; prints one hostname per line, one per task, in
 * arrival order; then pvm_exit(). Exit 1 with a message on stderr if a spawn fails or a
 * task does not answer within 30 s.
 * Task (pvm_parent() is a task id): sends its gethostname() to the parent and exits.
 *
 * Build (Debian pvm-dev puts pvm3.h in /usr/include and libpvm3 in the multiarch lib
 * dir, so no -I/-L is needed):
 *     gcc -O2 -Wall -o pvm_hosts pvm_hosts.c -lpvm3
 *
 * Where the task binary must be: the pvmd on each host execs the task itself. Given a
 * name without '/', it searches its ep= path, default $HOME/pvm3/bin/$PVM_ARCH (e.g.
 * ~/pvm3/bin/LINUX64/pvm_hosts). Given an absolute path it execs that path. This program
 * spawns the path in $PVM_HOSTS_TASK if set, else its own absolute path
 * (/proc/self/exe), which is valid on every host when the binary lives in a home
 * directory shared by all hosts (NFS, or the lab's shared home).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/time.h>
#include <pvm3.h>

#define TAG_HOST 4711

/* libpvm3 exports pvm_errlist but pvm3.h does not declare it: name the usual codes. */
static const char *pvm_err(int code)
{
    static char buf[32];

    switch (code) {
    case PvmBadParam: return "Bad parameter";
    case PvmNoHost: return "No such host";
    case PvmNoFile: return "No such file (task binary not found on that host)";
    case PvmDenied: return "Permission denied";
    case PvmNoMem: return "Malloc failed";
    case PvmSysErr: return "Can't contact local daemon";
    case PvmHostFail: return "Host failed";
    case PvmOutOfRes: return "Out of resources";
    default:
        snprintf(buf, sizeof buf, "PVM error %d", code);
        return buf;
    }
}

static int task(int parent)
{
    char host[256];

    if (gethostname(host, sizeof host) != 0)
        strcpy(host, "?");
    host[sizeof host - 1] = '\0';
    pvm_initsend(PvmDataDefault);
    pvm_pkstr(host);
    pvm_send(parent, TAG_HOST);
    pvm_exit();
    return 0;
}

static int master(int argc, char **argv)
{
    int nhost = 0, narch = 0, n, i, started;
    struct pvmhostinfo *hosts;
    char self[PATH_MAX];
    const char *name = getenv("PVM_HOSTS_TASK");
    int *tids;

    i = pvm_config(&nhost, &narch, &hosts);
    if (i < 0) {
        fprintf(stderr, "pvm_hosts: pvm_config failed: %s\n", pvm_err(i));
        pvm_exit();
        return 1;
    }
    n = argc > 1 ? atoi(argv[1]) : nhost;
    if (n < 1) {
        fprintf(stderr, "pvm_hosts: bad task count '%s'\n", argc > 1 ? argv[1] : "");
        pvm_exit();
        return 2;
    }
    if (name == NULL || *name == '\0') {
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0) {
            fprintf(stderr, "pvm_hosts: cannot find own path; set PVM_HOSTS_TASK\n");
            pvm_exit();
            return 1;
        }
        self[len] = '\0';
        name = self;
    }
    tids = calloc((size_t)n, sizeof *tids);
    if (tids == NULL) {
        perror("pvm_hosts");
        pvm_exit();
        return 1;
    }
    started = pvm_spawn((char *)name, (char **)0, PvmTaskDefault, "", n, tids);
    if (started < n) {
        int err = started < 0 ? started : tids[started];
        fprintf(stderr, "pvm_hosts: spawned %d of %d tasks of %s on %d hosts: %s\n",
                started < 0 ? 0 : started, n, name, nhost,
                pvm_err(err));
        for (i = 0; i < started; i++)
            pvm_kill(tids[i]);
        pvm_exit();
        return 1;
    }
    for (i = 0; i < n; i++) {
        struct timeval tmo = { 30, 0 };
        char host[256];
        int bufid = pvm_trecv(-1, TAG_HOST, &tmo);

        if (bufid <= 0) {
            fprintf(stderr, "pvm_hosts: %s after %d of %d answers\n",
                    bufid == 0 ? "timeout (30 s)" : "pvm_trecv failed", i, n);
            pvm_exit();
            return 1;
        }
        pvm_upkstr(host);
        printf("%s\n", host);
    }
    fflush(stdout);
    free(tids);
    pvm_exit();
    return 0;
}

int main(int argc, char **argv)
{
    int parent;

    if (pvm_mytid() < 0) {
        fprintf(stderr, "pvm_hosts: cannot enroll in PVM (is a pvmd running?)\n");
        return 1;
    }
    parent = pvm_parent();
    if (parent == PvmNoParent)
        return master(argc, argv);
    if (parent < 0) {
        fprintf(stderr, "pvm_hosts: pvm_parent failed: %d\n", parent);
        pvm_exit();
        return 1;
    }
    return task(parent);
}
