/* kernel.cuh - the tuned kernel of matmul.cu and its build-time knobs (see matmul.cu's header).
 *
 * A warp-tiled FP32 SGEMM: a block computes a BM x BN tile of C, each of its warps a WM x WN part of that
 * tile, and each warp's part is WM_ITER x WN_ITER sub-tiles in which every lane holds a TM x TN register tile.
 * Slices of A and B, BK deep, go through shared memory: A transposed (k-major, so that a lane reads its TM
 * values of one k as float4s), B as it is. With DOUBLE_BUFFER the next slice is fetched while this one is
 * multiplied (A through registers, B with cp.async where the target has it), one barrier per slice.
 *
 * Kept apart from the host program so that emulate.cpp can run the very same kernel on the CPU, with threads
 * standing in for a block's threads, to check its indexing on a machine without a GPU. No include guard: a test
 * includes it once per configuration to run its #error rules over the whole space.
 */

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 16
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 32
#endif
#ifndef WN_ITER
#define WN_ITER 2
#endif
#ifndef TM
#define TM 4
#endif
#ifndef TN
#define TN 4
#endif
#ifndef DOUBLE_BUFFER
#define DOUBLE_BUFFER 1
#endif
#ifndef ASYNC_COPY
#define ASYNC_COPY 1
#endif
#ifndef SWIZZLE
#define SWIZZLE 8
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

#define WARP 32
#define WARPS ((BM / WM) * (BN / WN))
#define THREADS (WARPS * WARP)
#define WM_ITER ((WM * WN) / (WARP * TM * TN * WN_ITER)) /* sub-tiles of a warp's part along M */
#define WSUB_M (WM / WM_ITER)                             /* rows of one sub-tile */
#define WSUB_N (WN / WN_ITER)                             /* columns of one sub-tile */
#define LANES_N (WSUB_N / TN)                             /* lanes along a sub-tile's columns */
#define A_PAD 4 /* floats added to each k-row of the transposed A: spreads its stores over the banks */
#define A_ROW (BM + A_PAD)
#define A_LOADS (BM * BK / 4 / THREADS) /* float4s of A's slice each thread fetches */
#define B_LOADS (BK * BN / 4 / THREADS)
#define STAGES (DOUBLE_BUFFER ? 2 : 1)
#define SHARED_BYTES (STAGES * BK * (A_ROW + BN) * 4)

/* The same rules as the spec's constraints, so that a hand build fails as early as a tuned one. */
#if BM < 1 || BN < 1 || BK < 4 || WM < 1 || WN < 1 || WN_ITER < 1 || SWIZZLE < 1 || MIN_BLOCKS < 1
#error "BM, BN, WM, WN, WN_ITER, SWIZZLE and MIN_BLOCKS must be positive, BK at least 4"
#endif
#if TM % 4 != 0 || TN % 4 != 0 || BK % 4 != 0
#error "TM, TN and BK must be multiples of 4 (whole float4s are loaded and stored)"
#endif
#if BM % WM != 0 || BN % WN != 0
#error "a block's tile must be whole warp tiles: BM % WM == 0 and BN % WN == 0"
#endif
#if THREADS > 1024
#error "(BM / WM) * (BN / WN) warps must be at most 1024 threads (CUDA's limit per block)"
#endif
#if WN % WN_ITER != 0 || WSUB_N % TN != 0 || (WARP % LANES_N) != 0
#error "WN / WN_ITER columns must split into TN-wide lanes that divide a warp"
#endif
#if WM_ITER < 1 || (WM * WN) % (WARP * TM * TN * WN_ITER) != 0 || WM % WM_ITER != 0 || WSUB_M != (WARP / LANES_N) * TM
#error "a warp's WM x WN must be whole sub-tiles of 32 lanes of TM x TN: WM * WN % (32 * TM * TN * WN_ITER) == 0"
#endif
#if (BM * BK / 4) % THREADS != 0 || (BK * BN / 4) % THREADS != 0
#error "each slice of A (BM x BK) and B (BK x BN) must be whole float4s for every thread"
#endif
#if DOUBLE_BUFFER != 0 && DOUBLE_BUFFER != 1
#error "DOUBLE_BUFFER must be 0 or 1"
#endif
#if ASYNC_COPY != 0 && ASYNC_COPY != 1
#error "ASYNC_COPY must be 0 or 1"
#endif
#if THREADS * MIN_BLOCKS > 2048
#error "MIN_BLOCKS blocks of THREADS threads must fit on one multiprocessor (2048 threads)"
#endif
#if SHARED_BYTES > 48 * 1024
#error "the slices of A and B (times two with DOUBLE_BUFFER) exceed the 48 KiB of static shared memory a block may have"
#endif

