/* What CPU kernels compute with: SIMD clones of hot loops, chunk sizes, vectorisable exp/tanh and
 * row reductions in 32 lanes. Header only. Not part of the ABI. */
#ifndef IT_VMATH_H
#define IT_VMATH_H

#include <math.h>
#include <stdint.h>

/* ---- SIMD dispatch -------------------------------------------------------------------- */
/* Hot loops are compiled three times (AVX-512, AVX2+FMA, baseline x86-64) and the best one
 * for the running CPU is picked when the library loads, so one binary runs on old and new
 * cluster nodes alike. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(IT_NO_TARGET_CLONES)
#define IT_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define IT_HOT
#endif


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
#define IT_SQRT1_2 0.7071067811865476f /* 1/sqrt(2) */
#define IT_INV_SQRT_2PI 0.3989422804014327f /* 1/sqrt(2 pi) */

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
    *var = v < 0.0f ? 0.0f : v;  /* rounding can take it below 0; a NaN (an inf in the row) stays, as PyTorch's */
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

#endif
