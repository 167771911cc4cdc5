/* What bounds an exact int8 product on AVX2 without VNNI (docs/speed.md, "int8 on
 * AVX2: the bound"): the rates of the instructions the tile uses, and the inner loop
 * of a 4-row, 8-column tile in its two exact forms, on data in L1.
 *
 *   gcc -O2 -mavx2 -mfma bench/int8_loops_avx2.c -o /tmp/int8_loops && /tmp/int8_loops
 *
 * Rates are per cycle of the clock estimated from a chain of dependent scalar adds
 * (one a cycle); run it on an idle core, twice. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define K 384
#define QUADS (K / 4)
#define GROUP_QUADS 8 /* Q8_0's 32 steps */
static uint8_t codes[QUADS * 64] __attribute__((aligned(64))); /* a panel: [quad][16 columns][4] */
static int8_t x8[4][K];
static int16_t x16[4][K];
static float scales[QUADS / GROUP_QUADS][16], xscales[4][QUADS / GROUP_QUADS];

/* Ten independent chains of one instruction: its throughput. */
#define TEN(op) op(a0) op(a1) op(a2) op(a3) op(a4) op(a5) op(a6) op(a7) op(a8) op(a9)
#define RATE(name, op)                                                            \
    {                                                                             \
        __m256i a0 = _mm256_set1_epi16(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0,    \
                a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0, b = a0;              \
        double t = now();                                                         \
        for (long i = 0; i < n; i++) { TEN(op) }                                  \
        double per_cycle = 10.0 * n / (now() - t) / hz;                           \
        printf("%-24s %.2f a cycle\n", name, per_cycle);                          \
        sink ^= _mm256_extract_epi32(_mm256_add_epi32(a0, a9), 0);                \
    }
#define MADD(a) __asm__ volatile("vpmaddwd %1, %0, %0" : "+x"(a) : "x"(b));
#define MADDUBS(a) __asm__ volatile("vpmaddubsw %1, %0, %0" : "+x"(a) : "x"(b));
#define SIGN(a) __asm__ volatile("vpsignb %1, %0, %0" : "+x"(a) : "x"(b));
#define FMA(a) __asm__ volatile("vfmadd231ps %1, %1, %0" : "+x"(a) : "x"(b));
#define ADD(a) __asm__ volatile("vpaddd %1, %0, %0" : "+x"(a) : "x"(b));

/* The tile's byte form: bias off, |q| unsigned, x takes q's sign, vpmaddubsw, vpmaddwd
 * by ones; each group's sums then, when `epilogue`, the f32 epilogue the kernel runs. */
#define BYTE_ROW(r)                                                                   \
    {                                                                                 \
        __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(*(int32_t *)&x8[r][4 * q]), w); \
        d##r = _mm256_add_epi32(d##r, _mm256_madd_epi16(_mm256_maddubs_epi16(m, x), ones)); \
    }
