// LayerNorm, RMSNorm and softmax over rows, the twins of cpu/norm.c. A row is handled by one
// block (sums in float32 through warp shuffles); the weight gradients of the norms are column
// sums in row order, so results do not depend on how the rows were scheduled.
#include "common.cuh"

namespace {

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

// Rows of at most kWarpRow columns (GPT-2's 768 to LLaMA-8B's 4096; most training rows) take a
// warp each instead of a block: the sums need no block barrier, and where the rows are whole
// aligned vectors a lane loads V values at once (common.cuh). The row is read from memory once
// and again from the cache for each later pass.
constexpr int64_t kWarpRow = 4096;
constexpr int kRowsPerBlock = 8;  // warps of a block, a row each

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T, int V>
__global__ void layernorm_fwd_warp(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                                   int64_t rows, int64_t C, float eps) {
    const int64_t row = (int64_t)blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= rows) return;  // a whole warp leaves: its shuffles below stay full
    const int lane = threadIdx.x & 31;
    const T *x = inp + row * C;
    float sum = 0.0f;
    for (int64_t c = lane * V; c < C; c += 32 * V) {
        Vec<T, V> v = *(const Vec<T, V> *)(x + c);
#pragma unroll
        for (int e = 0; e < V; e++) sum += to_f(v.x[e]);
    }
    const float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int64_t c = lane * V; c < C; c += 32 * V) {
        Vec<T, V> v = *(const Vec<T, V> *)(x + c);
#pragma unroll
        for (int e = 0; e < V; e++) var += (to_f(v.x[e]) - m) * (to_f(v.x[e]) - m);
    }
    const float r = rsqrtf(warp_sum(var) / C + eps);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
    for (int64_t c = lane * V; c < C; c += 32 * V) {
        Vec<T, V> v = *(const Vec<T, V> *)(x + c);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float h = (to_f(v.x[e]) - m) * r;
            if (w) h = h * to_f(w[c + e]) + (b ? to_f(b[c + e]) : 0.0f);
            v.x[e] = from_f<T>(h);
        }
        *(Vec<T, V> *)(out + row * C + c) = v;
    }
}

template <typename T, int V>
__global__ void norm_bwd_rows_warp(T *dinp, const T *dout, const T *inp, const T *w, const float *mean,
                                   const float *rstd, int64_t rows, int64_t C, int rms) {
    const int64_t row = (int64_t)blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    const T *x = inp + row * C, *dy = dout + row * C;
    const float m = rms ? 0.0f : mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = lane * V; c < C; c += 32 * V) {
        Vec<T, V> xv = *(const Vec<T, V> *)(x + c), gv = *(const Vec<T, V> *)(dy + c);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float g = to_f(gv.x[e]) * (w ? to_f(w[c + e]) : 1.0f);
            sg += g;
            sgx += g * (to_f(xv.x[e]) - m) * r;
        }
    }
    const float mg = rms ? 0.0f : warp_sum(sg) / C, mgx = warp_sum(sgx) / C;
    for (int64_t c = lane * V; c < C; c += 32 * V) {
        Vec<T, V> xv = *(const Vec<T, V> *)(x + c), gv = *(const Vec<T, V> *)(dy + c);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float g = to_f(gv.x[e]) * (w ? to_f(w[c + e]) : 1.0f);
            gv.x[e] = from_f<T>(r * (g - mg - (to_f(xv.x[e]) - m) * r * mgx));
        }
        *(Vec<T, V> *)(dinp + row * C + c) = gv;
    }
}

