/* bfloat16 matrix products on AVX512-BF16 (AMD Zen 4 and later, Intel Cooper Lake, Sapphire
 * Rapids without AMX): VDPBF16PS multiplies 16 pairs of bf16 by 16 pairs and adds each pair's
 * two products to a float32 lane. The products of two bf16 are exact in float32 and the sums
 * are float32, as the sgemm path's are (only the order differs).
 *
 * The layout is llm.c-simple BLIS: op(B) is packed a block of columns at a time into panels of
 * 32 columns in the instruction's pair layout (for each pair of k, the 32 columns' two values
 * interleaved: two zmm registers); op(A) a block of rows at a time into micro-panels of 12 rows
 * (for each pair of k, the 12 rows' two values as one 32-bit word, broadcast to all lanes).
 * The micro-kernel keeps a 12 x 32 tile of C in 24 zmm accumulators over K, then writes
 * alpha * sum + beta * C rounded to bf16 once, with the same rounding as it_convert_from_f32.
 * Odd K, and rows or columns past the edge, are zeros in the packed operands.
 *
 * Like every VDPBF16PS user, bf16 inputs below 2^-126 (subnormal) count as zero. */
#include "common.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#include <cpuid.h>
#include <immintrin.h>

#define MR 12                       /* rows of C per micro-kernel */
#define NR 32                       /* columns of C per micro-kernel: two zmm of float32 */
#define A_BUDGET ((int64_t)256 << 10) /* bytes of packed A per thread's block (L2) */
#define B_BUDGET ((int64_t)4 << 20)   /* bytes of packed B per block of columns */
#define K_CHUNK 4096                  /* values of K per pass (even) */

int it_avx512_bf16_ready(void) {
    static int ready = -1;
    if (ready >= 0) return ready;  /* a race only repeats the same answer */
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();  /* avx512f/bw here also means the OS saves the zmm state */
    ready = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 5 & 1) /* AVX512_BF16 */;
    return ready;
}

/* One 32-bit word of two bf16: (lo, hi) = (k even, k odd). */
static inline uint32_t pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

/* Micro-panel of op(A)[m, k] at rows [r0, r0 + MR) and k [k0, k1): (k1 - k0 + 1) / 2 words
 * per row, k-pair major. k0 is even. */
static void pack_a(uint32_t *dst, const uint16_t *a, int trans_a, int64_t m, int64_t k, int64_t r0,
                   int64_t k0, int64_t k1) {
    int64_t kk = k1 - k0, kp = (kk + 1) / 2, rows = m - r0 < MR ? m - r0 : MR;
    if (rows < MR) memset(dst, 0, (size_t)(kp * MR) * 4);
    if (!trans_a) {  /* A [m, k]: a row's pairs are contiguous */
        for (int64_t r = 0; r < rows; r++) {
            const uint16_t *row = a + (r0 + r) * k + k0;
            for (int64_t p = 0; p < kk / 2; p++) dst[p * MR + r] = pair(row[2 * p], row[2 * p + 1]);
            if (kk & 1) dst[(kp - 1) * MR + r] = pair(row[kk - 1], 0);
        }
    } else {         /* A [k, m]: a k's rows are contiguous */
        for (int64_t p = 0; p < kp; p++) {
            const uint16_t *lo = a + (k0 + 2 * p) * m + r0, *hi = lo + m;
            int odd = 2 * p + 1 == kk;
            for (int64_t r = 0; r < rows; r++) dst[p * MR + r] = pair(lo[r], odd ? 0 : hi[r]);
        }
    }
}

