/* json.c: reads the few fields rb-mw needs from a JEL event line (one JSON object): a key
 * of an object, numbers, strings, and the member objects {"id","name","host","pid"}.
 * Input comes from the pool, so every reader checks its bounds and fails with -1/NULL. */
#include "mw.h"

#include <stdlib.h>
#include <string.h>

static const char *ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

static const char *skip_string(const char *p) {
    for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && !*++p) return NULL;
    return *p ? p + 1 : NULL;
}

/* The end of the value at `v`; NULL if it is malformed. */
const char *json_skip(const char *v) {
    const char *p = ws(v);
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

/* The value of `key` in the object at `obj` (its top level only), or NULL. */
const char *json_key(const char *obj, const char *key) {
    const char *p = ws(obj);
    size_t klen = strlen(key);
    if (*p != '{') return NULL;
    for (p = ws(p + 1); *p == '"';) {
        const char *end = skip_string(p);
        if (!end) return NULL;
        int hit = (size_t)(end - p - 2) == klen && !memcmp(p + 1, key, klen);
        p = ws(end);
        if (*p != ':') return NULL;
        p = ws(p + 1);
        if (hit) return p;
        if (!(p = json_skip(p))) return NULL;
        p = ws(p);
        if (*p == ',') p = ws(p + 1);
    }
    return NULL;
}

int json_u64(const char *v, uint64_t *out) {
    if (!v || *v < '0' || *v > '9') return -1;
    *out = strtoull(v, NULL, 10);
    return 0;
}

/* A JSON string without escapes beyond \" and \\ (host and event names are plain). */
int json_str(const char *v, char *out, size_t size) {
    size_t n = 0;
    if (!v || *v != '"') return -1;
    for (v++; *v && *v != '"'; v++) {
        if (*v == '\\' && !*++v) return -1;
        if (n + 1 >= size) return -1;
        out[n++] = *v;
    }
    out[n] = 0;
    return *v == '"' ? 0 : -1;
}

int json_member_id(const char *v, uint64_t *id) {
    return v && *v == '{' ? json_u64(json_key(v, "id"), id) : -1;
}
