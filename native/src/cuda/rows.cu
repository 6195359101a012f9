// Kernels over rows: reductions, LayerNorm, RMSNorm, softmax and the fused softmax +
// cross-entropy. A row is handled by one block (sums in float32 through warp shuffles); the
// weight gradients of the norms are column sums, one thread per column, in row order, so
// results do not depend on how the rows were scheduled.
#include "common.cuh"

namespace {

template <typename C> __device__ __forceinline__ C combine(int op, C a, C b) {
    switch (op) {
    case IT_MAX: return a != a ? a : (b != b ? b : (a > b ? a : b));  // NaN wins
    case IT_MIN: return a != a ? a : (b != b ? b : (a < b ? a : b));
    default: return a + b;  // IT_SUM, IT_MEAN
    }
}

// [outer, n, inner] -> [outer, inner]: a thread per output, in order along n
template <typename T>
__global__ void reduce_kernel(int op, T *out, const T *inp, int64_t outer, int64_t n, int64_t inner) {
    using C = typename Acc<T>::type;
    GRID_STRIDE(w, outer * inner) {
        int64_t o = w / inner, i = w % inner;
        const T *x = inp + o * n * inner + i;
        C acc = load_acc(x, 0);
        for (int64_t j = 1; j < n; j++) acc = combine(op, acc, load_acc(x, j * inner));
        if (op == IT_MEAN) acc /= (C)n;
        store_acc(out, w, acc);
    }
}

template <typename T>
__global__ void arg_kernel(int is_max, int64_t *out, const T *inp, int64_t outer, int64_t n, int64_t inner) {
    using C = typename Acc<T>::type;
    GRID_STRIDE(w, outer * inner) {
        int64_t o = w / inner, i = w % inner, best = 0;
        const T *x = inp + o * n * inner + i;
        C bv = load_acc(x, 0);
        for (int64_t j = 1; j < n && bv == bv; j++) {  // the first NaN wins
            C v = load_acc(x, j * inner);
            if (v != v || (is_max ? v > bv : v < bv)) { bv = v; best = j; }
        }
        out[w] = best;
    }
}

// ---- LayerNorm / RMSNorm ------------------------------------------------------------------------
template <typename T>
__global__ void layernorm_fwd(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                              int64_t C, float eps) {
    const T *x = inp + blockIdx.x * C;
    float s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += to_f(x[c]);
    float m = block_sum(s) / C;
    float v = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float d = to_f(x[c]) - m;
        v += d * d;
    }
    float r = rsqrtf(block_sum(v) / C + eps);
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = m;
        rstd[blockIdx.x] = r;
    }
    T *y = out + blockIdx.x * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float h = (to_f(x[c]) - m) * r;
        if (w) h = h * to_f(w[c]) + (b ? to_f(b[c]) : 0.0f);
        y[c] = from_f<T>(h);
    }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight (rms: no mean(g) term)
template <typename T>
__global__ void norm_bwd_rows(T *dinp, const T *dout, const T *inp, const T *w, const float *mean,
                              const float *rstd, int64_t C, int rms) {
    int64_t row = blockIdx.x;
    const T *x = inp + row * C, *dy = dout + row * C;
    float m = rms ? 0.0f : mean[row], r = rstd[row];
    float sg = 0, sgx = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float g = to_f(dy[c]) * (w ? to_f(w[c]) : 1.0f);
        sg += g;
        sgx += g * (to_f(x[c]) - m) * r;
    }
    float mg = rms ? 0.0f : block_sum(sg) / C;
    float mgx = block_sum(sgx) / C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
        float g = to_f(dy[c]) * (w ? to_f(w[c]) : 1.0f);
        float xh = (to_f(x[c]) - m) * r;
        dinp[row * C + c] = from_f<T>(r * (g - mg - xh * mgx));
    }
}

// dweight[c] = sum over rows of dout * xhat, dbias[c] = sum of dout (overwritten)
template <typename T>
__global__ void norm_bwd_cols(T *dw, T *db, const T *dout, const T *inp, const float *mean,
                              const float *rstd, int64_t rows, int64_t C, int rms) {
    GRID_STRIDE(c, C) {
        float sw = 0, sb = 0;
        for (int64_t n = 0; n < rows; n++) {
            float dy = to_f(dout[n * C + c]);
            sw += dy * (to_f(inp[n * C + c]) - (rms ? 0.0f : mean[n])) * rstd[n];
            sb += dy;
        }
        dw[c] = from_f<T>(sw);
        if (db) db[c] = from_f<T>(sb);
    }
}

template <typename T>
__global__ void rmsnorm_fwd(T *out, float *rstd, const T *inp, const T *w, int64_t C, float eps) {
    const T *x = inp + blockIdx.x * C;
    float s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += to_f(x[c]) * to_f(x[c]);
    float r = rsqrtf(block_sum(s) / C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    T *y = out + blockIdx.x * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        y[c] = from_f<T>(to_f(x[c]) * r * (w ? to_f(w[c]) : 1.0f));
}

// ---- softmax and cross-entropy --------------------------------------------------------------------
template <typename T> __device__ float row_max(const T *x, int64_t C) {
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, to_f(x[c]));
    return block_max(m);
}

