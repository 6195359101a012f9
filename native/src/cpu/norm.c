/* LayerNorm, RMSNorm and softmax over the last dimension of N rows of C.
 * Row statistics are computed per row (parallel over rows); weight/bias gradients are
 * column sums, computed in a second pass parallel over columns so that every column is
 * summed over rows in the same order whatever the thread count. */
#include "common.h"

/* ---- row kernels (float32) ------------------------------------------------------------ */
IT_HOT static void layernorm_row(float *y, float *mean_out, float *rstd_out, const float *x,
                                 const float *w, const float *b, int64_t C, float eps) {
    float m, v;
    it_vmean_var(x, C, &m, &v);
    float r = 1.0f / sqrtf(v + eps);
    if (w && b) for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * r * w[c] + b[c];
    else if (w) for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * r * w[c];
    else for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * r;
    *mean_out = m;
    *rstd_out = r;
}

IT_HOT static void layernorm_backward_row(float *dx, const float *dy, const float *x,
                                          const float *w, float m, float r, int64_t C) {
    /* dx = r * (g - mean(g) - xhat * mean(g * xhat)), g = w * dy, xhat = (x - m) * r; dx holds
     * g first (it may not alias dy or x). */
    if (w) for (int64_t c = 0; c < C; c++) dx[c] = w[c] * dy[c];
    else memcpy(dx, dy, (size_t)C * sizeof(float));
    float a = it_vsum(dx, C) / (float)C;
    float bsum = (it_vdot(dx, x, C) - m * a * (float)C) * r / (float)C;
    for (int64_t c = 0; c < C; c++) dx[c] = (dx[c] - a - (x[c] - m) * r * bsum) * r;
}

IT_HOT static void rmsnorm_row(float *y, float *rstd_out, const float *x, const float *w,
                               int64_t C, float eps) {
    float r = 1.0f / sqrtf(it_vdot(x, x, C) / (float)C + eps);
    if (w) for (int64_t c = 0; c < C; c++) y[c] = x[c] * r * w[c];
    else for (int64_t c = 0; c < C; c++) y[c] = x[c] * r;
    *rstd_out = r;
}

IT_HOT static void rmsnorm_backward_row(float *dx, const float *dy, const float *x,
                                        const float *w, float r, int64_t C) {
    /* dx = r * (g - xhat * mean(g * xhat)), g = w * dy; dx holds g first. */
    if (w) for (int64_t c = 0; c < C; c++) dx[c] = w[c] * dy[c];
    else memcpy(dx, dy, (size_t)C * sizeof(float));
    float dot = it_vdot(dx, x, C) * r / (float)C;
    for (int64_t c = 0; c < C; c++) dx[c] = r * (dx[c] - x[c] * r * dot);
}

/* e = exp(x - max(x)) into `e` (a cache-resident row, or y itself); returns 1 / sum(e). The
 * exponentials and the sum are separate loops: fused, the sum's accumulators and exp's
 * temporaries do not fit the vector registers together. */
IT_HOT static float softmax_exp_row(float *e, const float *x, int64_t C) {
    float m = it_vmax(x, C);
    for (int64_t c = 0; c < C; c++) e[c] = it_expf(x[c] - m);
    return 1.0f / it_vsum(e, C);
}

IT_HOT static void scale_row(float *y, float s, int64_t C) {
    for (int64_t c = 0; c < C; c++) y[c] *= s;
}

IT_HOT static void softmax_backward_row(float *dx, const float *dy, const float *y, int64_t C) {
    float dot = it_vdot(dy, y, C);
    for (int64_t c = 0; c < C; c++) dx[c] = y[c] * (dy[c] - dot);
}

/* Affine gradients dw[c] = sum_n dy[n,c] * xhat[n,c], db[c] = sum_n dy[n,c], accumulated by
 * the row pass into per-block partial sums: blocks of IT_NORM_BLOCK rows are fixed whatever the
 * thread count, and the partials are added in block order afterwards. */
#define IT_NORM_BLOCK 32

IT_HOT static void affine_grad_row(float *dw, float *db, const float *dy, const float *x,
                                   float m, float r, int64_t C) {
    if (db) for (int64_t c = 0; c < C; c++) db[c] += dy[c];
    for (int64_t c = 0; c < C; c++) dw[c] += dy[c] * (x[c] - m) * r;
}

