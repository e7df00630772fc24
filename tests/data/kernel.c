/* A tiny program for tests: its "objective" is a function of its knobs, so results are checkable. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#ifndef SIZE
#define SIZE 1
#endif

int main(int argc, char **argv) {
    int scale = argc > 1 ? atoi(argv[1]) : 1;
    double sleep_s = argc > 2 ? atof(argv[2]) : 0.0;
    if (sleep_s > 0) usleep((useconds_t)(sleep_s * 1e6));
    printf("{\"score\": %d, \"size\": %d, \"scale\": %d}\n", SIZE * scale, SIZE, scale);
    return 0;
}
