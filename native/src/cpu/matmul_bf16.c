/* bfloat16 matrix products packed by us, llm.c-simple BLIS: op(B) is packed a block of
 * columns at a time into panels of NR columns, op(A) a block of rows at a time into
 * micro-panels of MR rows, and a micro-kernel keeps an MR x NR tile of C in registers over a
 * chunk of K. Between chunks the tile's float32 sums wait in a float32 copy of C; after the
 * last, C = alpha * sum + beta * C is rounded to bf16 once, with it_convert_from_f32's
 * rounding. Rows, columns and K past the edge are zeros in the packed operands. Two kernels:
 *
 * - AVX512-BF16 (AMD Zen 4 and later, Intel Cooper Lake, Sapphire Rapids without AMX):
 *   VDPBF16PS multiplies 16 pairs of bf16 by 16 pairs and adds each pair's two products to a
 *   float32 lane. B's panels hold, for each pair of k, 32 columns' two values interleaved (two
 *   zmm); A's micro-panels, for each pair of k, 12 rows' two values as one 32-bit word,
 *   broadcast to every lane: 24 zmm accumulators. Like every VDPBF16PS user, bf16 inputs
 *   below 2^-126 (subnormal) count as zero.
 * - AVX2 + FMA (CPUs without bf16 instructions): the packing converts bf16 to float32 as it
 *   copies, so the products run at float32's FMA rate with no conversion pass of their own
 *   (the sgemm path converts the operands and C around sgemm, which packs them again): a
 *   6 x 16 tile in 12 ymm accumulators, K in chunks of 384 (a 24 KB panel of B stays in L1).
 *
 * Either way the products of two bf16 are exact in float32 and the sums are float32, as the
 * sgemm path's are; only the order of the sums differs. */
#include <omp.h>

#include "common.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#include <cpuid.h>
#include <immintrin.h>

#define A_BUDGET ((int64_t)256 << 10) /* bytes of packed A per thread's block (L2) */
#define B_BUDGET ((int64_t)4 << 20)   /* bytes of packed B per block of columns */

/* ---- AVX512-BF16: 12 x 32 tiles, K in pairs -------------------------------------------- */
#define MR 12
#define NR 32

int it_avx512_bf16_ready(void) {
    static int ready = -1;
    if (ready >= 0) return ready;  /* a race only repeats the same answer */
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();  /* avx512f/bw here also means the OS saves the zmm state */
    ready = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 5 & 1) /* AVX512_BF16 */;
    return ready;
}