template <typename T> __global__ void softmax_fwd(T *out, const T *inp, int64_t C) {
    const T *x = inp + blockIdx.x * C;
    T *y = out + blockIdx.x * C;
    float m = row_max(x, C), s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += expf(to_f(x[c]) - m);
    float inv = 1.0f / block_sum(s);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) y[c] = from_f<T>(expf(to_f(x[c]) - m) * inv);
}

template <typename T> __global__ void softmax_bwd(T *dinp, const T *dout, const T *out, int64_t C) {
    int64_t base = blockIdx.x * C;
    float s = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += to_f(dout[base + c]) * to_f(out[base + c]);
    s = block_sum(s);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
        dinp[base + c] = from_f<T>(to_f(out[base + c]) * (to_f(dout[base + c]) - s));
}

__device__ __forceinline__ int64_t target_at(const void *targets, int is64, int64_t n) {
    return is64 ? ((const int64_t *)targets)[n] : ((const int32_t *)targets)[n];
}

// A target outside [0, vocab) that is not ignore_index gets a NaN loss and raises the device's
// index flag, reported at the host's next synchronisation (reading the loss, say).
template <typename T>
__global__ void ce_fwd(float *losses, float *lse, const T *logits, const void *targets, int is64,
                       int64_t V, int64_t Vp, int64_t ignore, int *bad) {
    int64_t n = blockIdx.x;
    const T *x = logits + n * Vp;
    float m = row_max(x, V), s = 0;
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) s += expf(to_f(x[c]) - m);
    float l = m + logf(block_sum(s));
    if (threadIdx.x == 0) {
        lse[n] = l;
        int64_t t = target_at(targets, is64, n);
        bool out_of_range = t != ignore && (t < 0 || t >= V);
        if (out_of_range) *bad = 1;
        losses[n] = t == ignore ? 0.0f : (out_of_range ? NAN : l - to_f(x[t]));
    }
}

// dlogits = (softmax - onehot(target)) * dloss, zero on padded columns; may alias logits
template <typename T>
__global__ void ce_bwd(T *dlogits, const T *logits, const float *lse, const void *targets, int is64,
                       const float *dlosses, int64_t V, int64_t Vp, int64_t ignore) {
    int64_t n = blockIdx.x;
    int64_t t = target_at(targets, is64, n);
    bool skip = t == ignore || t < 0 || t >= V;
    float l = lse[n], g = dlosses[n];
    for (int64_t c = threadIdx.x; c < Vp; c += blockDim.x) {
        float d = 0.0f;
        if (!skip && c < V) d = (expf(to_f(logits[n * Vp + c]) - l) - (c == t ? 1.0f : 0.0f)) * g;
        dlogits[n * Vp + c] = from_f<T>(d);
    }
}

// Rows as blocks: the grid's x dimension holds up to 2^31 - 1 blocks.
unsigned int row_blocks(int64_t rows) { return (unsigned int)rows; }
it_status check_rows(int64_t rows, const char *fn) {
    if (rows > 2147483647LL)
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "%lld rows exceed one launch's 2^31 - 1 blocks", (long long)rows);
    return IT_OK;
}

}  // namespace

