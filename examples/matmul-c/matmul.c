/* matmul.c - single-precision C = A*B (row-major, N x N), a tuning target for Fleet.
 *
 * Build-time knobs (gcc -D...):  TILE_I, TILE_J, TILE_K  cache tile sizes (0 0 0 = untiled baseline)
 *                                UNROLL                  innermost-loop unroll factor (1, 2, 4, 8; 1..64 ok)
 * Run-time knob:                 argv[1] = N (1..8192)
 * stdout: one JSON line {"gflops": .., "seconds": .., "tile_kib": .., "n": N, "check": "ok"}; exit 0, 2 (bad N),
 *         3 (wrong C). tile_kib: the cache one tile's blocks of A, B and C take (a second objective to weigh).
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef TILE_I
#define TILE_I 0
#endif
#ifndef TILE_J
#define TILE_J 0
#endif
#ifndef TILE_K
#define TILE_K 0
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#if TILE_I < 0 || TILE_J < 0 || TILE_K < 0
#error "TILE_I, TILE_J and TILE_K must be >= 0"
#endif
#if UNROLL < 1 || UNROLL > 64
#error "UNROLL must be in 1..64"
#endif

/* GCC does not macro-expand the argument of "#pragma GCC unroll", so build it with _Pragma. */
#define PRAGMA_(x) _Pragma(#x)
#define UNROLL_PRAGMA(n) PRAGMA_(GCC unroll n)

#if TILE_I == 0 && TILE_J == 0 && TILE_K == 0
/* Baseline: the textbook i-j-k loop. The inner k loop walks B down a column (stride N floats),
 * touching a new cache line per iteration, and is a float reduction GCC may not reorder without
 * -ffast-math, so it is memory-bound and gains ~nothing from SIMD at -O2 or -O3. UNROLL is
 * deliberately ignored: this is the fixed reference that speedups are reported against. */
static void matmul(int n, const float *restrict A, const float *restrict B, float *restrict C)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            float sum = 0.0f;
            for (int k = 0; k < n; k++)
                sum += A[(size_t)i * n + k] * B[(size_t)k * n + j];
            C[(size_t)i * n + j] = sum;
        }
}
#else
/* Tiled: blocks of A, B and C sized to stay in cache are reused across a whole tile. Inside a tile
 * the order is i-k-j, so the innermost loop does C[i][j] += a * B[k][j] over contiguous rows: no
 * reduction, unit stride, vectorisable. A tile size of 0 (with another one positive) means
 * "don't tile that loop". Tiles need not divide N: every bound is clipped to N. */
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define TILE_OR_N(t, n) ((t) > 0 ? (t) : (n))
static void matmul(int n, const float *restrict A, const float *restrict B, float *restrict C)
{
    const int ti = TILE_OR_N(TILE_I, n), tj = TILE_OR_N(TILE_J, n), tk = TILE_OR_N(TILE_K, n);
    memset(C, 0, (size_t)n * n * sizeof *C); /* tiles accumulate partial sums over k */
    for (int ii = 0; ii < n; ii += ti)
        for (int kk = 0; kk < n; kk += tk)
            for (int jj = 0; jj < n; jj += tj) {
                const int imax = MIN(ii + ti, n), kmax = MIN(kk + tk, n), jmax = MIN(jj + tj, n);
                for (int i = ii; i < imax; i++) {
                    float *restrict c = C + (size_t)i * n;
                    for (int k = kk; k < kmax; k++) {
                        const float a = A[(size_t)i * n + k];
                        const float *restrict b = B + (size_t)k * n;
                        int j = jj;
                        /* Unrolled body: UNROLL independent multiply-adds per step. GCC's -O2 cost
                         * model only vectorises a loop that needs no scalar epilogue; a loop stepping
                         * by UNROLL over this straight-line block qualifies, and the block is packed
                         * into SSE/AVX vectors, so UNROLL really changes the -O2 code. Indexing via
                         * cj/bj (not c[j + u]) keeps the accesses one contiguous group: with c[j + u]
                         * GCC 12 -O3 split the group at UNROLL=8 and fell back to scalar code. */
                        for (; j + UNROLL <= jmax; j += UNROLL) {
                            float *restrict cj = c + j;
                            const float *restrict bj = b + j;
                            UNROLL_PRAGMA(UNROLL)
                            for (int u = 0; u < UNROLL; u++)
                                cj[u] += a * bj[u];
                        }
                        for (; j < jmax; j++) /* remainder when UNROLL does not divide the tile */
                            c[j] += a * b[j];
                    }
                }
            }
}
#endif

