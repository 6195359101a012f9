/* Fills, casts, strided copies, concatenation, split and triangular masks. */
#include "common.h"

int it_collapse_dims(int ndim, int64_t *shape, int64_t *const *strides, int nops) {
    int out = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (out > 0) {
            int mergeable = 1;
            for (int o = 0; o < nops; o++)
                if (strides[o][out - 1] != shape[d] * strides[o][d]) mergeable = 0;
            if (mergeable) {
                shape[out - 1] *= shape[d];
                for (int o = 0; o < nops; o++) strides[o][out - 1] = strides[o][d];
                continue;
            }
        }
        shape[out] = shape[d];
        for (int o = 0; o < nops; o++) strides[o][out] = strides[o][d];
        out++;
    }
    if (out == 0) { /* a scalar */
        shape[0] = 1;
        for (int o = 0; o < nops; o++) strides[o][0] = 0;
        out = 1;
    }
    return out;
}

#define load_double it_load_f64
#define store_double it_store_f64

static it_status check_dtype(it_dtype dt, const char *fn) {
    IT_CHECK_ARG(it_dtype_size(dt) != 0, "%s: unknown dtype %d", fn, (int)dt);
    return IT_OK;
}

/* Copies one element of size es from src[i] to dst[j]. */
#define COPY_ELEM(es, dst, j, src, i)                                                        \
    switch (es) {                                                                            \
    case 1: ((uint8_t *)(dst))[j] = ((const uint8_t *)(src))[i]; break;                      \
    case 2: ((uint16_t *)(dst))[j] = ((const uint16_t *)(src))[i]; break;                    \
    case 4: ((uint32_t *)(dst))[j] = ((const uint32_t *)(src))[i]; break;                    \
    default: ((uint64_t *)(dst))[j] = ((const uint64_t *)(src))[i]; break;                   \
    }

/* Writes the element bit pattern `pat` (es bytes) to dst[j]. */
static inline void put_pattern(size_t es, void *dst, int64_t j, const unsigned char *pat) {
    memcpy((char *)dst + (size_t)j * es, pat, es);
}

it_status it_fill(it_device device, it_dtype dtype, void *out, double value, int64_t n) {
    IT_CHECK_DEVICE(device, "it_fill");
    IT_TRY(check_dtype(dtype, "it_fill"));
    IT_CHECK_SIZE(n, "it_fill");
    if (n == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_fill");
    IT_DISPATCH(fill, device, dtype, out, value, n);
    unsigned char pattern[8] = {0};
    store_double(dtype, pattern, 0, value);
    size_t es = it_dtype_size(dtype);
    if (es == 4) {
        uint32_t v;
        memcpy(&v, pattern, 4);
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) ((uint32_t *)out)[i] = v;
        return IT_OK;
    }
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) put_pattern(es, out, i, pattern);
    return IT_OK;
}

it_status it_arange(it_device device, it_dtype dtype, void *out, double start, double step,
                    int64_t n) {
    IT_CHECK_DEVICE(device, "it_arange");
    IT_TRY(check_dtype(dtype, "it_arange"));
    IT_CHECK_SIZE(n, "it_arange");
    IT_CHECK_FINITE(start, "it_arange");
    IT_CHECK_FINITE(step, "it_arange");
    if (n == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_arange");
    IT_DISPATCH(arange, device, dtype, out, start, step, n);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) store_double(dtype, out, i, start + (double)i * step);
    return IT_OK;
}

