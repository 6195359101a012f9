// Embedding lookups, rotary positions, the optimizer updates and random numbers.
//
// The embedding gradient is accumulated column by column in token order (one thread per
// column), so it is deterministic: no atomics, whose order would change the float sums from
// run to run. Random numbers use the CPU's counter-based streams: element i of a call hashes
// (seed, offset + i), so a seed draws the same numbers on the CPU and on any GPU.
#include "common.cuh"

namespace {
__device__ __forceinline__ int64_t index_at(const void *idx, int is64, int64_t n) {
    return is64 ? ((const int64_t *)idx)[n] : ((const int32_t *)idx)[n];
}

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

template <typename T>
__global__ void adamw_kernel(T *p, const T *g, float *m, float *v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float step_size, float bc2_sqrt) {
    float decay = 1.0f - lr * weight_decay;
    GRID_STRIDE(i, n) {
        float gi = to_f(g[i]);
        float pi = to_f(p[i]) * decay;
        float mi = m[i] + (1.0f - beta1) * (gi - m[i]);
        float vi = v[i] * beta2 + (1.0f - beta2) * gi * gi;
        p[i] = from_f<T>(pi - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps)));
        m[i] = mi;
        v[i] = vi;
    }
}

template <typename T>
__global__ void sgd_kernel(T *p, const T *g, float *buf, int64_t n, float lr, float momentum,
                           float dampening, float weight_decay, int nesterov, int first_step) {
    GRID_STRIDE(i, n) {
        float pi = to_f(p[i]);
        float d = to_f(g[i]) + weight_decay * pi;
        if (buf) {
            float b = first_step ? d : momentum * buf[i] + (1.0f - dampening) * d;
            buf[i] = b;
            d = nesterov ? d + momentum * b : b;
        }
        p[i] = from_f<T>(pi - lr * d);
    }
}

template <typename T>
__global__ void uniform_kernel(T *out, int64_t n, double a, double b, uint64_t key, uint64_t offset) {
    GRID_STRIDE(i, n) {
        double u = uniform_open0(random_bits(key, offset + (uint64_t)i));
        out[i] = from_f<T>((float)(a + (b - a) * (1.0 - u)));
    }
}

// Box-Muller on the counter pair (2j, 2j + 1): the even element takes the cosine, the odd one
// the sine, so element i depends only on (seed, offset + i), as on the CPU.
template <typename T>
__global__ void normal_kernel(T *out, int64_t n, double mean, double std, uint64_t key, uint64_t offset) {
    GRID_STRIDE(i, n) {
        uint64_t ctr = offset + (uint64_t)i, pair = ctr >> 1;
        double u1 = uniform_open0(random_bits(key, 2 * pair));
        double u2 = uniform_open0(random_bits(key, 2 * pair + 1));
        double r = sqrt(-2.0 * log(u1)), s, c;
        sincos(6.283185307179586 * u2, &s, &c);
        out[i] = from_f<T>((float)(mean + std * r * ((ctr & 1) ? s : c)));
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

it_status it_cuda_adamw_step(it_device device, it_dtype dtype, void *param, const void *grad, float *m,
                             float *v, int64_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, int64_t step) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    float bc1 = 1.0f - powf(beta1, (float)step), bc2_sqrt = sqrtf(1.0f - powf(beta2, (float)step));
    IT_FLOAT_SWITCH(dtype, "it_adamw_step",
                    adamw_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>(
                        (T *)param, (const T *)grad, m, v, n, lr, beta1, beta2, eps, weight_decay,
                        lr / bc1, bc2_sqrt));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_sgd_step(it_device device, it_dtype dtype, void *param, const void *grad,
                           float *momentum_buf, int64_t n, float lr, float momentum, float dampening,
                           float weight_decay, int32_t nesterov, int32_t first_step) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    float *buf = momentum != 0.0f ? momentum_buf : nullptr;
    IT_FLOAT_SWITCH(dtype, "it_sgd_step",
                    sgd_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>(
                        (T *)param, (const T *)grad, buf, n, lr, momentum, dampening, weight_decay,
                        nesterov, first_step));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_random_uniform(it_device device, it_dtype dtype, void *out, int64_t n, double low,
                                 double high, uint64_t seed, uint64_t offset) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    uint64_t key = mix64(seed ^ 0x5851f42d4c957f2dull);  // the CPU's key for uniform draws
    IT_FLOAT_SWITCH(dtype, "it_random_uniform",
                    uniform_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>((T *)out, n, low, high, key, offset));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_random_normal(it_device device, it_dtype dtype, void *out, int64_t n, double mean,
                                double std, uint64_t seed, uint64_t offset) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    uint64_t key = mix64(seed ^ 0xd1b54a32d192ed03ull);  // the CPU's key for normal draws
    IT_FLOAT_SWITCH(dtype, "it_random_normal",
                    normal_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>((T *)out, n, mean, std, key, offset));
    CU_LAUNCHED();
    return IT_OK;
}

}  // extern "C"