/* Fixed LCG (Numerical Recipes constants): same matrices every run, on every machine. */
static uint32_t lcg_state = 12345u;
static uint32_t lcg(void) { return lcg_state = lcg_state * 1664525u + 1013904223u; }

/* Values k/8 with k in -8..8: every product is a multiple of 1/64 and |C| <= N <= 2^13, so every
 * partial sum fits a float's 24-bit mantissa exactly, whatever order the loops add in. */
static float small_value(void) { return (float)((int)((lcg() >> 16) % 17u) - 8) / 8.0f; }

static float *alloc_matrix(int n)
{
    size_t bytes = ((size_t)n * n * sizeof(float) + 63) & ~(size_t)63; /* aligned_alloc wants a multiple */
    float *p = aligned_alloc(64, bytes);
    if (!p) {
        fprintf(stderr, "matmul: out of memory for N=%d\n", n);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    char *end = NULL;
    long nl = argc == 2 ? strtol(argv[1], &end, 10) : 0;
    if (argc != 2 || end == argv[1] || *end != '\0' || nl < 1 || nl > 8192) {
        fprintf(stderr, "usage: %s N   (matrix order, integer 1..8192)\n", argv[0]);
        return 2;
    }
    const int n = (int)nl;
    float *A = alloc_matrix(n), *B = alloc_matrix(n), *C = alloc_matrix(n);
    for (size_t x = 0; x < (size_t)n * n; x++) A[x] = small_value();
    for (size_t x = 0; x < (size_t)n * n; x++) B[x] = small_value();

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    matmul(n, A, B, C);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (seconds <= 0.0) seconds = 1e-9; /* clock granularity at tiny N; keeps gflops finite */

    /* Spot-check 16 entries (two corners catch tile-edge bugs, the rest pseudo-random) against a
     * double-precision dot product. Tolerance is relative to sum |a*b|, so entries that cancel to
     * ~0 are not held to an impossible standard. */
    for (int s = 0; s < 16; s++) {
        int i = s == 0 ? 0 : s == 1 ? n - 1 : (int)(lcg() % (uint32_t)n);
        int j = s == 0 ? 0 : s == 1 ? n - 1 : (int)(lcg() % (uint32_t)n);
        double ref = 0.0, mag = 0.0;
        for (int k = 0; k < n; k++) {
            double p = (double)A[(size_t)i * n + k] * (double)B[(size_t)k * n + j];
            ref += p;
            mag += fabs(p);
        }
        double got = C[(size_t)i * n + j];
        if (fabs(got - ref) > 1e-3 * mag) { /* mag == 0 means ref == 0: got must be 0 too */
            printf("{\"check\": \"failed\", \"n\": %d, \"i\": %d, \"j\": %d, \"got\": %.9g, \"want\": %.9g}\n",
                   n, i, j, got, ref);
            return 3;
        }
    }
    /* A tile's blocks: TILE_I x TILE_K of A, TILE_K x TILE_J of B, TILE_I x TILE_J of C (0, untiled, is all of N). */
    const double ti = TILE_I > 0 ? TILE_I : n, tj = TILE_J > 0 ? TILE_J : n, tk = TILE_K > 0 ? TILE_K : n;
    const double tile_kib = (ti * tk + tk * tj + ti * tj) * sizeof(float) / 1024.0;
    printf("{\"gflops\": %.6g, \"seconds\": %.9g, \"tile_kib\": %.6g, \"n\": %d, \"check\": \"ok\"}\n",
           2.0 * n * n * n / seconds / 1e9, seconds, tile_kib, n);
    free(A);
    free(B);
    free(C);
    return 0;
}