extern "C" {

it_status it_cuda_reduce(it_device device, it_reduce_op op, it_dtype dtype, void *out,
                         const void *inp, int64_t outer, int64_t n, int64_t inner) {
    if (outer * inner == 0) return IT_OK;
    if (n == 0) return it_cuda_error(IT_ERR_INVALID_ARGUMENT, "the reduced dimension is empty");
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    FLOAT_OR_DOUBLE(dtype, "it_reduce",
                    reduce_kernel<T><<<it_blocks(outer * inner), IT_THREADS, 0, s>>>(
                        (int)op, (T *)out, (const T *)inp, outer, n, inner));
    CU_LAUNCHED();
    return IT_OK;
}

static it_status arg_extreme(it_device device, int is_max, it_dtype dtype, int64_t *out,
                             const void *inp, int64_t outer, int64_t n, int64_t inner) {
    if (outer * inner == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    FLOAT_OR_DOUBLE(dtype, is_max ? "it_argmax" : "it_argmin",
                    arg_kernel<T><<<it_blocks(outer * inner), IT_THREADS, 0, s>>>(
                        is_max, out, (const T *)inp, outer, n, inner));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_argmax(it_device device, it_dtype dtype, int64_t *out, const void *inp,
                         int64_t outer, int64_t n, int64_t inner) {
    return arg_extreme(device, 1, dtype, out, inp, outer, n, inner);
}

it_status it_cuda_argmin(it_device device, it_dtype dtype, int64_t *out, const void *inp,
                         int64_t outer, int64_t n, int64_t inner) {
    return arg_extreme(device, 0, dtype, out, inp, outer, n, inner);
}

it_status it_cuda_layernorm_forward(it_device device, it_dtype dtype, void *out, float *mean,
                                    float *rstd, const void *inp, const void *weight,
                                    const void *bias, int64_t rows, int64_t cols, float eps) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(check_rows(rows, "it_layernorm_forward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    IT_FLOAT_SWITCH(dtype, "it_layernorm_forward",
                    layernorm_fwd<T><<<row_blocks(rows), IT_THREADS, 0, s>>>(
                        (T *)out, mean, rstd, (const T *)inp, (const T *)weight, (const T *)bias, cols, eps));
    CU_LAUNCHED();
    return IT_OK;
}

static it_status norm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight, void *dbias,
                               const void *dout, const void *inp, const void *weight, const float *mean,
                               const float *rstd, int64_t rows, int64_t cols, int rms, const char *fn) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    if (rows == 0) {  // no rows: zero gradients for the parameters
        if (dweight) CU_TRY(cudaMemsetAsync(dweight, 0, (size_t)cols * dtype_bytes(dtype), s));
        if (dbias) CU_TRY(cudaMemsetAsync(dbias, 0, (size_t)cols * dtype_bytes(dtype), s));
        return IT_OK;
    }
    IT_CU_TRY(check_rows(rows, fn));
    IT_FLOAT_SWITCH(dtype, fn, {
        if (dinp)
            norm_bwd_rows<T><<<row_blocks(rows), IT_THREADS, 0, s>>>(
                (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd, cols, rms);
        if (dweight)
            norm_bwd_cols<T><<<it_blocks(cols), IT_THREADS, 0, s>>>(
                (T *)dweight, (T *)dbias, (const T *)dout, (const T *)inp, mean, rstd, rows, cols, rms);
    });
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_layernorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                                     void *dbias, const void *dout, const void *inp,
                                     const void *weight, const float *mean, const float *rstd,
                                     int64_t rows, int64_t cols) {
    return norm_backward(device, dtype, dinp, dweight, dbias, dout, inp, weight, mean, rstd, rows, cols,
                         0, "it_layernorm_backward");
}

it_status it_cuda_rmsnorm_forward(it_device device, it_dtype dtype, void *out, float *rstd,
                                  const void *inp, const void *weight, int64_t rows, int64_t cols,
                                  float eps) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(check_rows(rows, "it_rmsnorm_forward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    IT_FLOAT_SWITCH(dtype, "it_rmsnorm_forward",
                    rmsnorm_fwd<T><<<row_blocks(rows), IT_THREADS, 0, s>>>(
                        (T *)out, rstd, (const T *)inp, (const T *)weight, cols, eps));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_rmsnorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                                   const void *dout, const void *inp, const void *weight,
                                   const float *rstd, int64_t rows, int64_t cols) {
    return norm_backward(device, dtype, dinp, dweight, NULL, dout, inp, weight, NULL, rstd, rows, cols,
                         1, "it_rmsnorm_backward");
}

it_status it_cuda_softmax_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                                  int64_t rows, int64_t cols) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(check_rows(rows, "it_softmax_forward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    IT_FLOAT_SWITCH(dtype, "it_softmax_forward",
                    softmax_fwd<T><<<row_blocks(rows), IT_THREADS, 0, s>>>((T *)out, (const T *)inp, cols));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_softmax_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                                   const void *out, int64_t rows, int64_t cols) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(check_rows(rows, "it_softmax_backward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    IT_FLOAT_SWITCH(dtype, "it_softmax_backward",
                    softmax_bwd<T><<<row_blocks(rows), IT_THREADS, 0, s>>>(
                        (T *)dinp, (const T *)dout, (const T *)out, cols));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_cross_entropy_forward(it_device device, it_dtype dtype, float *losses, float *lse,
                                        const void *logits, const void *targets, it_dtype target_dtype,
                                        int64_t rows, int64_t vocab, int64_t padded_vocab,
                                        int64_t ignore_index) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(check_rows(rows, "it_cross_entropy_forward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int is64 = target_dtype == IT_INT64, *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    IT_FLOAT_SWITCH(dtype, "it_cross_entropy_forward",
                    ce_fwd<T><<<row_blocks(rows), IT_THREADS * 2, 0, s>>>(
                        losses, lse, (const T *)logits, targets, is64, vocab, padded_vocab, ignore_index, bad));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_cross_entropy_backward(it_device device, it_dtype dtype, void *dlogits,
                                         const void *logits, const float *lse, const void *targets,
                                         it_dtype target_dtype, const float *dlosses, int64_t rows,
                                         int64_t vocab, int64_t padded_vocab, int64_t ignore_index) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(check_rows(rows, "it_cross_entropy_backward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int is64 = target_dtype == IT_INT64;
    IT_FLOAT_SWITCH(dtype, "it_cross_entropy_backward",
                    ce_bwd<T><<<row_blocks(rows), IT_THREADS * 2, 0, s>>>(
                        (T *)dlogits, (const T *)logits, lse, targets, is64, dlosses, vocab, padded_vocab,
                        ignore_index));
    CU_LAUNCHED();
    return IT_OK;
}

}  // extern "C"
