/*
 * bench.c - a small pipeline whose speed depends on gcc's inlining and
 * unrolling decisions.  Fleet's gcc-inline example tunes the flags that drive
 * those decisions (see README.md).
 *
 * Five stages run one after the other on data derived from SIZE:
 *
 *   1. sort    batches of records, each sorted twice by a bottom-up merge
 *              sort that takes its comparator through a function pointer
 *              (cmp_by_key, cmp_by_val): the comparisons become direct,
 *              inlinable calls only if sort_records is inlined or cloned;
 *   2. hash    a Bloom filter in front of an open-addressing hash table:
 *              insert, then look up hits and misses; a seeded hash_u32()
 *              is called with a constant seed at six call sites;
 *   3. stencil an integer 5-point stencil; stencil5() is called from the
 *              interior loop and from both borders, and updates running
 *              statistics through a pointer;
 *   4. vm      a bytecode interpreter (vm_run) whose switch cases call alu()
 *              with a constant opcode (inlining folds the inner switch away);
 *   5. mix     a large block digest, mix_block(), called with a constant
 *              length from a loop and from the leaves of a recursive tree
 *              digest (tree_digest); inlining it mostly duplicates code.
 *
 * Each stage's result is folded into a checksum.  The timed part runs the
 * five stages; afterwards an untimed reference path recomputes every stage
 * with plain code (libc qsort, a sorted array plus binary search, the
 * stencil written out, the VM program written as C, a word-at-a-time
 * digest) and the two checksums must agree.
 *
 * Usage: ./bench [SIZE]     (SIZE an integer from 1 to 1000, default 24)
 * Output: one JSON line on stdout, exit status 0:
 *   {"seconds": <wall time of the five stages>, "cpu_seconds": <their CPU
 *    time>, "checksum": "<16 hex>", "reference": "<16 hex>", "size": N,
 *    "stages": {"sort": <CPU s>, ...}, "valid": true}
 * "valid" is false (still exit 0, with a line on stderr) when a stage's
 * result differs from the reference.  A bad SIZE: usage on stderr, exit 2.
 *
 * Per-function inlining switches, all 0 by default:
 *   -DNOINLINE_HASH=1     __attribute__((noinline)) on hash_u32()
 *   -DNOINLINE_CMP=1      ... on cmp_by_key() and cmp_by_val()
 *   -DNOINLINE_STENCIL=1  ... on stencil5()
 *   -DNOINLINE_ALU=1      ... on alu()
 *   -DNOINLINE_MIX=1      ... on mix_block()
 *   -DNOINLINE_VM=1       ... on vm_run(), the interpreter loop (called once,
 *                         so -O2 inlines it into main, where it runs slower)
 */
#define _POSIX_C_SOURCE 199309L
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef NOINLINE_HASH
#define NOINLINE_HASH 0
#endif
#ifndef NOINLINE_CMP
#define NOINLINE_CMP 0
#endif
#ifndef NOINLINE_STENCIL
#define NOINLINE_STENCIL 0
#endif
#ifndef NOINLINE_ALU
#define NOINLINE_ALU 0
#endif
#ifndef NOINLINE_MIX
#define NOINLINE_MIX 0
#endif
#ifndef NOINLINE_VM
#define NOINLINE_VM 0
#endif

#define NOINLINE __attribute__((noinline))
#if NOINLINE_HASH
#define HASH_ATTR NOINLINE
#else
#define HASH_ATTR
#endif
#if NOINLINE_CMP
#define CMP_ATTR NOINLINE
#else
#define CMP_ATTR
#endif
#if NOINLINE_STENCIL
#define STENCIL_ATTR NOINLINE
#else
#define STENCIL_ATTR
#endif
#if NOINLINE_ALU
#define ALU_ATTR NOINLINE
#else
#define ALU_ATTR
#endif
#if NOINLINE_MIX
#define MIX_ATTR NOINLINE
#else
#define MIX_ATTR
#endif
#if NOINLINE_VM
#define VM_ATTR NOINLINE
#else
#define VM_ATTR
#endif

/* ------------------------------------------------------------------ utils */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    /* splitmix64: deterministic data for every stage */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fold(uint64_t h, uint64_t v)
{
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    return p;
}

