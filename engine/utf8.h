/* Paths and arguments as UTF-8 on every platform: Windows hands main() its
 * arguments, and the narrow file APIs their paths, in the ANSI code page,
 * which cannot hold every name. */
#ifndef COLI_UTF8_H
#define COLI_UTF8_H

#include <stddef.h>
#include <stdio.h>

/* Returns argv itself on POSIX; on Windows a UTF-8 copy of the wide command line
 * (kept for the life of the process), or argv when that fails. */
char **coli_args_utf8(int *argc, char **argv);

/* fopen of a UTF-8 path. */
FILE *coli_fopen(const char *path, const char *mode);

/* A whole small file (config.json, a shard index) of at most 64 MiB, malloc'ed;
 * NULL when it cannot be read. */
char *coli_read_file(const char *path, size_t *len);

/* -1: does not exist, 0: a file, 1: a directory. */
int coli_path_kind(const char *path);

#if defined(_WIN32)
#include <wchar.h>
/* A UTF-8 string as UTF-16, malloc'ed (NULL: not valid UTF-8, or out of memory).
 * An absolute path of MAX_PATH characters or more gets the \\?\ (or \\?\UNC\)
 * prefix, so the file APIs and the loader take it without a long-path manifest. */
wchar_t *coli_widen(const char *s);

/* UTF-16 as UTF-8, malloc'ed; NULL when it cannot be converted. */
char *coli_narrow(const wchar_t *w);
#endif

#endif
