/* Unary, binary (with broadcasting), scalar and gated (SwiGLU) elementwise kernels.
 * Each op is written once for float32 arrays; 16-bit dtypes go through float32 chunks. */
#include "common.h"

/* ---- unary ---------------------------------------------------------------------------- */
IT_HOT static void unary_f32(it_unary_op op, float *y, const float *x, int64_t n) {
    switch (op) {
    case IT_NEG: for (int64_t i = 0; i < n; i++) y[i] = -x[i]; break;
    case IT_EXP: for (int64_t i = 0; i < n; i++) y[i] = it_expf(x[i]); break;
    case IT_LOG: for (int64_t i = 0; i < n; i++) y[i] = logf(x[i]); break;
    case IT_SQRT: for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]); break;
    case IT_RSQRT: for (int64_t i = 0; i < n; i++) y[i] = 1.0f / sqrtf(x[i]); break;
    case IT_ABS: for (int64_t i = 0; i < n; i++) y[i] = fabsf(x[i]); break;
    case IT_TANH: for (int64_t i = 0; i < n; i++) y[i] = it_tanhf(x[i]); break;
    case IT_SIGMOID: for (int64_t i = 0; i < n; i++) y[i] = it_sigmoidf(x[i]); break;
    case IT_RELU: /* NaN stays NaN: a diverging run must show it */
        for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 || x[i] != x[i] ? x[i] : 0.0f;
        break;
    case IT_SILU: for (int64_t i = 0; i < n; i++) y[i] = x[i] * it_sigmoidf(x[i]); break;
    case IT_GELU_TANH:
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            y[i] = 0.5f * v * (1.0f + it_tanhf(IT_GELU_K * (v + 0.044715f * v * v * v)));
        }
        break;
    case IT_SIN: for (int64_t i = 0; i < n; i++) y[i] = sinf(x[i]); break;
    case IT_COS: for (int64_t i = 0; i < n; i++) y[i] = cosf(x[i]); break;
    case IT_SQUARE: for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i]; break;
    case IT_RECIPROCAL: for (int64_t i = 0; i < n; i++) y[i] = 1.0f / x[i]; break;
    case IT_GELU:
        for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * IT_SQRT1_2));
        break;
    }
}

/* dx = dy * f'(x); s is x, or the op's output for EXP, SQRT, TANH and SIGMOID. */
IT_HOT static void unary_backward_f32(it_unary_op op, float *dx, const float *dy, const float *s,
                                      int64_t n) {
    switch (op) {
    case IT_NEG: for (int64_t i = 0; i < n; i++) dx[i] = -dy[i]; break;
    case IT_EXP: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * s[i]; break;
    case IT_LOG: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] / s[i]; break;
    case IT_SQRT: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * 0.5f / s[i]; break;
    case IT_RSQRT:
        for (int64_t i = 0; i < n; i++) dx[i] = -0.5f * dy[i] / (s[i] * sqrtf(s[i]));
        break;
    case IT_ABS:
        for (int64_t i = 0; i < n; i++) dx[i] = s[i] > 0 ? dy[i] : (s[i] < 0 ? -dy[i] : 0.0f);
        break;
    case IT_TANH: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * (1.0f - s[i] * s[i]); break;
    case IT_SIGMOID: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * s[i] * (1.0f - s[i]); break;
    case IT_RELU: for (int64_t i = 0; i < n; i++) dx[i] = s[i] > 0 ? dy[i] : 0.0f; break;
    case IT_SILU:
        for (int64_t i = 0; i < n; i++) {
            float sg = it_sigmoidf(s[i]);
            dx[i] = dy[i] * sg * (1.0f + s[i] * (1.0f - sg));
        }
        break;
    case IT_GELU_TANH:
        for (int64_t i = 0; i < n; i++) {
            float v = s[i];
            float t = it_tanhf(IT_GELU_K * (v + 0.044715f * v * v * v));
            float dt = IT_GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
            dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dt);
        }
        break;
    case IT_SIN: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * cosf(s[i]); break;
    case IT_COS: for (int64_t i = 0; i < n; i++) dx[i] = -dy[i] * sinf(s[i]); break;
    case IT_SQUARE: for (int64_t i = 0; i < n; i++) dx[i] = 2.0f * s[i] * dy[i]; break;
    case IT_RECIPROCAL: for (int64_t i = 0; i < n; i++) dx[i] = -dy[i] / (s[i] * s[i]); break;
    case IT_GELU: /* Phi(x) + x phi(x) */
        for (int64_t i = 0; i < n; i++) {
            float v = s[i];
            dx[i] = dy[i] * (0.5f * (1.0f + erff(v * IT_SQRT1_2)) + v * IT_INV_SQRT_2PI * expf(-0.5f * v * v));
        }
        break;
    }
}