static double clock_seconds(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(void) { return clock_seconds(CLOCK_MONOTONIC); }
static double cpu_now(void) { return clock_seconds(CLOCK_PROCESS_CPUTIME_ID); }

static inline uint64_t rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

/* -------------------------------------------------------- stage 1: sort */

typedef struct {
    uint32_t key;
    uint32_t group;
    int32_t val;
    uint32_t id;
} rec;

typedef int (*rec_cmp)(const rec *, const rec *);

/* (group, key, id) ascending */
CMP_ATTR static int cmp_by_key(const rec *a, const rec *b)
{
    if (a->group != b->group)
        return a->group < b->group ? -1 : 1;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* (val descending, |key - 2^31| ascending, id) */
CMP_ATTR static int cmp_by_val(const rec *a, const rec *b)
{
    if (a->val != b->val)
        return a->val > b->val ? -1 : 1;
    uint32_t da = a->key >= 0x80000000u ? a->key - 0x80000000u : 0x80000000u - a->key;
    uint32_t db = b->key >= 0x80000000u ? b->key - 0x80000000u : 0x80000000u - b->key;
    if (da != db)
        return da < db ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* Stable bottom-up merge sort: insertion-sorted runs of SORT_RUN records,
   then merge passes between a and tmp.  cmp arrives through a pointer, so the
   calls stay indirect unless gcc inlines sort_records into a caller that
   passes a known comparator (or clones it for one); only then can cmp itself
   be inlined into the inner loops. */
#define SORT_RUN 12

static void sort_records(rec *a, rec *tmp, size_t n, rec_cmp cmp)
{
    for (size_t lo = 0; lo < n; lo += SORT_RUN) {
        size_t hi = lo + SORT_RUN < n ? lo + SORT_RUN : n;
        for (size_t i = lo + 1; i < hi; i++) {
            rec x = a[i];
            size_t j = i;
            while (j > lo && cmp(&x, &a[j - 1]) < 0) {
                a[j] = a[j - 1];
                j--;
            }
            a[j] = x;
        }
    }
    rec *src = a, *dst = tmp;
    for (size_t width = SORT_RUN; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n;
            size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                dst[k++] = cmp(&src[j], &src[i]) < 0 ? src[j++] : src[i++];
            while (i < mid)
                dst[k++] = src[i++];
            while (j < hi)
                dst[k++] = src[j++];
        }
        rec *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, n * sizeof *a);
}

static void make_records(rec *r, size_t n, uint64_t seed)
{
    rng_state = seed;
    for (size_t i = 0; i < n; i++) {
        uint64_t x = rng_next();
        r[i].key = (uint32_t)x;
        r[i].group = (uint32_t)(x >> 32) % 61u;
        r[i].val = (int32_t)((x >> 40) % 1001u) - 500;
        r[i].id = (uint32_t)i;
    }
}

static uint64_t digest_records(const rec *r, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i += 7)
        h = fold(h, ((uint64_t)r[i].id << 32) ^ r[i].key);
    return fold(h, r[n - 1].id);
}

#define SORT_BATCH 4096

/* batches of SORT_BATCH records, each sorted by key and then by value */
static uint64_t stage_sort(size_t batches)
{
    size_t n = SORT_BATCH;
    rec *r = xmalloc(n * sizeof *r), *tmp = xmalloc(n * sizeof *tmp);
    uint64_t h = 0;
    for (size_t b = 0; b < batches; b++) {
        make_records(r, n, 0x5EED0001ull + b);
        sort_records(r, tmp, n, cmp_by_key);
        h = fold(h, digest_records(r, n));
        sort_records(r, tmp, n, cmp_by_val);
        h = fold(h, digest_records(r, n));
    }
    free(r);
    free(tmp);
    return h;
}

/* -------------------------------------------------------- stage 2: hash */

/* A seeded 32-bit hash.  Odd seeds get a second round.  Every call site
   passes a constant seed, so once inlined the seed test folds away (gcc -O2
   inlines it: its estimate knows the branch folds); called, every probe
   pays for the call and the test. */
HASH_ATTR static uint32_t hash_u32(uint32_t x, uint32_t seed)
{
    x ^= seed * 0x9E3779B9u;
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    if (seed & 1) {
        x += seed;
        x ^= x >> 15;
        x *= 0x2C1B3C6Du;
        x ^= x >> 12;
        x *= 0x297A2D39u;
        x ^= x >> 15;
    }
    return x;
}

#define TABLE_SEED 0x2545F491u /* odd: two rounds */
#define BLOOM_SEED_A 2u
#define BLOOM_SEED_B 4u
#define BLOOM_BITS (1u << 16)

typedef struct {
    uint32_t *keys; /* 0 = empty slot; keys are never 0 */
    uint32_t *vals;
    uint32_t mask;
    uint64_t *bloom; /* BLOOM_BITS bits, two hashes per key */
} table;

static void table_insert(table *t, uint32_t k, uint32_t v)
{
    uint32_t a = hash_u32(k, BLOOM_SEED_A) % BLOOM_BITS, b = hash_u32(k, BLOOM_SEED_B) % BLOOM_BITS;
    t->bloom[a / 64] |= 1ull << (a % 64);
    t->bloom[b / 64] |= 1ull << (b % 64);
    uint32_t i = hash_u32(k, TABLE_SEED) & t->mask;
    while (t->keys[i] != 0 && t->keys[i] != k)
        i = (i + 1) & t->mask;
    t->keys[i] = k;
    t->vals[i] = v;
}

/* 0 when k is certainly absent */
static int bloom_maybe(const table *t, uint32_t k)
{
    uint32_t a = hash_u32(k, BLOOM_SEED_A) % BLOOM_BITS, b = hash_u32(k, BLOOM_SEED_B) % BLOOM_BITS;
    return (int)((t->bloom[a / 64] >> (a % 64)) & (t->bloom[b / 64] >> (b % 64)) & 1);
}

static int table_find(const table *t, uint32_t k, uint32_t *v)
{
    uint32_t i = hash_u32(k, TABLE_SEED) & t->mask;
    while (t->keys[i] != 0) {
        if (t->keys[i] == k) {
            *v = t->vals[i];
            return 1;
        }
        i = (i + 1) & t->mask;
    }
    return 0;
}

/* keys inserted: nonzero, derived from the rng; queries: half of them are
   inserted keys, half are random (mostly misses, most of which the Bloom
   filter rejects). */
static uint32_t hash_key(uint64_t x)
{
    uint32_t k = (uint32_t)(x >> 12) & 0x3FFFFFFFu;
    return k ? k : 1u;
}

static uint64_t stage_hash(size_t n, size_t reps, uint32_t *keys_out, uint32_t *queries_out)
{
    uint32_t cap = 1;
    while (cap < 2 * n)
        cap <<= 1;
    table t = {xmalloc(cap * sizeof(uint32_t)), xmalloc(cap * sizeof(uint32_t)), cap - 1,
               xmalloc(BLOOM_BITS / 8)};
    memset(t.keys, 0, cap * sizeof(uint32_t));
    memset(t.bloom, 0, BLOOM_BITS / 8);
    rng_state = 0x5EED0002ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = hash_key(rng_next());
        keys_out[i] = k;
        table_insert(&t, k, (uint32_t)i);
    }
    for (size_t i = 0; i < 4 * n; i++) {
        uint64_t x = rng_next();
        queries_out[i] = (x & 1) ? keys_out[(x >> 1) % n] : hash_key(x);
    }
    uint64_t hits = 0, sum = 0;
    for (size_t rep = 0; rep < reps; rep++) {
        for (size_t i = 0; i < 4 * n; i++) {
            uint32_t v, q = queries_out[i];
            if (bloom_maybe(&t, q) && table_find(&t, q, &v)) {
                hits++;
                sum += keys_out[v] ^ (uint32_t)rep;
            }
        }
    }
    free(t.keys);
    free(t.vals);
    free(t.bloom);
    return fold(hits, sum);
}

