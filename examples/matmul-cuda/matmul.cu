/* matmul.cu - single-precision C = A*B (row-major, N x N) on an NVIDIA GPU, a tuning target for Fleet.
 *
 * Build-time knobs (nvcc -D...), the kernel's in kernel.cuh:
 *   BM, BN, BK         the block's tile of C (BM x BN) and the depth of the slices of A and B it stages
 *   WM, WN             one warp's part of the block's tile
 *   WN_ITER            sub-tiles a warp's part is cut into along N (along M follows from the rest)
 *   TM, TN             one lane's register tile in each sub-tile (multiples of 4: float4 accesses)
 *   DOUBLE_BUFFER      1: fetch the next slice while this one is multiplied (two stages of shared memory)
 *   ASYNC_COPY         1: B's slices go to shared memory by cp.async (sm_80 and later), no registers on the way
 *   SWIZZLE            rows of tiles walked together, for the L2 cache (1: plain row-major order)
 *   MIN_BLOCKS         blocks each multiprocessor must hold at once (__launch_bounds__: caps the registers)
 *   MATMUL_CUBLAS      defined: the program can also time cuBLAS (--cublas); link with -lcublas
 *
 * Usage: matmul N [--cublas] [--iters K] [--energy]
 * stdout: one JSON line {"gflops": .., "ms": .., "n": N, "iters": K, "check": "ok", "valid": true, ...}.
 * --energy: time launches for at least a second and read the GPU's energy counter (NVML, loaded at run time from
 * the driver's libnvidia-ml.so.1) around them: "joules" per launch and "watts" are added to the line.
 * Exit status: 0 measured (a wrong answer prints "check": "failed" and "valid": false), 1 CUDA error,
 * 2 bad arguments.
 */
#include <cuda_runtime.h>

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MATMUL_CUBLAS
#include <cublas_v2.h>
#endif

#include "kernel.cuh"

/* The reference: one thread per entry of C, a plain dot product accumulated in double. */
__global__ void reference_sgemm(const float *A, const float *B, float *C, int n, int ld)
{
    const int col = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y * blockDim.y + threadIdx.y;
    if (row >= n || col >= n)
        return;
    double sum = 0.0;
    for (int k = 0; k < n; ++k)
        sum += (double)A[(size_t)row * ld + k] * (double)B[(size_t)k * ld + col];
    C[(size_t)row * ld + col] = (float)sum;
}

#define CHECK(call)                                                                                             \
    do {                                                                                                        \
        cudaError_t err_ = (call);                                                                              \
        if (err_ != cudaSuccess) {                                                                              \
            fprintf(stderr, "matmul: %s failed: %s\n", #call, cudaGetErrorString(err_));                        \
            exit(1);                                                                                            \
        }                                                                                                       \
    } while (0)

#ifdef MATMUL_CUBLAS
#define CHECK_CUBLAS(call)                                                                                      \
    do {                                                                                                        \
        cublasStatus_t st_ = (call);                                                                            \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                     \
            fprintf(stderr, "matmul: %s failed: cuBLAS status %d\n", #call, (int)st_);                          \
            exit(1);                                                                                            \
        }                                                                                                       \
    } while (0)
#endif

static const int MAX_N = 16384;
/* Every entry of A and B is k/8 with k in -8..8, so products are multiples of 1/64 of magnitude <= 1 and
 * every partial sum of up to MAX_N of them is exact in float: a correct kernel gets the exact answer whatever
 * order it adds in, and the tolerance only has to absorb nothing. It is kept for a float kernel that rounds. */
static const double TOLERANCE = 1e-3;

static uint32_t lcg_state = 12345u;
static float next_value(void)
{
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return (float)((int)((lcg_state >> 16) % 17u) - 8) / 8.0f;
}

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The GPU's energy counter through NVML, looked up at run time so that the program needs no NVML to build and
 * runs without it unless --energy is asked for. The device is found by its PCI bus id: NVML numbers every GPU of
 * the machine, CUDA only those CUDA_VISIBLE_DEVICES leaves. */
typedef struct {
    void *device;
    int (*energy)(void *device, unsigned long long *millijoules);
} Energy;

static const char *energy_open(Energy *e, int cuda_device)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == NULL)
        return "cannot load libnvidia-ml.so.1 (the NVIDIA driver's NVML)";
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_bus)(const char *, void **) = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    e->energy = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    char bus[32];
    unsigned long long probe = 0;
    if (!init || !by_bus || !e->energy || init() != 0)
        return "NVML does not start";
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) != cudaSuccess || by_bus(bus, &e->device) != 0)
        return "NVML does not know the CUDA device";
    if (e->energy(e->device, &probe) != 0)
        return "this GPU has no energy counter (NVML's total energy consumption)";
    return NULL;
}

static unsigned long long energy_now(const Energy *e)
{
    unsigned long long millijoules = 0;
    e->energy(e->device, &millijoules);
    return millijoules;
}

