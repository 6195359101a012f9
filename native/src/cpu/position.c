/* Rotary position embedding and token embedding lookup. */
#include "common.h"

/* ---- rotary embedding ----------------------------------------------------------------- */
/* Rotates interleaved pairs of one [D] head vector by +angle (sign 1) or -angle (sign -1). */
IT_HOT static void rope_row(float *y, const float *x, const float *cs, const float *sn,
                            int64_t half, float sign) {
    for (int64_t i = 0; i < half; i++) {
        float x0 = x[2 * i], x1 = x[2 * i + 1], c = cs[i], s = sign * sn[i];
        y[2 * i] = x0 * c - x1 * s;
        y[2 * i + 1] = x0 * s + x1 * c;
    }
}

static it_status check_rope(const char *fn, it_device device, it_dtype dtype, void *out,
                            const void *inp, const float *cos, const float *sin, int64_t B,
                            int64_t T, int64_t H, int64_t D) {
    IT_CHECK_DEVICE(device, fn);
    IT_CHECK_FLOAT(dtype, fn);
    IT_CHECK_SIZE(B, fn);
    IT_CHECK_SIZE(T, fn);
    IT_CHECK_SIZE(H, fn);
    IT_CHECK_ARG(D > 0 && D % 2 == 0, "%s: head_dim must be even and > 0, got %lld", fn,
                 (long long)D);
    IT_CHECK_PRODUCT(fn, 8, B, T, H, D);
    IT_CHECK_PRODUCT(fn, 8, T, D);  /* the cos/sin tables */
    IT_CHECK_ARG(B * T * H == 0 || (out && inp && cos && sin), "%s: NULL pointer", fn);
    return IT_OK;
}

static it_status rope(const char *fn, it_dtype dtype, void *out, const void *inp,
                      const float *cos, const float *sin, int64_t B, int64_t T, int64_t H,
                      int64_t D, float sign) {
    if (B * T * H == 0) return IT_OK;
    int64_t rows = B * T * H, half = D / 2;
    int failed = 0;
#pragma omp parallel if (rows * D > 16384)
    {
        float xb[1024], yb[1024];
        float *xs = D > 1024 ? (float *)it_scratch_alloc((size_t)D * 8) : xb;
        int broken = !xs;
        if (broken) failed = 1;
        float *ys = D > 1024 ? (xs ? xs + D : NULL) : yb;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (broken) continue;
            int64_t t = (r / H) % T;
            const float *x = it_row_load(dtype, inp, r * D, D, xs);
            float *y = it_row_dest(dtype, out, r * D, ys);
            if (dtype == IT_FLOAT32 && x == y) { /* in place: rotate a copy */
                memcpy(xs, x, (size_t)D * 4);
                x = xs;
            }
            rope_row(y, x, cos + t * half, sin + t * half, half, sign);
            it_row_store(dtype, out, r * D, y, D);
        }
        if (D > 1024) it_scratch_free(xs);
    }
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return IT_OK;
}

it_status it_rope_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                          const float *cos, const float *sin, int64_t batch, int64_t seq,
                          int64_t heads, int64_t head_dim) {
    IT_TRY(check_rope("it_rope_forward", device, dtype, out, inp, cos, sin, batch, seq, heads,
                      head_dim));
    IT_DISPATCH(rope_forward, device, dtype, out, inp, cos, sin, batch, seq, heads, head_dim);
    return rope("it_rope_forward", dtype, out, inp, cos, sin, batch, seq, heads, head_dim, 1.0f);
}

it_status it_rope_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                           const float *cos, const float *sin, int64_t batch, int64_t seq,
                           int64_t heads, int64_t head_dim) {
    IT_TRY(check_rope("it_rope_backward", device, dtype, dinp, dout, cos, sin, batch, seq, heads,
                      head_dim));
    IT_DISPATCH(rope_backward, device, dtype, dinp, dout, cos, sin, batch, seq, heads, head_dim);
    return rope("it_rope_backward", dtype, dinp, dout, cos, sin, batch, seq, heads, head_dim,
                -1.0f);
}