/* ----------------------------------------------------- stage 3: stencil */

typedef struct {
    int64_t sum;     /* sum of the outputs */
    int32_t lo, hi;  /* smallest and largest output */
    uint32_t clipped; /* outputs that hit the clamp */
} stats;

/* One output point: weighted 5-point sum with a rounding shift, clamped, and
   accounted in *st.  w is the row length and s the shift; both are constants
   at the call sites.  Once inlined, *st lives in registers; called, it is
   loaded and stored at every point. */
STENCIL_ATTR static void stencil5(const int32_t *g, int32_t *out, size_t i, size_t w, int s, int border,
                                  stats *st)
{
    int64_t c = g[i], n = g[i - w], so = g[i + w], e = g[i + 1], we = g[i - 1];
    int64_t sum = 4 * c + n + so + e + we;
    if (border)
        sum = (sum + 3 * c) / 2;
    int64_t r = (sum + ((int64_t)1 << (s - 1))) >> s;
    if (r > 1000) {
        r = 1000;
        st->clipped++;
    }
    if (r < -1000) {
        r = -1000;
        st->clipped++;
    }
    int32_t v = (int32_t)(r + (c >> 4));
    st->sum += v;
    if (v < st->lo)
        st->lo = v;
    if (v > st->hi)
        st->hi = v;
    out[i] = v;
}