it_status it_cast(it_device device, void *out, it_dtype out_dtype, const void *inp,
                  it_dtype inp_dtype, int64_t n) {
    IT_CHECK_DEVICE(device, "it_cast");
    IT_TRY(check_dtype(out_dtype, "it_cast"));
    IT_TRY(check_dtype(inp_dtype, "it_cast"));
    IT_CHECK_SIZE(n, "it_cast");
    if (n == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_cast");
    IT_CHECK_PTR(inp, "it_cast");
    IT_DISPATCH(cast, device, out, out_dtype, inp, inp_dtype, n);
    int64_t nchunks = (n + IT_CHUNK - 1) / IT_CHUNK;
    if (out_dtype == inp_dtype) return it_memcpy(device, out, device, inp,
                                                 (size_t)n * it_dtype_size(out_dtype));
    if (it_is_float(out_dtype) && it_is_float(inp_dtype)) {
#pragma omp parallel
        {
            float buf[IT_CHUNK];
#pragma omp for schedule(static)
            for (int64_t c = 0; c < nchunks; c++) {
                int64_t off = c * IT_CHUNK, len = n - off < IT_CHUNK ? n - off : IT_CHUNK;
                const float *x = it_row_load(inp_dtype, inp, off, len, buf);
                if (out_dtype == IT_FLOAT32) memcpy((float *)out + off, x, (size_t)len * 4);
                else it_row_store(out_dtype, out, off, x, len);
            }
        }
        return IT_OK;
    }
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        if (inp_dtype == IT_INT64 && out_dtype == IT_INT32)
            ((int32_t *)out)[i] = (int32_t)((const int64_t *)inp)[i];
        else if (inp_dtype == IT_INT32 && out_dtype == IT_INT64)
            ((int64_t *)out)[i] = ((const int32_t *)inp)[i];
        else store_double(out_dtype, out, i, load_double(inp_dtype, inp, i));
    }
    return IT_OK;
}

