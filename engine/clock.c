#if !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include "clock.h"

#if defined(_WIN32)
#include <windows.h>
#else
#include <time.h>
#endif

double coli_now(void) {
#if defined(_WIN32)
    LARGE_INTEGER f, c;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&c);
    return (double)c.QuadPart / (double)f.QuadPart;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
#endif
}
