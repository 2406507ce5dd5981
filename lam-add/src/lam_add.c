/*
 * rb-lam-add's LAM part: add one host to the running LAM/MPI 7.1 universe of this user, as
 * `lamgrow HOST` does, through LAM's own boot framework (the boot SSI module LAM selects,
 * normally rsh, so the job's LAMRSH -- the rsh shim -- starts the new lamd), then tell
 * every node of the universe about the new one.
 *
 * The difference from lamgrow: LAM runs one lamgrow per universe, and lamgrow makes sure
 * of that by asking *every* node for its process table before it starts (one remote round
 * per node, about 1 ms each on the loaded test lab, while the job waits for its machine). This
 * program asks only this node, where the job's own lamgrows run, waiting while a lamgrow
 * is enrolled here (the job's phase-1 `lamgrow anyLinux` is often still failing when its
 * grant arrives). It enrols under its own name (ENROL_NAME), not lamgrow's: a lamgrow the
 * job starts meanwhile must not be refused ("already running"), since LAM refuses before
 * it looks the host up, so a `lamgrow anyLinux-2` right after `lamgrow anyLinux-1` would
 * never ask for its machine. Such a lamgrow of a symbolic name fails at the shim without
 * touching the universe; one of a real host at the very moment of this add could take the
 * same new node id (modules/CONTRACT.md, Known limits). A lamgrow run at the same moment
 * from another node of the universe is not seen either; lam-grow's callers never do that.
 *
 * Before it attaches to the local lamd it waits while one is starting (the job's lamboot
 * still running): LAM's attach removes the session directory of a lamd it cannot reach,
 * which would end the starting one (wait_for_the_local_lamd). A lamd is starting until it
 * listens on its socket, not when the socket file appears (listens). A boot is under way
 * also while there is no directory at all: hboot's tkill makes and removes it before the
 * lamd makes its own (boot_running_here).
 *
 * Exit status (see main.rs): 0 added; 1 LAM refused or failed (its message on stderr);
 * 4 no lamd of this user here (none starting either, a socket nobody listens on, or a lamd
 * that stayed without a listening socket for BOOT_LIMIT_MS); 5 another lamgrow stayed
 * enrolled on this node for BUSY_LIMIT_MS; 6 the host is a node of the universe already
 * (LAM refused the boot, and the host's address is one of the universe's links: what
 * `lamnodes -i` lists).
 */
#include <lam_config.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <all_opt.h>
#include <dl_inet.h>
#include <etc_misc.h>
#include <events.h>
#include <kio.h>
#include <lam-ssi-boot.h>
#include <lam-ssi.h>
#include <laminternal.h>
#include <lamnet.h>
#include <mpisys.h>
#include <net.h>
#include <preq.h>
#include <priority.h>
#include <t_types.h>

extern char **environ;

enum {
    EXIT_ADDED = 0,
    EXIT_FAILED = 1,
    EXIT_NO_UNIVERSE = 4,
    EXIT_BUSY = 5,
    EXIT_ALREADY_THERE = 6,
};

/* How long to wait for another lamgrow of this node to end, and how often to look. */
#define BUSY_LIMIT_MS 5000

/* How long a starting lamd (session directory, no socket yet) is waited for. */
#define BOOT_LIMIT_MS 10000

/* The name LAM's lamgrow enrols under and looks for. */
#define LAMGROW_NAME "lamgrow"

/* The name this program enrols under: not lamgrow's (see the top of this file). */
#define ENROL_NAME "rb-lam-add"

static long ms_since(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
}

/* The pause after `waited_ms` of a busy node: every ms while a phase-1 lamgrow would
   normally end, then less often for one that hangs on its remote shell. */
static void busy_pause(long waited_ms)
{
    long ms = waited_ms < 100 ? 1 : waited_ms < 1000 ? 10 : 100;
    struct timespec pause = {0, ms * 1000000L};
    nanosleep(&pause, NULL);
}

/* 1 if a process other than us is enrolled on this node as lamgrow, 0 if none, -1 when
   the node cannot be asked. */
static int other_lamgrow_here(void)
{
    static struct pstate table[PMAX];
    int count = rpstate(getnodeid(), SELECT_ALL, 0, table, PMAX);
    if (count < 0)
        return -1;
    for (int i = 0; i < count; ++i)
        if (strcmp(table[i].ps_name, LAMGROW_NAME) == 0 && table[i].ps_pid != lam_getpid())
            return 1;
    return 0;
}

/* 1 if a process listens on the Unix stream socket at `path`: our connect is taken into its
   queue (or the queue is full). 0 when it is refused (bound, not listening: a lamd starting,
   or one that died) or cannot be made. Non-blocking, so a full queue never holds us. The
   lamd takes the connection and its end as a client gone before it attached (kio_req: a
   short read, the descriptor closed), as for any LAM command killed at its start. A path
   longer than sun_path is reached through its directory's descriptor, as LAM itself chdirs
   to it. */
