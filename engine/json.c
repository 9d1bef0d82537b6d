#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct parser {
    const char *s;
    size_t len, pos;
    char *err;
    size_t errlen;
    int failed;
} parser;

static int fail(parser *p, const char *what) {
    if (!p->failed) snprintf(p->err, p->errlen, "invalid JSON at byte %zu: %s", p->pos, what);
    p->failed = 1;
    return 1;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static int literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail(p, "unknown literal");
    p->pos += n;
    return 0;
}

static int hex4(parser *p, unsigned *out) {
    unsigned v = 0;
    if (p->len - p->pos < 4) return fail(p, "truncated \\u escape");
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return fail(p, "bad hex digit in \\u escape");
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The output is never longer than the input between the quotes. */
static int parse_string(parser *p, char **out) {
    size_t start = ++p->pos, end = start;
    while (end < p->len && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->len) return fail(p, "unterminated string");
    char *o = malloc(end - start + 1);
    size_t n = 0;
    if (!o) return fail(p, "out of memory");
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos++];
        if (c < 0x20) { free(o); return fail(p, "control character in string"); }
        if (c != '\\') { o[n++] = (char)c; continue; }
        char e = p->s[p->pos++];
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (hex4(p, &cp)) { free(o); return 1; }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->pos + 2 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    free(o);
                    return fail(p, "unpaired surrogate");
                }
                p->pos += 2;
                if (hex4(p, &lo)) { free(o); return 1; }
                if (lo < 0xDC00 || lo > 0xDFFF) { free(o); return fail(p, "bad low surrogate"); }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(o);
                return fail(p, "unpaired surrogate");
            }
            if (cp == 0) { free(o); return fail(p, "NUL in string"); }
            n += put_utf8(o + n, cp);
            break;
        }
        default: free(o); return fail(p, "bad escape");
        }
    }
    o[n] = 0;
    p->pos = end + 1;
    *out = o;
    return 0;
}

static int parse_number(parser *p, json_value *v) {
    size_t start = p->pos;
    int integer = 1;
    if (p->s[p->pos] == '-') p->pos++;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return fail(p, "bad number");
    if (p->s[p->pos] == '0') p->pos++;
    else while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    if (p->pos < p->len && p->s[p->pos] == '.') {
        integer = 0;
        p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return fail(p, "bad fraction");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        integer = 0;
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9') return fail(p, "bad exponent");
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    }
    char buf[64];
    size_t n = p->pos - start;
    if (n >= sizeof buf) return fail(p, "number too long");
    memcpy(buf, p->s + start, n);
    buf[n] = 0;
    v->type = JSON_NUMBER;
    v->number = strtod(buf, NULL);
    if (integer) {
        errno = 0;
        long long ll = strtoll(buf, NULL, 10);
        v->is_integer = errno == 0;
        v->integer = ll;
    }
    if (!isfinite(v->number)) return fail(p, "number out of range");
    return 0;
}

static int parse_value(parser *p, json_value *v, int depth);

static int grow(parser *p, json_value *v, size_t *cap, int object) {
    if (v->count < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 8;
    json_value *items = realloc(v->items, nc * sizeof *items);
    if (!items) return fail(p, "out of memory");
    v->items = items;
    if (object) {
        char **keys = realloc(v->keys, nc * sizeof *keys);
        if (!keys) return fail(p, "out of memory");
        v->keys = keys;
    }
    *cap = nc;
    return 0;
}

static int parse_container(parser *p, json_value *v, int depth, int object) {
    size_t cap = 0;
    char close = object ? '}' : ']';
    v->type = object ? JSON_OBJECT : JSON_ARRAY;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        if (grow(p, v, &cap, object)) return 1;
        json_value *item = &v->items[v->count];
        memset(item, 0, sizeof *item);
        skip_ws(p);
        if (object) {
            if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "expected a member name");
            if (parse_string(p, &v->keys[v->count])) return 1;
            v->count++;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') return fail(p, "expected ':'");
            p->pos++;
        } else {
            v->count++;
        }
        if (parse_value(p, item, depth + 1)) return 1;
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, "unterminated container");
        if (p->s[p->pos] == ',') { p->pos++; continue; }
        if (p->s[p->pos] == close) { p->pos++; return 0; }
        return fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_value(parser *p, json_value *v, int depth) {
    if (depth > MAX_DEPTH) return fail(p, "nested too deeply");
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, "unexpected end");
    char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_container(p, v, depth, 1);
    case '[': return parse_container(p, v, depth, 0);
    case '"': v->type = JSON_STRING; return parse_string(p, &v->string);
    case 't': v->type = JSON_BOOL; v->boolean = 1; return literal(p, "true");
    case 'f': v->type = JSON_BOOL; return literal(p, "false");
    case 'n': v->type = JSON_NULL; return literal(p, "null");
    default: return parse_number(p, v);
    }
}

static void free_inner(json_value *v) {
    for (size_t i = 0; i < v->count; i++) {
        free_inner(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
}

void json_free(json_value *v) {
    if (!v) return;
    free_inner(v);
    free(v);
}

int json_parse(const char *text, size_t len, json_value **out, char *err, size_t errlen) {
    parser p = {text, len, 0, err, errlen, 0};
    json_value *v = calloc(1, sizeof *v);
    *out = NULL;
    if (!v) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    if (parse_value(&p, v, 0) == 0) {
        skip_ws(&p);
        if (p.pos != p.len) fail(&p, "trailing characters");
    }
    if (p.failed) {
        json_free(v);
        return 1;
    }
    *out = v;
    return 0;
}

const json_value *json_get(const json_value *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

const char *json_type_name(json_type t) {
    static const char *names[] = {"null", "boolean", "number", "string", "array", "object"};
    return names[t];
}
