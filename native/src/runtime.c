/* Threads (OpenMP), the BLAS binding and streaming stores. */
#include <omp.h>
#include <unistd.h>

#include "runtime.h"
#include "status.h"

#if defined(IT_BLAS_SCIPY_OPENBLAS)
#include <cblas.h>
#define IT_CBLAS_SGEMM scipy_cblas_sgemm
#define IT_CBLAS_DGEMM scipy_cblas_dgemm
#else
#include <cblas.h>
#define IT_CBLAS_SGEMM cblas_sgemm
#define IT_CBLAS_DGEMM cblas_dgemm
#endif

#ifndef IT_BLAS_DESC
#define IT_BLAS_DESC "unknown BLAS"
#endif

void it_blas_set_threads(int n) {
#if defined(IT_BLAS_SCIPY_OPENBLAS)
    scipy_openblas_set_num_threads(n);
#else
    (void)n;
#endif
}

int it_blas_set_threads_local(int n) {
    /* This OpenBLAS is a pthreads build: called with several threads from inside an OpenMP
     * region it warns and may oversubscribe, so callers that run sgemm on every OpenMP thread
     * set it to one thread around the region. The setting is process-wide. */
#if defined(IT_BLAS_SCIPY_OPENBLAS)
    int prev = scipy_openblas_get_num_threads();
    if (prev != n) scipy_openblas_set_num_threads(n);
    return prev;
#else
    (void)n;
    return 0;
#endif
}

/* OMP_NUM_THREADS is read by the OpenMP runtime itself: a value past IT_MAX_THREADS is
 * brought down when the library loads, before any kernel can ask for that many threads. */
__attribute__((constructor)) static void it_bound_threads_at_load(void) {
    if (omp_get_max_threads() > IT_MAX_THREADS) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int n = cores >= 1 && cores <= IT_MAX_THREADS ? (int)cores : IT_MAX_THREADS;
        omp_set_num_threads(n);
        it_blas_set_threads(n);
    }
}

it_status it_set_num_threads(int32_t n) {
    IT_CHECK_ARG(n >= 1 && n <= IT_MAX_THREADS,
                 "it_set_num_threads: the thread count must be in [1, %d], got %d", IT_MAX_THREADS,
                 (int)n);
    omp_set_num_threads(n);
    it_blas_set_threads(n);
    return IT_OK;
}

int32_t it_get_num_threads(void) { return omp_get_max_threads(); }

void it_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
              int64_t ldc) {
    IT_CBLAS_SGEMM(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                   trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a,
                   (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

void it_dgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double *a, int64_t lda, const double *b, int64_t ldb, double beta, double *c,
              int64_t ldc) {
    IT_CBLAS_DGEMM(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                   trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a,
                   (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* ---- streaming stores ------------------------------------------------------------------ */
#if defined(__x86_64__) || defined(__SSE__)
#include <xmmintrin.h>
void it_store_scaled_stream(float *dst, const float *src, float scale, int64_t n) {
    int64_t c = 0;
    for (; c < n && ((uintptr_t)(dst + c) & 15); c++) dst[c] = src[c] * scale;
    __m128 s = _mm_set1_ps(scale);
    for (; c + 4 <= n; c += 4) _mm_stream_ps(dst + c, _mm_mul_ps(_mm_loadu_ps(src + c), s));
    for (; c < n; c++) dst[c] = src[c] * scale;
}
void it_stream_fence(void) { _mm_sfence(); }
#else
void it_store_scaled_stream(float *dst, const float *src, float scale, int64_t n) {
    for (int64_t c = 0; c < n; c++) dst[c] = src[c] * scale;
}
void it_stream_fence(void) {}
#endif