#define BYTE_TOTAL(r)                                                                 \
    t##r = epilogue ? _mm256_fmadd_ps(_mm256_cvtepi32_ps(d##r),                        \
                                      _mm256_mul_ps(ws, _mm256_set1_ps(xscales[r][g])), t##r) \
                    : _mm256_add_ps(t##r, _mm256_castsi256_ps(d##r));
static __attribute__((noinline)) __m256 byte_form(int epilogue) {
    const __m256i bias = _mm256_set1_epi8(-128), ones = _mm256_set1_epi16(1);
    __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
    for (int g = 0; g < QUADS / GROUP_QUADS; g++) {
        __m256i d0 = _mm256_setzero_si256(), d1 = d0, d2 = d0, d3 = d0;
        for (int q = g * GROUP_QUADS; q < (g + 1) * GROUP_QUADS; q++) {
            __m256i w = _mm256_xor_si256(_mm256_loadu_si256((void *)(codes + 64 * q)), bias);
            __m256i m = _mm256_sign_epi8(w, w);
            BYTE_ROW(0) BYTE_ROW(1) BYTE_ROW(2) BYTE_ROW(3)
        }
        __m256 ws = _mm256_loadu_ps(scales[g]);
        BYTE_TOTAL(0) BYTE_TOTAL(1) BYTE_TOTAL(2) BYTE_TOTAL(3)
    }
    return _mm256_add_ps(_mm256_add_ps(t0, t1), _mm256_add_ps(t2, t3));
}

/* The i16 form: the biased bytes zero-extended, x widened beforehand, vpmaddwd and
 * vpaddd; two lanes a column (added pairwise at a group's end, not counted here). */
#define WIDE_ROW(r)                                                          \
    {                                                                        \
        __m256i x = _mm256_set1_epi64x(*(int64_t *)&x16[r][4 * q]);          \
        lo##r = _mm256_add_epi32(lo##r, _mm256_madd_epi16(lo, x));           \
        hi##r = _mm256_add_epi32(hi##r, _mm256_madd_epi16(hi, x));           \
    }
static __attribute__((noinline)) __m256i i16_form(void) {
    __m256i lo0 = _mm256_setzero_si256(), lo1 = lo0, lo2 = lo0, lo3 = lo0, hi0 = lo0, hi1 = lo0,
            hi2 = lo0, hi3 = lo0;
    for (int q = 0; q < QUADS; q++) {
        __m256i lo = _mm256_cvtepu8_epi16(_mm_loadu_si128((void *)(codes + 64 * q)));
        __m256i hi = _mm256_cvtepu8_epi16(_mm_loadu_si128((void *)(codes + 64 * q + 16)));
        WIDE_ROW(0) WIDE_ROW(1) WIDE_ROW(2) WIDE_ROW(3)
    }
    __m256i a = _mm256_add_epi32(_mm256_add_epi32(lo0, lo1), _mm256_add_epi32(lo2, lo3));
    __m256i b = _mm256_add_epi32(_mm256_add_epi32(hi0, hi1), _mm256_add_epi32(hi2, hi3));
    return _mm256_add_epi32(a, b);
}

int main(void) {
    int sink = 0;
    long n = 1000000000;
    long chain = 0;
    double t = now();
    for (long i = 0; i < n; i++)
        __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(chain));
    double hz = 4.0 * n / (now() - t);
    printf("clock ~ %.2f GHz\n", hz / 1e9);
    n = 100000000;
    RATE("vfmadd231ps", FMA)
    RATE("vpmaddwd", MADD)
    RATE("vpmaddubsw", MADDUBS)
    RATE("vpsignb", SIGN)
    {
        /* five chains of each, independent: whether they share pipes */
        __m256i a0 = _mm256_set1_epi16(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
                a6 = a0, a7 = a0, a8 = a0, a9 = a0, b = a0;
        t = now();
        for (long i = 0; i < n; i++) {
            MADD(a0) ADD(a5) MADD(a1) ADD(a6) MADD(a2) ADD(a7) MADD(a3) ADD(a8) MADD(a4) ADD(a9)
        }
        printf("%-24s %.2f a cycle\n", "vpmaddwd and vpaddd", 10.0 * n / (now() - t) / hz);
        sink ^= _mm256_extract_epi32(_mm256_add_epi32(a0, a9), 0);
    }

    for (int i = 0; i < QUADS * 64; i++) codes[i] = (uint8_t)(i * 37);
    for (int r = 0; r < 4; r++)
        for (int k = 0; k < K; k++) x8[r][k] = x16[r][k] = (int8_t)((k * 3 + r) % 255 - 127);
    long calls = 200000;
    double macs = (double)calls * QUADS * 128; /* 4 rows x 8 columns x 4 steps a quad */
    __m256 total = _mm256_setzero_ps();
    for (int epilogue = 0; epilogue < 2; epilogue++) {
        t = now();
        for (long i = 0; i < calls; i++) {
            __asm__ volatile("" ::: "memory"); /* each call reads the codes anew */
            total = _mm256_add_ps(total, byte_form(epilogue));
        }
        printf("byte form, 4 x 8 tile%-12s %.1f multiply-adds a cycle\n",
               epilogue ? ", epilogue" : "", macs / (now() - t) / hz);
    }
    __m256i acc = _mm256_setzero_si256();
    t = now();
    for (long i = 0; i < calls; i++) {
        __asm__ volatile("" ::: "memory");
        acc = _mm256_add_epi32(acc, i16_form());
    }
    printf("i16 form, 4 x 8 tile             %.1f multiply-adds a cycle\n", macs / (now() - t) / hz);
    sink ^= _mm256_extract_epi32(acc, 0) ^ (int)_mm256_cvtss_f32(total);
    return sink == 12345678;
}