/* Panel of op(B)[k, n] at columns [c0, c0 + NR) and k [k0, k1): for each pair of k, NR words.
 * k0 is even. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void pack_b(uint32_t *dst, const uint16_t *b, int trans_b,
                                                                int64_t k, int64_t n, int64_t c0, int64_t k0,
                                                                int64_t k1) {
    int64_t kk = k1 - k0, kp = (kk + 1) / 2, cols = n - c0 < NR ? n - c0 : NR;
    if (!trans_b) {  /* B [k, n]: two rows of 32 columns interleaved by one permute each */
        const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                            39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
        const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
        __mmask32 mask = cols == NR ? ~(__mmask32)0 : (((__mmask32)1 << cols) - 1);
        for (int64_t p = 0; p < kp; p++) {
            const uint16_t *even_row = b + (k0 + 2 * p) * n + c0;
            __m512i even = _mm512_maskz_loadu_epi16(mask, even_row);
            __m512i odd = 2 * p + 1 < kk ? _mm512_maskz_loadu_epi16(mask, even_row + n) : _mm512_setzero_si512();
            _mm512_storeu_si512(dst + p * NR, _mm512_permutex2var_epi16(even, lo, odd));
            _mm512_storeu_si512(dst + p * NR + 16, _mm512_permutex2var_epi16(even, hi, odd));
        }
    } else {         /* B [n, k]: a column's pairs are contiguous */
        if (cols < NR) memset(dst, 0, (size_t)(kp * NR) * 4);
        for (int64_t j = 0; j < cols; j++) {
            const uint16_t *col = b + (c0 + j) * k + k0;
            for (int64_t p = 0; p < kk / 2; p++) dst[p * NR + j] = pair(col[2 * p], col[2 * p + 1]);
            if (kk & 1) dst[(kp - 1) * NR + j] = pair(col[kk - 1], 0);
        }
    }
}

/* float32 to bf16, round to nearest even, NaN kept quiet: it_f32_to_bf16 on 16 lanes. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m256i to_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, nan));
}

/* One 12 x 32 tile of sums over kp pairs of k, started from `partial` (float32, leading
 * dimension ldc) unless this is K's first chunk; unless it is the last, the sums go back to
 * `partial`, else C[rows, cols] (leading dimension ldc) = alpha * sums + beta * C in bf16. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void micro_kernel(
    int64_t kp, const uint32_t *pa, const uint32_t *pb, float *partial, int first, int last, uint16_t *c,
    int64_t ldc, int rows, int cols, float alpha, float beta) {
    __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    __mmask16 m1 = cols >= 32 ? 0xffff : cols <= 16 ? 0 : (__mmask16)((1u << (cols - 16)) - 1);
    __m512 acc[MR][2];
    for (int r = 0; r < MR; r++)
        for (int h = 0; h < 2; h++)
            acc[r][h] = first || r >= rows ? _mm512_setzero_ps()
                                           : _mm512_maskz_loadu_ps(h ? m1 : m0, partial + r * ldc + 16 * h);
    for (int64_t p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(pb + p * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(pb + p * NR + 16);
        for (int r = 0; r < MR; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)pa[p * MR + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
        }
    }
    if (!last) {
        for (int r = 0; r < rows; r++)
            for (int h = 0; h < 2; h++) _mm512_mask_storeu_ps(partial + r * ldc + 16 * h, h ? m1 : m0, acc[r][h]);
        return;
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int r = 0; r < rows; r++) {
        uint16_t *dst = c + r * ldc;
        for (int h = 0; h < 2; h++) {
            __mmask16 mask = h ? m1 : m0;
            __m512 v = _mm512_mul_ps(va, acc[r][h]);
            if (beta != 0.0f) {  /* like BLAS: C is not read when beta is 0 */
                __m512i old = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, dst + 16 * h)), 16);
                v = _mm512_fmadd_ps(vb, _mm512_castsi512_ps(old), v);
            }
            _mm256_mask_storeu_epi16(dst + 16 * h, mask, to_bf16(v));
        }
    }
}