/* float64 tensors: the same ops, one element at a time in double precision. */
static double unary_f64(it_unary_op op, double x) {
    switch (op) {
    case IT_NEG: return -x;
    case IT_EXP: return exp(x);
    case IT_LOG: return log(x);
    case IT_SQRT: return sqrt(x);
    case IT_RSQRT: return 1.0 / sqrt(x);
    case IT_ABS: return fabs(x);
    case IT_TANH: return tanh(x);
    case IT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case IT_RELU: return x > 0 || x != x ? x : 0.0;
    case IT_SILU: return x / (1.0 + exp(-x));
    case IT_GELU_TANH: return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case IT_SIN: return sin(x);
    case IT_COS: return cos(x);
    case IT_SQUARE: return x * x;
    case IT_RECIPROCAL: return 1.0 / x;
    case IT_GELU: return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
    }
    return 0;
}

static double unary_backward_f64(it_unary_op op, double dy, double s) {
    switch (op) {
    case IT_NEG: return -dy;
    case IT_EXP: return dy * s;
    case IT_LOG: return dy / s;
    case IT_SQRT: return dy * 0.5 / s;
    case IT_RSQRT: return -0.5 * dy / (s * sqrt(s));
    case IT_ABS: return s > 0 ? dy : (s < 0 ? -dy : 0.0);
    case IT_TANH: return dy * (1.0 - s * s);
    case IT_SIGMOID: return dy * s * (1.0 - s);
    case IT_RELU: return s > 0 ? dy : 0.0;
    case IT_SILU: { double sg = 1.0 / (1.0 + exp(-s)); return dy * sg * (1.0 + s * (1.0 - sg)); }
    case IT_GELU_TANH: {
        double t = tanh(0.7978845608028654 * (s + 0.044715 * s * s * s));
        double dt = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * s * s);
        return dy * (0.5 * (1.0 + t) + 0.5 * s * (1.0 - t * t) * dt);
    }
    case IT_SIN: return dy * cos(s);
    case IT_COS: return -dy * sin(s);
    case IT_SQUARE: return 2.0 * s * dy;
    case IT_RECIPROCAL: return -dy / (s * s);
    case IT_GELU: return dy * (0.5 * (1.0 + erf(s * 0.7071067811865476)) + s * 0.3989422804014327 * exp(-0.5 * s * s));
    }
    return 0;
}

static it_status check_unary_op(it_unary_op op, const char *fn) {
    IT_CHECK_ARG(op >= IT_NEG && op <= IT_GELU, "%s: unknown unary op %d", fn, (int)op);
    return IT_OK;
}

it_status it_unary(it_device device, it_unary_op op, it_dtype dtype, void *out, const void *inp,
                   int64_t n) {
    IT_CHECK_DEVICE(device, "it_unary");
    IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64, IT_ERR_NOT_SUPPORTED,
               "it_unary: dtype %s is not supported (a floating-point dtype)", it_dtype_name(dtype));
    IT_TRY(check_unary_op(op, "it_unary"));
    IT_CHECK_PRODUCT("it_unary", 8, n);
    if (n == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_unary");
    IT_CHECK_PTR(inp, "it_unary");
    IT_DISPATCH(unary, device, op, dtype, out, inp, n);
    if (dtype == IT_FLOAT64) {
#pragma omp parallel for schedule(static) if (n > 32768)
        for (int64_t i = 0; i < n; i++) ((double *)out)[i] = unary_f64(op, ((const double *)inp)[i]);
        return IT_OK;
    }
    int64_t nchunks = (n + IT_CHUNK - 1) / IT_CHUNK;
#pragma omp parallel if (nchunks > 4)
    {
        float xb[IT_CHUNK], yb[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t off = c * IT_CHUNK, len = n - off < IT_CHUNK ? n - off : IT_CHUNK;
            const float *x = it_row_load(dtype, inp, off, len, xb);
            float *y = it_row_dest(dtype, out, off, yb);
            unary_f32(op, y, x, len);
            it_row_store(dtype, out, off, y, len);
        }
    }
    return IT_OK;
}