static void stencil_step(const int32_t *src, int32_t *dst, size_t w, size_t h, stats *st)
{
    for (size_t y = 1; y + 1 < h; y++) {
        size_t row = y * w;
        stencil5(src, dst, row + 1, w, 3, 1, st);
        for (size_t x = 2; x + 2 < w; x++)
            stencil5(src, dst, row + x, w, 3, 0, st);
        stencil5(src, dst, row + w - 2, w, 3, 1, st);
    }
}

static void stencil_init(int32_t *g, size_t w, size_t h)
{
    rng_state = 0x5EED0003ull;
    for (size_t i = 0; i < w * h; i++)
        g[i] = (int32_t)(rng_next() % 2001u) - 1000;
}

static uint64_t grid_digest(const int32_t *g, size_t w, size_t h)
{
    uint64_t d = 0;
    for (size_t i = 0; i < w * h; i++)
        d = d * 31u + (uint32_t)g[i];
    return d;
}

#define STENCIL_W 256
#define STENCIL_H 128

static uint64_t stage_stencil(size_t steps)
{
    size_t w = STENCIL_W, h = STENCIL_H;
    int32_t *a = xmalloc(w * h * sizeof *a), *b = xmalloc(w * h * sizeof *b);
    stencil_init(a, w, h);
    memcpy(b, a, w * h * sizeof *a);
    stats st = {0, INT32_MAX, INT32_MIN, 0};
    for (size_t t = 0; t < steps; t++) {
        stencil_step(a, b, w, h, &st);
        int32_t *s = a;
        a = b;
        b = s;
    }
    uint64_t d = grid_digest(a, w, h);
    free(a);
    free(b);
    return fold(fold(d, (uint64_t)st.sum), ((uint64_t)(uint32_t)st.lo << 32 | (uint32_t)st.hi) ^ st.clipped);
}

/* ---------------------------------------------------------- stage 4: vm */

enum { A_ADD, A_SUB, A_MUL, A_XOR, A_AND, A_OR, A_SHL, A_SHR, A_ROL, A_MIN };

/* Generic ALU: a switch on op.  Called with a constant op from every case of
   the interpreter, so inlining it folds the switch to one instruction. */
ALU_ATTR static uint64_t alu(int op, uint64_t a, uint64_t b)
{
    switch (op) {
    case A_ADD: return a + b;
    case A_SUB: return a - b;
    case A_MUL: return a * b;
    case A_XOR: return a ^ b;
    case A_AND: return a & b;
    case A_OR:  return a | b;
    case A_SHL: return a << (b & 63);
    case A_SHR: return a >> (b & 63);
    case A_ROL: return (b & 63) ? rotl64(a, (int)(b & 63)) : a;
    case A_MIN: return a < b ? a : b;
    default:    return 0;
    }
}

enum {
    OP_ADD, OP_SUB, OP_MUL, OP_XOR, OP_AND, OP_OR, OP_SHL, OP_SHR, OP_ROL, OP_MIN,
    OP_ADDI, OP_MULI, OP_XORI, OP_SHRI, OP_ROLI,
    OP_MOVI, OP_JLT, OP_HALT
};

typedef struct {
    uint8_t op, d, a, b; /* registers; for *I ops the immediate is imm */
    int32_t imm;
} insn;

/* The interpreter loop.  Called once, so gcc inlines it (through stage_vm)
   into main by default. */
