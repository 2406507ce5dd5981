/* libjel.so: the JEL client in C, nothing but libc (see jel.h and PROTOCOL.md, "JEL").
 *
 * Layout: errors (thread-local message and exit code), a growable string, a minimal JSON
 * reader (enough to find a key of an object and read numbers, strings and members), the
 * connection (connect, SO_PEERCRED, hello, lines), then the calls of jel.h. */
#define _GNU_SOURCE
#include "jel.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define JEL_VERSION 1

/* ---- errors ---- */

static __thread char err_msg[1024];
static __thread int err_code;

static int fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof err_msg, fmt, ap);
    va_end(ap);
    err_code = code;
    return -1;
}

const char *jel_error(void) { return err_msg; }
int jel_exit_code(void) { return err_code; }

/* ---- a growable string ---- */

typedef struct {
    char *p;
    size_t len, cap;
} sb_t;

static int sb_add_n(sb_t *s, const char *text, size_t n) {
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        while (cap < s->len + n + 1) cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p) return fail(69, "out of memory");
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->len, text, n);
    s->len += n;
    s->p[s->len] = 0;
    return 0;
}

static int sb_add(sb_t *s, const char *text) { return sb_add_n(s, text, strlen(text)); }

/* Appends `text` as a JSON string (quoted, escaped). */
static int sb_add_json_str(sb_t *s, const char *text) {
    if (sb_add(s, "\"")) return -1;
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\', esc[1] = (char)*c, esc[2] = 0;
        } else if (*c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *c);
        } else {
            esc[0] = (char)*c, esc[1] = 0;
        }
        if (sb_add(s, esc)) return -1;
    }
    return sb_add(s, "\"");
}

/* ---- a minimal JSON reader ---- */

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* The end of the string starting at `p` (a quote), after its closing quote; NULL if bad. */
static const char *skip_string(const char *p) {
    for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && !*++p) return NULL;
    return *p ? p + 1 : NULL;
}

/* The end of the value starting at `p`; NULL if bad. */
static const char *skip_value(const char *p) {
    p = skip_ws(p);
    if (*p == '"') return skip_string(p);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (*p) {
            if (*p == '"') {
                if (!(p = skip_string(p))) return NULL;
                continue;
            }
            if (*p == '{' || *p == '[') depth++;
            if (*p == '}' || *p == ']') depth--;
            p++;
            if (depth == 0) return p;
        }
        return NULL;
    }
    while (*p && *p != ',' && *p != '}' && *p != ']' && *p != ' ') p++;
    return p;
}

/* The value of `key` in the object starting at `obj`, or NULL. */
static const char *find_key(const char *obj, const char *key) {
    const char *p = skip_ws(obj);
    if (*p != '{') return NULL;
    size_t klen = strlen(key);
    for (p = skip_ws(p + 1); *p == '"';) {
        const char *end = skip_string(p);
        if (!end) return NULL;
        int hit = (size_t)(end - p - 2) == klen && !memcmp(p + 1, key, klen);
        p = skip_ws(end);
        if (*p != ':') return NULL;
        p = skip_ws(p + 1);
        if (hit) return p;
        if (!(p = skip_value(p))) return NULL;
        p = skip_ws(p);
        if (*p == ',') p = skip_ws(p + 1);
    }
    return NULL;
}

static int get_u64(const char *obj, const char *key, uint64_t *out) {
    const char *v = find_key(obj, key);
    if (!v || *v < '0' || *v > '9') return -1;
    *out = strtoull(v, NULL, 10);
    return 0;
}

/* Reads the JSON string at `v` into `buf` (UTF-8; \u escapes of the BMP). */
static int read_string(const char *v, char *buf, size_t size) {
    size_t n = 0;
    if (*v != '"') return -1;
    for (v++; *v && *v != '"'; v++) {
        unsigned code = (unsigned char)*v; /* raw bytes pass through (UTF-8 stays UTF-8) */
        int from_u = 0;
        if (*v == '\\') {
            switch (*++v) {
            case 'n': code = '\n'; break;
            case 't': code = '\t'; break;
            case 'r': code = '\r'; break;
            case 'b': code = '\b'; break;
            case 'f': code = '\f'; break;
            case 'u':
                if (sscanf(v + 1, "%4x", &code) != 1) return -1;
                v += 4, from_u = 1;
                break;
            case 0: return -1;
            default: code = (unsigned char)*v;
            }
        }
        char utf8[3];
        size_t len = 1;
        if (!from_u || code < 0x80) {
            utf8[0] = (char)code;
        } else if (code < 0x800) {
            utf8[0] = (char)(0xc0 | code >> 6), utf8[1] = (char)(0x80 | (code & 0x3f)), len = 2;
        } else {
            utf8[0] = (char)(0xe0 | code >> 12), utf8[1] = (char)(0x80 | ((code >> 6) & 0x3f));
            utf8[2] = (char)(0x80 | (code & 0x3f)), len = 3;
        }
        if (n + len >= size) return -1;
        memcpy(buf + n, utf8, len);
        n += len;
    }
    buf[n] = 0;
    return *v == '"' ? 0 : -1;
}