static void usage(const char *why)
{
    fprintf(stderr, "matmul: %s\nusage: matmul N [--cublas] [--iters K] [--energy]   (1 <= N <= %d, 1 <= K <= 10000)\n", why,
            MAX_N);
    exit(2);
}

typedef struct {
    int cublas; /* time cuBLAS instead of the tuned kernel */
    int n, ld;
    const float *A, *B;
    float *C;
#ifdef MATMUL_CUBLAS
    cublasHandle_t handle;
#endif
} Problem;

static void launch(const Problem *p)
{
    if (p->cublas) {
#ifdef MATMUL_CUBLAS
        /* cuBLAS is column-major: the column-major product B' * A' of the row-major B and A, which cuBLAS
         * sees as their transposes, is (A * B)' in column-major order, that is A * B in row-major order. */
        const float one = 1.0f, zero = 0.0f;
        CHECK_CUBLAS(cublasSgemm(p->handle, CUBLAS_OP_N, CUBLAS_OP_N, p->n, p->n, p->n, &one, p->B, p->ld, p->A,
                                 p->ld, &zero, p->C, p->ld));
#endif
        return;
    }
    const dim3 grid(p->ld / BN, p->ld / BM);
    tuned_sgemm<<<grid, THREADS>>>(p->A, p->B, p->C, p->ld);
    CHECK(cudaGetLastError());
}

