/* Internal helpers shared by every source file of libinfinitrain. Not part of the ABI. */
#ifndef IT_COMMON_H
#define IT_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "infinitrain.h"

/* ---- errors --------------------------------------------------------------------------- */
/* Records a message for it_last_error() on this thread and returns `status`. */
it_status it_set_error(it_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define IT_REQUIRE(cond, status, ...)                                                        \
    do {                                                                                     \
        if (!(cond)) return it_set_error((status), __VA_ARGS__);                             \
    } while (0)
#define IT_CHECK_ARG(cond, ...) IT_REQUIRE(cond, IT_ERR_INVALID_ARGUMENT, __VA_ARGS__)
#define IT_CHECK_PTR(p, fn) IT_CHECK_ARG((p) != NULL, "%s: %s is NULL", fn, #p)
#define IT_CHECK_SIZE(x, fn) IT_CHECK_ARG((x) >= 0, "%s: %s must be >= 0, got %lld", fn, #x, \
                                          (long long)(x))
/* Sizes whose product (of all of them, each >= 0) stays at most 2^58: kernels multiply them
 * into element counts, byte counts and scratch sizes of a few buffers, which must not wrap
 * (a wrapped product means a heap overflow, or IT_OK for work never done). */
#define IT_MAX_ELEMENTS ((int64_t)1 << 58)
it_status it_check_product(const char *fn, const int64_t *sizes, int n);
#define IT_CHECK_PRODUCT(fn, ...)                                                            \
    IT_TRY(it_check_product((fn), (const int64_t[]){__VA_ARGS__},                            \
                            (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))))
#define IT_TRY(expr)                                                                         \
    do {                                                                                     \
        it_status _st = (expr);                                                              \
        if (_st != IT_OK) return _st;                                                        \
    } while (0)

/* Every kernel entry point checks its device first (a known type: cpu:0, or cuda:N), then
 * its other arguments; then IT_DISPATCH hands a CUDA device to the CUDA library and the CPU
 * runs the code that follows. */
it_status it_check_device(it_device device, const char *fn);
#define IT_CHECK_DEVICE(device, fn) IT_TRY(it_check_device((device), (fn)))

/* libinfinitrain_cuda.so (beside this library) is opened on the first CUDA call, so that a
 * CPU install needs no CUDA library. A build or machine without it answers IT_ERR_NO_CUDA
 * saying why; an op it does not implement, IT_ERR_NOT_SUPPORTED. it_cuda_failed(status, fn)
 * carries the CUDA library's message over to it_last_error(). */