it_status it_copy_strided(it_device device, it_dtype dtype, void *out, const int64_t *out_strides,
                          const void *inp, const int64_t *inp_strides, const int64_t *shape,
                          int32_t ndim) {
    IT_CHECK_DEVICE(device, "it_copy_strided");
    IT_TRY(check_dtype(dtype, "it_copy_strided"));
    IT_CHECK_ARG(ndim >= 0 && ndim <= IT_MAX_DIMS, "it_copy_strided: ndim %d not in [0, %d]",
                 (int)ndim, IT_MAX_DIMS);
    IT_CHECK_ARG(ndim == 0 || (shape && out_strides && inp_strides),
                 "it_copy_strided: shape or strides are NULL");
    int64_t sh[IT_MAX_DIMS + 1], so[IT_MAX_DIMS + 1], si[IT_MAX_DIMS + 1], numel = 1;
    if (ndim > 0) IT_TRY(it_check_product("it_copy_strided", shape, ndim));
    for (int d = 0; d < ndim; d++) {
        sh[d] = shape[d], so[d] = out_strides[d], si[d] = inp_strides[d], numel *= shape[d];
    }
    if (numel == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_copy_strided");
    IT_CHECK_PTR(inp, "it_copy_strided");
    int64_t *strides[2] = {so, si};
    int nd = it_collapse_dims(ndim, sh, strides, 2);
    IT_DISPATCH(copy_strided, device, dtype, out, so, inp, si, sh, nd);
    int64_t cols = sh[nd - 1], rows = numel / cols, os = so[nd - 1], is = si[nd - 1];
    size_t es = it_dtype_size(dtype);
#pragma omp parallel for schedule(static) if (numel > 32768)
    for (int64_t r = 0; r < rows; r++) {
        char *o = (char *)out + it_row_offset(r, sh, so, nd) * (int64_t)es;
        const char *x = (const char *)inp + it_row_offset(r, sh, si, nd) * (int64_t)es;
        if (os == 1 && is == 1) memcpy(o, x, (size_t)cols * es);
        else for (int64_t c = 0; c < cols; c++) { COPY_ELEM(es, o, c * os, x, c * is); }
    }
    return IT_OK;
}

static it_status check_parts(const char *fn, it_dtype dtype, const void *joined,
                             void *const *parts, const int64_t *sizes, int32_t num_parts,
                             int64_t outer, int64_t inner) {
    IT_TRY(check_dtype(dtype, fn));
    IT_CHECK_ARG(num_parts >= 1, "%s: needs at least one tensor", fn);
    IT_CHECK_ARG(sizes && parts, "%s: the sizes or tensors array is NULL", fn);
    IT_CHECK_SIZE(outer, fn);
    IT_CHECK_SIZE(inner, fn);
    int64_t total = 0;
    for (int i = 0; i < num_parts; i++) {
        IT_CHECK_ARG(sizes[i] >= 0, "%s: size %d is negative", fn, i);
        IT_CHECK_ARG(!__builtin_add_overflow(total, sizes[i], &total), "%s: sizes overflow", fn);
        IT_CHECK_PRODUCT(fn, 8, total, outer, inner);
        IT_CHECK_ARG(parts[i] != NULL || sizes[i] * outer * inner == 0,
                     "%s: tensor %d is NULL", fn, i);
    }
    IT_CHECK_ARG(total * outer * inner == 0 || joined, "%s: the joined tensor is NULL", fn);
    return IT_OK;
}

static it_status concat_or_split(it_dtype dtype, void *joined, void *const *parts,
                                 const int64_t *sizes, int32_t num_parts, int64_t outer,
                                 int64_t inner, int split) {
    int64_t total = 0;
    for (int i = 0; i < num_parts; i++) total += sizes[i];
    if (total * outer * inner == 0) return IT_OK;
    size_t es = it_dtype_size(dtype);
#pragma omp parallel for schedule(static) if (total * outer * inner > 32768)
    for (int64_t o = 0; o < outer; o++) {
        int64_t at = 0;
        for (int i = 0; i < num_parts; i++) {
            size_t len = (size_t)(sizes[i] * inner) * es;
            char *j = (char *)joined + (size_t)((o * total + at) * inner) * es;
            char *p = (char *)parts[i] + (size_t)(o * sizes[i] * inner) * es;
            if (split) memcpy(p, j, len);
            else memcpy(j, p, len);
            at += sizes[i];
        }
    }
    return IT_OK;
}

it_status it_concat(it_device device, it_dtype dtype, void *out, const void *const *inputs,
                    const int64_t *sizes, int32_t num_inputs, int64_t outer, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_concat");
    IT_TRY(check_parts("it_concat", dtype, out, (void *const *)inputs, sizes, num_inputs, outer,
                       inner));
    IT_DISPATCH(concat, device, dtype, out, inputs, sizes, num_inputs, outer, inner);
    return concat_or_split(dtype, out, (void *const *)inputs, sizes, num_inputs, outer, inner, 0);
}

it_status it_split(it_device device, it_dtype dtype, void *const *outputs, const void *inp,
                   const int64_t *sizes, int32_t num_outputs, int64_t outer, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_split");
    IT_TRY(check_parts("it_split", dtype, inp, outputs, sizes, num_outputs, outer, inner));
    IT_DISPATCH(split, device, dtype, outputs, inp, sizes, num_outputs, outer, inner);
    return concat_or_split(dtype, (void *)inp, outputs, sizes, num_outputs, outer, inner, 1);
}

it_status it_triangle(it_device device, it_dtype dtype, void *out, const void *inp, int64_t batch,
                      int64_t rows, int64_t cols, int64_t diagonal, int32_t upper,
                      double fill_value) {
    IT_CHECK_DEVICE(device, "it_triangle");
    IT_TRY(check_dtype(dtype, "it_triangle"));
    IT_CHECK_SIZE(batch, "it_triangle");
    IT_CHECK_SIZE(rows, "it_triangle");
    IT_CHECK_SIZE(cols, "it_triangle");
    IT_CHECK_PRODUCT("it_triangle", 8, batch, rows, cols);
    if (batch * rows * cols == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_triangle");
    IT_CHECK_PTR(inp, "it_triangle");
    IT_DISPATCH(triangle, device, dtype, out, inp, batch, rows, cols, diagonal, upper, fill_value);
    unsigned char pattern[8] = {0};
    store_double(dtype, pattern, 0, fill_value);
    size_t es = it_dtype_size(dtype);
#pragma omp parallel for schedule(static) if (batch * rows * cols > 32768)
    for (int64_t br = 0; br < batch * rows; br++) {
        int64_t i = br % rows;
        for (int64_t j = 0; j < cols; j++) {
            int keep = upper ? (j - i >= diagonal) : (j - i <= diagonal);
            int64_t at = br * cols + j;
            if (keep) { COPY_ELEM(es, out, at, inp, at); }
            else put_pattern(es, out, at, pattern);
        }
    }
    return IT_OK;
}
