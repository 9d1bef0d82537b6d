/* `coli doctor`: why the GPU tier would or would not run on this machine, told
 * without starting it. The platform; the backends beside the executable, their ABI
 * and the device code inside them; for HIP, what COLI_HIP_RUNTIME_DIR says, the
 * binding decision (decided, as the bind decides it, before anything loads), the
 * runtimes already mapped and those the system holds, with their versions; the
 * GPUs each backend's runtime reports against the code the backend carries; and
 * one verdict line per problem, with its fix. No backend is initialised and no
 * device is selected or given memory. */
#ifndef COLI_DOCTOR_H
#define COLI_DOCTOR_H

#include <stdio.h>

/* The report on `out` (one JSON object with `json`); 0 when nothing stands in the
 * GPU tier's way, 1 when a verdict is a problem (warnings alone give 0). */
int coli_doctor(int json, FILE *out);

#endif
