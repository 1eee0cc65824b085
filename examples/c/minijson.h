/* A tiny JSON reader for the examples: walks objects and arrays, reads strings and integers.
 * Enough to pick fields out of correx's answers; not a general-purpose parser. */
#ifndef MINIJSON_H
#define MINIJSON_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static inline const char *mj_ws(const char *p) {
    while (p && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* Skips one string starting at its opening quote; returns the char after the closing quote. */
static inline const char *mj_skip_string(const char *p) {
    if (!p || *p != '"') return NULL;
    for (p++; *p; p++) {
        if (*p == '\\') {
            if (!*++p) return NULL;
        } else if (*p == '"') {
            return p + 1;
        }
    }
    return NULL;
}

/* Skips one value of any kind; returns the char after it, or NULL on malformed input. */
static inline const char *mj_skip(const char *p) {
    p = mj_ws(p);
    if (!p || !*p) return NULL;
    if (*p == '"') return mj_skip_string(p);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (*p) {
            if (*p == '"') {
                p = mj_skip_string(p);
                if (!p) return NULL;
                continue;
            }
            if (*p == '{' || *p == '[') depth++;
            if (*p == '}' || *p == ']') {
                if (--depth == 0) return p + 1;
            }
            p++;
        }
        return NULL;
    }
    while (*p && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n') p++;
    return p;
}

/* The value of `key` in the object at `obj` (top level only), or NULL. */
static inline const char *mj_get(const char *obj, const char *key) {
    const char *p = mj_ws(obj);
    size_t klen = strlen(key);
    if (!p || *p != '{') return NULL;
    p = mj_ws(p + 1);
    while (p && *p == '"') {
        const char *kend = mj_skip_string(p);
        if (!kend) return NULL;
        int match = (size_t)(kend - p - 2) == klen && strncmp(p + 1, key, klen) == 0;
        p = mj_ws(kend);
        if (!p || *p != ':') return NULL;
        p = mj_ws(p + 1);
        if (match) return p;
        p = mj_ws(mj_skip(p));
        if (p && *p == ',') p = mj_ws(p + 1);
    }
    return NULL;
}

/* Copies the string value at `v` into buf (escapes decoded, \\u kept as '?'); 0 on success. */
static inline int mj_str(const char *v, char *buf, size_t n) {
    size_t o = 0;
    v = mj_ws(v);
    if (!v || *v != '"' || n == 0) return -1;
    for (v++; *v && *v != '"'; v++) {
        char c = *v;
        if (c == '\\') {
            v++;
            switch (*v) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': c = '?'; if (strlen(v) >= 5) v += 4; break;
            case '\0': return -1;
            default: c = *v;
            }
        }
        if (o + 1 < n) buf[o++] = c;
    }
    buf[o] = '\0';
    return 0;
}

/* The integer at `v`, or `fallback`. */
static inline long long mj_int(const char *v, long long fallback) {
    char *end = NULL;
    long long x;
    v = mj_ws(v);
    if (!v) return fallback;
    x = strtoll(v, &end, 10);
    return end == v ? fallback : x;
}

/* The first element of the array at `arr`, or NULL when empty. */
static inline const char *mj_first(const char *arr) {
    const char *p = mj_ws(arr);
    if (!p || *p != '[') return NULL;
    p = mj_ws(p + 1);
    return (p && *p != ']') ? p : NULL;
}

/* The element after `elem`, or NULL at the end. */
static inline const char *mj_next(const char *elem) {
    const char *p = mj_ws(mj_skip(elem));
    if (!p || *p != ',') return NULL;
    return mj_ws(p + 1);
}

#endif