int main(int argc, char **argv)
{
    Problem p;
    memset(&p, 0, sizeof p);
    int iters = 0; /* 0: as many as fit in about a quarter of a second, 5 to 100 (a second, up to 10000, with --energy) */
    int energy = 0;
    if (argc < 2)
        usage("the matrix order N is missing");
    char *end = NULL;
    const long n = strtol(argv[1], &end, 10);
    if (*argv[1] == '\0' || *end != '\0' || n < 1 || n > MAX_N)
        usage("N must be an integer in range");
    p.n = (int)n;
    for (int i = 2; i < argc; ++i) {
        if (strcmp(argv[i], "--cublas") == 0) {
#ifdef MATMUL_CUBLAS
            p.cublas = 1;
#else
            usage("--cublas needs a build with -DMATMUL_CUBLAS ... -lcublas");
#endif
        } else if (strcmp(argv[i], "--energy") == 0) {
            energy = 1;
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            const long k = strtol(argv[++i], &end, 10);
            if (*argv[i] == '\0' || *end != '\0' || k < 1 || k > 10000)
                usage("--iters K must be an integer in range");
            iters = (int)k;
        } else {
            usage("unknown argument");
        }
    }
    /* Padding to whole tiles (and whole float4s) keeps bounds checks out of the kernel; GFLOPS count only
     * the N x N work. */
    const long ld = p.cublas ? (n + 3) / 4 * 4 : padded_order(n);
    if (ld > 2L * MAX_N)
        usage("the tiles are too large for this N");
    p.ld = (int)ld;
    if (!p.cublas && p.ld / BM > 65535)
        usage("N needs more than 65535 blocks along y; use larger tiles");

    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        fprintf(stderr, "matmul: no CUDA device is available\n");
        return 1;
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    Energy meter;
    const char *no_energy = energy ? energy_open(&meter, 0) : NULL;
    if (no_energy != NULL) {
        fprintf(stderr, "matmul: --energy: %s\n", no_energy);
        return 1;
    }

    const size_t count = (size_t)p.ld * p.ld, bytes = count * sizeof(float);
    float *hA = (float *)calloc(count, sizeof(float)), *hB = (float *)calloc(count, sizeof(float));
    float *hC = (float *)malloc(bytes), *hR = (float *)malloc(bytes);
    if (!hA || !hB || !hC || !hR) {
        fprintf(stderr, "matmul: out of host memory for N=%ld\n", n);
        return 1;
    }
    for (int i = 0; i < p.n; ++i)
        for (int j = 0; j < p.n; ++j)
            hA[(size_t)i * p.ld + j] = next_value();
    for (int i = 0; i < p.n; ++i)
        for (int j = 0; j < p.n; ++j)
            hB[(size_t)i * p.ld + j] = next_value();

    float *dA, *dB, *dC, *dR;
    CHECK(cudaMalloc(&dA, bytes));
    CHECK(cudaMalloc(&dB, bytes));
    CHECK(cudaMalloc(&dC, bytes));
    CHECK(cudaMalloc(&dR, bytes));
    CHECK(cudaMemcpy(dA, hA, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dB, hB, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dC, 0, bytes));
    CHECK(cudaMemset(dR, 0, bytes));
    p.A = dA;
    p.B = dB;
    p.C = dC;
#ifdef MATMUL_CUBLAS
    if (p.cublas) {
        CHECK_CUBLAS(cublasCreate(&p.handle));
        /* The default math mode: true FP32, no TF32 tensor cores, the same arithmetic as the tuned kernel. */
        CHECK_CUBLAS(cublasSetMathMode(p.handle, CUBLAS_DEFAULT_MATH));
    }
#endif

    /* The answer check: the reference kernel's whole matrix, itself spot-checked on the host. */
    const dim3 rblock(16, 16), rgrid((p.n + 15) / 16, (p.n + 15) / 16);
    reference_sgemm<<<rgrid, rblock>>>(dA, dB, dR, p.n, p.ld);
    CHECK(cudaGetLastError());
    launch(&p);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(hR, dR, bytes, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hC, dC, bytes, cudaMemcpyDeviceToHost));
    for (int s = 0; s < 16; ++s) {
        const int i = s == 0 ? 0 : s == 1 ? p.n - 1 : (int)(next_value() * 8 + 8) * (p.n - 1) / 16;
        const int j = s == 0 ? 0 : s == 1 ? p.n - 1 : (int)(next_value() * 8 + 8) * (p.n - 1) / 16;
        double want = 0.0;
        for (int k = 0; k < p.n; ++k)
            want += (double)hA[(size_t)i * p.ld + k] * hB[(size_t)k * p.ld + j];
        if (fabs(hR[(size_t)i * p.ld + j] - want) > TOLERANCE) {
            fprintf(stderr, "matmul: the reference kernel is wrong at (%d, %d): %g, want %g\n", i, j,
                    hR[(size_t)i * p.ld + j], want);
            return 1;
        }
    }
    for (int i = 0; i < p.n; ++i)
        for (int j = 0; j < p.n; ++j) {
            const float got = hC[(size_t)i * p.ld + j], want = hR[(size_t)i * p.ld + j];
            if (!(fabs((double)got - want) <= TOLERANCE)) { /* also catches NaN */
                printf("{\"check\": \"failed\", \"valid\": false, \"n\": %d, \"i\": %d, \"j\": %d, \"got\": %.9g, "
                       "\"want\": %.9g}\n",
                       p.n, i, j, got, want);
                return 0;
            }
        }

    /* Timing: warm-up launches, then each launch between its own pair of events; the median launch. */
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start));
    for (int w = 0; w < 3; ++w)
        launch(&p);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float warm_ms = 0.0f;
    CHECK(cudaEventElapsedTime(&warm_ms, start, stop));
    if (iters == 0) {
        const double per_launch = warm_ms / 3.0 > 1e-3 ? warm_ms / 3.0 : 1e-3;
        /* NVML's energy counter moves in steps of tens of milliseconds: a second of launches makes them small. */
        iters = (int)((energy ? 1000.0 : 250.0) / per_launch);
        iters = iters < 5 ? 5 : iters > (energy ? 10000 : 100) ? (energy ? 10000 : 100) : iters;
    }
    cudaEvent_t *marks = (cudaEvent_t *)malloc(sizeof(cudaEvent_t) * (iters + 1));
    double *ms = (double *)malloc(sizeof(double) * iters);
    if (!marks || !ms) {
        fprintf(stderr, "matmul: out of host memory\n");
        return 1;
    }
    for (int i = 0; i <= iters; ++i)
        CHECK(cudaEventCreate(&marks[i]));
    CHECK(cudaDeviceSynchronize());
    const unsigned long long energy_start = energy ? energy_now(&meter) : 0;
    CHECK(cudaEventRecord(marks[0]));
    for (int i = 0; i < iters; ++i) {
        launch(&p);
        CHECK(cudaEventRecord(marks[i + 1]));
    }
    CHECK(cudaEventSynchronize(marks[iters]));
    const unsigned long long energy_end = energy ? energy_now(&meter) : 0;
    float total_ms = 0.0f;
    CHECK(cudaEventElapsedTime(&total_ms, marks[0], marks[iters]));
    for (int i = 0; i < iters; ++i) {
        float t = 0.0f;
        CHECK(cudaEventElapsedTime(&t, marks[i], marks[i + 1]));
        ms[i] = t;
    }
    qsort(ms, iters, sizeof(double), compare_doubles);
    const double median_ms = iters % 2 ? ms[iters / 2] : (ms[iters / 2 - 1] + ms[iters / 2]) / 2.0;
    const double gflops = 2.0 * p.n * (double)p.n * p.n / (median_ms * 1e-3) / 1e9;
    printf("{\"gflops\": %.1f, \"ms\": %.4f, \"min_ms\": %.4f, \"n\": %d, \"iters\": %d, \"check\": \"ok\", "
           "\"valid\": true, \"mode\": \"%s\", \"device\": \"%s\", \"sm\": %d",
           gflops, median_ms, ms[0], p.n, iters, p.cublas ? "cublas" : "kernel", prop.name,
           prop.major * 10 + prop.minor);
    if (energy) {
        const double joules = (double)(energy_end - energy_start) / 1000.0;
        printf(", \"joules\": %.6f, \"watts\": %.1f", joules / iters, joules / (total_ms * 1e-3));
    }
    printf("}\n");

#ifdef MATMUL_CUBLAS
    if (p.cublas)
        cublasDestroy(p.handle);
#endif
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(dR);
    free(hA);
    free(hB);
    free(hC);
    free(hR);
    free(marks);
    free(ms);
    return 0;
}