IT_HOT static void add_partials(float *out, const float *partials, int64_t nblocks, int64_t C,
                                int64_t c0, int64_t len) {
    for (int64_t c = 0; c < len; c++) out[c] = 0.0f;
    for (int64_t b = 0; b < nblocks; b++)
        for (int64_t c = 0; c < len; c++) out[c] += partials[b * C + c0 + c];
}

/* Shared backward driver of LayerNorm (mean != NULL) and RMSNorm (mean == NULL). */
static it_status norm_backward(const char *fn, it_dtype dt, void *dinp, void *dweight,
                               void *dbias, const void *dout, const void *inp,
                               const void *weight, const float *mean, const float *rstd,
                               int64_t N, int64_t C) {
    int64_t nblocks = (N + IT_NORM_BLOCK - 1) / IT_NORM_BLOCK;
    float *pw = NULL, *pb = NULL;
    if (dweight) {
        pw = (float *)it_scratch_alloc((size_t)(nblocks * C * (dbias ? 2 : 1)) * sizeof(float));
        IT_REQUIRE(pw, IT_ERR_OUT_OF_MEMORY, "%s: out of memory for gradient partial sums", fn);
        if (dbias) pb = pw + nblocks * C;
    }
    int failed = 0;
#pragma omp parallel if (N * C > 16384)
    {
        float *scratch = (float *)it_scratch_alloc((size_t)C * 5 * sizeof(float));
        if (!scratch) failed = 1;
        float *gb = scratch, *xb = scratch + C, *db = scratch + 2 * C, *wb = scratch + 3 * C;
        const float *w = weight && scratch ? it_row_load(dt, weight, 0, C, wb) : NULL;
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < nblocks; blk++) {
            if (!scratch) continue;
            float *bw = pw ? pw + blk * C : NULL, *bb = pb ? pb + blk * C : NULL;
            if (bw) memset(bw, 0, (size_t)C * sizeof(float));
            if (bb) memset(bb, 0, (size_t)C * sizeof(float));
            int64_t end = (blk + 1) * IT_NORM_BLOCK < N ? (blk + 1) * IT_NORM_BLOCK : N;
            for (int64_t n = blk * IT_NORM_BLOCK; n < end; n++) {
                const float *g = it_row_load(dt, dout, n * C, C, gb);
                const float *x = it_row_load(dt, inp, n * C, C, xb);
                float m = mean ? mean[n] : 0.0f;
                if (dinp) {
                    float *d = it_row_dest(dt, dinp, n * C, db);
                    if (mean) layernorm_backward_row(d, g, x, w, m, rstd[n], C);
                    else rmsnorm_backward_row(d, g, x, w, rstd[n], C);
                    it_row_store(dt, dinp, n * C, d, C);
                }
                if (bw) affine_grad_row(bw, bb, g, x, m, rstd[n], C);
            }
        }
        if (pw) { /* column chunks: each column's partials added in block order */
            float *sum = scratch + 4 * C;
#pragma omp for schedule(static)
            for (int64_t c0 = 0; c0 < C; c0 += 256) {
                if (!scratch) continue;
                int64_t len = C - c0 < 256 ? C - c0 : 256;
                add_partials(sum, pw, nblocks, C, c0, len);
                if (dt == IT_FLOAT32) memcpy((float *)dweight + c0, sum, (size_t)len * 4);
                else it_row_store(dt, dweight, c0, sum, len);
                if (pb) {
                    add_partials(sum, pb, nblocks, C, c0, len);
                    if (dt == IT_FLOAT32) memcpy((float *)dbias + c0, sum, (size_t)len * 4);
                    else it_row_store(dt, dbias, c0, sum, len);
                }
            }
        }
        it_scratch_free(scratch);
    }
    it_scratch_free(pw);
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return IT_OK;
}

