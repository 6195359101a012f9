/* Batched matrix products through BLAS sgemm; bfloat16 through the CPU's own bf16 products
 * where it has them (AMX tiles: matmul_amx.c; AVX512-BF16: matmul_bf16.c), on CPUs with only
 * AVX2 through our own FMA kernel on operands widened while packed (matmul_bf16.c), other 16-bit
 * products converted to float32 around sgemm (accumulation is always float32). */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common.h"

/* The best bf16 path this CPU has, chosen once. The AVX2 kernel only where there is no
 * AVX-512: there sgemm's own AVX-512 kernel outruns it. INFINITRAIN_BF16_MATMUL=sgemm|avx2|
 * avx512_bf16|amx caps the choice (for comparisons: each path below the best stays reachable;
 * avx2 picks the AVX2 kernel even beside AVX-512). */
it_bf16_path it_bf16_matmul_path(void) {
    static int path = -1;
    if (path >= 0) return (it_bf16_path)path;  /* a race only repeats the same answer */
    const char *env = getenv("INFINITRAIN_BF16_MATMUL");
    it_bf16_path cap = !env ? IT_BF16_AMX : !strcasecmp(env, "sgemm") ? IT_BF16_SGEMM
                     : !strcasecmp(env, "avx2") ? IT_BF16_AVX2
                     : !strcasecmp(env, "avx512_bf16") ? IT_BF16_AVX512 : IT_BF16_AMX;
    int avx512 = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    avx512 = __builtin_cpu_supports("avx512f");
#endif
    path = cap >= IT_BF16_AMX && it_amx_ready() ? IT_BF16_AMX
         : cap >= IT_BF16_AVX512 && it_avx512_bf16_ready() ? IT_BF16_AVX512
         : cap >= IT_BF16_AVX2 && it_avx2_fma_ready() && (cap == IT_BF16_AVX2 || !avx512) ? IT_BF16_AVX2
         : IT_BF16_SGEMM;
    return (it_bf16_path)path;
}

const char *it_bf16_path_name(it_bf16_path p) {
    return p == IT_BF16_AMX ? "AMX tiles" : p == IT_BF16_AVX512 ? "AVX512-BF16"
         : p == IT_BF16_AVX2 ? "AVX2 FMA on widened operands" : "float32 sgemm";
}

/* rows [r0, r0+nr) x cols [c0, c0+nc) of a row-major 16-bit matrix (leading dimension ld)
 * to a contiguous float32 block, and back. */
static void block_to_f32(it_dtype dt, const uint16_t *src, int64_t ld, int64_t r0, int64_t nr,
                         int64_t c0, int64_t nc, float *dst) {
    for (int64_t r = 0; r < nr; r++) it_convert_to_f32(dt, src + (r0 + r) * ld + c0, dst + r * nc, nc);
}
static void block_from_f32(it_dtype dt, const float *src, uint16_t *dst, int64_t ld, int64_t r0,
                           int64_t nr, int64_t c0, int64_t nc) {
    for (int64_t r = 0; r < nr; r++) it_convert_from_f32(dt, src + r * nc, dst + (r0 + r) * ld + c0, nc);
}

/* One 16-bit product through sgemm, converting in tiles so that the float32 copies stay a
 * few MB whatever the shape: the larger of M and N is walked in tiles of up to TILE, K in
 * chunks sized so that a tile of each operand fits the budget; each C tile accumulates in
 * float32 over the K chunks and is converted back once. When the other operand fits the
 * budget whole (all of K), it is converted once, not once per tile: for GPT-2's output head
 * (N = 50304 columns walked in tiles) that was the same activations converted ~100 times. */
#define TILE 2048
#define BUDGET ((int64_t)1 << 22) /* floats per operand tile (16 MB) */
static it_status matmul_16bit(it_dtype dt, uint16_t *c, const uint16_t *a, const uint16_t *b,
                              int64_t m, int64_t n, int64_t k, int trans_a, int trans_b,
                              float alpha, float beta) {
    int tile_rows = m >= n;
    int64_t t = tile_rows ? (m < TILE ? m : TILE) : (n < TILE ? n : TILE);
    int64_t other = tile_rows ? n : m;           /* the side converted whole per K chunk */
    int64_t kc = BUDGET / (t > other ? t : other);
    kc = kc < 16 ? 16 : (kc > k ? k : kc);
    if (k == 0) kc = 0;
    /* one K chunk: the untiled operand's chunk is all of it, the same for every tile */
    int once = kc == k && k > 0;
    size_t na = (size_t)((tile_rows ? t : m) * kc), nb = (size_t)(kc * (tile_rows ? n : t));
    size_t nc = (size_t)(tile_rows ? t * n : m * t);
    float *buf = (float *)it_scratch_alloc((na + nb + nc) * sizeof(float));
    IT_REQUIRE(buf, IT_ERR_OUT_OF_MEMORY, "it_matmul: out of memory converting %s operands",
               it_dtype_name(dt));
    float *fa = buf, *fb = buf + na, *fc = fb + nb;
    if (once && tile_rows) { /* all of op(B) [k, n] */
        if (trans_b) block_to_f32(dt, b, k, 0, n, 0, k, fb);
        else block_to_f32(dt, b, n, 0, k, 0, n, fb);
    } else if (once) {       /* all of op(A) [m, k] */
        if (trans_a) block_to_f32(dt, a, m, 0, k, 0, m, fa);
        else block_to_f32(dt, a, k, 0, m, 0, k, fa);
    }
    for (int64_t o0 = 0; o0 < (tile_rows ? m : n); o0 += t) {
        int64_t len = (tile_rows ? m : n) - o0 < t ? (tile_rows ? m : n) - o0 : t;
        int64_t r0 = tile_rows ? o0 : 0, nr = tile_rows ? len : m;   /* rows of C */
        int64_t c0 = tile_rows ? 0 : o0, ncol = tile_rows ? n : len;  /* columns of C */
        if (beta != 0.0f) block_to_f32(dt, c, n, r0, nr, c0, ncol, fc);
        else memset(fc, 0, nc * sizeof(float));
        if (k == 0)
            for (int64_t i = 0; i < nr * ncol; i++) fc[i] *= beta;
        for (int64_t k0 = 0; k0 < k; k0 += kc) {
            int64_t kk = k - k0 < kc ? k - k0 : kc;
            /* op(A)[r0:r0+nr, k0:k0+kk]: A is [M, K], or [K, M] when transposed */
            if (!once || tile_rows) {
                if (trans_a) block_to_f32(dt, a, m, k0, kk, r0, nr, fa);
                else block_to_f32(dt, a, k, r0, nr, k0, kk, fa);
            }
            /* op(B)[k0:k0+kk, c0:c0+ncol]: B is [K, N], or [N, K] when transposed */
            if (!once || !tile_rows) {
                if (trans_b) block_to_f32(dt, b, k, c0, ncol, k0, kk, fb);
                else block_to_f32(dt, b, n, k0, kk, c0, ncol, fb);
            }
            it_sgemm(trans_a, trans_b, nr, ncol, kk, alpha, fa, trans_a ? nr : kk, fb,
                     trans_b ? kk : ncol, k0 == 0 ? beta : 1.0f, fc, ncol);
        }
        block_from_f32(dt, fc, c, n, r0, nr, c0, ncol);
    }
    it_scratch_free(buf);
    return IT_OK;
}

