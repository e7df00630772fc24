// emulate.cpp - runs kernel.cuh's tuned_sgemm on the CPU, to check its indexing where there is no GPU.
//
// Each block runs as THREADS std::threads meeting at a std::barrier for __syncthreads(), and its
// __shared__ arrays are function statics, shared by those threads; blocks run one after the other. This
// checks what the kernel computes (tiles, vector accesses, the shared-memory staging and its barriers), not
// how fast: that needs a GPU.
//
//   g++ -std=c++20 -O1 -pthread -DBM=64 -DBN=32 ... emulate.cpp -o emulate && ./emulate 40
//
// stdout: one JSON line {"check": "ok", "n": N, "ld": LD} (exit 0) or {"check": "failed", ...} (exit 3).
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};

static thread_local dim3 threadIdx, blockIdx;
static dim3 gridDim;
static std::barrier<> *block_barrier = nullptr;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

static void __syncthreads() { block_barrier->arrive_and_wait(); }

#include "kernel.cuh"

int main(int argc, char **argv)
{
    const long n = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 0;
    if (n < 1 || n > 512) {
        std::fprintf(stderr, "usage: emulate N   (1 <= N <= 512)\n");
        return 2;
    }
    const int ld = (int)padded_order(n);
    std::vector<float> A((size_t)ld * ld), B((size_t)ld * ld), C((size_t)ld * ld, -1.0f);
    uint32_t state = 7u;
    for (long i = 0; i < n; ++i)
        for (long j = 0; j < n; ++j) {
            state = state * 1664525u + 1013904223u;
            A[i * ld + j] = (float)((int)((state >> 16) % 17u) - 8) / 8.0f;
            state = state * 1664525u + 1013904223u;
            B[i * ld + j] = (float)((int)((state >> 16) % 17u) - 8) / 8.0f;
        }
    gridDim = dim3((unsigned)(ld / BN), (unsigned)(ld / BM));
    for (unsigned by = 0; by < gridDim.y; ++by)
        for (unsigned bx = 0; bx < gridDim.x; ++bx) {
            std::barrier<> barrier(THREADS);
            block_barrier = &barrier;
            std::vector<std::thread> threads;
            for (unsigned tid = 0; tid < THREADS; ++tid)
                threads.emplace_back([&, tid] {
                    threadIdx = dim3(tid);
                    blockIdx = dim3(bx, by);
                    tuned_sgemm(A.data(), B.data(), C.data(), ld);
                });
            for (std::thread &t : threads)
                t.join();
        }
    for (long i = 0; i < n; ++i)
        for (long j = 0; j < n; ++j) {
            double want = 0.0;
            for (long k = 0; k < n; ++k)
                want += (double)A[i * ld + k] * B[k * ld + j];
            if (!(std::fabs(C[i * ld + j] - want) <= 1e-3)) {
                std::printf("{\"check\": \"failed\", \"n\": %ld, \"i\": %ld, \"j\": %ld, \"got\": %g, \"want\": %g}\n",
                            n, i, j, C[i * ld + j], want);
                return 3;
            }
        }
    std::printf("{\"check\": \"ok\", \"n\": %ld, \"ld\": %d}\n", n, ld);
    return 0;
}
