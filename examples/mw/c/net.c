/* net.c: the master-worker wire, newline-terminated text lines over TCP (IPv4): listening
 * on every interface and advertising their addresses, connecting to the first that
 * answers, and buffered line reads that never block the master's loop. The lines:
 *   worker → master  hello TOKEN LAUNCH MEMBER_ID HOST PID    (first line, once)
 *   master → worker  task ID LO HI MS                         (count the primes in [LO,HI))
 *   worker → master  result ID COUNT
 *   master → worker  quit                                     (nothing left for it)      */
#define _GNU_SOURCE
#include "mw.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int line_fill(line_conn *c) {
    if (c->len >= sizeof c->buf) return -1;
    ssize_t n = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
    if (n > 0) {
        c->len += (size_t)n;
        return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 1;
    return n == 0 ? 0 : -1;
}

int line_take(line_conn *c, char *out, size_t size) {
    char *nl = memchr(c->buf, '\n', c->len);
    if (!nl) return c->len >= sizeof c->buf ? -1 : 0;
    size_t n = (size_t)(nl - c->buf);
    if (n >= size) return -1;
    memcpy(out, c->buf, n);
    out[n] = 0;
    c->len -= n + 1;
    memmove(c->buf, nl + 1, c->len);
    return 1;
}

int line_send(int fd, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line - 1) return -1;
    line[n++] = '\n';
    for (int off = 0; off < n;) {
        ssize_t w = send(fd, line + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, 1000) <= 0) return -1;
            continue;
        }
        if (w <= 0) return -1;
        off += (int)w;
    }
    return 0;
}

/* Parses "A.B.C.D:PORT" into `sa`. */
static int parse_addr(const char *text, size_t len, struct sockaddr_in *sa) {
    char buf[64];
    if (len >= sizeof buf) return -1;
    memcpy(buf, text, len);
    buf[len] = 0;
    char *colon = strrchr(buf, ':');
    if (!colon) return -1;
    *colon = 0;
    char *end;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || port == 0 || port > 65535) return -1;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, buf, &sa->sin_addr) == 1 ? 0 : -1;
}

/* A blocking connect bounded by `ms`. */
static int connect_within(const struct sockaddr_in *sa, int ms) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) < 0) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len = sizeof err;
        if (errno != EINPROGRESS || poll(&p, 1, ms) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
            close(fd);
            return -1;
        }
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int tcp_connect_any(const char *addrs, int each_ms, char *err, size_t errsize) {
    for (const char *p = addrs; *p;) {
        size_t len = strcspn(p, ",");
        struct sockaddr_in sa;
        if (parse_addr(p, len, &sa)) {
            snprintf(err, errsize, "bad master address `%.*s` (want IPv4:PORT)", (int)len, p);
            return -1;
        }
        int fd = connect_within(&sa, each_ms);
        if (fd >= 0) return fd;
        p += len;
        if (*p == ',') p++;
    }
    snprintf(err, errsize, "no master address answered (%s)", addrs);
    return -1;
}

/* Appends "IP:PORT" of `in` to the comma list `out`. */
static void add_addr(char *out, size_t size, const struct in_addr *in, unsigned port) {
    char ip[INET_ADDRSTRLEN];
    size_t used = strlen(out);
    inet_ntop(AF_INET, in, ip, sizeof ip);
    snprintf(out + used, size - used, "%s%s:%u", used ? "," : "", ip, port);
}

int tcp_listen(const char *only, char *addrs, size_t size, char *err, size_t errsize) {
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (only && inet_pton(AF_INET, only, &sa.sin_addr) != 1) {
        snprintf(err, errsize, "--address %s is not an IPv4 address", only);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 64) ||
        getsockname(fd, (struct sockaddr *)&sa, &len)) {
        snprintf(err, errsize, "cannot listen on TCP: %s", strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    unsigned port = ntohs(sa.sin_port);
    addrs[0] = 0;
    if (only) {
        add_addr(addrs, size, &sa.sin_addr, port);
        return fd;
    }
    struct ifaddrs *ifs = NULL;
    getifaddrs(&ifs);
    for (int loopback = 0; loopback < 2; loopback++)
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
                continue;
            if (!!(i->ifa_flags & IFF_LOOPBACK) != loopback) continue;
            if (strlen(addrs) + 32 < size)
                add_addr(addrs, size, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, port);
        }
    if (ifs) freeifaddrs(ifs);
    if (!addrs[0]) {
        struct in_addr lo = {.s_addr = htonl(INADDR_LOOPBACK)};
        add_addr(addrs, size, &lo, port);
    }
    return fd;
}
