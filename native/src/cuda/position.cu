// Embedding lookups and rotary positions, the twins of cpu/position.c. The embedding gradient
// is accumulated column by column in token order (one thread per column), so it is
// deterministic: no atomics, whose order would change the float sums from run to run.
#include "common.cuh"

namespace {

template <typename T>
__global__ void embedding_fwd(T *out, const void *idx, int is64, const T *w, int64_t n, int64_t V,
                              int64_t C, int *bad) {
    GRID_STRIDE(e, n * C) {
        int64_t row = e / C, c = e % C, t = index_at(idx, is64, row);
        if (t < 0 || t >= V) {
            *bad = 1;  // reported at the host's next synchronisation
            out[e] = from_f<T>(0.0f);
        } else {
            out[e] = w[t * C + c];
        }
    }
}

template <typename T>
__global__ void embedding_bwd(T *dw, const T *dout, const void *idx, int is64, int64_t n, int64_t V,
                              int64_t C) {
    GRID_STRIDE(c, C) {
        for (int64_t r = 0; r < n; r++) {
            int64_t t = index_at(idx, is64, r);
            if (t >= 0 && t < V) dw[t * C + c] = from_f<T>(to_f(dw[t * C + c]) + to_f(dout[r * C + c]));
        }
    }
}

// x [B, T, H, D]: the pair (2i, 2i+1) of position t turned by sign * angle(t, i)
template <typename T>
__global__ void rope_kernel(T *out, const T *inp, const float *cs, const float *sn, int64_t T_,
                            int64_t H, int64_t D, float sign, int64_t pairs) {
    int64_t half = D / 2;
    GRID_STRIDE(p, pairs) {
        int64_t i = p % half, row = p / half, t = (row / H) % T_;
        float x0 = to_f(inp[row * D + 2 * i]), x1 = to_f(inp[row * D + 2 * i + 1]);
        float c = cs[t * half + i], s = sign * sn[t * half + i];
        out[row * D + 2 * i] = from_f<T>(x0 * c - x1 * s);
        out[row * D + 2 * i + 1] = from_f<T>(x0 * s + x1 * c);
    }
}

}  // namespace

extern "C" {

it_status it_cuda_embedding_forward(it_device device, it_dtype dtype, void *out, const void *indices,
                                    it_dtype index_dtype, const void *weight, int64_t n,
                                    int64_t num_embeddings, int64_t cols) {
    if (n * cols == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int is64 = index_dtype == IT_INT64;
    int *bad_ptr;  // an id outside the table: zeros here, an error at the next synchronisation
    IT_CU_TRY(it_cuda_index_flag(device, &bad_ptr));
    IT_FLOAT_SWITCH(dtype, "it_embedding_forward",
                    embedding_fwd<T><<<it_blocks(n * cols), IT_THREADS, 0, s>>>(
                        (T *)out, indices, is64, (const T *)weight, n, num_embeddings, cols, bad_ptr));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_embedding_backward(it_device device, it_dtype dtype, void *dweight, const void *dout,
                                     const void *indices, it_dtype index_dtype, int64_t n,
                                     int64_t num_embeddings, int64_t cols) {
    if (n * cols == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int is64 = index_dtype == IT_INT64;
    IT_FLOAT_SWITCH(dtype, "it_embedding_backward",
                    embedding_bwd<T><<<it_blocks(cols, 128), 128, 0, s>>>(
                        (T *)dweight, (const T *)dout, indices, is64, n, num_embeddings, cols));
    CU_LAUNCHED();
    return IT_OK;
}

static it_status rope(it_device device, it_dtype dtype, void *out, const void *inp, const float *cos,
                      const float *sin, int64_t B, int64_t seq, int64_t H, int64_t D, float sign,
                      const char *fn) {
    if (B * seq * H == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int64_t pairs = B * seq * H * (D / 2);  // in place is safe: each pair is read, then written
    IT_FLOAT_SWITCH(dtype, fn,
                    rope_kernel<T><<<it_blocks(pairs), IT_THREADS, 0, s>>>(
                        (T *)out, (const T *)inp, cos, sin, seq, H, D, sign, pairs));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_rope_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                               const float *cos, const float *sin, int64_t batch, int64_t seq,
                               int64_t heads, int64_t head_dim) {
    return rope(device, dtype, out, inp, cos, sin, batch, seq, heads, head_dim, 1.0f, "it_rope_forward");
}

it_status it_cuda_rope_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                                const float *cos, const float *sin, int64_t batch, int64_t seq,
                                int64_t heads, int64_t head_dim) {
    return rope(device, dtype, dinp, dout, cos, sin, batch, seq, heads, head_dim, -1.0f, "it_rope_backward");
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(embedding_forward);
IT_CUDA_MIRRORS(embedding_backward);
IT_CUDA_MIRRORS(rope_forward);
IT_CUDA_MIRRORS(rope_backward);