static int listens(const char *path)
{
    struct sockaddr_un address;
    memset(&address, 0, sizeof address);
    address.sun_family = AF_UNIX;
    int directory = -1;
    if (strlen(path) < sizeof address.sun_path) {
        strcpy(address.sun_path, path);
    } else {
        const char *slash = strrchr(path, '/');
        if (slash == NULL)
            return 0;
        char *parent = strndup(path, (size_t) (slash - path));
        if (parent == NULL)
            return 0;
        directory = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        free(parent);
        if (directory < 0)
            return 0;
        int length = snprintf(address.sun_path, sizeof address.sun_path, "/proc/self/fd/%d/%s",
                              directory, slash + 1);
        if (length < 0 || (size_t) length >= sizeof address.sun_path) {
            close(directory);
            return 0;
        }
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int taken = probe >= 0 &&
                (connect(probe, (struct sockaddr *) &address, sizeof address) == 0 ||
                 errno == EAGAIN);
    if (probe >= 0)
        close(probe);
    if (directory >= 0)
        close(directory);
    return taken;
}

/* What this node's LAM session directory says of the local lamd (LAM's own paths: the
   directory and its kernel socket, lam_get_tmpdir and lam_get_sockname). A socket file is
   not yet a lamd that answers: the lamd binds it (the file appears) and only then listens
   (LAM's sfh_sock_open_srv_unix_stm), and a client's connect in between is refused, which
   makes LAM's attach remove the session directory. */
enum local_lamd { LAMD_NONE, LAMD_STARTING, LAMD_BOUND, LAMD_LISTENING };

static enum local_lamd local_lamd(void)
{
    char *dir = lam_get_tmpdir();
    char *socket = lam_get_sockname();
    enum local_lamd state = LAMD_NONE;
    if (dir != NULL && socket != NULL) {
        if (access(socket, F_OK) == 0)
            state = listens(socket) ? LAMD_LISTENING : LAMD_BOUND;
        else if (access(dir, F_OK) == 0)
            state = LAMD_STARTING;
    }
    free(dir);
    free(socket);
    return state;
}

/* The programs of a LAM boot on its origin node, in the order they run: lamboot runs hboot,
   hboot runs tkill (which makes and removes the session directory while it clears an old
   session) and then lamd (which makes it again, then its socket). */
static const char *const BOOT_PROGRAMS[] = {"lamboot", "hboot", "tkill", "lamd"};

/* 1 if one of BOOT_PROGRAMS runs here as this user (by /proc/PID's owner and its comm), 0
   if none does. Between tkill's rmdir and lamd's mkdir (about 2 ms, or however long the
   lamd takes to start) there is no session directory, yet the boot is in progress. */
static int boot_running_here(void)
{
    DIR *proc = opendir("/proc");
    if (proc == NULL)
        return 0;
    uid_t me = getuid();
    int found = 0;
    struct dirent *entry;
    while (!found && (entry = readdir(proc)) != NULL) {
        if (!isdigit((unsigned char) entry->d_name[0]))
            continue;
        char path[sizeof "/proc//comm" + sizeof entry->d_name];
        struct stat owner;
        snprintf(path, sizeof path, "/proc/%s", entry->d_name);
        if (stat(path, &owner) != 0 || owner.st_uid != me)
            continue;
        snprintf(path, sizeof path, "/proc/%s/comm", entry->d_name);
        FILE *comm_file = fopen(path, "r");
        if (comm_file == NULL)
            continue;
        char comm[32] = "";
        if (fgets(comm, sizeof comm, comm_file) != NULL)
            comm[strcspn(comm, "\n")] = '\0';
        fclose(comm_file);
        for (size_t i = 0; i < sizeof BOOT_PROGRAMS / sizeof BOOT_PROGRAMS[0]; ++i)
            if (strcmp(comm, BOOT_PROGRAMS[i]) == 0)
                found = 1;
    }
    closedir(proc);
    return found;
}

/* 0 once the local lamd listens, -1 when none does (said on stderr). LAM's client attach
   (kenter) that finds no lamd *removes the session directory*; a lamd between its mkdir of
   that directory and its listen (a lamboot of the job in progress) then fails ("chdir
   failed!", exit 2) and the lamboot waits 60 s for it. So this program attaches only to a
   lamd that listens on its socket, and waits while one is starting, at most BOOT_LIMIT_MS:
   a directory without a listening socket for that long is one a dead lamd left. A lamd is
   starting while its directory is there without the socket, or with the socket bound but
   not listened on, and also while there is no directory but a boot program of this user
   runs here (boot_running_here): the directory tkill made is gone before the lamd makes
   its own. A socket nobody listens on, with no boot program of this user here, is a dead
   lamd's. */
static int wait_for_the_local_lamd(void)
{
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    char here[256] = "";
    gethostname(here, sizeof here - 1);
    for (;;) {
        enum local_lamd state = local_lamd();
        if (state == LAMD_LISTENING)
            return 0;
        long waited = ms_since(&start);
        if ((state == LAMD_NONE || state == LAMD_BOUND) && !boot_running_here()) {
            fprintf(stderr, "rb-lam-add: no LAM universe of this user on %s (%s)\n", here,
                    state == LAMD_NONE ? "no lamd"
                                       : "no lamd listens on its socket: one that died left it");
            return -1;
        }
        if (waited >= BOOT_LIMIT_MS) {
            fprintf(stderr,
                    "rb-lam-add: no LAM universe of this user on %s: no listening lamd socket in its "
                    "session directory for %ld ms (a lamd that died, or a lamboot that "
                    "hangs)\n",
                    here, waited);
            return -1;
        }
        busy_pause(waited);
    }
}

static void wait_for_other_lamgrows(void)
{
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int busy = other_lamgrow_here();
        if (busy < 0) {
            fprintf(stderr, "rb-lam-add: cannot read the process table of n%d: %s\n",
                    getnodeid(), strerror(errno));
            kexit(EXIT_FAILED);
        }
        if (busy == 0)
            return;
        long waited = ms_since(&start);
        if (waited >= BUSY_LIMIT_MS) {
            fprintf(stderr, "rb-lam-add: lamgrow: already running on n%d (waited %ld ms)\n",
                    getnodeid(), waited);
            kexit(EXIT_BUSY);
        }
        busy_pause(waited);
    }
}

