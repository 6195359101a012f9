/* bfloat16 matrix products on Intel AMX (Sapphire Rapids and later): TDPBF16PS multiplies a
 * 16 x 32 bf16 tile of A by a 32 x 16 tile of B into a 16 x 16 float32 tile, exactly (a
 * product of two bf16 fits a float32) and accumulated in float32, as the sgemm path does.
 *
 * The operands are packed into tiles a block at a time (zero-padded to whole tiles): A as
 * rows of 32 consecutive k, B in AMX's pair layout (row r of a tile holds k = 2r and 2r + 1
 * of 16 columns, interleaved). Each thread computes 32 x 32 blocks of C with four
 * accumulator tiles, K in chunks of 2048 summed in a float32 buffer, and C is written once
 * (alpha, beta, rounding to bf16). Blocks are taken so that a packed block of each operand
 * stays a few MB.
 *
 * Linux hands out AMX's 8 KB of tile state only to a process that asks for it
 * (arch_prctl ARCH_REQ_XCOMP_PERM); it_amx_ready() asks once and says whether this CPU and
 * kernel allow it. */
#include "common.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && defined(__linux__)
#define IT_HAVE_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_BYTES 1024                  /* 16 rows x 64 bytes */
#define PACK_BUDGET ((int64_t)4 << 20)   /* bytes per packed operand block */

int it_amx_ready(void) {
    static int ready = -1;
    if (ready >= 0) return ready;  /* a race only repeats the same answer */
    unsigned eax, ebx, ecx, edx;
    int ok = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
             (edx >> 22 & 1) /* AMX-BF16 */ && (edx >> 24 & 1) /* AMX-TILE */ &&
             syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    ready = ok;
    return ready;
}

/* Tiles 0-7 of 16 rows x 64 bytes (palette 1). Constant data: GCC 12 drops the stores of a
 * configuration built on the stack before _tile_loadconfig reads it. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;
static const tile_config kTiles __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

__attribute__((target("amx-tile"))) static void configure_tiles(void) { _tile_loadconfig(&kTiles); }

/* The tile of op(A)[m, k] at rows [r0, r0 + 16), k [k0, k0 + 32), zero outside; the inner
 * loop walks the direction that is contiguous in memory. */
static void pack_a_tile(uint16_t *dst, const uint16_t *a, int trans_a, int64_t m, int64_t k,
                        int64_t r0, int64_t k0) {
    if (!trans_a) {  /* A [m, k]: a row's k are contiguous */
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 32; c++)
                dst[r * 32 + c] = r0 + r < m && k0 + c < k ? a[(r0 + r) * k + k0 + c] : 0;
    } else {         /* A [k, m]: a k's rows are contiguous */
        for (int c = 0; c < 32; c++)
            for (int r = 0; r < 16; r++)
                dst[r * 32 + c] = r0 + r < m && k0 + c < k ? a[(k0 + c) * m + r0 + r] : 0;
    }
}

/* The tile of op(B)[k, n] at k [k0, k0 + 32), columns [c0, c0 + 16), in AMX's pair layout:
 * row r holds (k0 + 2r, k0 + 2r + 1) of each column, interleaved. */
static void pack_b_tile(uint16_t *dst, const uint16_t *b, int trans_b, int64_t k, int64_t n,
                        int64_t k0, int64_t c0) {
    if (!trans_b) {  /* B [k, n]: a k's columns are contiguous */
        for (int r = 0; r < 16; r++)
            for (int p = 0; p < 2; p++)
                for (int j = 0; j < 16; j++)
                    dst[r * 32 + 2 * j + p] = k0 + 2 * r + p < k && c0 + j < n ? b[(k0 + 2 * r + p) * n + c0 + j] : 0;
    } else {         /* B [n, k]: a column's k are contiguous */
        for (int j = 0; j < 16; j++)
            for (int q = 0; q < 32; q++)
                dst[(q / 2) * 32 + 2 * j + q % 2] = c0 + j < n && k0 + q < k ? b[(c0 + j) * k + k0 + q] : 0;
    }
}

/* A 32 x 32 block of C (float32, rows of 32) += a 2-tile strip of A times one of B over kt
 * tiles of K; `fresh` starts it from zero instead. */
__attribute__((target("amx-tile,amx-bf16"))) static void block_32x32(float *acc, int fresh, const uint16_t *a0,
                                                                     const uint16_t *a1, const uint16_t *b0,
                                                                     const uint16_t *b1, int64_t kt) {
    if (fresh) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, acc, 128);
        _tile_loadd(1, acc + 16, 128);
        _tile_loadd(2, acc + 16 * 32, 128);
        _tile_loadd(3, acc + 16 * 32 + 16, 128);
    }
    for (int64_t t = 0; t < kt; t++) {
        _tile_loadd(4, a0 + t * 512, 64);
        _tile_loadd(5, a1 + t * 512, 64);
        _tile_loadd(6, b0 + t * 512, 64);
        _tile_loadd(7, b1 + t * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, acc, 128);
    _tile_stored(1, acc + 16, 128);
    _tile_stored(2, acc + 16 * 32, 128);
    _tile_stored(3, acc + 16 * 32 + 16, 128);
}

__attribute__((target("amx-tile"))) static void release_tiles(void) { _tile_release(); }

/* Packs `count` tiles of one operand: strips of 32 rows (A) or columns (B) from `first`, K
 * tiles from k0, kt of them per strip. */