static int get_str(const char *obj, const char *key, char *buf, size_t size) {
    const char *v = find_key(obj, key);
    return v ? read_string(v, buf, size) : -1;
}

/* Reads a member object; returns 1 when it is one, 0 for null, -1 when neither. */
static int read_member(const char *v, jel_member *m) {
    if (!v) return -1;
    if (!strncmp(v, "null", 4)) return 0;
    jel_member tmp;
    uint64_t pid;
    memset(&tmp, 0, sizeof tmp);
    const char *name = find_key(v, "name");
    if (get_u64(v, "id", &tmp.id) || get_u64(v, "pid", &pid) || !name ||
        get_str(v, "host", tmp.host, sizeof tmp.host))
        return -1;
    tmp.pid = (uint32_t)pid;
    tmp.has_name = *name == '"';
    if (tmp.has_name && read_string(name, tmp.name, sizeof tmp.name)) return -1;
    if (m) *m = tmp;
    return 1;
}

/* ---- the connection ---- */

struct jel_conn {
    int fd;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    sb_t in;      /* bytes read and not yet returned as lines */
    size_t start; /* where the unread bytes of `in` begin */
    uint64_t next_seq;
    int watching, terminated;
};

static int write_all(jel_conn *c, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return fail(69, "lost the connection to the job's pool at %s: %s", c->path, strerror(errno));
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* The next line (without its newline), malloc'd; NULL at the end or on error. */
static char *read_line(jel_conn *c) {
    for (;;) {
        char *nl = c->in.len > c->start ? memchr(c->in.p + c->start, '\n', c->in.len - c->start) : NULL;
        if (nl) {
            size_t n = (size_t)(nl - (c->in.p + c->start));
            char *line = strndup(c->in.p + c->start, n);
            c->start += n + 1;
            if (!line) fail(69, "out of memory");
            return line;
        }
        if (c->start > 0) { /* keep the unread part only */
            memmove(c->in.p, c->in.p + c->start, c->in.len - c->start);
            c->in.len -= c->start, c->start = 0;
        }
        char buf[65536];
        ssize_t r = read(c->fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            fail(69, "lost the connection to the job's pool at %s: %s", c->path, strerror(errno));
            return NULL;
        }
        if (r == 0) {
            fail(69, "the job's pool at %s closed the connection\nhelp: the job may have ended", c->path);
            return NULL;
        }
        if (sb_add_n(&c->in, buf, (size_t)r)) return NULL;
    }
}

/* Sends one request line; returns the reply line (malloc'd), or NULL with the error set
 * (a refusal: exit code 1 and the pool's error and help). */
static char *request(jel_conn *c, sb_t *req) {
    if (sb_add(req, "\n") || write_all(c, req->p, req->len)) {
        free(req->p);
        return NULL;
    }
    free(req->p);
    char *line = read_line(c);
    if (!line) return NULL;
    char kind[32], error[512] = "", help[512] = "";
    if (!get_str(line, "reply", kind, sizeof kind) && !strcmp(kind, "error")) {
        get_str(line, "error", error, sizeof error);
        get_str(line, "help", help, sizeof help);
        fail(1, "the pool refused the request: %s\nhelp: %s", error, help);
        free(line);
        return NULL;
    }
    return line;
}

static int check_uid(jel_conn *c) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len))
        return fail(69, "cannot tell who serves the socket %s: %s", c->path, strerror(errno));
    if (cred.uid != geteuid())
        return fail(77, "the socket %s is served by uid %u, not you (uid %u)\nhelp: do not use this socket; check who made it (`ls -ln %s`)",
                    c->path, (unsigned)cred.uid, (unsigned)geteuid(), c->path);
    return 0;
}

static int hello(jel_conn *c) {
    char out[32];
    int n = snprintf(out, sizeof out, "{\"jel\":%d}\n", JEL_VERSION);
    if (write_all(c, out, (size_t)n)) return -1;
    char *line = read_line(c);
    if (!line) return -1;
    uint64_t version;
    int ok = !get_u64(line, "jel", &version) && version == JEL_VERSION;
    if (!ok) {
        char error[512] = "";
        get_str(line, "error", error, sizeof error);
        fail(69, "the job's pool at %s refused our hello: %s\nhelp: use a JEL client of the same ResourceBroker as the job", c->path, error);
    }
    free(line);
    return ok ? 0 : -1;
}

