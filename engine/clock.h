/* A monotonic clock in seconds, for the timings the engine reports. */
#ifndef COLI_CLOCK_H
#define COLI_CLOCK_H

double coli_now(void);

#endif
