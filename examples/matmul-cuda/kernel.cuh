/* kernel.cuh - the tuned kernel of matmul.cu and its build-time knobs (see matmul.cu's header).
 *
 * Kept apart from the host program so that emulate.cpp can run the very same kernel on the CPU, with threads
 * standing in for a block's threads, to check its indexing on a machine without a GPU. No include guard: a test
 * includes it once per configuration to run its #error rules over the whole space.
 */

#ifndef BLOCK_X
#define BLOCK_X 16
#endif
#ifndef BLOCK_Y
#define BLOCK_Y 16
#endif
#ifndef TILE_M
#define TILE_M 4
#endif
#ifndef TILE_N
#define TILE_N 4
#endif
#ifndef TILE_K
#define TILE_K 16
#endif
#ifndef UNROLL
#define UNROLL 4
#endif
#ifndef VECTOR
#define VECTOR 4
#endif
#ifndef SHARED
#define SHARED 1
#endif

#define THREADS (BLOCK_X * BLOCK_Y)
#define BM (BLOCK_Y * TILE_M) /* rows of C per block */
#define BN (BLOCK_X * TILE_N) /* columns of C per block */

/* The same rules as the spec's constraints, so that a hand build fails as early as a tuned one. */
#if BLOCK_X < 1 || BLOCK_Y < 1 || TILE_M < 1 || TILE_N < 1 || TILE_K < 1 || UNROLL < 1
#error "BLOCK_X, BLOCK_Y, TILE_M, TILE_N, TILE_K and UNROLL must be positive"
#endif
#if THREADS > 1024
#error "BLOCK_X * BLOCK_Y must be at most 1024 (CUDA's limit of threads per block)"
#endif
#if VECTOR != 1 && VECTOR != 2 && VECTOR != 4
#error "VECTOR must be 1, 2 or 4"
#endif
#if TILE_M % VECTOR != 0 || TILE_N % VECTOR != 0 || TILE_K % VECTOR != 0
#error "TILE_M, TILE_N and TILE_K must be multiples of VECTOR (whole vectors are loaded and stored)"
#endif
#if SHARED != 0 && SHARED != 1
#error "SHARED must be 0 or 1"
#endif
#if SHARED && (BM + BN) * TILE_K * 4 > 48 * 1024
#error "(BM + BN) * TILE_K floats exceed the 48 KiB of static shared memory a block may have"
#endif

/* The argument of "#pragma unroll" must be a constant; build the pragma from the macro's value. */
#define PRAGMA_(x) _Pragma(#x)
#define UNROLL_PRAGMA(n) PRAGMA_(unroll n)

#if VECTOR == 4
typedef float4 vec_t;
#elif VECTOR == 2
typedef float2 vec_t;
#else
typedef float vec_t;
#endif

/* One aligned vector of VECTOR floats from src into registers dst[0..VECTOR). */
__device__ __forceinline__ void load_vec(float *dst, const float *src)
{
    const vec_t v = *reinterpret_cast<const vec_t *>(src);
    const float *f = reinterpret_cast<const float *>(&v);
#pragma unroll
    for (int j = 0; j < VECTOR; ++j)
        dst[j] = f[j];
}

__device__ __forceinline__ void store_vec(float *dst, const float *src)
{
    vec_t v;
    float *f = reinterpret_cast<float *>(&v);
#pragma unroll
    for (int j = 0; j < VECTOR; ++j)
        f[j] = src[j];
    *reinterpret_cast<vec_t *>(dst) = v;
}

/* C = A * B for ld x ld matrices, ld a multiple of BM, BN, TILE_K and 4 (the host pads), so that no
 * thread needs a bounds check and every vector access is aligned. Block (bx, by) computes the BM x BN
 * tile of C at (by * BM, bx * BN); thread (tx, ty) its TILE_M x TILE_N sub-tile at (ty * TILE_M, tx * TILE_N). */
