/* Dtypes: names, 16-bit floats, elements of any dtype as double, bulk and row conversions (dtypes.c). Not part of the ABI. */
#ifndef IT_DTYPES_H
#define IT_DTYPES_H

#include <math.h>
#include "status.h"

/* float32, bfloat16 and float16: the dtypes compute kernels accept. */
static inline int it_is_float(it_dtype dt) {
    return dt == IT_FLOAT32 || dt == IT_BFLOAT16 || dt == IT_FLOAT16;
}
const char *it_dtype_name(it_dtype dt);
#define IT_CHECK_FLOAT(dt, fn)                                                               \
    IT_REQUIRE(it_is_float(dt), IT_ERR_NOT_SUPPORTED,                                        \
               "%s: dtype %s is not supported (float32, bfloat16 or float16)", fn,           \
               it_dtype_name(dt))


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

#endif