/* ---- entry points --------------------------------------------------------------------- */
#define CHECK_ROWS(fn)                                                                       \
    IT_CHECK_DEVICE(device, fn);                                                             \
    IT_CHECK_FLOAT(dtype, fn);                                                               \
    IT_CHECK_SIZE(rows, fn);                                                                 \
    IT_CHECK_ARG(cols > 0, "%s: the normalised dimension must be > 0, got %lld", fn,         \
                 (long long)cols);                                                           \
    IT_CHECK_PRODUCT(fn, 16, rows, cols);                                                   \
    IT_CHECK_PRODUCT(fn, 16, cols)

it_status it_layernorm_forward(it_device device, it_dtype dtype, void *out, float *mean,
                               float *rstd, const void *inp, const void *weight,
                               const void *bias, int64_t rows, int64_t cols, float eps) {
    CHECK_ROWS("it_layernorm_forward");
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(out && mean && rstd && inp, "it_layernorm_forward: NULL pointer");
    IT_CHECK_ARG(weight || !bias, "it_layernorm_forward: a bias needs a weight");
    IT_DISPATCH(layernorm_forward, device, dtype, out, mean, rstd, inp, weight, bias, rows, cols, eps);
    int64_t C = cols;
    int stream = dtype == IT_FLOAT32 && rows * cols * 4 >= IT_STREAM_MIN_BYTES && out != inp;
    int failed = 0;
#pragma omp parallel if (rows * cols > 16384)
    {
        int scratched = dtype != IT_FLOAT32 || stream;
        float *scratch = scratched ? (float *)it_scratch_alloc((size_t)C * 16) : NULL;
        if (scratched && !scratch) failed = 1;
        float *xb = scratch, *yb = scratch ? scratch + C : NULL;
        const float *w = NULL, *b = NULL;
        if (scratch || !scratched) {
            if (weight) w = it_row_load(dtype, weight, 0, C, scratch ? scratch + 2 * C : NULL);
            if (bias) b = it_row_load(dtype, bias, 0, C, scratch ? scratch + 3 * C : NULL);
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            if (scratched && !scratch) continue;
            const float *x = it_row_load(dtype, inp, n * C, C, xb);
            float *y = stream ? yb : it_row_dest(dtype, out, n * C, yb);
            layernorm_row(y, mean + n, rstd + n, x, w, b, C, eps);
            if (stream) it_store_scaled_stream((float *)out + n * C, y, 1.0f, C);
            else it_row_store(dtype, out, n * C, y, C);
        }
        if (stream) it_stream_fence();
        it_scratch_free(scratch);
    }
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_layernorm_forward: out of memory");
    return IT_OK;
}

it_status it_layernorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                                void *dbias, const void *dout, const void *inp,
                                const void *weight, const float *mean, const float *rstd,
                                int64_t rows, int64_t cols) {
    CHECK_ROWS("it_layernorm_backward");
    IT_CHECK_ARG(dout && inp && mean && rstd, "it_layernorm_backward: NULL pointer");
    IT_CHECK_NO_ALIAS(dinp, dout, "it_layernorm_backward");
    IT_CHECK_NO_ALIAS(dinp, inp, "it_layernorm_backward");
    IT_CHECK_ARG(dweight || !dbias, "it_layernorm_backward: dbias needs dweight (the forward "
                 "pass had a bias without a weight)");
    IT_DISPATCH(layernorm_backward, device, dtype, dinp, dweight, dbias, dout, inp, weight, mean,
                rstd, rows, cols);
    if (rows == 0) {
        if (dweight) IT_TRY(it_fill(device, dtype, dweight, 0.0, cols));
        if (dbias) IT_TRY(it_fill(device, dtype, dbias, 0.0, cols));
        return IT_OK;
    }
    return norm_backward("it_layernorm_backward", dtype, dinp, dweight, dbias, dout, inp, weight,
                         mean, rstd, rows, cols);
}