__global__ void __launch_bounds__(THREADS) tuned_sgemm(const float *__restrict__ A, const float *__restrict__ B,
                                                       float *__restrict__ C, int ld)
{
    const int tx = threadIdx.x, ty = threadIdx.y;
    const size_t row0 = (size_t)blockIdx.y * BM + ty * TILE_M;
    const size_t col0 = (size_t)blockIdx.x * BN + tx * TILE_N;
    float acc[TILE_M][TILE_N];
#pragma unroll
    for (int m = 0; m < TILE_M; ++m)
#pragma unroll
        for (int n = 0; n < TILE_N; ++n)
            acc[m][n] = 0.0f;

#if SHARED
    /* A's slice is stored transposed (k-major), so that a thread reads its TILE_M values of A for one k
     * as contiguous, vectorisable words, as it does B's TILE_N values. */
    __shared__ __align__(16) float As[TILE_K][BM];
    __shared__ __align__(16) float Bs[TILE_K][BN];
    const int tid = ty * BLOCK_X + tx;
    const float *a_block = A + (size_t)blockIdx.y * BM * ld;
    const float *b_block = B + (size_t)blockIdx.x * BN;
    for (int k0 = 0; k0 < ld; k0 += TILE_K) {
        for (int i = tid; i < BM * (TILE_K / VECTOR); i += THREADS) {
            const int r = i / (TILE_K / VECTOR), c = (i % (TILE_K / VECTOR)) * VECTOR;
            float v[VECTOR];
            load_vec(v, a_block + (size_t)r * ld + k0 + c);
#pragma unroll
            for (int j = 0; j < VECTOR; ++j)
                As[c + j][r] = v[j];
        }
        for (int i = tid; i < TILE_K * (BN / VECTOR); i += THREADS) {
            const int r = i / (BN / VECTOR), c = (i % (BN / VECTOR)) * VECTOR;
            float v[VECTOR];
            load_vec(v, b_block + (size_t)(k0 + r) * ld + c);
            store_vec(&Bs[r][c], v);
        }
        __syncthreads();
        UNROLL_PRAGMA(UNROLL)
        for (int k = 0; k < TILE_K; ++k) {
            float a[TILE_M], b[TILE_N];
#pragma unroll
            for (int m = 0; m < TILE_M; m += VECTOR)
                load_vec(a + m, &As[k][ty * TILE_M + m]);
#pragma unroll
            for (int n = 0; n < TILE_N; n += VECTOR)
                load_vec(b + n, &Bs[k][tx * TILE_N + n]);
#pragma unroll
            for (int m = 0; m < TILE_M; ++m)
#pragma unroll
                for (int n = 0; n < TILE_N; ++n)
                    acc[m][n] = fmaf(a[m], b[n], acc[m][n]);
        }
        __syncthreads(); /* the next slice overwrites As and Bs */
    }
#else
    /* Every thread reads its operands from global memory; the caches, not the kernel, share them. */
    for (int k0 = 0; k0 < ld; k0 += TILE_K) {
        UNROLL_PRAGMA(UNROLL)
        for (int k = k0; k < k0 + TILE_K; ++k) {
            float a[TILE_M], b[TILE_N];
#pragma unroll
            for (int m = 0; m < TILE_M; ++m)
                a[m] = A[(row0 + m) * ld + k];
#pragma unroll
            for (int n = 0; n < TILE_N; n += VECTOR)
                load_vec(b + n, B + (size_t)k * ld + col0 + n);
#pragma unroll
            for (int m = 0; m < TILE_M; ++m)
#pragma unroll
                for (int n = 0; n < TILE_N; ++n)
                    acc[m][n] = fmaf(a[m], b[n], acc[m][n]);
        }
    }
#endif

#pragma unroll
    for (int m = 0; m < TILE_M; ++m)
#pragma unroll
        for (int n = 0; n < TILE_N; n += VECTOR)
            store_vec(C + (row0 + m) * ld + col0 + n, &acc[m][n]);
}

static inline int tile_gcd(int a, int b) { return b == 0 ? a : tile_gcd(b, a % b); }

/* The leading dimension the kernel needs for order n: n rounded up to whole BM, BN, TILE_K and float4s.
 * The host pads the matrices with zeros to it, which changes no entry of the n x n product. */
static inline long padded_order(long n)
{
    long unit = 4;
    const int sizes[3] = {BM, BN, TILE_K};
    for (int i = 0; i < 3; ++i)
        unit = unit / tile_gcd((int)unit, sizes[i]) * sizes[i];
    return (n + unit - 1) / unit * unit;
}