VM_ATTR static uint64_t vm_run(const insn *code, uint64_t *r)
{
    uint64_t steps = 0;
    for (size_t pc = 0;;) {
        const insn *in = &code[pc++];
        steps++;
        switch (in->op) {
        case OP_ADD: r[in->d] = alu(A_ADD, r[in->a], r[in->b]); break;
        case OP_SUB: r[in->d] = alu(A_SUB, r[in->a], r[in->b]); break;
        case OP_MUL: r[in->d] = alu(A_MUL, r[in->a], r[in->b]); break;
        case OP_XOR: r[in->d] = alu(A_XOR, r[in->a], r[in->b]); break;
        case OP_AND: r[in->d] = alu(A_AND, r[in->a], r[in->b]); break;
        case OP_OR:  r[in->d] = alu(A_OR, r[in->a], r[in->b]); break;
        case OP_SHL: r[in->d] = alu(A_SHL, r[in->a], r[in->b]); break;
        case OP_SHR: r[in->d] = alu(A_SHR, r[in->a], r[in->b]); break;
        case OP_ROL: r[in->d] = alu(A_ROL, r[in->a], r[in->b]); break;
        case OP_MIN: r[in->d] = alu(A_MIN, r[in->a], r[in->b]); break;
        case OP_ADDI: r[in->d] = alu(A_ADD, r[in->a], (uint64_t)(int64_t)in->imm); break;
        case OP_MULI: r[in->d] = alu(A_MUL, r[in->a], (uint64_t)(int64_t)in->imm); break;
        case OP_XORI: r[in->d] = alu(A_XOR, r[in->a], (uint64_t)(int64_t)in->imm); break;
        case OP_SHRI: r[in->d] = alu(A_SHR, r[in->a], (uint64_t)in->imm); break;
        case OP_ROLI: r[in->d] = alu(A_ROL, r[in->a], (uint64_t)in->imm); break;
        case OP_MOVI: r[in->d] = (uint64_t)(int64_t)in->imm; break;
        case OP_JLT:
            if (r[in->a] < r[in->b])
                pc = (size_t)in->imm;
            break;
        case OP_HALT:
        default:
            return steps;
        }
    }
}

/* The program (r0 = acc, r1 = i, r2 = n; ref_vm is the same loop in C):
 *   acc = 12345; i = 0;
 *   do {
 *     t = i * 0x1E3779B1; t ^= t >> 13; t = rol(t, 7) + acc;
 *     u = (min(t, acc ^ 0x5bd1e995) - (i & 255)) | (i << 3);
 *     acc = acc * 5 + (t ^ u); acc &= ~((acc >> 61) << 2); acc = rol(acc, 1);
 *   } while (++i < n);
 * 3 setup instructions, 25 per iteration, 1 halt. */
static const insn vm_program[] = {
    /* 0 */ {OP_MOVI, 0, 0, 0, 12345},
    /* 1 */ {OP_MOVI, 1, 0, 0, 0},
    /* 2 */ {OP_MOVI, 6, 0, 0, 1},
    /* loop at 3 */
    /* 3 */ {OP_MULI, 3, 1, 0, (int32_t)0x1E3779B1},
    /* 4 */ {OP_SHRI, 4, 3, 0, 13},
    /* 5 */ {OP_XOR, 3, 3, 4, 0},
    /* 6 */ {OP_ROLI, 3, 3, 0, 7},
    /* 7 */ {OP_ADD, 3, 3, 0, 0},
    /* 8 */ {OP_XORI, 4, 0, 0, 0x5bd1e995},
    /* 9 */ {OP_MIN, 4, 3, 4, 0},
    /* 10 */ {OP_MOVI, 5, 0, 0, 255},
    /* 11 */ {OP_AND, 5, 1, 5, 0},
    /* 12 */ {OP_SUB, 4, 4, 5, 0},
    /* 13 */ {OP_MOVI, 5, 0, 0, 3},
    /* 14 */ {OP_SHL, 5, 1, 5, 0},
    /* 15 */ {OP_OR, 4, 4, 5, 0},
    /* 16 */ {OP_MULI, 5, 0, 0, 5},
    /* 17 */ {OP_XOR, 4, 3, 4, 0},
    /* 18 */ {OP_ADD, 0, 5, 4, 0},
    /* 19 */ {OP_MOVI, 5, 0, 0, 61},
    /* 20 */ {OP_SHR, 5, 0, 5, 0},
    /* 21 */ {OP_MOVI, 4, 0, 0, 2},
    /* 22 */ {OP_SHL, 5, 5, 4, 0},
    /* 23 */ {OP_XORI, 5, 5, 0, -1},
    /* 24 */ {OP_AND, 0, 0, 5, 0},
    /* 25 */ {OP_ROL, 0, 0, 6, 0},
    /* 26 */ {OP_ADDI, 1, 1, 0, 1},
    /* 27 */ {OP_JLT, 0, 1, 2, 3},
    /* 28 */ {OP_HALT, 0, 0, 0, 0},
};

static uint64_t stage_vm(uint64_t n)
{
    uint64_t r[8] = {0};
    r[2] = n;
    uint64_t steps = vm_run(vm_program, r);
    return fold(r[0], steps);
}

/* --------------------------------------------------------- stage 5: mix */

#define MIX_P1 0x9E3779B185EBCA87ull
#define MIX_P2 0xC2B2AE3D27D4EB4Full
#define MIX_P3 0x165667B19E3779F9ull

static inline uint64_t load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t mix_lane(uint64_t acc, uint64_t w)
{
    acc += w * MIX_P2;
    acc = rotl64(acc, 31);
    return acc * MIX_P1;
}

