/* A small, strict JSON reader for config.json and safetensors headers: every
 * malformed input is an error with a byte offset, never a crash. */
#ifndef COLI_JSON_H
#define COLI_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value {
    json_type type;
    int boolean;
    double number;
    int is_integer;      /* the literal had no fraction or exponent */
    int64_t integer;     /* valid when is_integer and it fits */
    char *string;        /* NUL-terminated (strings, object keys) */
    size_t count;        /* array items / object members */
    struct json_value *items;
    char **keys;         /* object member names, parallel to items */
} json_value;

/* Parses text[0..len); 0 on success with *out owned by the caller (json_free). */
int json_parse(const char *text, size_t len, json_value **out, char *err, size_t errlen);
void json_free(json_value *v);

/* Member of an object, or NULL. */
const json_value *json_get(const json_value *obj, const char *key);
const char *json_type_name(json_type t);

#endif