it_status it_cuda_symbol(const char *symbol, const char *fn, void **out);
it_status it_cuda_failed(it_status status, const char *fn);
#define IT_CUDA_CALL(fn, sym, ...)                                                           \
    do {                                                                                     \
        static __typeof__(&sym) impl_;                                                       \
        if (!impl_) IT_TRY(it_cuda_symbol(#sym, (fn), (void **)&impl_));                     \
        it_status st_ = impl_(__VA_ARGS__);                                                  \
        if (st_ != IT_OK) return it_cuda_failed(st_, (fn));                                  \
    } while (0)
/* After the checks: a CUDA device runs it_cuda_<op>(device, <the same arguments>). */
#define IT_DISPATCH(op, device, ...)                                                         \
    do {                                                                                     \
        if ((device).type == IT_CUDA) {                                                      \
            static __typeof__(&it_##op) cuda_;                                               \
            if (!cuda_) IT_TRY(it_cuda_symbol("it_cuda_" #op, "it_" #op, (void **)&cuda_));  \
            it_status st_ = cuda_((device), __VA_ARGS__);                                    \
            return st_ == IT_OK ? IT_OK : it_cuda_failed(st_, "it_" #op);                    \
        }                                                                                    \
    } while (0)

/* The most threads a kernel may use: OpenMP runtimes exit the process when asked for far more
 * threads than they can create (OMP_NUM_THREADS=70000), so requests are bounded here. */
#define IT_MAX_THREADS 1024

/* float32, bfloat16 and float16: the dtypes compute kernels accept. */
static inline int it_is_float(it_dtype dt) {
    return dt == IT_FLOAT32 || dt == IT_BFLOAT16 || dt == IT_FLOAT16;
}
const char *it_dtype_name(it_dtype dt);
#define IT_CHECK_FLOAT(dt, fn)                                                               \
    IT_REQUIRE(it_is_float(dt), IT_ERR_NOT_SUPPORTED,                                        \
               "%s: dtype %s is not supported (float32, bfloat16 or float16)", fn,           \
               it_dtype_name(dt))

/* ---- SIMD dispatch -------------------------------------------------------------------- */
/* Hot loops are compiled three times (AVX-512, AVX2+FMA, baseline x86-64) and the best one
 * for the running CPU is picked when the library loads, so one binary runs on old and new
 * cluster nodes alike. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(IT_NO_TARGET_CLONES)
#define IT_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define IT_HOT
#endif

/* ---- 16-bit floats -------------------------------------------------------------------- */
static inline float it_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t it_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}
float it_f16_to_f32(uint16_t h);
uint16_t it_f32_to_f16(float f);

/* Element i of any dtype as double, and back (casts, fills, integer, float64 and bool
 * arithmetic, indexing). Out-of-range values saturate; NaN becomes 0 in integer dtypes;
 * anything non-zero is true in bool. */
static inline double it_load_f64(it_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case IT_FLOAT32: return ((const float *)p)[i];
    case IT_BFLOAT16: return it_bf16_to_f32(((const uint16_t *)p)[i]);
    case IT_FLOAT16: return it_f16_to_f32(((const uint16_t *)p)[i]);
    case IT_INT32: return ((const int32_t *)p)[i];
    case IT_INT64: return (double)((const int64_t *)p)[i];
    case IT_UINT8: case IT_BOOL: return ((const uint8_t *)p)[i];
    case IT_FLOAT64: return ((const double *)p)[i];
    }
    return 0;
}
static inline double it_clamp_f64(double v, double lo, double hi) {
    if (v != v) return 0;
    return v < lo ? lo : (v > hi ? hi : v);
}
static inline void it_store_f64(it_dtype dt, void *p, int64_t i, double v) {
    switch (dt) {
    case IT_FLOAT32: ((float *)p)[i] = (float)v; break;
    case IT_BFLOAT16: ((uint16_t *)p)[i] = it_f32_to_bf16((float)v); break;
    case IT_FLOAT16: ((uint16_t *)p)[i] = it_f32_to_f16((float)v); break;
    case IT_INT32: ((int32_t *)p)[i] = (int32_t)it_clamp_f64(v, -2147483648.0, 2147483647.0); break;
    case IT_INT64:
        ((int64_t *)p)[i] = (int64_t)it_clamp_f64(v, -9223372036854775808.0, 9223372036854774784.0);
        break;
    case IT_UINT8: ((uint8_t *)p)[i] = (uint8_t)it_clamp_f64(v, 0, 255); break;
    case IT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case IT_FLOAT64: ((double *)p)[i] = v; break;
    }
}
/* An index tensor's element i (int32 or int64). */
static inline int64_t it_load_index(it_dtype dt, const void *p, int64_t i) {
    return dt == IT_INT32 ? ((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

/* Bulk conversions (vectorised). */
void it_convert_to_f32(it_dtype dt, const void *src, float *dst, int64_t n);
void it_convert_from_f32(it_dtype dt, const float *src, void *dst, int64_t n);

/* Row access for kernels written once in float32: a float32 row is used in place, a 16-bit
 * row is converted into `scratch` first (and written back by it_row_store). */
static inline const float *it_row_load(it_dtype dt, const void *base, int64_t off, int64_t n,
                                       float *scratch) {
    if (dt == IT_FLOAT32) return (const float *)base + off;
    it_convert_to_f32(dt, (const uint16_t *)base + off, scratch, n);
    return scratch;
}
static inline float *it_row_dest(it_dtype dt, void *base, int64_t off, float *scratch) {
    return dt == IT_FLOAT32 ? (float *)base + off : scratch;
}
static inline void it_row_store(it_dtype dt, void *base, int64_t off, const float *row,
                                int64_t n) {
    if (dt != IT_FLOAT32) it_convert_from_f32(dt, row, (uint16_t *)base + off, n);
}

/* Elementwise kernels walk their arrays in chunks of this many elements: small enough that
 * 16-bit chunks converted to float32 stay in L1, large enough to amortise the loop. */
#define IT_CHUNK 2048

/* Deterministic parallel sums: a long sum is split into fixed blocks whose partial sums are
 * added in order, so the result does not depend on the number of threads. */
#define IT_SUM_BLOCK 4096

/* ---- vectorisable math ---------------------------------------------------------------- */
/* exp(x) in float32 to ~1 ulp, written branch-free so that loops calling it vectorise
 * (libm's expf is an opaque call). Range reduction x = n ln2 + r, degree-7 polynomial for
 * e^r, 2^n built in the exponent bits. exp(-inf) = 0, exp(nan) = nan. */
static inline float it_expf(float x) {
    /* NaN is clamped too (to 0), so that the integer conversion below is always defined */
    float xc = x < -87.33654f ? -87.33654f : (x > 88.72283f ? 88.72283f : (x == x ? x : 0.0f));
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* n + 127 in [1, 254] */
    float scale;
    memcpy(&scale, &bits, 4);
    float y = p * scale;
    y = x < -87.33654f ? 0.0f : y;
    y = x > 88.72283f ? INFINITY : y;
    return x != x ? x : y;
}
static inline float it_sigmoidf(float x) { return 1.0f / (1.0f + it_expf(-x)); }
static inline float it_tanhf(float x) {
    float ax = x < 0 ? -x : x;
    float t = 1.0f - 2.0f / (it_expf(2.0f * ax) + 1.0f);
    t = ax < 1e-4f ? ax : t; /* tanh(x) = x below float32 resolution of the formula above */
    return x < 0 ? -t : t;
}
#define IT_GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* ---- row reductions ------------------------------------------------------------------- */
/* Sums over a fixed 32 lanes: several independent vector accumulators hide the add latency,
 * and because the lane count is fixed (not the vector width) the result is the same on every
 * SIMD level and thread count. Inlined into IT_HOT callers. */
#define IT_LANES 32
static inline float it_lanes_total(const float *acc) {
    float s = 0.0f;
    for (int j = 0; j < IT_LANES; j++) s += acc[j];
    return s;
}
static inline float it_vsum(const float *x, int64_t n) {
    float acc[IT_LANES] = {0};
    int64_t c = 0;
    for (; c + IT_LANES <= n; c += IT_LANES)
        for (int j = 0; j < IT_LANES; j++) acc[j] += x[c + j];
    for (; c < n; c++) acc[c % IT_LANES] += x[c];
    return it_lanes_total(acc);
}
static inline float it_vdot(const float *x, const float *y, int64_t n) {
    float acc[IT_LANES] = {0};
    int64_t c = 0;
    for (; c + IT_LANES <= n; c += IT_LANES)
        for (int j = 0; j < IT_LANES; j++) acc[j] += x[c + j] * y[c + j];
    for (; c < n; c++) acc[c % IT_LANES] += x[c] * y[c];
    return it_lanes_total(acc);
}
/* sum((x - m)^2) */
static inline float it_vsumsq_centered(const float *x, float m, int64_t n) {
    float acc[IT_LANES] = {0};
    int64_t c = 0;
    for (; c + IT_LANES <= n; c += IT_LANES)
        for (int j = 0; j < IT_LANES; j++) acc[j] += (x[c + j] - m) * (x[c + j] - m);
    for (; c < n; c++) acc[c % IT_LANES] += (x[c] - m) * (x[c] - m);
    return it_lanes_total(acc);
}
/* Mean and variance in one pass, with sums shifted by x[0] so that a large mean does not
 * cancel the variance away (the shifted-data algorithm). */
static inline void it_vmean_var(const float *x, int64_t n, float *mean, float *var) {
    float s1[IT_LANES] = {0}, s2[IT_LANES] = {0};
    const float k = x[0];
    int64_t c = 0;
    for (; c + IT_LANES <= n; c += IT_LANES)
        for (int j = 0; j < IT_LANES; j++) {
            float d = x[c + j] - k;
            s1[j] += d;
            s2[j] += d * d;
        }
    for (; c < n; c++) {
        float d = x[c] - k;
        s1[c % IT_LANES] += d;
        s2[c % IT_LANES] += d * d;
    }
    float m = it_lanes_total(s1) / (float)n;
    float v = it_lanes_total(s2) / (float)n - m * m;
    *mean = k + m;
    *var = v > 0.0f ? v : 0.0f;
}

/* max(x); a NaN anywhere makes the result NaN. */
static inline float it_vmax(const float *x, int64_t n) {
    float acc[IT_LANES];
    int nan = 0;
    for (int j = 0; j < IT_LANES; j++) acc[j] = -INFINITY;
    int64_t c = 0;
    for (; c + IT_LANES <= n; c += IT_LANES)
        for (int j = 0; j < IT_LANES; j++) {
            float v = x[c + j];
            nan |= v != v;
            acc[j] = v > acc[j] ? v : acc[j];
        }
    for (; c < n; c++) {
        nan |= x[c] != x[c];
        acc[c % IT_LANES] = x[c] > acc[c % IT_LANES] ? x[c] : acc[c % IT_LANES];
    }
    float m = acc[0];
    for (int j = 1; j < IT_LANES; j++) m = acc[j] > m ? acc[j] : m;
    return nan ? NAN : m;
}

/* ---- streaming stores ------------------------------------------------------------------ */
/* Outputs larger than the caches are written with non-temporal stores: a normal store first
 * reads the destination line into the cache (read-for-ownership), so an output costs two DRAM
 * transfers instead of one. Used for rows that are computed in a cache-resident scratch row.
 * Call it_stream_fence() before the data is read by another thread (end of the kernel). */
#define IT_STREAM_MIN_BYTES ((int64_t)16 << 20)
void it_store_scaled_stream(float *dst, const float *src, float scale, int64_t n);
void it_stream_fence(void);

/* ---- BLAS ----------------------------------------------------------------------------- */
/* Sets the number of BLAS threads and returns the previous value (a no-op for BLAS libraries
 * without the call); used around OpenMP regions whose threads each call sgemm. */
int it_blas_set_threads_local(int n);
void it_blas_set_threads(int n);
void it_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
              int64_t ldc);
void it_dgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double *a, int64_t lda, const double *b, int64_t ldb, double beta, double *c,
              int64_t ldc);

/* ---- strided iteration ---------------------------------------------------------------- */
/* Merges neighbouring dimensions that are contiguous with each other in every operand, and
 * drops size-1 dimensions, so that strided kernels run long inner loops. `strides` holds
 * `nops` arrays of ndim strides. Returns the new ndim (>= 1); shape/strides are rewritten. */
int it_collapse_dims(int ndim, int64_t *shape, int64_t *const *strides, int nops);

/* Element offset of the start of row r (the last dimension is the row). */
static inline int64_t it_row_offset(int64_t r, const int64_t *shape, const int64_t *strides,
                                    int ndim) {
    int64_t off = 0;
    for (int d = ndim - 2; d >= 0; d--) {
        int64_t i = r % shape[d];
        r /= shape[d];
        off += i * strides[d];
    }
    return off;
}
#define IT_MAX_DIMS 16

/* bfloat16 products on Intel AMX (cpu/matmul_amx.c): whether this CPU and kernel allow
 * them (asked once), and C = alpha op(A) op(B) + beta C for one row-major problem. */
int it_amx_ready(void);
it_status it_matmul_bf16_amx(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                             int64_t k, int trans_a, int trans_b, float alpha, float beta);

/* Aligned scratch memory for kernels (not counted by the storage allocator). */
void *it_scratch_alloc(size_t nbytes);
void it_scratch_free(void *p);

#endif