it_status it_unary_backward(it_device device, it_unary_op op, it_dtype dtype, void *dinp,
                            const void *dout, const void *saved, int64_t n) {
    IT_CHECK_DEVICE(device, "it_unary_backward");
    IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64, IT_ERR_NOT_SUPPORTED,
               "it_unary_backward: dtype %s is not supported (a floating-point dtype)",
               it_dtype_name(dtype));
    IT_TRY(check_unary_op(op, "it_unary_backward"));
    IT_CHECK_SIZE(n, "it_unary_backward");
    if (n == 0) return IT_OK;
    IT_CHECK_PTR(dinp, "it_unary_backward");
    IT_CHECK_PTR(dout, "it_unary_backward");
    IT_CHECK_PTR(saved, "it_unary_backward");
    IT_DISPATCH(unary_backward, device, op, dtype, dinp, dout, saved, n);
    if (dtype == IT_FLOAT64) {
#pragma omp parallel for schedule(static) if (n > 32768)
        for (int64_t i = 0; i < n; i++)
            ((double *)dinp)[i] = unary_backward_f64(op, ((const double *)dout)[i],
                                                     ((const double *)saved)[i]);
        return IT_OK;
    }
    int64_t nchunks = (n + IT_CHUNK - 1) / IT_CHUNK;
#pragma omp parallel if (nchunks > 4)
    {
        float gb[IT_CHUNK], sb[IT_CHUNK], db[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t off = c * IT_CHUNK, len = n - off < IT_CHUNK ? n - off : IT_CHUNK;
            const float *g = it_row_load(dtype, dout, off, len, gb);
            const float *s = it_row_load(dtype, saved, off, len, sb);
            float *d = it_row_dest(dtype, dinp, off, db);
            unary_backward_f32(op, d, g, s, len);
            it_row_store(dtype, dinp, off, d, len);
        }
    }
    return IT_OK;
}

/* ---- binary --------------------------------------------------------------------------- */
IT_HOT static void binary_f32(it_binary_op op, float *y, const float *a, const float *b,
                              int64_t n) {
    switch (op) {
    case IT_ADD: for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i]; break;
    case IT_SUB: for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i]; break;
    case IT_MUL: for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i]; break;
    case IT_DIV: for (int64_t i = 0; i < n; i++) y[i] = a[i] / b[i]; break;
    case IT_MAXIMUM:
        for (int64_t i = 0; i < n; i++)
            y[i] = (a[i] != a[i] || b[i] != b[i]) ? a[i] + b[i] : (a[i] > b[i] ? a[i] : b[i]);
        break;
    case IT_MINIMUM:
        for (int64_t i = 0; i < n; i++)
            y[i] = (a[i] != a[i] || b[i] != b[i]) ? a[i] + b[i] : (a[i] < b[i] ? a[i] : b[i]);
        break;
    case IT_POW: for (int64_t i = 0; i < n; i++) y[i] = powf(a[i], b[i]); break;
    }
}

static inline double binary_f64(it_binary_op op, double a, double b) {
    switch (op) {
    case IT_ADD: return a + b;
    case IT_SUB: return a - b;
    case IT_MUL: return a * b;
    case IT_DIV: return a / b;
    case IT_MAXIMUM: return (a != a || b != b) ? a + b : (a > b ? a : b);
    case IT_MINIMUM: return (a != a || b != b) ? a + b : (a < b ? a : b);
    case IT_POW: return pow(a, b);
    }
    return 0;
}

static inline int64_t binary_i64(it_binary_op op, int64_t a, int64_t b) {
    switch (op) {
    case IT_ADD: return a + b;
    case IT_SUB: return a - b;
    case IT_MUL: return a * b;
    case IT_MAXIMUM: return a > b ? a : b;
    case IT_MINIMUM: return a < b ? a : b;
    default: return 0;
    }
}

static inline int64_t load_int(it_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case IT_INT32: return ((const int32_t *)p)[i];
    case IT_INT64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}