/* Starts a lamd on the host named in `options` through the boot SSI. On success fills in
   the new node's id, address and host name (malloc'ed). LAM prints its own messages. */
static int boot_new_node(OPT *options, int *new_id, struct sockaddr_in *address, char **name)
{
    struct lamnode *nodes = NULL;
    int count = 0;
    int origin = -1;
    int started = 0;

    if (lam_ssi_boot_open(options) != 0 || lam_ssi_boot_select(LAM_SSI_BOOT_LOCATION_ROOT) != 0)
        return -1;
    if (lam_ssi_boot.lsba_parse_options(options, 0) != 0 ||
        lam_ssi_boot.lsba_allocate_nodes(&nodes, &count, &origin) != 0)
        return -1;
    *new_id = -1;
    for (int i = 0; i < count; ++i)
        if (nodes[i].lnd_type & NT_BOOT) {
            *new_id = i;
            break;
        }
    if (*new_id < 0) {
        fprintf(stderr, "rb-lam-add: LAM's boot module named no node to boot\n");
        return -1;
    }
    nodes[*new_id].lnd_ncpus = 1;
    if (lam_ssi_boot.lsba_verify_nodes(nodes, count) != 0)
        return -1;
    _kio.ki_origin = origin;
    if (lam_ssi_boot.lsba_prepare_boot() != 0)
        return -1;
    if (lam_ssi_boot.lsba_start_rte_procs(nodes, count, LAM_SSI_BOOT_PROC_LAMD, &started) != 0 ||
        started != 1)
        return -1;
    /* The start-up exchange filled in the new lamd's UDP port. */
    *address = nodes[*new_id].lnd_addr;
    *name = strdup(nodes[*new_id].lnd_hname);
    lam_ssi_boot.lsba_deallocate_nodes(&nodes, &count);
    lam_ssi_boot_close();
    return 0;
}

/* Sends `node` the link to the new node (a DIQSETLINK request to its link daemon) and
   waits for its answer. 0 on success, else -1 with errno set. */
static int tell_node(int node, int new_id, struct sockaddr_in address)
{
    struct dilink link;
    struct nmsg message;
    struct direq *request = (struct direq *) message.nh_data;
    struct direply *reply = (struct direply *) message.nh_data;

    memset(&link, 0, sizeof link);
    memset(&message, 0, sizeof message);
    link.dil_link = ltot(new_id);
    link.dil_addr = address;

    request->diq_req = DIQSETLINK;
    request->diq_src_node = getnodeid();
    request->diq_src_event = -lam_getpid();
    request->diq_type = 0;
    request->diq_ncpus = 1;
    message.nh_flags = NOBUF;
    message.nh_msg = (char *) &link;
    message.nh_node = node;
    message.nh_event = EVDLI;
    message.nh_type = 0;
    message.nh_length = sizeof link;
    if (getroute(&message) != 0)
        return -1;
    if (message.nh_dl_event == message.nh_event) {
        /* This node's own link daemon: deliver locally. */
        message.nh_dl_event = EVDL0;
        message.nh_dl_link = getnodeid();
    }
    if (dsend(&message) != 0)
        return -1;
    message.nh_event = -lam_getpid();
    message.nh_length = 0;
    if (drecv(&message) != 0)
        return -1;
    if (reply->dir_reply != 0) {
        errno = reply->dir_reply;
        return -1;
    }
    return 0;
}