/* Copy 16 bytes of global memory into shared memory: cp.async (Ampere and later) when asked for, so that the
 * copy needs no register and runs while the block computes; a plain float4 copy otherwise. */
__device__ __forceinline__ void copy16(float *shared_dst, const float *global_src)
{
#if ASYNC_COPY && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned dst = (unsigned)__cvta_generic_to_shared(shared_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(global_src));
#else
    *reinterpret_cast<float4 *>(shared_dst) = *reinterpret_cast<const float4 *>(global_src);
#endif
}

/* Wait until this thread's cp.async copies have landed (the barrier after it makes them everyone's). */
__device__ __forceinline__ void copies_done()
{
#if ASYNC_COPY && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::);
#endif
}

/* A float4 of memory into four registers, and four registers into a float4 of memory: the registers are
 * named one by one, since an array of registers has no 16-byte alignment to cast to float4. */
__device__ __forceinline__ void unpack(float *dst, const float *src)
{
    const float4 v = *reinterpret_cast<const float4 *>(src);
    dst[0] = v.x;
    dst[1] = v.y;
    dst[2] = v.z;
    dst[3] = v.w;
}

__device__ __forceinline__ void pack(float *dst, const float *src)
{
    float4 v;
    v.x = src[0];
    v.y = src[1];
    v.z = src[2];
    v.w = src[3];
    *reinterpret_cast<float4 *>(dst) = v;
}

/* One slice's worth of a thread's part of the copy from global memory: A's float4s in registers (they are
 * transposed on their way into shared memory), B's straight into shared memory. */
struct Slice {
    float4 a[A_LOADS];
};

__device__ __forceinline__ void fetch_slice(Slice &s, float *Bs, const float *A, const float *B, int ld, int k0,
                                            int tid)
{
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
        const int index = tid + i * THREADS, row = index / (BK / 4), col = index % (BK / 4) * 4;
        s.a[i] = *reinterpret_cast<const float4 *>(A + (size_t)row * ld + k0 + col);
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
        const int index = tid + i * THREADS, row = index / (BN / 4), col = index % (BN / 4) * 4;
        copy16(Bs + row * BN + col, B + (size_t)(k0 + row) * ld + col);
    }
}

__device__ __forceinline__ void store_slice(const Slice &s, float *As, int tid)
{
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
        const int index = tid + i * THREADS, row = index / (BK / 4), col = index % (BK / 4) * 4;
        As[(col + 0) * A_ROW + row] = s.a[i].x;
        As[(col + 1) * A_ROW + row] = s.a[i].y;
        As[(col + 2) * A_ROW + row] = s.a[i].z;
        As[(col + 3) * A_ROW + row] = s.a[i].w;
    }
}