/* A large function: the digest of one block of n bytes (n a multiple of 8).
   Four lanes take words round-robin, written out 8 words (two rounds) at a
   time, then the leftover words one by one, then an avalanche.  Its body is
   big enough that -O2 never inlines it; large limits inline it into
   tree_digest (and tree_digest into itself), which grows the code a lot and
   the speed hardly at all. */
MIX_ATTR static uint64_t mix_block(const uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t v0 = seed + MIX_P1 + MIX_P2, v1 = seed + MIX_P2, v2 = seed, v3 = seed - MIX_P1;
    size_t nw = n / 8, i = 0;
    for (; i + 8 <= nw; i += 8) {
        const uint8_t *q = p + 8 * i;
        v0 = mix_lane(v0, load64(q + 0));
        v1 = mix_lane(v1, load64(q + 8));
        v2 = mix_lane(v2, load64(q + 16));
        v3 = mix_lane(v3, load64(q + 24));
        v0 = mix_lane(v0, load64(q + 32));
        v1 = mix_lane(v1, load64(q + 40));
        v2 = mix_lane(v2, load64(q + 48));
        v3 = mix_lane(v3, load64(q + 56));
    }
    for (; i < nw; i++) {
        uint64_t w = load64(p + 8 * i);
        switch (i & 3) {
        case 0: v0 = mix_lane(v0, w); break;
        case 1: v1 = mix_lane(v1, w); break;
        case 2: v2 = mix_lane(v2, w); break;
        default: v3 = mix_lane(v3, w); break;
        }
    }
    uint64_t h = rotl64(v0, 1) + rotl64(v1, 7) + rotl64(v2, 12) + rotl64(v3, 18);
    h = (h ^ mix_lane(0, v0)) * MIX_P1 + MIX_P3;
    h = (h ^ mix_lane(0, v1)) * MIX_P1 + MIX_P3;
    h = (h ^ mix_lane(0, v2)) * MIX_P1 + MIX_P3;
    h = (h ^ mix_lane(0, v3)) * MIX_P1 + MIX_P3;
    h += (uint64_t)n;
    h ^= h >> 33;
    h *= MIX_P2;
    h ^= h >> 29;
    h *= MIX_P3;
    h ^= h >> 32;
    return h;
}

#define MIX_BUF 4096
#define MIX_LEAF 256

/* Recursive tree digest: halves (multiples of 8 bytes) down to leaves of at
   most MIX_LEAF bytes, each digested by mix_block. */
static uint64_t tree_digest(const uint8_t *p, size_t n, uint64_t seed, unsigned depth)
{
    if (n <= MIX_LEAF)
        return mix_block(p, n, seed);
    size_t h = n / 16 * 8;
    uint64_t l = tree_digest(p, h, seed, depth + 1);
    uint64_t r = tree_digest(p + h, n - h, seed ^ l, depth + 1);
    return fold(l * MIX_P3 + depth, r);
}

static uint64_t stage_mix(size_t rounds, uint8_t *buf)
{
    rng_state = 0x5EED0005ull;
    for (size_t i = 0; i < MIX_BUF; i += 8) {
        uint64_t x = rng_next();
        memcpy(buf + i, &x, 8);
    }
    uint64_t h = 0;
    for (size_t r = 0; r < rounds; r++) {
        /* call site 1: small blocks of a constant 40 bytes */
        for (size_t off = 8 * (r % 8); off + 128 <= MIX_BUF; off += 128)
            h ^= mix_block(buf + off, 40, h);
        /* call site 2: the whole buffer as a tree, chained */
        h = tree_digest(buf, MIX_BUF - 8 * (r % 8), h + r, 0);
    }
    return h;
}

/* ---------------------------------------------------- reference (untimed) */