// the vector width a warp-per-row kernel takes (0: rows too long, a block each)
template <typename T> int warp_row_vector(int64_t C, std::initializer_list<const void *> pointers) {
    constexpr int V = 16 / sizeof(T);
    if (C > kWarpRow) return 0;
    return C % V == 0 && vec_aligned(pointers) ? V : 1;
}
unsigned int warp_row_blocks(int64_t rows) { return (unsigned int)((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

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
// passes so that more threads than columns work: chunk k of `len` rows of columns c .. c + V - 1
// (V at a time where rows are whole aligned vectors, common.cuh) sums into partial[k * C + c]
// (dweight) and partial[(chunks + k) * C + c] (dbias), then each column adds its chunks in order
template <typename T, int V>
__global__ void norm_bwd_col_chunks(float *partial, const T *dout, const T *inp, const float *mean,
                                    const float *rstd, int64_t rows, int64_t C, int64_t chunks, int64_t len,
                                    int rms) {
    GRID_STRIDE(w, chunks * (C / V)) {
        int64_t c = (w % (C / V)) * V, k = w / (C / V), end = (k + 1) * len < rows ? (k + 1) * len : rows;
        float sw[V] = {}, sb[V] = {};
        for (int64_t n = k * len; n < end; n++) {
            Vec<T, V> dy = *(const Vec<T, V> *)(dout + n * C + c), x = *(const Vec<T, V> *)(inp + n * C + c);
            const float m = rms ? 0.0f : mean[n], r = rstd[n];
#pragma unroll
            for (int e = 0; e < V; e++) {
                sw[e] += to_f(dy.x[e]) * (to_f(x.x[e]) - m) * r;
                sb[e] += to_f(dy.x[e]);
            }
        }
#pragma unroll
        for (int e = 0; e < V; e++) {
            partial[k * C + c + e] = sw[e];
            partial[(chunks + k) * C + c + e] = sb[e];
        }
    }
}

// a warp per column: lane l adds chunks l, l + 32, ... in order, then the lanes in a fixed tree
template <typename T>
__global__ void norm_bwd_col_sums(T *dw, T *db, const float *partial, int64_t C, int64_t chunks) {
    const int lane = threadIdx.x & 31;
    for (int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; c < C;
         c += (int64_t)blockDim.x * gridDim.x / 32) {
        float sw = 0, sb = 0;
        for (int64_t k = lane; k < chunks; k += 32) {
            sw += partial[k * C + c];
            sb += partial[(chunks + k) * C + c];
        }
        sw = warp_sum(sw);
        sb = warp_sum(sb);
        if (lane == 0) {
            dw[c] = from_f<T>(sw);
            if (db) db[c] = from_f<T>(sb);
        }
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


}  // namespace

extern "C" {

it_status it_cuda_layernorm_forward(it_device device, it_dtype dtype, void *out, float *mean,
                                    float *rstd, const void *inp, const void *weight,
                                    const void *bias, int64_t rows, int64_t cols, float eps) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(check_rows(rows, "it_layernorm_forward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    IT_FLOAT_SWITCH(dtype, "it_layernorm_forward", {
        constexpr int V = 16 / sizeof(T);
        const int v = warp_row_vector<T>(cols, {out, inp, weight, bias});
        if (v > 1)
            layernorm_fwd_warp<T, V><<<warp_row_blocks(rows), 32 * kRowsPerBlock, 0, s>>>(
                (T *)out, mean, rstd, (const T *)inp, (const T *)weight, (const T *)bias, rows, cols, eps);
        else if (v == 1)
            layernorm_fwd_warp<T, 1><<<warp_row_blocks(rows), 32 * kRowsPerBlock, 0, s>>>(
                (T *)out, mean, rstd, (const T *)inp, (const T *)weight, (const T *)bias, rows, cols, eps);
        else
            layernorm_fwd<T><<<row_blocks(rows), IT_THREADS, 0, s>>>((T *)out, mean, rstd, (const T *)inp,
                                                                   (const T *)weight, (const T *)bias, cols, eps);
    });
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
    const int64_t vector = 16 / (int64_t)dtype_bytes(dtype);  // columns a thread takes where rows are whole vectors
    const bool vec = cols % vector == 0 && vec_aligned({dout, inp});
    int64_t want = (kEnoughOutputs * (vec ? vector : 1) + cols - 1) / cols, most = (rows + 63) / 64;
    int64_t chunks = want < most ? want : most, len = (rows + chunks - 1) / chunks;
    chunks = (rows + len - 1) / len;
    if (dweight) CU_TRY(cudaMallocAsync((void **)&partial, (size_t)(2 * chunks * cols) * sizeof(float), s));
    IT_FLOAT_SWITCH(dtype, fn, {
        constexpr int V = 16 / sizeof(T);
        const int v = warp_row_vector<T>(cols, {dinp, dout, inp, weight});
        if (dinp && v > 1)
            norm_bwd_rows_warp<T, V><<<warp_row_blocks(rows), 32 * kRowsPerBlock, 0, s>>>(
                (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd, rows, cols, rms);
        else if (dinp && v == 1)
            norm_bwd_rows_warp<T, 1><<<warp_row_blocks(rows), 32 * kRowsPerBlock, 0, s>>>(
                (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd, rows, cols, rms);
        else if (dinp)
            norm_bwd_rows<T><<<row_blocks(rows), IT_THREADS, 0, s>>>(
                (T *)dinp, (const T *)dout, (const T *)inp, (const T *)weight, mean, rstd, cols, rms);
        if (dweight) {
            if (vec)
                norm_bwd_col_chunks<T, V><<<it_blocks(chunks * cols / V), IT_THREADS, 0, s>>>(
                    partial, (const T *)dout, (const T *)inp, mean, rstd, rows, cols, chunks, len, rms);
            else
                norm_bwd_col_chunks<T, 1><<<it_blocks(chunks * cols), IT_THREADS, 0, s>>>(
                    partial, (const T *)dout, (const T *)inp, mean, rstd, rows, cols, chunks, len, rms);
            norm_bwd_col_sums<T><<<it_blocks(cols * 32), IT_THREADS, 0, s>>>((T *)dweight, (T *)dbias, partial, cols,
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

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(layernorm_forward);
IT_CUDA_MIRRORS(layernorm_backward);
IT_CUDA_MIRRORS(rmsnorm_forward);
IT_CUDA_MIRRORS(rmsnorm_backward);
IT_CUDA_MIRRORS(softmax_forward);
IT_CUDA_MIRRORS(softmax_backward);
