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

template <typename C> __device__ __forceinline__ C identity(int op) {
    return op == IT_MAX ? C(-INFINITY) : (op == IT_MIN ? C(INFINITY) : C(0));
}

// `v` combined over the block (blockDim.x a multiple of 32); every thread gets it
template <typename C> __device__ C block_combine(int op, C v) {
    __shared__ C part[32];
    for (int o = 16; o > 0; o >>= 1) v = combine(op, v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // part may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : identity<C>(op);
    for (int o = 16; o > 0; o >>= 1) v = combine(op, v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Few outputs over long rows would leave most of the GPU idle with a thread per output (the
// sum of a whole gradient for its norm: one thread, 38M elements). Then n is cut into chunks,
// each reduced by a block (inner == 1) or a thread (inner > 1) into a partial, and a second
// pass combines each output's partials in chunk order: deterministic, as the first pass.
constexpr int64_t kEnoughOutputs = 65536;  // outputs at or above which a thread per output is enough
constexpr int64_t kRowChunk = 8192;        // inner == 1: elements per block

// inner == 1: block b reduces chunk b % chunks of row b / chunks; with one chunk per row it
// writes the output, else a partial
template <typename T>
__global__ void row_chunks(int op, T *out, typename Acc<T>::type *partial, const T *inp, int64_t n,
                           int64_t chunks) {
    using C = typename Acc<T>::type;
    int64_t o = blockIdx.x / chunks, start = (blockIdx.x % chunks) * kRowChunk;
    int64_t end = start + kRowChunk < n ? start + kRowChunk : n;
    const T *x = inp + o * n;
    C acc = identity<C>(op);
    for (int64_t j = start + threadIdx.x; j < end; j += blockDim.x) acc = combine(op, acc, load_acc(x, j));
    acc = block_combine(op, acc);
    if (threadIdx.x == 0) {
        if (chunks > 1) {
            partial[blockIdx.x] = acc;
        } else {
            if (op == IT_MEAN) acc /= (C)n;
            store_acc(out, o, acc);
        }
    }
}

template <typename T>
__global__ void row_partials(int op, T *out, const typename Acc<T>::type *partial, int64_t n, int64_t chunks) {
    using C = typename Acc<T>::type;
    C acc = identity<C>(op);
    for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x)
        acc = combine(op, acc, partial[blockIdx.x * chunks + j]);
    acc = block_combine(op, acc);
    if (threadIdx.x == 0) {
        if (op == IT_MEAN) acc /= (C)n;
        store_acc(out, blockIdx.x, acc);
    }
}

// inner > 1: a thread per (o, chunk, i) sums rows [chunk * len, ...) of column i into
// partial[(o * chunks + chunk) * inner + i]; then a thread per output combines its chunks
template <typename T>
__global__ void column_chunks(int op, typename Acc<T>::type *partial, const T *inp, int64_t outer, int64_t n,
                              int64_t inner, int64_t chunks, int64_t len) {
    using C = typename Acc<T>::type;
    GRID_STRIDE(w, outer * chunks * inner) {
        int64_t i = w % inner, c = (w / inner) % chunks, o = w / (inner * chunks);
        int64_t end = (c + 1) * len < n ? (c + 1) * len : n;
        C acc = identity<C>(op);
        for (int64_t j = c * len; j < end; j++) acc = combine(op, acc, load_acc(inp, (o * n + j) * inner + i));
        partial[w] = acc;
    }
}

template <typename T>
__global__ void column_partials(int op, T *out, const typename Acc<T>::type *partial, int64_t outer, int64_t n,
                                int64_t inner, int64_t chunks) {
    using C = typename Acc<T>::type;
    GRID_STRIDE(w, outer * inner) {
        int64_t o = w / inner, i = w % inner;
        const C *p = partial + o * chunks * inner + i;
        C acc = p[0];
        for (int64_t c = 1; c < chunks; c++) acc = combine(op, acc, p[c * inner]);
        if (op == IT_MEAN) acc /= (C)n;
        store_acc(out, w, acc);
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

// dweight[c] = sum over rows of dout * xhat, dbias[c] = sum of dout (overwritten), in two
// passes so that more threads than columns work: chunk k of `len` rows of column c sums into
// partial[k * C + c] (dweight) and partial[(chunks + k) * C + c] (dbias), then each column adds
// its chunks in order
template <typename T>
__global__ void norm_bwd_col_chunks(float *partial, const T *dout, const T *inp, const float *mean,
                                    const float *rstd, int64_t rows, int64_t C, int64_t chunks, int64_t len,
                                    int rms) {
    GRID_STRIDE(w, chunks * C) {
        int64_t c = w % C, k = w / C, end = (k + 1) * len < rows ? (k + 1) * len : rows;
        float sw = 0, sb = 0;
        for (int64_t n = k * len; n < end; n++) {
            float dy = to_f(dout[n * C + c]);
            sw += dy * (to_f(inp[n * C + c]) - (rms ? 0.0f : mean[n])) * rstd[n];
            sb += dy;
        }
        partial[w] = sw;
        partial[chunks * C + w] = sb;
    }
}

template <typename T>
__global__ void norm_bwd_col_sums(T *dw, T *db, const float *partial, int64_t C, int64_t chunks) {
    GRID_STRIDE(c, C) {
        float sw = 0, sb = 0;
        for (int64_t k = 0; k < chunks; k++) {
            sw += partial[k * C + c];
            sb += partial[(chunks + k) * C + c];
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
    int64_t outputs = outer * inner;
    if (outputs >= kEnoughOutputs || n <= 256) {
        FLOAT_OR_DOUBLE(dtype, "it_reduce",
                        reduce_kernel<T><<<it_blocks(outputs), IT_THREADS, 0, s>>>(
                            (int)op, (T *)out, (const T *)inp, outer, n, inner));
        CU_LAUNCHED();
        return IT_OK;
    }
    // chunks along n: for rows, blocks of kRowChunk; for columns, enough threads to fill the GPU,
    // each walking at least 64 rows
    int64_t chunks, len;
    if (inner == 1) {
        len = kRowChunk;
        chunks = (n + len - 1) / len;
        if (outer * chunks > 2147483647LL)
            return it_cuda_error(IT_ERR_NOT_SUPPORTED, "it_reduce: %lld rows of %lld are too many blocks",
                                 (long long)outer, (long long)n);
    } else {
        int64_t want = (kEnoughOutputs + outputs - 1) / outputs, most = (n + 63) / 64;
        chunks = want < most ? want : most;
        len = (n + chunks - 1) / chunks;
        chunks = (n + len - 1) / len;
    }
    size_t acc_bytes = dtype == IT_FLOAT64 ? sizeof(double) : sizeof(float);
    void *partial = nullptr;
    bool partials = inner > 1 || chunks > 1;
    if (partials) CU_TRY(cudaMallocAsync(&partial, (size_t)(outputs * chunks) * acc_bytes, s));
    FLOAT_OR_DOUBLE(dtype, "it_reduce", {
        using C = typename Acc<T>::type;
        if (inner == 1) {
            row_chunks<T><<<(unsigned int)(outer * chunks), IT_THREADS, 0, s>>>((int)op, (T *)out, (C *)partial,
                                                                              (const T *)inp, n, chunks);
            if (chunks > 1)
                row_partials<T><<<(unsigned int)outer, IT_THREADS, 0, s>>>((int)op, (T *)out, (const C *)partial,
                                                                          n, chunks);
        } else {
            column_chunks<T><<<it_blocks(outputs * chunks), IT_THREADS, 0, s>>>(
                (int)op, (C *)partial, (const T *)inp, outer, n, inner, chunks, len);
            column_partials<T><<<it_blocks(outputs), IT_THREADS, 0, s>>>((int)op, (T *)out, (const C *)partial,
                                                                        outer, n, inner, chunks);
        }
    });
    cudaError_t launched = cudaPeekAtLastError();
    if (partials) CU_TRY(cudaFreeAsync(partial, s));
    CU_TRY(launched);
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
    float *partial = nullptr;
    int64_t want = (kEnoughOutputs + cols - 1) / cols, most = (rows + 63) / 64;
    int64_t chunks = want < most ? want : most, len = (rows + chunks - 1) / chunks;
    chunks = (rows + len - 1) / len;
    if (dweight) CU_TRY(cudaMallocAsync((void **)&partial, (size_t)(2 * chunks * cols) * sizeof(float), s));
    IT_FLOAT_SWITCH(dtype, fn, {
        if (dinp)
            norm_bwd_rows<T><<<row_blocks(rows), IT_THREADS, 0, s>>>(
                (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd, cols, rms);
        if (dweight) {
            norm_bwd_col_chunks<T><<<it_blocks(chunks * cols), IT_THREADS, 0, s>>>(
                partial, (const T *)dout, (const T *)inp, mean, rstd, rows, cols, chunks, len, rms);
            norm_bwd_col_sums<T><<<it_blocks(cols), IT_THREADS, 0, s>>>((T *)dweight, (T *)dbias, partial, cols,
                                                                       chunks);
        }
    });
    cudaError_t launched = cudaPeekAtLastError();
    if (partial) CU_TRY(cudaFreeAsync(partial, s));
    CU_TRY(launched);
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