static void pack_a(uint16_t *dst, const uint16_t *a, int trans_a, int64_t m, int64_t k, int64_t first,
                   int64_t tiles16, int64_t k0, int64_t kt) {
#pragma omp parallel for schedule(static) if (tiles16 * kt > 8)
    for (int64_t t = 0; t < tiles16 * kt; t++)
        pack_a_tile(dst + t * 512, a, trans_a, m, k, first + (t / kt) * 16, k0 + (t % kt) * 32);
}
static void pack_b(uint16_t *dst, const uint16_t *b, int trans_b, int64_t k, int64_t n, int64_t first,
                   int64_t tiles16, int64_t k0, int64_t kt) {
#pragma omp parallel for schedule(static) if (tiles16 * kt > 8)
    for (int64_t t = 0; t < tiles16 * kt; t++)
        pack_b_tile(dst + t * 512, b, trans_b, k, n, k0 + (t % kt) * 32, first + (t / kt) * 16);
}

#define K_CHUNK 64 /* K tiles (2048 values of K) per packed chunk */

/* C's 32 x 32 block at (r0, c0) = alpha * sum + beta * C, rounded to bf16 once. */
static void write_block(uint16_t *c, const float *sum, int64_t r0, int64_t c0, int64_t m, int64_t n,
                        float alpha, float beta) {
    int64_t rows = m - r0 < 32 ? m - r0 : 32, cols = n - c0 < 32 ? n - c0 : 32;
    float row[32];
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *dst = c + (r0 + r) * n + c0;
        for (int64_t q = 0; q < cols; q++)
            row[q] = alpha * sum[r * 32 + q] + (beta != 0.0f ? beta * it_bf16_to_f32(dst[q]) : 0.0f);
        it_convert_from_f32(IT_BFLOAT16, row, dst, cols);
    }
}

it_status it_matmul_bf16_amx(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                             int64_t k, int trans_a, int trans_b, float alpha, float beta) {
    /* C is walked in blocks of mb x nb so that a block's packed strips of A and B stay within
     * the budget. K up to 2048 (most products) is one chunk: B's block is packed once for all
     * blocks of rows, and each 32 x 32 block is written as soon as it is summed. A longer K
     * goes in chunks, the block's sums kept in a float32 buffer between them. */
    int64_t kt = (k + 31) / 32, kc = kt < K_CHUNK ? kt : K_CHUNK, chunks = (kt + kc - 1) / kc;
    int64_t per = PACK_BUDGET / (2 * kc * TILE_BYTES);
    per = per < 1 ? 1 : per;
    int64_t mb = per * 32, nb = per * 32;
    int64_t mb_alloc = mb < m ? mb : (m + 31) / 32 * 32, nb_alloc = nb < n ? nb : (n + 31) / 32 * 32;
    uint16_t *pa = (uint16_t *)it_scratch_alloc((size_t)(mb_alloc / 16 * kc) * TILE_BYTES);
    uint16_t *pb = (uint16_t *)it_scratch_alloc((size_t)(nb_alloc / 16 * kc) * TILE_BYTES);
    float *acc = chunks > 1 ? (float *)it_scratch_alloc((size_t)(mb_alloc * nb_alloc) * sizeof(float)) : NULL;
    if (!pa || !pb || (chunks > 1 && !acc)) {
        it_scratch_free(pa);
        it_scratch_free(pb);
        it_scratch_free(acc);
        IT_REQUIRE(0, IT_ERR_OUT_OF_MEMORY, "it_matmul: out of memory packing bfloat16 operands");
    }
    for (int64_t n0 = 0; n0 < n; n0 += nb) {
        int64_t nlen = n - n0 < nb ? n - n0 : nb, bn = (nlen + 31) / 32;
        if (chunks == 1) pack_b(pb, b, trans_b, k, n, n0, 2 * bn, 0, kt);
        for (int64_t m0 = 0; m0 < m; m0 += mb) {
            int64_t mlen = m - m0 < mb ? m - m0 : mb, bm = (mlen + 31) / 32;
            for (int64_t ch = 0; ch < chunks; ch++) {
                int64_t k0 = ch * kc * 32, kk = kt - ch * kc < kc ? kt - ch * kc : kc;
                int last = ch == chunks - 1;
                if (chunks > 1) pack_b(pb, b, trans_b, k, n, n0, 2 * bn, k0, kk);
                pack_a(pa, a, trans_a, m, k, m0, 2 * bm, k0, kk);
#pragma omp parallel if (bm * bn > 1)
                {
                    float local[32 * 32];
                    configure_tiles();
#pragma omp for schedule(static) collapse(2)
                    for (int64_t i = 0; i < bm; i++)
                        for (int64_t j = 0; j < bn; j++) {
                            const uint16_t *a0 = pa + 2 * i * kk * 512, *b0 = pb + 2 * j * kk * 512;
                            float *sum = chunks > 1 ? acc + (i * bn + j) * 1024 : local;
                            block_32x32(sum, ch == 0, a0, a0 + kk * 512, b0, b0 + kk * 512, kk);
                            if (last) write_block(c, sum, m0 + 32 * i, n0 + 32 * j, m, n, alpha, beta);
                        }
                    release_tiles();
                }
            }
        }
    }
    it_scratch_free(pa);
    it_scratch_free(pb);
    it_scratch_free(acc);
    return IT_OK;
}

#else
int it_amx_ready(void) { return 0; }
it_status it_matmul_bf16_amx(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                             int64_t k, int trans_a, int trans_b, float alpha, float beta) {
    (void)c, (void)a, (void)b, (void)m, (void)n, (void)k, (void)trans_a, (void)trans_b, (void)alpha, (void)beta;
    IT_REQUIRE(0, IT_ERR_NOT_SUPPORTED, "it_matmul: this build has no AMX path");
}
#endif
