/* Errors, build information, threads, dtypes, 16-bit float conversion and the BLAS binding. */
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "common.h"

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

/* ---- errors --------------------------------------------------------------------------- */
static _Thread_local char it_error_message[1024] = "";

it_status it_set_error(it_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it_error_message, sizeof it_error_message, fmt, ap);
    va_end(ap);
    return status;
}

const char *it_last_error(void) { return it_error_message; }

const char *it_status_name(it_status status) {
    switch (status) {
    case IT_OK: return "IT_OK";
    case IT_ERR_INVALID_ARGUMENT: return "IT_ERR_INVALID_ARGUMENT";
    case IT_ERR_OUT_OF_MEMORY: return "IT_ERR_OUT_OF_MEMORY";
    case IT_ERR_NOT_SUPPORTED: return "IT_ERR_NOT_SUPPORTED";
    case IT_ERR_NO_CUDA: return "IT_ERR_NO_CUDA";
    case IT_ERR_INDEX_OUT_OF_RANGE: return "IT_ERR_INDEX_OUT_OF_RANGE";
    case IT_ERR_INTERNAL: return "IT_ERR_INTERNAL";
    case IT_ERR_CUDA: return "IT_ERR_CUDA";
    case IT_ERR_NCCL: return "IT_ERR_NCCL";
    }
    return "IT_ERR_UNKNOWN";
}

it_status it_check_product(const char *fn, const int64_t *sizes, int n) {
    int64_t total = 1;
    for (int i = 0; i < n; i++) {
        IT_CHECK_ARG(sizes[i] >= 0, "%s: size %d is negative (%lld)", fn, i, (long long)sizes[i]);
        if (sizes[i] == 0) return IT_OK;
    }
    for (int i = 0; i < n; i++) {
        IT_CHECK_ARG(!__builtin_mul_overflow(total, sizes[i], &total) && total <= IT_MAX_ELEMENTS,
                     "%s: the sizes multiply past %lld elements (size %d is %lld): too large",
                     fn, (long long)IT_MAX_ELEMENTS, i, (long long)sizes[i]);
    }
    return IT_OK;
}

/* ---- build information and threads ---------------------------------------------------- */
const char *it_version(void) { return "0.1.0"; }

static const char *it_simd_level(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return it_amx_ready() ? "x86-64-v4 (AVX-512), AMX-BF16 for bfloat16 products" : "x86-64-v4 (AVX-512)";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "x86-64-v3 (AVX2+FMA)";
    return "x86-64 baseline (SSE2)";
#else
    return "compiler default";
#endif
}

const char *it_cuda_describe(void);  /* device.c */

const char *it_build_info(void) {
    static _Thread_local char info[1024];
    snprintf(info, sizeof info, "infinitrain %s; BLAS: %s; SIMD: %s; OpenMP: %d threads; CUDA: %s",
             it_version(), IT_BLAS_DESC, it_simd_level(), omp_get_max_threads(), it_cuda_describe());
    return info;
}

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

/* Scratch comes from the caching allocator too (a large temporary freed every call would
 * otherwise be mapped and faulted in every call); the owning storage sits just before the
 * returned pointer, which stays 64-byte aligned. */
void *it_scratch_alloc(size_t nbytes) {
    it_storage *s = NULL;
    it_device cpu = {IT_CPU, 0};
    if (it_storage_new(cpu, nbytes + 64, &s) != IT_OK) return NULL;
    char *p = (char *)it_storage_data(s) + 64;
    memcpy(p - sizeof s, &s, sizeof s);
    return p;
}
void it_scratch_free(void *p) {
    if (!p) return;
    it_storage *s;
    memcpy(&s, (char *)p - sizeof s, sizeof s);
    it_storage_free(s);
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

/* ---- dtypes --------------------------------------------------------------------------- */
size_t it_dtype_size(it_dtype dtype) {
    switch (dtype) {
    case IT_FLOAT32: case IT_INT32: return 4;
    case IT_BFLOAT16: case IT_FLOAT16: return 2;
    case IT_INT64: case IT_FLOAT64: return 8;
    case IT_UINT8: case IT_BOOL: return 1;
    }
    return 0;
}

const char *it_dtype_name(it_dtype dt) {
    switch (dt) {
    case IT_FLOAT32: return "float32";
    case IT_BFLOAT16: return "bfloat16";
    case IT_FLOAT16: return "float16";
    case IT_INT32: return "int32";
    case IT_INT64: return "int64";
    case IT_UINT8: return "uint8";
    case IT_FLOAT64: return "float64";
    case IT_BOOL: return "bool";
    }
    return "unknown";
}

/* IEEE binary16 by hand (gcc 12 has no portable _Float16 on every target we build for). */
float it_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else { /* subnormal: renormalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t it_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);         /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);        /* overflow -> inf */
    if (absu < 0x38800000u) {                                          /* subnormal or zero */
        if (absu < 0x33000000u) return (uint16_t)sign;
        uint32_t man = (absu & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absu >> 23);                           /* 14 .. 24 */
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t v = absu - ((127u - 15u) << 23);
    v += 0xfffu + ((v >> 13) & 1u);                                    /* round to nearest even */
    return (uint16_t)(sign | (v >> 13));
}

IT_HOT static void bf16_to_f32_n(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(dst + i, &u, 4);
    }
}

IT_HOT static void f32_to_bf16_n(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, 4);
        uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        uint32_t nan = (u >> 16) | 0x40u;
        dst[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
    }
}

/* Large conversions outside a parallel region are split across threads (to_f32 says which
 * direction); returns 0 when the caller should convert serially itself. */
#define IT_CONVERT_PARALLEL (1 << 18)
static int convert_in_parallel(int to_f32, it_dtype dt, const void *src, void *dst, int64_t n) {
    if (n < IT_CONVERT_PARALLEL || omp_in_parallel()) return 0;
    const int64_t piece = IT_CONVERT_PARALLEL / 4;
    const int64_t in_size = to_f32 ? (int64_t)it_dtype_size(dt) : 4;
    const int64_t out_size = to_f32 ? 4 : (int64_t)it_dtype_size(dt);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < (n + piece - 1) / piece; c++) {
        int64_t off = c * piece, len = n - off < piece ? n - off : piece;
        const char *s = (const char *)src + off * in_size;
        char *d = (char *)dst + off * out_size;
        if (to_f32) it_convert_to_f32(dt, s, (float *)d, len);
        else it_convert_from_f32(dt, (const float *)s, d, len);
    }
    return 1;
}

void it_convert_to_f32(it_dtype dt, const void *src, float *dst, int64_t n) {
    if (convert_in_parallel(1, dt, src, dst, n)) return;
    if (dt == IT_FLOAT32) { memcpy(dst, src, (size_t)n * 4); return; }
    if (dt == IT_BFLOAT16) { bf16_to_f32_n((const uint16_t *)src, dst, n); return; }
    const uint16_t *s = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = it_f16_to_f32(s[i]);
}

void it_convert_from_f32(it_dtype dt, const float *src, void *dst, int64_t n) {
    if (convert_in_parallel(0, dt, src, dst, n)) return;
    if (dt == IT_FLOAT32) { memcpy(dst, src, (size_t)n * 4); return; }
    if (dt == IT_BFLOAT16) { f32_to_bf16_n(src, (uint16_t *)dst, n); return; }
    uint16_t *d = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) d[i] = it_f32_to_f16(src[i]);
}
