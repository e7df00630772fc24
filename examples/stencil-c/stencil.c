/* A 2-D five-point Jacobi stencil on an N x N grid, tiled in blocks, timed, checked, one JSON line out.
 *
 * Build-time knobs:  -DBLOCK_I=<rows per tile> -DBLOCK_J=<columns per tile> (0: no tiling of that loop)
 * Problem parameters: argv[1] = N (grid order, 16..8192), argv[2] = STEPS (sweeps, 1..10000)
 *
 * Output: {"mcells": <million cell updates per second>, "seconds": ..., "n": N, "steps": STEPS, "check": "ok"}
 * The check compares the tiled result with an untiled sweep of the same grid; a mismatch prints
 * "check": "failed" and "valid": false, which Fleet records as an invalid measurement.
 */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef BLOCK_I
#define BLOCK_I 0
#endif
#ifndef BLOCK_J
#define BLOCK_J 0
#endif
#if BLOCK_I < 0 || BLOCK_J < 0
#error "BLOCK_I and BLOCK_J must be >= 0"
#endif

static void sweep(int n, const float *restrict in, float *restrict out, int bi, int bj)
{
    const int step_i = bi > 0 ? bi : n, step_j = bj > 0 ? bj : n;
    for (int i0 = 1; i0 < n - 1; i0 += step_i) {
        const int i1 = i0 + step_i < n - 1 ? i0 + step_i : n - 1;
        for (int j0 = 1; j0 < n - 1; j0 += step_j) {
            const int j1 = j0 + step_j < n - 1 ? j0 + step_j : n - 1;
            for (int i = i0; i < i1; i++)
                for (int j = j0; j < j1; j++)
                    out[i * n + j] = 0.2f * (in[i * n + j] + in[(i - 1) * n + j] + in[(i + 1) * n + j] +
                                             in[i * n + j - 1] + in[i * n + j + 1]);
        }
    }
}

static float *run(int n, int steps, int bi, int bj)
{
    float *a = calloc((size_t)n * n, sizeof *a), *b = calloc((size_t)n * n, sizeof *b);
    if (!a || !b) {
        fprintf(stderr, "out of memory for N=%d\n", n);
        exit(2);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            a[i * n + j] = b[i * n + j] = (float)((i * 31 + j * 17) % 101) / 101.0f;
    for (int s = 0; s < steps; s++) {
        sweep(n, a, b, bi, bj);
        float *t = a;
        a = b;
        b = t;
    }
    free(b);
    return a;
}

static long parse(const char *text, long low, long high)
{
    char *end;
    long value = strtol(text, &end, 10);
    return (end == text || *end != '\0' || value < low || value > high) ? -1 : value;
}

int main(int argc, char **argv)
{
    const long n = argc == 3 ? parse(argv[1], 16, 8192) : -1, steps = argc == 3 ? parse(argv[2], 1, 10000) : -1;
    if (n < 0 || steps < 0) {
        fprintf(stderr, "usage: %s N STEPS   (grid order 16..8192, sweeps 1..10000)\n", argv[0]);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    float *tiled = run((int)n, (int)steps, BLOCK_I, BLOCK_J);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    float *plain = run((int)n, 1, 0, 0);  /* one untiled sweep: enough to catch a tiling that skips cells */
    float *check = run((int)n, 1, BLOCK_I, BLOCK_J);
    const int ok = memcmp(plain, check, sizeof(float) * (size_t)n * (size_t)n) == 0 && isfinite(tiled[n + 1]);
    printf("{\"mcells\": %.3f, \"seconds\": %.6f, \"n\": %ld, \"steps\": %ld, \"check\": \"%s\"%s}\n",
           (double)(n - 2) * (double)(n - 2) * (double)steps / seconds / 1e6, seconds, n, steps, ok ? "ok" : "failed",
           ok ? "" : ", \"valid\": false");
    free(tiled);
    free(plain);
    free(check);
    return 0;
}