it_status it_rmsnorm_forward(it_device device, it_dtype dtype, void *out, float *rstd,
                             const void *inp, const void *weight, int64_t rows, int64_t cols,
                             float eps) {
    CHECK_ROWS("it_rmsnorm_forward");
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(out && rstd && inp, "it_rmsnorm_forward: NULL pointer");
    IT_DISPATCH(rmsnorm_forward, device, dtype, out, rstd, inp, weight, rows, cols, eps);
    int64_t C = cols;
    int failed = 0;
#pragma omp parallel if (rows * cols > 16384)
    {
        float *scratch = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)C * 12);
        int broken = dtype != IT_FLOAT32 && !scratch;
        if (broken) failed = 1;
        float *xb = scratch, *yb = scratch ? scratch + C : NULL;
        const float *w = weight && !broken ? it_row_load(dtype, weight, 0, C, scratch ? scratch + 2 * C : NULL) : NULL;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            if (broken) continue;
            const float *x = it_row_load(dtype, inp, n * C, C, xb);
            float *y = it_row_dest(dtype, out, n * C, yb);
            rmsnorm_row(y, rstd + n, x, w, C, eps);
            it_row_store(dtype, out, n * C, y, C);
        }
        it_scratch_free(scratch);
    }
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_rmsnorm_forward: out of memory");
    return IT_OK;
}

it_status it_rmsnorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                              const void *dout, const void *inp, const void *weight,
                              const float *rstd, int64_t rows, int64_t cols) {
    CHECK_ROWS("it_rmsnorm_backward");
    IT_CHECK_ARG(dout && inp && rstd, "it_rmsnorm_backward: NULL pointer");
    IT_DISPATCH(rmsnorm_backward, device, dtype, dinp, dweight, dout, inp, weight, rstd, rows, cols);
    if (rows == 0) return dweight ? it_fill(device, dtype, dweight, 0.0, cols) : IT_OK;
    return norm_backward("it_rmsnorm_backward", dtype, dinp, dweight, NULL, dout, inp, weight,
                         NULL, rstd, rows, cols);
}

it_status it_softmax_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                             int64_t rows, int64_t cols) {
    CHECK_ROWS("it_softmax_forward");
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(out && inp, "it_softmax_forward: NULL pointer");
    IT_DISPATCH(softmax_forward, device, dtype, out, inp, rows, cols);
    int64_t C = cols;
    /* A large float32 output is computed row by row in scratch and streamed out. */
    int stream = dtype == IT_FLOAT32 && rows * cols * 4 >= IT_STREAM_MIN_BYTES && out != inp;
    int failed = 0;
#pragma omp parallel if (rows * cols > 16384)
    {
        int scratched = dtype != IT_FLOAT32 || stream;
        float *scratch = scratched ? (float *)it_scratch_alloc((size_t)C * 8) : NULL;
        if (scratched && !scratch) failed = 1;
        float *xb = scratch, *yb = scratch ? scratch + C : NULL;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            if (scratched && !scratch) continue;
            const float *x = it_row_load(dtype, inp, n * C, C, xb);
            if (stream) {
                float inv = softmax_exp_row(yb, x, C);
                it_store_scaled_stream((float *)out + n * C, yb, inv, C);
                continue;
            }
            float *y = it_row_dest(dtype, out, n * C, yb);
            scale_row(y, softmax_exp_row(y, x, C), C);
            it_row_store(dtype, out, n * C, y, C);
        }
        if (stream) it_stream_fence();
        it_scratch_free(scratch);
    }
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_softmax_forward: out of memory");
    return IT_OK;
}

it_status it_softmax_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                              const void *out, int64_t rows, int64_t cols) {
    CHECK_ROWS("it_softmax_backward");
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(dinp && dout && out, "it_softmax_backward: NULL pointer");
    IT_DISPATCH(softmax_backward, device, dtype, dinp, dout, out, rows, cols);
    int64_t C = cols;
    int failed = 0;
#pragma omp parallel if (rows * cols > 16384)
    {
        float *scratch = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)C * 12);
        int broken = dtype != IT_FLOAT32 && !scratch;
        if (broken) failed = 1;
        float *gb = scratch, *yb = scratch ? scratch + C : NULL, *db = scratch ? scratch + 2 * C : NULL;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            if (broken) continue;
            const float *g = it_row_load(dtype, dout, n * C, C, gb);
            const float *y = it_row_load(dtype, out, n * C, C, yb);
            float *d = it_row_dest(dtype, dinp, n * C, db);
            softmax_backward_row(d, g, y, C);
            it_row_store(dtype, dinp, n * C, d, C);
        }
        it_scratch_free(scratch);
    }
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_softmax_backward: out of memory");
    return IT_OK;
}