/* C = A * B for ld x ld matrices, ld a multiple of BM, BN and BK (the host pads), so that no thread needs a
 * bounds check and every float4 access is aligned. MIN_BLOCKS blocks per multiprocessor caps the registers a
 * thread may use at 64 Ki / (THREADS * MIN_BLOCKS): more blocks hide more latency, until the tiles spill. */
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS) tuned_sgemm(const float *__restrict__ A, const float *__restrict__ B,
                                                       float *__restrict__ C, int ld)
{
    /* SWIZZLE rows of tiles are walked column by column, so that blocks running at once share slices of A
     * and B in the L2 cache; SWIZZLE 1 is the plain row-major order. */
    const int tiles_n = gridDim.x, tiles_m = gridDim.y;
    const int linear = blockIdx.y * tiles_n + blockIdx.x;
    const int group = linear / (SWIZZLE * tiles_n), first_m = group * SWIZZLE;
    const int group_rows = tiles_m - first_m < SWIZZLE ? tiles_m - first_m : SWIZZLE;
    const int in_group = linear % (SWIZZLE * tiles_n);
    const int tile_m = first_m + in_group % group_rows, tile_n = in_group / group_rows;

    const int tid = threadIdx.x, warp = tid / WARP, lane = tid % WARP;
    const int warp_m = warp / (BN / WN), warp_n = warp % (BN / WN);
    const int lane_m = lane / LANES_N, lane_n = lane % LANES_N;

    __shared__ __align__(16) float As[STAGES][BK * A_ROW];
    __shared__ __align__(16) float Bs[STAGES][BK * BN];

    A += (size_t)tile_m * BM * ld;
    B += (size_t)tile_n * BN;
    C += (size_t)tile_m * BM * ld + (size_t)tile_n * BN;

    float acc[WM_ITER * TM][WN_ITER * TN];
#pragma unroll
    for (int m = 0; m < WM_ITER * TM; ++m)
#pragma unroll
        for (int n = 0; n < WN_ITER * TN; ++n)
            acc[m][n] = 0.0f;

    Slice next;
    fetch_slice(next, Bs[0], A, B, ld, 0, tid);
    store_slice(next, As[0], tid);
    copies_done();
    __syncthreads();

    const int slices = ld / BK;
    for (int t = 0; t < slices; ++t) {
        const int stage = DOUBLE_BUFFER ? t % 2 : 0;
        const bool more = t + 1 < slices;
#if DOUBLE_BUFFER
        /* The other stage was last read before the barrier that ended the previous slice: free to fill. */
        if (more)
            fetch_slice(next, Bs[1 - stage], A, B, ld, (t + 1) * BK, tid);
#endif
        const float *as = As[stage] + warp_m * WM + lane_m * TM;
        const float *bs = Bs[stage] + warp_n * WN + lane_n * TN;
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            float a[WM_ITER * TM], b[WN_ITER * TN];
#pragma unroll
            for (int i = 0; i < WM_ITER; ++i)
#pragma unroll
                for (int m = 0; m < TM; m += 4)
                    unpack(&a[i * TM + m], as + k * A_ROW + i * WSUB_M + m);
#pragma unroll
            for (int j = 0; j < WN_ITER; ++j)
#pragma unroll
                for (int n = 0; n < TN; n += 4)
                    unpack(&b[j * TN + n], bs + k * BN + j * WSUB_N + n);
#pragma unroll
            for (int m = 0; m < WM_ITER * TM; ++m)
#pragma unroll
                for (int n = 0; n < WN_ITER * TN; ++n)
                    acc[m][n] = fmaf(a[m], b[n], acc[m][n]);
        }
#if DOUBLE_BUFFER
        if (more) {
            store_slice(next, As[1 - stage], tid);
            copies_done();
        }
        __syncthreads(); /* the next slice is in place, and this one may be overwritten */
#else
        if (more) {
            __syncthreads(); /* everyone is done with this slice before it is overwritten */
            fetch_slice(next, Bs[0], A, B, ld, (t + 1) * BK, tid);
            store_slice(next, As[0], tid);
            copies_done();
            __syncthreads();
        }
#endif
    }

#pragma unroll
    for (int i = 0; i < WM_ITER; ++i)
#pragma unroll
        for (int m = 0; m < TM; ++m) {
            float *row = C + (size_t)(warp_m * WM + i * WSUB_M + lane_m * TM + m) * ld + warp_n * WN + lane_n * TN;
#pragma unroll
            for (int j = 0; j < WN_ITER; ++j)
#pragma unroll
                for (int n = 0; n < TN; n += 4)
                    pack(row + j * WSUB_N + n, &acc[i * TM + m][j * TN + n]);
        }
}

static inline long tile_gcd(long a, long b) { return b == 0 ? a : tile_gcd(b, a % b); }

/* The leading dimension the kernel needs for order n: n rounded up to whole BM, BN and BK (all multiples of
 * 4, so whole float4s too). The host pads the matrices with zeros to it, which changes no entry of the n x n
 * product. */
static inline long padded_order(long n)
{
    long unit = BM / tile_gcd(BM, BN) * BN;
    unit = unit / tile_gcd(unit, BK) * BK;
    return (n + unit - 1) / unit * unit;
}
