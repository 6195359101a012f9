/* LayerNorm, RMSNorm and softmax over the last dimension of N rows of C.
 * Row statistics are computed per row (parallel over rows); weight/bias gradients are
 * column sums, computed in a second pass parallel over columns so that every column is
 * summed over rows in the same order whatever the thread count. */
#include "common.h"

/* ---- row kernels (float32) ------------------------------------------------------------ */
IT_HOT static void layernorm_row(float *y, float *mean_out, float *rstd_out, const float *x,
                                 const float *w, const float *b, int64_t C, float eps) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++) s += x[c];
    float m = s / (float)C, v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    float r = 1.0f / sqrtf(v / (float)C + eps);
    if (w && b) for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * r * w[c] + b[c];
    else if (w) for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * r * w[c];
    else for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * r;
    *mean_out = m;
    *rstd_out = r;
}

IT_HOT static void layernorm_backward_row(float *dx, const float *dy, const float *x,
                                          const float *w, float m, float r, int64_t C) {
    float a = 0.0f, bsum = 0.0f;
#pragma omp simd reduction(+ : a, bsum)
    for (int64_t c = 0; c < C; c++) {
        float g = w ? w[c] * dy[c] : dy[c];
        a += g;
        bsum += g * (x[c] - m) * r;
    }
    a /= (float)C;
    bsum /= (float)C;
    for (int64_t c = 0; c < C; c++) {
        float g = w ? w[c] * dy[c] : dy[c];
        dx[c] = (g - a - (x[c] - m) * r * bsum) * r;
    }
}

IT_HOT static void rmsnorm_row(float *y, float *rstd_out, const float *x, const float *w,
                               int64_t C, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; c++) ss += x[c] * x[c];
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (w) for (int64_t c = 0; c < C; c++) y[c] = x[c] * r * w[c];
    else for (int64_t c = 0; c < C; c++) y[c] = x[c] * r;
    *rstd_out = r;
}

IT_HOT static void rmsnorm_backward_row(float *dx, const float *dy, const float *x,
                                        const float *w, float r, int64_t C) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < C; c++) dot += (w ? w[c] * dy[c] : dy[c]) * x[c] * r;
    dot /= (float)C;
    for (int64_t c = 0; c < C; c++) dx[c] = r * ((w ? w[c] * dy[c] : dy[c]) - x[c] * r * dot);
}

IT_HOT static void softmax_row(float *y, const float *x, int64_t C) {
    float m = -INFINITY;
    for (int64_t c = 0; c < C; c++) m = x[c] > m ? x[c] : m;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++) {
        y[c] = it_expf(x[c] - m);
        s += y[c];
    }
    float inv = 1.0f / s;
    for (int64_t c = 0; c < C; c++) y[c] *= inv;
}

IT_HOT static void softmax_backward_row(float *dx, const float *dy, const float *y, int64_t C) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < C; c++) dot += dy[c] * y[c];
    for (int64_t c = 0; c < C; c++) dx[c] = y[c] * (dy[c] - dot);
}

/* Column sums for the affine gradients: dw[c] = sum_n dy[n,c] * xhat[n,c], db[c] = sum_n dy.
 * xhat = (x - mean) * rstd, or x * rstd for RMSNorm (mean == NULL). */
IT_HOT static void affine_grad_cols(float *dw, float *db, const float *dy, const float *x,
                                    float m, float r, int64_t len) {
    if (db) for (int64_t c = 0; c < len; c++) db[c] += dy[c];
    for (int64_t c = 0; c < len; c++) dw[c] += dy[c] * (x[c] - m) * r;
}

