/* Minimal JSON writing for the CLI's --json output. */
#ifndef COLI_JSON_OUT_H
#define COLI_JSON_OUT_H

#include <stdio.h>

/* Writes s as a JSON string literal (quoted, escaped); NULL becomes null. */
void json_string(FILE *f, const char *s);

#endif
