#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L /* isatty */
#endif
#include "progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <io.h>
#define stderr_is_terminal() _isatty(_fileno(stderr))
#else
#include <unistd.h>
#define stderr_is_terminal() isatty(STDERR_FILENO)
#endif

#include "clock.h"

/* A run shorter than this shows nothing; the line changes at most this often. */
#define QUIET_SECONDS 0.5
#define EVERY_SECONDS 0.25

void progress_start(progress *p) {
    const char *env = getenv("COLI_PROGRESS");
    memset(p, 0, sizeof *p);
    p->forced = env && !strcmp(env, "1");
    p->on = p->forced || (!(env && !strcmp(env, "0")) && stderr_is_terminal());
    p->start = p->shown = coli_now();
}

void progress_show(progress *p, const char *fmt, ...) {
    if (!p->on) return;
    const double now = coli_now();
    if (!p->forced && (now - p->shown < EVERY_SECONDS || now - p->start < QUIET_SECONDS)) return;
    char line[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* padded over the line before: a Windows console need not know ANSI's erase */
    const int len = (int)strlen(line);
    fprintf(stderr, "\r%-*s", len > p->width ? len : p->width, line);
    fflush(stderr);
    p->width = len;
    p->shown = now;
}

void progress_clear(progress *p) {
    if (!p->on || !p->width) return;
    fprintf(stderr, "\r%*s\r", p->width, "");
    fflush(stderr);
    p->width = 0;
}