it_status it_matmul(it_device device, it_dtype dtype, void *c, const void *a, const void *b,
                    int64_t batch, int64_t m, int64_t n, int64_t k, int32_t trans_a,
                    int32_t trans_b, float alpha, float beta, int64_t stride_a,
                    int64_t stride_b, int64_t stride_c) {
    IT_CHECK_DEVICE(device, "it_matmul");
    IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64, IT_ERR_NOT_SUPPORTED,
               "it_matmul: dtype %s is not supported (a floating-point dtype)", it_dtype_name(dtype));
    IT_CHECK_SIZE(batch, "it_matmul");
    IT_CHECK_SIZE(m, "it_matmul");
    IT_CHECK_SIZE(n, "it_matmul");
    IT_CHECK_SIZE(k, "it_matmul");
    IT_CHECK_ARG(m < INT32_MAX && n < INT32_MAX && k < INT32_MAX,
                 "it_matmul: a dimension does not fit BLAS's 32-bit integers");
    IT_CHECK_FLAG(trans_a, "it_matmul");
    IT_CHECK_FLAG(trans_b, "it_matmul");
    IT_CHECK_FINITE(alpha, "it_matmul");
    IT_CHECK_FINITE(beta, "it_matmul");
    IT_CHECK_PRODUCT("it_matmul", 4, batch, m, n);  /* before any product is used */
    IT_CHECK_PRODUCT("it_matmul", 4, batch, m, k);
    IT_CHECK_PRODUCT("it_matmul", 4, batch, k, n);
    if (batch * m * n == 0) return IT_OK;
    IT_CHECK_ARG(c != NULL && ((a && b) || k == 0), "it_matmul: NULL pointer");
    IT_CHECK_NO_ALIAS(c, a, "it_matmul");  /* C is written while A and B are still read */
    IT_CHECK_NO_ALIAS(c, b, "it_matmul");
    IT_CHECK_ARG(stride_c >= m * n || batch == 1,
                 "it_matmul: output problems overlap (stride_c %lld < m*n %lld)",
                 (long long)stride_c, (long long)(m * n));
    IT_DISPATCH(matmul, device, dtype, c, a, b, batch, m, n, k, trans_a, trans_b, alpha, beta,
                stride_a, stride_b, stride_c);
    int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;

    if (dtype == IT_FLOAT64) {
        for (int64_t i = 0; i < batch; i++)
            it_dgemm(trans_a, trans_b, m, n, k, alpha, (const double *)a + i * stride_a, lda,
                     (const double *)b + i * stride_b, ldb, beta, (double *)c + i * stride_c, n);
        return IT_OK;
    }
    if (dtype == IT_FLOAT32) {
        for (int64_t i = 0; i < batch; i++)
            it_sgemm(trans_a, trans_b, m, n, k, alpha, (const float *)a + i * stride_a, lda,
                     (const float *)b + i * stride_b, ldb, beta, (float *)c + i * stride_c, n);
        return IT_OK;
    }
    it_bf16_path path = dtype == IT_BFLOAT16 && k > 0 ? it_bf16_matmul_path() : IT_BF16_SGEMM;
    for (int64_t i = 0; i < batch; i++) {
        uint16_t *ci = (uint16_t *)c + i * stride_c;
        const uint16_t *ai = (const uint16_t *)a + i * stride_a, *bi = (const uint16_t *)b + i * stride_b;
        if (path == IT_BF16_AMX)
            IT_TRY(it_matmul_bf16_amx(ci, ai, bi, m, n, k, trans_a, trans_b, alpha, beta));
        else if (path == IT_BF16_AVX512)
            IT_TRY(it_matmul_bf16_avx512(ci, ai, bi, m, n, k, trans_a, trans_b, alpha, beta));
        else if (path == IT_BF16_AVX2)
            IT_TRY(it_matmul_bf16_avx2(ci, ai, bi, m, n, k, trans_a, trans_b, alpha, beta));
        else
            IT_TRY(matmul_16bit(dtype, ci, ai, bi, m, n, k, trans_a, trans_b, alpha, beta));
    }
    return IT_OK;
}