static inline void store_int(it_dtype dt, void *p, int64_t i, int64_t v) {
    switch (dt) {
    case IT_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case IT_INT64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

/* A float row read with a stride (0 = broadcast) into a float32 buffer. */
static const float *gather_f32(it_dtype dt, const void *base, int64_t off, int64_t stride,
                               int64_t len, float *buf) {
    if (stride == 1) return it_row_load(dt, base, off, len, buf);
    for (int64_t i = 0; i < len; i++) {
        int64_t at = off + i * stride;
        buf[i] = dt == IT_FLOAT32 ? ((const float *)base)[at]
               : dt == IT_BFLOAT16 ? it_bf16_to_f32(((const uint16_t *)base)[at])
               : it_f16_to_f32(((const uint16_t *)base)[at]);
    }
    return buf;
}

it_status it_binary(it_device device, it_binary_op op, it_dtype dtype, void *out, const void *a,
                    const int64_t *a_strides, const void *b, const int64_t *b_strides,
                    const int64_t *shape, int32_t ndim) {
    IT_CHECK_DEVICE(device, "it_binary");
    IT_CHECK_ARG(op >= IT_ADD && op <= IT_POW, "it_binary: unknown op %d", (int)op);
    IT_CHECK_ARG(it_dtype_size(dtype) != 0, "it_binary: unknown dtype %d", (int)dtype);
    IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64 || (op != IT_DIV && op != IT_POW),
               IT_ERR_NOT_SUPPORTED, "it_binary: division and power of %s tensors are not "
               "supported; cast to a float dtype first", it_dtype_name(dtype));
    IT_REQUIRE(dtype != IT_BOOL || op == IT_MAXIMUM || op == IT_MINIMUM, IT_ERR_NOT_SUPPORTED,
               "it_binary: arithmetic on bool tensors is not supported; cast to an integer "
               "or float dtype first");
    IT_CHECK_ARG(ndim == 0 || (shape && a_strides && b_strides),
                 "it_binary: shape or strides are NULL");
    IT_CHECK_ARG(ndim >= 0 && ndim <= IT_MAX_DIMS, "it_binary: ndim %d not in [0, %d]",
                 (int)ndim, IT_MAX_DIMS);
    int64_t sh[IT_MAX_DIMS + 1], so[IT_MAX_DIMS + 1], sa[IT_MAX_DIMS + 1], sb[IT_MAX_DIMS + 1];
    int64_t numel = 1;
    if (ndim > 0) IT_TRY(it_check_product("it_binary", shape, ndim));
    for (int d = ndim - 1; d >= 0; d--) {
        sh[d] = shape[d], so[d] = numel, sa[d] = a_strides[d], sb[d] = b_strides[d];
        numel *= shape[d];
    }
    if (numel == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_binary");
    IT_CHECK_PTR(a, "it_binary");
    IT_CHECK_PTR(b, "it_binary");
    int64_t *strides[3] = {so, sa, sb};
    int nd = it_collapse_dims(ndim, sh, strides, 3);  /* a contiguous add is one dimension */
    IT_DISPATCH(binary, device, op, dtype, out, a, sa, b, sb, sh, nd);
    int64_t cols = sh[nd - 1], rows = numel / cols;
    int64_t ia = sa[nd - 1], ib = sb[nd - 1];
    int64_t nchunks_per_row = (cols + IT_CHUNK - 1) / IT_CHUNK;
    int64_t work = rows * nchunks_per_row;

    if (dtype == IT_FLOAT64) {
#pragma omp parallel for schedule(static) if (numel > 32768)
        for (int64_t r = 0; r < rows; r++) {
            int64_t oa = it_row_offset(r, sh, sa, nd), ob = it_row_offset(r, sh, sb, nd);
            for (int64_t c = 0; c < cols; c++)
                ((double *)out)[r * cols + c] = binary_f64(op, ((const double *)a)[oa + c * ia],
                                                           ((const double *)b)[ob + c * ib]);
        }
        return IT_OK;
    }
    if (!it_is_float(dtype)) {
#pragma omp parallel for schedule(static) if (numel > 32768)
        for (int64_t r = 0; r < rows; r++) {
            int64_t oa = it_row_offset(r, sh, sa, nd), ob = it_row_offset(r, sh, sb, nd);
            for (int64_t c = 0; c < cols; c++)
                store_int(dtype, out, r * cols + c,
                          binary_i64(op, load_int(dtype, a, oa + c * ia),
                                     load_int(dtype, b, ob + c * ib)));
        }
        return IT_OK;
    }
#pragma omp parallel if (numel > 32768)
    {
        float ab[IT_CHUNK], bb[IT_CHUNK], yb[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t w = 0; w < work; w++) {
            int64_t r = w / nchunks_per_row, c0 = (w % nchunks_per_row) * IT_CHUNK;
            int64_t len = cols - c0 < IT_CHUNK ? cols - c0 : IT_CHUNK;
            int64_t oa = it_row_offset(r, sh, sa, nd) + c0 * ia;
            int64_t ob = it_row_offset(r, sh, sb, nd) + c0 * ib;
            int64_t oy = r * cols + c0;
            const float *x = gather_f32(dtype, a, oa, ia, len, ab);
            const float *z = gather_f32(dtype, b, ob, ib, len, bb);
            float *y = it_row_dest(dtype, out, oy, yb);
            binary_f32(op, y, x, z, len);
            it_row_store(dtype, out, oy, y, len);
        }
    }
    return IT_OK;
}

/* ---- scalar --------------------------------------------------------------------------- */
IT_HOT static void scalar_f32(it_scalar_op op, float *y, const float *x, float s, int64_t n) {
    switch (op) {
    case IT_SCALAR_ADD: for (int64_t i = 0; i < n; i++) y[i] = x[i] + s; break;
    case IT_SCALAR_MUL: for (int64_t i = 0; i < n; i++) y[i] = x[i] * s; break;
    case IT_SCALAR_RSUB: for (int64_t i = 0; i < n; i++) y[i] = s - x[i]; break;
    case IT_SCALAR_RDIV: for (int64_t i = 0; i < n; i++) y[i] = s / x[i]; break;
    case IT_SCALAR_DIV: for (int64_t i = 0; i < n; i++) y[i] = x[i] / s; break;
    case IT_SCALAR_POW:
        if (s == 2.0f) for (int64_t i = 0; i < n; i++) y[i] = x[i] * x[i];
        else if (s == 0.5f) for (int64_t i = 0; i < n; i++) y[i] = sqrtf(x[i]);
        else for (int64_t i = 0; i < n; i++) y[i] = powf(x[i], s);
        break;
    case IT_SCALAR_MAX:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] != x[i] ? x[i] : (x[i] > s ? x[i] : s);
        break;
    case IT_SCALAR_MIN:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] != x[i] ? x[i] : (x[i] < s ? x[i] : s);
        break;
    }
}

