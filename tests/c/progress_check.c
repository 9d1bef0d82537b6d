/* Draws each argument as the progress line in turn, then clears it (engine/progress.c),
 * for tests/unit/test_progress.py, which reads stderr as a terminal would show it. */
#include <stdio.h>

#include "progress.h"

int main(int argc, char **argv) {
    progress p;
    progress_start(&p);
    for (int i = 1; i < argc; i++) progress_show(&p, "%s", argv[i]);
    progress_clear(&p);
    return 0;
}