static it_status affine_grads(it_dtype dt, void *dweight, void *dbias, const void *dout,
                              const void *inp, const float *mean, const float *rstd, int64_t N,
                              int64_t C) {
    int64_t nchunks = (C + 255) / 256;
#pragma omp parallel
    {
        float dw[256], db[256], gb[256], xb[256];
#pragma omp for schedule(static)
        for (int64_t k = 0; k < nchunks; k++) {
            int64_t c0 = k * 256, len = C - c0 < 256 ? C - c0 : 256;
            memset(dw, 0, sizeof dw);
            memset(db, 0, sizeof db);
            for (int64_t n = 0; n < N; n++) {
                const float *g = it_row_load(dt, dout, n * C + c0, len, gb);
                const float *x = it_row_load(dt, inp, n * C + c0, len, xb);
                affine_grad_cols(dw, dbias ? db : NULL, g, x, mean ? mean[n] : 0.0f, rstd[n], len);
            }
            if (dt == IT_FLOAT32) {
                memcpy((float *)dweight + c0, dw, (size_t)len * 4);
                if (dbias) memcpy((float *)dbias + c0, db, (size_t)len * 4);
            } else {
                it_row_store(dt, dweight, c0, dw, len);
                if (dbias) it_row_store(dt, dbias, c0, db, len);
            }
        }
    }
    return IT_OK;
}

/* ---- entry points --------------------------------------------------------------------- */
#define CHECK_ROWS(fn)                                                                       \
    IT_ON_CPU(device, fn);                                                                   \
    IT_CHECK_FLOAT(dtype, fn);                                                               \
    IT_CHECK_SIZE(rows, fn);                                                                 \
    IT_CHECK_ARG(cols > 0, "%s: the normalised dimension must be > 0, got %lld", fn,         \
                 (long long)cols)

it_status it_layernorm_forward(it_device device, it_dtype dtype, void *out, float *mean,
                               float *rstd, const void *inp, const void *weight,
                               const void *bias, int64_t rows, int64_t cols, float eps) {
    CHECK_ROWS("it_layernorm_forward");
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(out && mean && rstd && inp, "it_layernorm_forward: NULL pointer");
    IT_CHECK_ARG(weight || !bias, "it_layernorm_forward: a bias needs a weight");
    int64_t C = cols;
#pragma omp parallel if (rows * cols > 16384)
    {
        float *scratch = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)C * 16);
        float *xb = scratch, *yb = scratch ? scratch + C : NULL;
        const float *w = NULL, *b = NULL;
        if (weight) w = it_row_load(dtype, weight, 0, C, scratch ? scratch + 2 * C : NULL);
        if (bias) b = it_row_load(dtype, bias, 0, C, scratch ? scratch + 3 * C : NULL);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            const float *x = it_row_load(dtype, inp, n * C, C, xb);
            float *y = it_row_dest(dtype, out, n * C, yb);
            layernorm_row(y, mean + n, rstd + n, x, w, b, C, eps);
            it_row_store(dtype, out, n * C, y, C);
        }
        it_scratch_free(scratch);
    }
    return IT_OK;
}

it_status it_layernorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                                void *dbias, const void *dout, const void *inp,
                                const void *weight, const float *mean, const float *rstd,
                                int64_t rows, int64_t cols) {
    CHECK_ROWS("it_layernorm_backward");
    IT_CHECK_ARG(dout && inp && mean && rstd, "it_layernorm_backward: NULL pointer");
    int64_t C = cols;
    if (dinp && rows > 0) {
#pragma omp parallel if (rows * cols > 16384)
        {
            float *scratch = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)C * 16);
            float *gb = scratch, *xb = scratch ? scratch + C : NULL, *db = scratch ? scratch + 2 * C : NULL;
            const float *w = weight ? it_row_load(dtype, weight, 0, C, scratch ? scratch + 3 * C : NULL) : NULL;
#pragma omp for schedule(static)
            for (int64_t n = 0; n < rows; n++) {
                const float *g = it_row_load(dtype, dout, n * C, C, gb);
                const float *x = it_row_load(dtype, inp, n * C, C, xb);
                float *d = it_row_dest(dtype, dinp, n * C, db);
                layernorm_backward_row(d, g, x, w, mean[n], rstd[n], C);
                it_row_store(dtype, dinp, n * C, d, C);
            }
            it_scratch_free(scratch);
        }
    }
    if (dweight) return affine_grads(dtype, dweight, dbias, dout, inp, mean, rstd, rows, C);
    if (dbias) { /* bias without weight cannot happen in forward; keep it well defined */
        IT_TRY(it_reduce(device, IT_SUM, dtype, dbias, dout, 1, rows, C));
    }
    return IT_OK;
}