/* ---- embedding ------------------------------------------------------------------------ */
static inline int64_t load_index(it_dtype dt, const void *p, int64_t i) {
    return dt == IT_INT64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

static it_status check_indices(const char *fn, it_device device, it_dtype index_dtype,
                               const void *indices, int64_t n, int64_t num_embeddings) {
    IT_CHECK_ARG(index_dtype == IT_INT32 || index_dtype == IT_INT64,
                 "%s: indices must be int32 or int64, got %s", fn, it_dtype_name(index_dtype));
    if (device.type != IT_CPU) return IT_OK;  /* device memory: the CUDA kernel checks them */
    for (int64_t i = 0; i < n; i++) {
        int64_t ix = load_index(index_dtype, indices, i);
        IT_REQUIRE(ix >= 0 && ix < num_embeddings, IT_ERR_INDEX_OUT_OF_RANGE,
                   "embedding: index %lld at position %lld is out of range for %lld embeddings",
                   (long long)ix, (long long)i, (long long)num_embeddings);
    }
    return IT_OK;
}

it_status it_embedding_forward(it_device device, it_dtype dtype, void *out, const void *indices,
                               it_dtype index_dtype, const void *weight, int64_t n,
                               int64_t num_embeddings, int64_t cols) {
    IT_CHECK_DEVICE(device, "it_embedding_forward");
    IT_CHECK_FLOAT(dtype, "it_embedding_forward");
    IT_CHECK_SIZE(n, "it_embedding_forward");
    IT_CHECK_SIZE(cols, "it_embedding_forward");
    IT_CHECK_SIZE(num_embeddings, "it_embedding_forward");
    IT_CHECK_PRODUCT("it_embedding_forward", 8, n, cols);
    IT_CHECK_PRODUCT("it_embedding_forward", 8, num_embeddings, cols);
    if (n * cols == 0) return IT_OK;
    IT_CHECK_ARG(out && indices && weight, "it_embedding_forward: NULL pointer");
    IT_TRY(check_indices("it_embedding_forward", device, index_dtype, indices, n, num_embeddings));
    IT_DISPATCH(embedding_forward, device, dtype, out, indices, index_dtype, weight, n,
                num_embeddings, cols);
    size_t row_bytes = (size_t)cols * it_dtype_size(dtype);
#pragma omp parallel for schedule(static) if (n * cols > 32768)
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)out + i * row_bytes,
               (const char *)weight + load_index(index_dtype, indices, i) * row_bytes, row_bytes);
    return IT_OK;
}

IT_HOT static void add_row(float *acc, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

it_status it_embedding_backward(it_device device, it_dtype dtype, void *dweight,
                                const void *dout, const void *indices, it_dtype index_dtype,
                                int64_t n, int64_t num_embeddings, int64_t cols) {
    IT_CHECK_DEVICE(device, "it_embedding_backward");
    IT_CHECK_FLOAT(dtype, "it_embedding_backward");
    IT_CHECK_SIZE(n, "it_embedding_backward");
    IT_CHECK_SIZE(cols, "it_embedding_backward");
    IT_CHECK_SIZE(num_embeddings, "it_embedding_backward");
    IT_CHECK_PRODUCT("it_embedding_backward", 8, n, cols);
    IT_CHECK_PRODUCT("it_embedding_backward", 8, num_embeddings, cols);
    if (n * cols == 0) return IT_OK;
    IT_CHECK_ARG(dweight && indices && dout, "it_embedding_backward: NULL pointer");
    IT_TRY(check_indices("it_embedding_backward", device, index_dtype, indices, n, num_embeddings));
    IT_DISPATCH(embedding_backward, device, dtype, dweight, dout, indices, index_dtype, n,
                num_embeddings, cols);
    /* Threads own column ranges, so repeated tokens never race and every row's sum is
     * accumulated in token order. */
    const int64_t CB = 256;
    int64_t nchunks = (cols + CB - 1) / CB;
#pragma omp parallel if (n * cols > 32768)
    {
        float gb[256], wb[256];
#pragma omp for schedule(static)
        for (int64_t k = 0; k < nchunks; k++) {
            int64_t c0 = k * CB, len = cols - c0 < CB ? cols - c0 : CB;
            for (int64_t i = 0; i < n; i++) {
                int64_t row = load_index(index_dtype, indices, i);
                const float *g = it_row_load(dtype, dout, i * cols + c0, len, gb);
                float *w = dtype == IT_FLOAT32 ? (float *)dweight + row * cols + c0
                                               : (it_convert_to_f32(dtype, (uint16_t *)dweight + row * cols + c0, wb, len), wb);
                add_row(w, g, len);
                it_row_store(dtype, dweight, row * cols + c0, w, len);
            }
        }
    }
    return IT_OK;
}