it_status it_matmul_bf16_avx512(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                                int64_t k, int trans_a, int trans_b, float alpha, float beta) {
    /* Blocks: K in chunks of up to K_CHUNK (one chunk at GPT-2's widths; longer K, such as the
     * head's 50k-wide input gradient, keeps its partial sums in a float32 copy of C between
     * chunks); B's columns in blocks whose packed panels fit B_BUDGET (all of N at GPT-2's
     * widths, ~2700 columns of the head at K = 768); each thread's rows in blocks of micro-
     * panels that fit A_BUDGET, as many blocks as keeps the threads evenly loaded. When there
     * are fewer blocks of rows than threads, the panels of a block are shared out too. */
    int64_t kc = k < K_CHUNK ? k : K_CHUNK, chunks = (k + kc - 1) / kc;
    int64_t kpc = (kc + 1) / 2, threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    int64_t panel_b = kpc * NR * 4, panel_a = kpc * MR * 4;
    int64_t panels_n = (n + NR - 1) / NR, panels_m = (m + MR - 1) / MR;
    int64_t nc = B_BUDGET / panel_b < 1 ? 1 : B_BUDGET / panel_b;  /* panels per block */
    if (nc > panels_n) nc = panels_n;
    int64_t per = A_BUDGET / panel_a < 1 ? 1 : A_BUDGET / panel_a;  /* micro-panels per block */
    int64_t blocks = (panels_m + per - 1) / per;
    blocks = (blocks + threads - 1) / threads * threads;
    if (blocks > panels_m) blocks = panels_m;
    per = (panels_m + blocks - 1) / blocks;
    blocks = (panels_m + per - 1) / per;
    int64_t groups = blocks >= threads ? 1 : (threads + blocks - 1) / blocks;  /* column groups */
    uint32_t *pb = (uint32_t *)it_scratch_alloc((size_t)(nc * panel_b));
    uint32_t *pa = (uint32_t *)it_scratch_alloc((size_t)(threads * per * panel_a));
    float *partial = chunks > 1 ? (float *)it_scratch_alloc((size_t)(m * n) * 4) : NULL;
    if (!pa || !pb || (chunks > 1 && !partial)) {
        it_scratch_free(pa);
        it_scratch_free(pb);
        it_scratch_free(partial);
        IT_REQUIRE(0, IT_ERR_OUT_OF_MEMORY, "it_matmul: out of memory packing bfloat16 operands");
    }
#pragma omp parallel num_threads((int)threads) if (threads > 1)
    {
        uint32_t *mine = pa + (int64_t)omp_get_thread_num() * per * (panel_a / 4);
        for (int64_t k0 = 0; k0 < k; k0 += kc)
            for (int64_t p0 = 0; p0 < panels_n; p0 += nc) {
                int64_t k1 = k - k0 < kc ? k : k0 + kc, kp = (k1 - k0 + 1) / 2;
                int64_t np = panels_n - p0 < nc ? panels_n - p0 : nc;
                int first = k0 == 0, last = k1 == k;
#pragma omp for schedule(static)
                for (int64_t j = 0; j < np; j++) pack_b(pb + j * (panel_b / 4), b, trans_b, k, n, (p0 + j) * NR, k0, k1);
#pragma omp for schedule(static)
                for (int64_t t = 0; t < blocks * groups; t++) {
                    int64_t i0 = t / groups * per, ni = panels_m - i0 < per ? panels_m - i0 : per;
                    int64_t g = t % groups, j0 = np * g / groups, j1 = np * (g + 1) / groups;
                    if (j0 == j1) continue;
                    for (int64_t i = 0; i < ni; i++)
                        pack_a(mine + i * (panel_a / 4), a, trans_a, m, k, (i0 + i) * MR, k0, k1);
                    for (int64_t j = j0; j < j1; j++) {
                        int64_t c0 = (p0 + j) * NR;
                        int cols = (int)(n - c0 < NR ? n - c0 : NR);
                        for (int64_t i = 0; i < ni; i++) {
                            int64_t r0 = (i0 + i) * MR;
                            int rows = (int)(m - r0 < MR ? m - r0 : MR);
                            micro_kernel(kp, mine + i * (panel_a / 4), pb + j * (panel_b / 4),
                                         partial ? partial + r0 * n + c0 : NULL, first, last, c + r0 * n + c0,
                                         n, rows, cols, alpha, beta);
                        }
                    }
                }
            }
    }
    it_scratch_free(pa);
    it_scratch_free(pb);
    it_scratch_free(partial);
    return IT_OK;
}

#else
int it_avx512_bf16_ready(void) { return 0; }
it_status it_matmul_bf16_avx512(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                                int64_t k, int trans_a, int trans_b, float alpha, float beta) {
    (void)c, (void)a, (void)b, (void)m, (void)n, (void)k, (void)trans_a, (void)trans_b, (void)alpha, (void)beta;
    IT_REQUIRE(0, IT_ERR_NOT_SUPPORTED, "it_matmul: this build has no AVX512-BF16 path");
}
#endif
