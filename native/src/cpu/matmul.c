/* Batched matrix products through BLAS sgemm; 16-bit dtypes are converted to float32 around
 * the call (accumulation is always float32). */
#include "common.h"

it_status it_matmul(it_device device, it_dtype dtype, void *c, const void *a, const void *b,
                    int64_t batch, int64_t m, int64_t n, int64_t k, int32_t trans_a,
                    int32_t trans_b, float alpha, float beta, int64_t stride_a,
                    int64_t stride_b, int64_t stride_c) {
    IT_ON_CPU(device, "it_matmul");
    IT_CHECK_FLOAT(dtype, "it_matmul");
    IT_CHECK_SIZE(batch, "it_matmul");
    IT_CHECK_SIZE(m, "it_matmul");
    IT_CHECK_SIZE(n, "it_matmul");
    IT_CHECK_SIZE(k, "it_matmul");
    IT_CHECK_ARG(m < INT32_MAX && n < INT32_MAX && k < INT32_MAX,
                 "it_matmul: a dimension does not fit BLAS's 32-bit integers");
    if (batch * m * n == 0) return IT_OK;
    IT_CHECK_ARG(c != NULL && ((a && b) || k == 0), "it_matmul: NULL pointer");
    IT_CHECK_ARG(stride_c >= m * n || batch == 1,
                 "it_matmul: output problems overlap (stride_c %lld < m*n %lld)",
                 (long long)stride_c, (long long)(m * n));
    int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;

    if (dtype == IT_FLOAT32) {
        for (int64_t i = 0; i < batch; i++)
            it_sgemm(trans_a, trans_b, m, n, k, alpha, (const float *)a + i * stride_a, lda,
                     (const float *)b + i * stride_b, ldb, beta, (float *)c + i * stride_c, n);
        return IT_OK;
    }
    float *fa = (float *)it_scratch_alloc((size_t)(m * k + k * n + m * n) * sizeof(float));
    IT_REQUIRE(fa, IT_ERR_OUT_OF_MEMORY, "it_matmul: out of memory converting %s operands",
               it_dtype_name(dtype));
    float *fb = fa + m * k, *fc = fb + k * n;
    for (int64_t i = 0; i < batch; i++) {
        it_convert_to_f32(dtype, (const uint16_t *)a + i * stride_a, fa, m * k);
        it_convert_to_f32(dtype, (const uint16_t *)b + i * stride_b, fb, k * n);
        if (beta != 0.0f) it_convert_to_f32(dtype, (const uint16_t *)c + i * stride_c, fc, m * n);
        it_sgemm(trans_a, trans_b, m, n, k, alpha, fa, lda, fb, ldb, beta, fc, n);
        it_convert_from_f32(dtype, fc, (uint16_t *)c + i * stride_c, m * n);
    }
    it_scratch_free(fa);
    return IT_OK;
}