jel_conn *jel_connect(const char *path) {
    if (!path) path = getenv("RB_JEL");
    if (!path || !*path) {
        fail(2, "not inside a ResourceBroker job (RB_JEL is not set)\nhelp: JEL serves the processes of a job: run the program under the agent (`agent PROGRAM ARGS...`)");
        return NULL;
    }
    jel_conn *c = calloc(1, sizeof *c);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (!c) {
        fail(69, "out of memory");
        return NULL;
    }
    if (strlen(path) >= sizeof addr.sun_path) {
        fail(69, "the socket path %s is too long", path);
        free(c);
        return NULL;
    }
    strcpy(addr.sun_path, path);
    strcpy(c->path, path);
    c->next_seq = 1;
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&addr, sizeof addr)) {
        fail(69, "cannot connect to the job's pool at %s: %s\nhelp: is the job still running?", path, strerror(errno));
    } else if (!check_uid(c) && !hello(c)) {
        return c;
    }
    jel_close(c);
    return NULL;
}

void jel_close(jel_conn *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    free(c->in.p);
    free(c);
}

/* ---- the calls ---- */

int jel_join(jel_conn *c, const char *name, jel_member *self) {
    sb_t req = {0};
    if (sb_add(&req, "{\"op\":\"join\",\"name\":")) return -1;
    if (name ? sb_add_json_str(&req, name) : sb_add(&req, "null")) return -1;
    char pid[32];
    snprintf(pid, sizeof pid, ",\"pid\":%d}", (int)getpid());
    if (sb_add(&req, pid)) return -1;
    char *line = request(c, &req);
    if (!line) return -1;
    int ok = read_member(find_key(line, "member"), self) == 1;
    free(line);
    return ok ? 0 : fail(69, "the pool's reply to join has no member");
}

int jel_leave(jel_conn *c) {
    sb_t req = {0};
    if (sb_add(&req, "{\"op\":\"leave\"}")) return -1;
    char *line = request(c, &req);
    free(line);
    return line ? 0 : -1;
}

static int election(jel_conn *c, const char *op, const char *name, jel_member *winner, uint64_t *epoch) {
    sb_t req = {0};
    if (sb_add(&req, "{\"op\":\"") || sb_add(&req, op) || sb_add(&req, "\",\"name\":") ||
        sb_add_json_str(&req, name) || sb_add(&req, "}"))
        return -1;
    char *line = request(c, &req);
    if (!line) return -1;
    uint64_t e = 0;
    int won = read_member(find_key(line, "winner"), winner);
    if (get_u64(line, "epoch", &e)) won = -1;
    free(line);
    if (epoch) *epoch = e;
    return won < 0 ? fail(69, "the pool's reply to %s is not an election result", op) : won;
}

int jel_elect(jel_conn *c, const char *name, jel_member *winner, uint64_t *epoch) {
    return election(c, "elect", name, winner, epoch);
}

int jel_result(jel_conn *c, const char *name, jel_member *winner, uint64_t *epoch) {
    return election(c, "result", name, winner, epoch);
}

int jel_signal(jel_conn *c, const char *name, const uint64_t *to, size_t nto, const char *payload_json) {
    sb_t req = {0};
    if (sb_add(&req, "{\"op\":\"signal\",\"name\":") || sb_add_json_str(&req, name) || sb_add(&req, ",\"to\":["))
        return -1;
    for (size_t i = 0; i < nto; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s%llu", i ? "," : "", (unsigned long long)to[i]);
        if (sb_add(&req, id)) return -1;
    }
    if (sb_add(&req, "],\"payload\":") || sb_add(&req, payload_json ? payload_json : "null") || sb_add(&req, "}"))
        return -1;
    char *line = request(c, &req);
    free(line);
    return line ? 0 : -1;
}

int jel_watch(jel_conn *c, uint64_t from) {
    char text[64];
    sb_t req = {0};
    snprintf(text, sizeof text, "{\"op\":\"watch\",\"from\":%llu}", (unsigned long long)(from ? from : 1));
    if (sb_add(&req, text)) return -1;
    char *line = request(c, &req);
    if (!line) return -1;
    free(line);
    c->next_seq = from ? from : 1;
    c->watching = 1;
    return 0;
}

/* Reconnects a cut-off watcher and resumes at its next seq. */
static int resume(jel_conn *c) {
    jel_conn *fresh = jel_connect(c->path);
    if (!fresh) return -1;
    close(c->fd);
    c->fd = fresh->fd;
    c->in.len = c->start = 0;
    fresh->fd = -1;
    jel_close(fresh);
    return jel_watch(c, c->next_seq);
}

int jel_next_event(jel_conn *c, jel_event *ev) {
    if (!c->watching) return fail(64, "jel_next_event needs jel_watch first");
    char *line = read_line(c);
    if (!line && !c->terminated && resume(c) == 0) line = read_line(c);
    if (!line) return -1;
    memset(ev, 0, sizeof *ev);
    if (get_u64(line, "seq", &ev->seq) || get_str(line, "event", ev->kind, sizeof ev->kind)) {
        fail(69, "the job's pool sent a line that is not an event: %.200s", line);
        free(line);
        return -1;
    }
    ev->json = line;
    c->next_seq = ev->seq + 1;
    if (!strcmp(ev->kind, "terminated")) c->terminated = 1;
    return 0;
}

void jel_event_free(jel_event *ev) {
    free(ev->json);
    ev->json = NULL;
}