int it_avx2_fma_ready(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* One 32-bit word of two bf16: (lo, hi) = (k even, k odd). */
static inline uint32_t pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

/* Micro-panel of op(A)[m, k] at rows [r0, r0 + MR) and k [k0, k1): (k1 - k0 + 1) / 2 words
 * per row, k-pair major. k0 is even. */
static void pack_a_pairs(uint32_t *dst, const uint16_t *a, int trans_a, int64_t m, int64_t k, int64_t r0,
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
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void pack_b_pairs(uint32_t *dst, const uint16_t *b, int trans_b,
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
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void kernel_12x32(
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

#undef MR
#undef NR

/* ---- AVX2 + FMA: 6 x 16 tiles of float32, bf16 converted while packing ------------------- */
/* Micro-panel of op(A) at rows [r0, r0 + 6) and k [k0, k1) as float32, k major. */
static void pack_a_f32(uint32_t *dst_words, const uint16_t *a, int trans_a, int64_t m, int64_t k, int64_t r0,
                       int64_t k0, int64_t k1) {
    float *dst = (float *)dst_words;
    int64_t kk = k1 - k0, rows = m - r0 < 6 ? m - r0 : 6;
    if (rows < 6) memset(dst, 0, (size_t)(kk * 6) * 4);
    if (!trans_a) {
        for (int64_t r = 0; r < rows; r++) {
            const uint16_t *row = a + (r0 + r) * k + k0;
            for (int64_t p = 0; p < kk; p++) dst[p * 6 + r] = it_bf16_to_f32(row[p]);
        }
    } else {
        for (int64_t p = 0; p < kk; p++) {
            const uint16_t *row = a + (k0 + p) * m + r0;
            for (int64_t r = 0; r < rows; r++) dst[p * 6 + r] = it_bf16_to_f32(row[r]);
        }
    }
}

/* Panel of op(B) at columns [c0, c0 + 16) and k [k0, k1) as float32, k major. */
__attribute__((target("avx2,fma"))) static void pack_b_f32(uint32_t *dst_words, const uint16_t *b, int trans_b,
                                                          int64_t k, int64_t n, int64_t c0, int64_t k0, int64_t k1) {
    float *dst = (float *)dst_words;
    int64_t kk = k1 - k0, cols = n - c0 < 16 ? n - c0 : 16;
    if (!trans_b && cols == 16) {  /* B [k, n]: 16 columns of a row widened in two loads */
        for (int64_t p = 0; p < kk; p++) {
            const uint16_t *row = b + (k0 + p) * n + c0;
            for (int h = 0; h < 2; h++) {
                __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 8 * h)));
                _mm256_storeu_si256((__m256i *)(dst + p * 16 + 8 * h), _mm256_slli_epi32(w, 16));
            }
        }
        return;
    }
    if (cols < 16) memset(dst, 0, (size_t)(kk * 16) * 4);
    if (!trans_b) {
        for (int64_t p = 0; p < kk; p++)
            for (int64_t j = 0; j < cols; j++) dst[p * 16 + j] = it_bf16_to_f32(b[(k0 + p) * n + c0 + j]);
    } else {       /* B [n, k]: a column's k are contiguous */
        for (int64_t j = 0; j < cols; j++) {
            const uint16_t *col = b + (c0 + j) * k + k0;
            for (int64_t p = 0; p < kk; p++) dst[p * 16 + j] = it_bf16_to_f32(col[p]);
        }
    }
}

__attribute__((target("avx2,fma"))) static void kernel_6x16(int64_t kk, const uint32_t *pa_words,
                                                           const uint32_t *pb_words, float *partial, int first,
                                                           int last, uint16_t *c, int64_t ldc, int rows, int cols,
                                                           float alpha, float beta) {
    const float *pa = (const float *)pa_words, *pb = (const float *)pb_words;
    /* The sums kept from K's earlier chunks come in (and go back out) straight from and to
     * `partial` on a whole tile, through a zero-padded copy on an edge tile. */
    int whole = rows == 6 && cols == 16;
    float kept[6][16] = {{0}};
    if (!first && !whole)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < cols; j++) kept[r][j] = partial[r * ldc + j];
    const float *in = whole ? partial : &kept[0][0];
    int64_t ld_in = whole ? ldc : 16;
    /* twelve named accumulators: held in an array, GCC 12 stores them back every k */
#define IT_ROW(r)                                                                              \
    __m256 c##r##0 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(in + r * ld_in),            \
           c##r##1 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(in + r * ld_in + 8);
    IT_ROW(0) IT_ROW(1) IT_ROW(2) IT_ROW(3) IT_ROW(4) IT_ROW(5)
#undef IT_ROW
    for (int64_t p = 0; p < kk; p++) {
        __m256 b0 = _mm256_loadu_ps(pb + p * 16), b1 = _mm256_loadu_ps(pb + p * 16 + 8);
#define IT_ROW(r)                                                  \
    {                                                              \
        __m256 a = _mm256_broadcast_ss(pa + p * 6 + r);            \
        c##r##0 = _mm256_fmadd_ps(a, b0, c##r##0);                 \
        c##r##1 = _mm256_fmadd_ps(a, b1, c##r##1);                 \
    }
        IT_ROW(0) IT_ROW(1) IT_ROW(2) IT_ROW(3) IT_ROW(4) IT_ROW(5)
#undef IT_ROW
    }
    float sums[6][16];
    float *out = !last && whole ? partial : &sums[0][0];
    int64_t ld_out = !last && whole ? ldc : 16;
#define IT_ROW(r) _mm256_storeu_ps(out + r * ld_out, c##r##0), _mm256_storeu_ps(out + r * ld_out + 8, c##r##1);
    IT_ROW(0) IT_ROW(1) IT_ROW(2) IT_ROW(3) IT_ROW(4) IT_ROW(5)
#undef IT_ROW
    if (!last && whole) return;
    /* an edge tile's sums, or C itself: once per tile (not per k), plain C is cheap here */
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            if (!last) {
                partial[r * ldc + j] = sums[r][j];
            } else {
                uint16_t *dst = c + r * ldc + j;
                *dst = it_f32_to_bf16(alpha * sums[r][j] + (beta != 0.0f ? beta * it_bf16_to_f32(*dst) : 0.0f));
            }
        }
}

/* ---- the driver both kernels share ---------------------------------------------------------- */
typedef struct {
    int mr, nr;          /* the tile of C */
    int k_per_word;      /* values of K in one 32-bit word of a packed row: 2 (bf16 pairs) or 1 */
    int64_t k_chunk;     /* values of K per pass */
    void (*pack_a)(uint32_t *, const uint16_t *, int, int64_t, int64_t, int64_t, int64_t, int64_t);
    void (*pack_b)(uint32_t *, const uint16_t *, int, int64_t, int64_t, int64_t, int64_t, int64_t);
    void (*kernel)(int64_t, const uint32_t *, const uint32_t *, float *, int, int, uint16_t *, int64_t, int,
                   int, float, float);
} packed_kernel;

