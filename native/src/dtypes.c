/* Dtype sizes and names, 16-bit float conversion, bulk conversions. */
#include <omp.h>

#include "dtypes.h"
#include "runtime.h"
#include "vmath.h"

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