it_status it_scalar(it_device device, it_scalar_op op, it_dtype dtype, void *out, const void *inp,
                    double scalar, int64_t n) {
    IT_CHECK_DEVICE(device, "it_scalar");
    IT_CHECK_ARG(op >= IT_SCALAR_ADD && op <= IT_SCALAR_DIV, "it_scalar: unknown op %d", (int)op);
    IT_CHECK_ARG(it_dtype_size(dtype) != 0, "it_scalar: unknown dtype %d", (int)dtype);
    IT_CHECK_PRODUCT("it_scalar", 8, n);
    if (n == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_scalar");
    IT_CHECK_PTR(inp, "it_scalar");
    IT_REQUIRE(dtype != IT_BOOL, IT_ERR_NOT_SUPPORTED,
               "it_scalar: arithmetic on bool tensors is not supported; cast first");
    IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64 ||
               (op != IT_SCALAR_RDIV && op != IT_SCALAR_POW && op != IT_SCALAR_DIV &&
                scalar == (double)(int64_t)scalar),
               IT_ERR_NOT_SUPPORTED,
               "it_scalar: %s tensors take integer add/mul/rsub/max/min only; cast to a "
               "float dtype first", it_dtype_name(dtype));
    IT_DISPATCH(scalar, device, op, dtype, out, inp, scalar, n);
    if (dtype == IT_FLOAT64) {
#pragma omp parallel for schedule(static) if (n > 32768)
        for (int64_t i = 0; i < n; i++) {
            double x = ((const double *)inp)[i], y;
            switch (op) {
            case IT_SCALAR_ADD: y = x + scalar; break;
            case IT_SCALAR_MUL: y = x * scalar; break;
            case IT_SCALAR_RSUB: y = scalar - x; break;
            case IT_SCALAR_RDIV: y = scalar / x; break;
            case IT_SCALAR_DIV: y = x / scalar; break;
            case IT_SCALAR_POW: y = pow(x, scalar); break;
            case IT_SCALAR_MAX: y = x != x ? x : (x > scalar ? x : scalar); break;
            default: y = x != x ? x : (x < scalar ? x : scalar); break;
            }
            ((double *)out)[i] = y;
        }
        return IT_OK;
    }
    if (!it_is_float(dtype)) {
        int64_t s = (int64_t)scalar;
#pragma omp parallel for schedule(static) if (n > 32768)
        for (int64_t i = 0; i < n; i++) {
            int64_t x = load_int(dtype, inp, i), y;
            switch (op) {
            case IT_SCALAR_ADD: y = x + s; break;
            case IT_SCALAR_MUL: y = x * s; break;
            case IT_SCALAR_RSUB: y = s - x; break;
            case IT_SCALAR_MAX: y = x > s ? x : s; break;
            default: y = x < s ? x : s; break;
            }
            store_int(dtype, out, i, y);
        }
        return IT_OK;
    }
    int64_t nchunks = (n + IT_CHUNK - 1) / IT_CHUNK;
#pragma omp parallel if (nchunks > 4)
    {
        float xb[IT_CHUNK], yb[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t off = c * IT_CHUNK, len = n - off < IT_CHUNK ? n - off : IT_CHUNK;
            const float *x = it_row_load(dtype, inp, off, len, xb);
            float *y = it_row_dest(dtype, out, off, yb);
            scalar_f32(op, y, x, (float)scalar, len);
            it_row_store(dtype, out, off, y, len);
        }
    }
    return IT_OK;
}

