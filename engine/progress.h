/* One line on stderr that follows a long run (the prefill's layers, the decode's tokens)
 * where stderr is a terminal, rewritten in place a few times a second and cleared at the
 * end, so what the run prints is what it prints without it. COLI_PROGRESS=1 shows it
 * anyway, every step (a log, a test), COLI_PROGRESS=0 never. */
#ifndef COLI_PROGRESS_H
#define COLI_PROGRESS_H

typedef struct progress {
    int on, forced;
    double start, shown; /* coli_now() at the start and at the last line drawn */
    int width;           /* the line on screen, 0 for none */
} progress;

void progress_start(progress *p);
/* Draws the line (printf's format); on a terminal not where one was drawn a moment ago,
 * or while the run is young enough that it may end before a reader could see it. */
void progress_show(progress *p, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void progress_clear(progress *p);

#endif