it_status it_rmsnorm_forward(it_device device, it_dtype dtype, void *out, float *rstd,
                             const void *inp, const void *weight, int64_t rows, int64_t cols,
                             float eps) {
    CHECK_ROWS("it_rmsnorm_forward");
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(out && rstd && inp, "it_rmsnorm_forward: NULL pointer");
    int64_t C = cols;
#pragma omp parallel if (rows * cols > 16384)
    {
        float *scratch = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)C * 12);
        float *xb = scratch, *yb = scratch ? scratch + C : NULL;
        const float *w = weight ? it_row_load(dtype, weight, 0, C, scratch ? scratch + 2 * C : NULL) : NULL;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            const float *x = it_row_load(dtype, inp, n * C, C, xb);
            float *y = it_row_dest(dtype, out, n * C, yb);
            rmsnorm_row(y, rstd + n, x, w, C, eps);
            it_row_store(dtype, out, n * C, y, C);
        }
        it_scratch_free(scratch);
    }
    return IT_OK;
}

it_status it_rmsnorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                              const void *dout, const void *inp, const void *weight,
                              const float *rstd, int64_t rows, int64_t cols) {
    CHECK_ROWS("it_rmsnorm_backward");
    IT_CHECK_ARG(dout && inp && rstd, "it_rmsnorm_backward: NULL pointer");
    int64_t C = cols;
    if (dinp && rows > 0) {
#pragma omp parallel if (rows * cols > 16384)
        {
            float *scratch = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)C * 16);
            float *gb = scratch, *xb = scratch ? scratch + C : NULL, *db = scratch ? scratch + 2 * C : NULL;
            const float *w = weight ? it_row_load(dtype, weight, 0, C, scratch ? scratch + 3 * C : NULL) : NULL;
#pragma omp for schedule(static)
            for (int64_t n = 0; n < rows; n++) {
                const float *g = it_row_load(dtype, dout, n * C, C, gb);
                const float *x = it_row_load(dtype, inp, n * C, C, xb);
                float *d = it_row_dest(dtype, dinp, n * C, db);
                rmsnorm_backward_row(d, g, x, w, rstd[n], C);
                it_row_store(dtype, dinp, n * C, d, C);
            }
            it_scratch_free(scratch);
        }
    }
    if (dweight) return affine_grads(dtype, dweight, NULL, dout, inp, NULL, rstd, rows, C);
    return IT_OK;
}

it_status it_softmax_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                             int64_t rows, int64_t cols) {
    CHECK_ROWS("it_softmax_forward");
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(out && inp, "it_softmax_forward: NULL pointer");
    int64_t C = cols;
#pragma omp parallel if (rows * cols > 16384)
    {
        float *scratch = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)C * 8);
        float *xb = scratch, *yb = scratch ? scratch + C : NULL;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            const float *x = it_row_load(dtype, inp, n * C, C, xb);
            float *y = it_row_dest(dtype, out, n * C, yb);
            softmax_row(y, x, C);
            it_row_store(dtype, out, n * C, y, C);
        }
        it_scratch_free(scratch);
    }
    return IT_OK;
}

it_status it_softmax_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                              const void *out, int64_t rows, int64_t cols) {
    CHECK_ROWS("it_softmax_backward");
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(dinp && dout && out, "it_softmax_backward: NULL pointer");
    int64_t C = cols;
#pragma omp parallel if (rows * cols > 16384)
    {
        float *scratch = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)C * 12);
        float *gb = scratch, *yb = scratch ? scratch + C : NULL, *db = scratch ? scratch + 2 * C : NULL;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            const float *g = it_row_load(dtype, dout, n * C, C, gb);
            const float *y = it_row_load(dtype, out, n * C, C, yb);
            float *d = it_row_dest(dtype, dinp, n * C, db);
            softmax_backward_row(d, g, y, C);
            it_row_store(dtype, dinp, n * C, d, C);
        }
        it_scratch_free(scratch);
    }
    return IT_OK;
}