static int ref_cmp_key(const void *pa, const void *pb)
{
    const rec *a = pa, *b = pb;
    if (a->group != b->group)
        return a->group < b->group ? -1 : 1;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int64_t ref_dist(uint32_t k)
{
    int64_t d = (int64_t)k - 0x80000000ll;
    return d < 0 ? -d : d;
}

static int ref_cmp_val(const void *pa, const void *pb)
{
    const rec *a = pa, *b = pb;
    if (a->val != b->val)
        return a->val > b->val ? -1 : 1;
    int64_t da = ref_dist(a->key), db = ref_dist(b->key);
    if (da != db)
        return da < db ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static uint64_t ref_sort(size_t batches)
{
    size_t n = SORT_BATCH;
    rec *r = xmalloc(n * sizeof *r);
    uint64_t h = 0;
    /* Both orders are total (id breaks ties), so qsort agrees with a stable sort. */
    for (size_t b = 0; b < batches; b++) {
        make_records(r, n, 0x5EED0001ull + b);
        qsort(r, n, sizeof *r, ref_cmp_key);
        h = fold(h, digest_records(r, n));
        qsort(r, n, sizeof *r, ref_cmp_val);
        h = fold(h, digest_records(r, n));
    }
    free(r);
    return h;
}

static int ref_cmp_u32(const void *pa, const void *pb)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return (a > b) - (a < b);
}

typedef struct {
    uint32_t key, last; /* last index at which key was inserted */
} kv;

static int ref_cmp_kv(const void *pa, const void *pb)
{
    return ref_cmp_u32(&((const kv *)pa)->key, &((const kv *)pb)->key);
}

static uint64_t ref_hash(size_t n, size_t reps, const uint32_t *keys, const uint32_t *queries)
{
    /* The table maps a key to the index of its last insertion. */
    kv *s = xmalloc(n * sizeof *s);
    for (size_t i = 0; i < n; i++)
        s[i] = (kv){keys[i], (uint32_t)i};
    qsort(s, n, sizeof *s, ref_cmp_kv);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && s[m - 1].key == s[i].key) {
            if (s[i].last > s[m - 1].last)
                s[m - 1].last = s[i].last;
        } else {
            s[m++] = s[i];
        }
    }
    uint64_t hits = 0, sum = 0;
    for (size_t i = 0; i < 4 * n; i++) {
        size_t lo = 0, hi = m;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (s[mid].key < queries[i])
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < m && s[lo].key == queries[i]) {
            for (size_t rep = 0; rep < reps; rep++) {
                hits++;
                sum += keys[s[lo].last] ^ (uint32_t)rep;
            }
        }
    }
    free(s);
    return fold(hits, sum);
}

static uint64_t ref_stencil(size_t steps)
{
    size_t w = STENCIL_W, h = STENCIL_H;
    int32_t *a = xmalloc(w * h * sizeof *a), *b = xmalloc(w * h * sizeof *b);
    stencil_init(a, w, h);
    memcpy(b, a, w * h * sizeof *a);
    int64_t sum_all = 0;
    int32_t lo = INT32_MAX, hi = INT32_MIN;
    uint32_t clipped = 0;
    for (size_t t = 0; t < steps; t++) {
        for (size_t y = 1; y + 1 < h; y++) {
            for (size_t x = 1; x + 1 < w; x++) {
                size_t i = y * w + x;
                int border = (x == 1 || x == w - 2);
                int64_t c = a[i];
                int64_t sum = 4 * c + a[i - w] + a[i + w] + a[i + 1] + a[i - 1];
                if (border)
                    sum = (sum + 3 * c) / 2;
                int64_t r = (sum + 4) >> 3;
                if (r > 1000 || r < -1000) {
                    clipped++;
                    r = r > 1000 ? 1000 : -1000;
                }
                int32_t v = (int32_t)(r + (c >> 4));
                sum_all += v;
                lo = v < lo ? v : lo;
                hi = v > hi ? v : hi;
                b[i] = v;
            }
        }
        int32_t *s = a;
        a = b;
        b = s;
    }
    uint64_t d = grid_digest(a, w, h);
    free(a);
    free(b);
    return fold(fold(d, (uint64_t)sum_all), ((uint64_t)(uint32_t)lo << 32 | (uint32_t)hi) ^ clipped);
}

static uint64_t ref_vm(uint64_t n)
{
    uint64_t acc = 12345, i = 0;
    uint64_t steps = 3;
    do {
        uint64_t t = i * (uint64_t)(int64_t)(int32_t)0x1E3779B1;
        t ^= t >> 13;
        t = rotl64(t, 7) + acc;
        uint64_t x = acc ^ (uint64_t)(int64_t)0x5bd1e995;
        uint64_t u = t < x ? t : x;
        u = (u - (i & 255)) | (i << 3);
        acc = acc * 5 + (t ^ u);
        acc &= ~((acc >> 61) << 2);
        acc = rotl64(acc, 1);
        i++;
        steps += 25;
    } while (i < n);
    return fold(acc, steps + 1);
}