/* Takes down the lamd just booted on `host` when the universe could not be told about it
   (as lamgrow does): `lamwipe` with a one-line boot schema. */
static void wipe_new_node(const char *host)
{
    char schema[] = "/tmp/rb-lam-add-wipe-XXXXXX";
    int fd = mkstemp(schema);
    if (fd < 0)
        return;
    FILE *out = fdopen(fd, "w");
    if (out == NULL) {
        close(fd);
        unlink(schema);
        return;
    }
    fprintf(out, "%s\n", host);
    fclose(out);
    char *argv[] = {"lamwipe", schema, NULL};
    pid_t pid;
    if (posix_spawnp(&pid, "lamwipe", NULL, NULL, argv, environ) == 0)
        waitpid(pid, NULL, 0);
    unlink(schema);
}

/* Whether `host` is a node of the universe already: its address is the address of one of
   the universe's links (what `lamnodes -i` lists). Asked only after LAM refused the boot, so
   the add's own path costs nothing more. */
static int already_in_universe(const char *host)
{
    struct hostent *entry = gethostbyname(host);
    if (entry == NULL || entry->h_addrtype != AF_INET || entry->h_addr_list[0] == NULL)
        return 0;
    struct in_addr wanted;
    memcpy(&wanted, entry->h_addr_list[0], sizeof wanted);
    struct dolink *links = NULL;
    int4 count = 0;
    if (ldogetlinks(&links, &count) != 0)
        return 0;
    int found = 0;
    for (int i = 0; i < count && !found; ++i)
        found = links[i].dol_link != NOTLINKID &&
                links[i].dol_addr.sin_addr.s_addr == wanted.s_addr;
    free(links);
    return found;
}

int rb_lam_add(const char *host)
{
    char *argv[] = {"rb-lam-add", (char *) host, NULL};
    int argc = 2;
    OPT *options = ao_init();
    if (options == NULL) {
        perror("rb-lam-add");
        return EXIT_FAILED;
    }
    /* The boot SSI reads the host from the arguments left over, and LAM's settings from
       LAM_MPI_SSI_* in the environment (the job's LAMRSH, boot_rsh_fast, ...). */
    ao_setflags(options, AOPRESERVE_ARGV);
    lam_ssi_base_open(options);
    lam_ssi_base_ao_setup(options);
    if (ao_parse(options, &argc, argv) != 0) {
        fprintf(stderr, "rb-lam-add: LAM did not take the arguments\n");
        return EXIT_FAILED;
    }
    lam_tmpdir_init_opt(NULL, NULL, 0);
    if (lam_ssi_base_ao_process_args(options) != 0)
        return EXIT_FAILED;
    if (wait_for_the_local_lamd() != 0)
        return EXIT_NO_UNIVERSE;
    if (kenter(ENROL_NAME, PRCMD) != 0) {
        char here[256] = "";
        gethostname(here, sizeof here - 1);
        fprintf(stderr, "rb-lam-add: no LAM universe of this user on %s (no lamd answers)\n",
                here);
        return EXIT_NO_UNIVERSE;
    }

    int count = getnall();
    if (count <= 0) {
        fprintf(stderr, "rb-lam-add: the local lamd lists no nodes\n");
        kexit(EXIT_FAILED);
    }
    int *nodes = malloc((size_t) count * sizeof *nodes);
    if (nodes == NULL || getall(nodes, count) < 0) {
        perror("rb-lam-add: getall");
        kexit(EXIT_FAILED);
    }

    wait_for_other_lamgrows();

    int new_id = -1;
    struct sockaddr_in address;
    char *name = NULL;
    if (boot_new_node(options, &new_id, &address, &name) != 0) {
        if (already_in_universe(host)) {
            fprintf(stderr, "rb-lam-add: %s is a node of this LAM universe already\n", host);
            kexit(EXIT_ALREADY_THERE);
        }
        kexit(EXIT_FAILED);
    }
    lam_ssi_base_close();

    for (int i = 0; i < count; ++i)
        if (tell_node(nodes[i], new_id, address) != 0) {
            fprintf(stderr, "rb-lam-add: could not tell n%d about n%d (%s): %s; taking %s down\n",
                    nodes[i], new_id, name, strerror(errno), name);
            wipe_new_node(name);
            kexit(EXIT_FAILED);
        }
    kexit(EXIT_ADDED);
    return EXIT_ADDED;
}