/* ---- SwiGLU --------------------------------------------------------------------------- */
IT_HOT static void swiglu_f32(float *y, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = a[i] * it_sigmoidf(a[i]) * b[i];
}

IT_HOT static void swiglu_backward_f32(float *da, float *db, const float *dy, const float *a,
                                       const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float s = it_sigmoidf(a[i]);
        float silu = a[i] * s;
        db[i] = dy[i] * silu;
        da[i] = dy[i] * b[i] * s * (1.0f + a[i] * (1.0f - s));
    }
}

it_status it_swiglu_forward(it_device device, it_dtype dtype, void *out, const void *a,
                            const void *b, int64_t n) {
    IT_CHECK_DEVICE(device, "it_swiglu_forward");
    IT_CHECK_FLOAT(dtype, "it_swiglu_forward");
    IT_CHECK_SIZE(n, "it_swiglu_forward");
    if (n == 0) return IT_OK;
    IT_CHECK_ARG(out && a && b, "it_swiglu_forward: NULL pointer");
    IT_DISPATCH(swiglu_forward, device, dtype, out, a, b, n);
    int64_t nchunks = (n + IT_CHUNK - 1) / IT_CHUNK;
#pragma omp parallel if (nchunks > 4)
    {
        float abuf[IT_CHUNK], bbuf[IT_CHUNK], ybuf[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t off = c * IT_CHUNK, len = n - off < IT_CHUNK ? n - off : IT_CHUNK;
            const float *x = it_row_load(dtype, a, off, len, abuf);
            const float *g = it_row_load(dtype, b, off, len, bbuf);
            float *y = it_row_dest(dtype, out, off, ybuf);
            swiglu_f32(y, x, g, len);
            it_row_store(dtype, out, off, y, len);
        }
    }
    return IT_OK;
}

it_status it_swiglu_backward(it_device device, it_dtype dtype, void *da, void *db,
                             const void *dout, const void *a, const void *b, int64_t n) {
    IT_CHECK_DEVICE(device, "it_swiglu_backward");
    IT_CHECK_FLOAT(dtype, "it_swiglu_backward");
    IT_CHECK_SIZE(n, "it_swiglu_backward");
    if (n == 0) return IT_OK;
    IT_CHECK_ARG(da && db && dout && a && b, "it_swiglu_backward: NULL pointer");
    IT_DISPATCH(swiglu_backward, device, dtype, da, db, dout, a, b, n);
    int64_t nchunks = (n + IT_CHUNK - 1) / IT_CHUNK;
#pragma omp parallel if (nchunks > 4)
    {
        float gb[IT_CHUNK], abuf[IT_CHUNK], bbuf[IT_CHUNK], dab[IT_CHUNK], dbb[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t off = c * IT_CHUNK, len = n - off < IT_CHUNK ? n - off : IT_CHUNK;
            const float *g = it_row_load(dtype, dout, off, len, gb);
            const float *x = it_row_load(dtype, a, off, len, abuf);
            const float *z = it_row_load(dtype, b, off, len, bbuf);
            float *dx = it_row_dest(dtype, da, off, dab);
            float *dz = it_row_dest(dtype, db, off, dbb);
            swiglu_backward_f32(dx, dz, g, x, z, len);
            it_row_store(dtype, da, off, dx, len);
            it_row_store(dtype, db, off, dz, len);
        }
    }
    return IT_OK;
}