static uint64_t ref_mix_block(const uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t v[4] = {seed + MIX_P1 + MIX_P2, seed + MIX_P2, seed, seed - MIX_P1};
    for (size_t i = 0; i < n / 8; i++)
        v[i % 4] = mix_lane(v[i % 4], load64(p + 8 * i));
    uint64_t h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
    for (int j = 0; j < 4; j++)
        h = (h ^ mix_lane(0, v[j])) * MIX_P1 + MIX_P3;
    h += (uint64_t)n;
    h = (h ^ (h >> 33)) * MIX_P2;
    h = (h ^ (h >> 29)) * MIX_P3;
    return h ^ (h >> 32);
}

static uint64_t ref_tree_digest(const uint8_t *p, size_t n, uint64_t seed, unsigned depth)
{
    if (n <= MIX_LEAF)
        return ref_mix_block(p, n, seed);
    size_t h = n / 16 * 8;
    uint64_t l = ref_tree_digest(p, h, seed, depth + 1);
    uint64_t r = ref_tree_digest(p + h, n - h, seed ^ l, depth + 1);
    return fold(l * MIX_P3 + depth, r);
}

static uint64_t ref_mix(size_t rounds, const uint8_t *buf)
{
    uint64_t h = 0;
    for (size_t r = 0; r < rounds; r++) {
        for (size_t off = 8 * (r % 8); off + 128 <= MIX_BUF; off += 128)
            h ^= ref_mix_block(buf + off, 40, h);
        h = ref_tree_digest(buf, MIX_BUF - 8 * (r % 8), h + r, 0);
    }
    return h;
}

/* -------------------------------------------------------------- driver */

int main(int argc, char **argv)
{
    long size = 24;
    if (argc > 1) {
        char *end;
        size = strtol(argv[1], &end, 10);
        if (*argv[1] == '\0' || *end != '\0' || size < 1 || size > 1000) {
            fprintf(stderr, "usage: %s [SIZE]   (SIZE an integer from 1 to 1000, default 24)\n", argv[0]);
            return 2;
        }
    }
    size_t sort_batches = (size_t)size;
    size_t n_hash = 8192, hash_reps = (size_t)size * 4;
    size_t stencil_steps = (size_t)size * 16;
    uint64_t n_vm = (uint64_t)size * 40000;
    size_t n_mix = (size_t)size * 800;

    uint32_t *keys = xmalloc(n_hash * sizeof *keys);
    uint32_t *queries = xmalloc(4 * n_hash * sizeof *queries);
    uint8_t *buf = xmalloc(MIX_BUF);

    /* Wall time of the whole timed part; CPU time of it and of each stage
       (CPU time is steadier on a busy machine). */
    uint64_t part[5];
    double t[6];
    double w0 = now();
    t[0] = cpu_now();
    part[0] = stage_sort(sort_batches);
    t[1] = cpu_now();
    part[1] = stage_hash(n_hash, hash_reps, keys, queries);
    t[2] = cpu_now();
    part[2] = stage_stencil(stencil_steps);
    t[3] = cpu_now();
    part[3] = stage_vm(n_vm);
    t[4] = cpu_now();
    part[4] = stage_mix(n_mix, buf);
    t[5] = cpu_now();
    double seconds = now() - w0;

    uint64_t want[5];
    want[0] = ref_sort(sort_batches);
    want[1] = ref_hash(n_hash, hash_reps, keys, queries);
    want[2] = ref_stencil(stencil_steps);
    want[3] = ref_vm(n_vm);
    want[4] = ref_mix(n_mix, buf);

    uint64_t checksum = 0, reference = 0;
    int valid = 1;
    for (int i = 0; i < 5; i++) {
        checksum = fold(checksum, part[i]);
        reference = fold(reference, want[i]);
        if (part[i] != want[i]) {
            valid = 0;
            fprintf(stderr, "bench: stage %d: got %016" PRIx64 ", want %016" PRIx64 "\n", i, part[i], want[i]);
        }
    }
    printf("{\"seconds\": %.6f, \"cpu_seconds\": %.6f, \"checksum\": \"%016" PRIx64 "\", \"reference\": \"%016" PRIx64
           "\", \"size\": %ld, \"stages\": {\"sort\": %.6f, \"hash\": %.6f, \"stencil\": %.6f, "
           "\"vm\": %.6f, \"mix\": %.6f}, \"valid\": %s}\n",
           seconds, t[5] - t[0], checksum, reference, size, t[1] - t[0], t[2] - t[1], t[3] - t[2], t[4] - t[3],
           t[5] - t[4], valid ? "true" : "false");
    free(keys);
    free(queries);
    free(buf);
    return 0;
}