static const packed_kernel kAvx512Bf16 = {12, 32, 2, 4096, pack_a_pairs, pack_b_pairs, kernel_12x32};
static const packed_kernel kAvx2 = {6, 16, 1, 384, pack_a_f32, pack_b_f32, kernel_6x16};

static it_status matmul_packed(const packed_kernel *kd, uint16_t *c, const uint16_t *a, const uint16_t *b,
                               int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, float alpha,
                               float beta) {
    /* Blocks: K in chunks of kd->k_chunk (one chunk of bf16 pairs at GPT-2's widths; longer K,
     * such as the head's 50k-wide input gradient, keeps its partial sums in a float32 copy of C
     * between chunks); B's columns in blocks whose packed panels fit B_BUDGET (all of N at
     * GPT-2's widths); each thread's rows in blocks of micro-panels that fit A_BUDGET, as many
     * blocks as keeps the threads evenly loaded. When there are fewer blocks of rows than
     * threads, the panels of a block are shared out too. */
    const int64_t mr = kd->mr, nr = kd->nr;
    int64_t kc = k < kd->k_chunk ? k : kd->k_chunk, chunks = (k + kc - 1) / kc;
    int64_t words = (kc + kd->k_per_word - 1) / kd->k_per_word;  /* per packed row of a chunk */
    int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    int64_t panel_b = words * nr * 4, panel_a = words * mr * 4;
    int64_t panels_n = (n + nr - 1) / nr, panels_m = (m + mr - 1) / mr;
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
                int64_t k1 = k - k0 < kc ? k : k0 + kc, kw = (k1 - k0 + kd->k_per_word - 1) / kd->k_per_word;
                int64_t np = panels_n - p0 < nc ? panels_n - p0 : nc;
                int first = k0 == 0, last = k1 == k;
#pragma omp for schedule(static)
                for (int64_t j = 0; j < np; j++) kd->pack_b(pb + j * (panel_b / 4), b, trans_b, k, n, (p0 + j) * nr, k0, k1);
#pragma omp for schedule(static)
                for (int64_t t = 0; t < blocks * groups; t++) {
                    int64_t i0 = t / groups * per, ni = panels_m - i0 < per ? panels_m - i0 : per;
                    int64_t g = t % groups, j0 = np * g / groups, j1 = np * (g + 1) / groups;
                    if (j0 == j1) continue;
                    for (int64_t i = 0; i < ni; i++)
                        kd->pack_a(mine + i * (panel_a / 4), a, trans_a, m, k, (i0 + i) * mr, k0, k1);
                    for (int64_t j = j0; j < j1; j++) {
                        int64_t c0 = (p0 + j) * nr;
                        int cols = (int)(n - c0 < nr ? n - c0 : nr);
                        for (int64_t i = 0; i < ni; i++) {
                            int64_t r0 = (i0 + i) * mr;
                            int rows = (int)(m - r0 < mr ? m - r0 : mr);
                            kd->kernel(kw, mine + i * (panel_a / 4), pb + j * (panel_b / 4),
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

it_status it_matmul_bf16_avx512(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                                int64_t k, int trans_a, int trans_b, float alpha, float beta) {
    return matmul_packed(&kAvx512Bf16, c, a, b, m, n, k, trans_a, trans_b, alpha, beta);
}

it_status it_matmul_bf16_avx2(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                              int64_t k, int trans_a, int trans_b, float alpha, float beta) {
    return matmul_packed(&kAvx2, c, a, b, m, n, k, trans_a, trans_b, alpha, beta);
}

#else
int it_avx512_bf16_ready(void) { return 0; }
int it_avx2_fma_ready(void) { return 0; }
it_status it_matmul_bf16_avx512(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                                int64_t k, int trans_a, int trans_b, float alpha, float beta) {
    (void)c, (void)a, (void)b, (void)m, (void)n, (void)k, (void)trans_a, (void)trans_b, (void)alpha, (void)beta;
    IT_REQUIRE(0, IT_ERR_NOT_SUPPORTED, "it_matmul: this build has no AVX512-BF16 path");
}
it_status it_matmul_bf16_avx2(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                              int64_t k, int trans_a, int trans_b, float alpha, float beta) {
    (void)c, (void)a, (void)b, (void)m, (void)n, (void)k, (void)trans_a, (void)trans_b, (void)alpha, (void)beta;
    IT_REQUIRE(0, IT_ERR_NOT_SUPPORTED, "it_matmul: this build has no AVX2 path");
}
#endif
