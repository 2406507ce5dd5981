/* A daemon that erases what identifies it, as OpenSSH's ControlPersist master does: it
 * forks (the parent exits), calls setsid, forks again, puts its stdio on /dev/null, and
 * writes zeros over its environment strings (what setproctitle does to make room for a
 * title), so that /proc/PID/environ holds no tag any more. Then it sleeps.
 *
 * Usage: clear_environ SECONDS [MARKER]   (MARKER only makes it findable with pgrep -f)
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv) {
    unsigned seconds = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 300;
    if (fork() != 0)
        return 0;
    setsid();
    if (fork() != 0)
        return 0;
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
    }
    for (char **e = environ; *e != NULL; e++)
        memset(*e, 0, strlen(*e));
    while (seconds > 0)
        seconds = sleep(seconds);
    return 0;
}
