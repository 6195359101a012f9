// The optimizer updates (AdamW, SGD with momentum), the twins of cpu/optim.c.
#include "common.cuh"

#include <vector>

namespace {

template <typename T>
__device__ __forceinline__ void adamw_element(T *p, const T *g, float *m, float *v, int64_t i, float decay,
                                              float beta1, float beta2, float eps, float step_size,
                                              float bc2_sqrt) {
    float gi = to_f(g[i]);
    float pi = to_f(p[i]) * decay;
    float mi = fmaf(1.0f - beta1, gi - m[i], m[i]);  // fmaf as cpu/optim.c spells it: the same bits
    float vi = fmaf(v[i], beta2, (1.0f - beta2) * gi * gi);
    p[i] = from_f<T>(fmaf(-step_size, mi / (sqrtf(vi) / bc2_sqrt + eps), pi));
    m[i] = mi;
    v[i] = vi;
}

template <typename T>
__global__ void adamw_kernel(T *p, const T *g, float *m, float *v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float step_size, float bc2_sqrt) {
    float decay = 1.0f - lr * weight_decay;
    GRID_STRIDE(i, n) adamw_element(p, g, m, v, i, decay, beta1, beta2, eps, step_size, bc2_sqrt);
}

// Many tensors in one launch: tensor k owns the blocks from first_block on, each block a run of
// kAdamwRun of its elements (PyTorch's multi_tensor_apply, with the table in device memory).
struct AdamwTensor {
    void *p;
    const void *g;
    float *m, *v;
    int64_t n, first_block;
};
constexpr int64_t kAdamwRun = 8 * IT_THREADS;

template <typename T>
__global__ void adamw_multi_kernel(const AdamwTensor *ts, int count, float lr, float beta1, float beta2, float eps,
                                   float weight_decay, float step_size, float bc2_sqrt) {
    int lo = 0, hi = count - 1;  // the last tensor whose first block is at or before this one
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ts[mid].first_block <= (int64_t)blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    const AdamwTensor t = ts[lo];
    int64_t start = ((int64_t)blockIdx.x - t.first_block) * kAdamwRun;
    int64_t end = start + kAdamwRun < t.n ? start + kAdamwRun : t.n;
    float decay = 1.0f - lr * weight_decay;
    for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x)
        adamw_element((T *)t.p, (const T *)t.g, t.m, t.v, i, decay, beta1, beta2, eps, step_size, bc2_sqrt);
}

template <typename T>
__global__ void sgd_kernel(T *p, const T *g, float *buf, int64_t n, float lr, float momentum,
                           float dampening, float weight_decay, int nesterov, int first_step) {
    GRID_STRIDE(i, n) {
        float pi = to_f(p[i]);
        float d = fmaf(weight_decay, pi, to_f(g[i]));
        if (buf) {
            float b = first_step ? d : fmaf(momentum, buf[i], (1.0f - dampening) * d);
            buf[i] = b;
            d = nesterov ? fmaf(momentum, b, d) : b;
        }
        p[i] = from_f<T>(fmaf(-lr, d, pi));
    }
}

}  // namespace

extern "C" {

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

it_status it_cuda_adamw_step_multi(it_device device, it_dtype dtype, void *const *params, const void *const *grads,
                                   float *const *exp_avgs, float *const *exp_avg_sqs, const int64_t *sizes,
                                   int32_t num_inputs, float lr, float beta1, float beta2, float eps,
                                   float weight_decay, int64_t step) {
    std::vector<AdamwTensor> table;
    int64_t blocks = 0;
    for (int32_t i = 0; i < num_inputs; i++) {
        if (sizes[i] == 0) continue;
        table.push_back({params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], sizes[i], blocks});
        blocks += (sizes[i] + kAdamwRun - 1) / kAdamwRun;
    }
    if (table.empty()) return IT_OK;
    if (blocks > 2147483647LL)
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "it_adamw_step_multi: %lld blocks exceed one launch's 2^31 - 1",
                             (long long)blocks);
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    float bc1 = 1.0f - powf(beta1, (float)step), bc2_sqrt = sqrtf(1.0f - powf(beta2, (float)step));
    AdamwTensor *dev;  // the table in device memory (the copy from pageable memory is staged at once)
    size_t bytes = table.size() * sizeof(AdamwTensor);
    CU_TRY(cudaMallocAsync((void **)&dev, bytes, s));
    CU_TRY(cudaMemcpyAsync(dev, table.data(), bytes, cudaMemcpyHostToDevice, s));
    IT_FLOAT_SWITCH(dtype, "it_adamw_step_multi",
                    adamw_multi_kernel<T><<<(unsigned int)blocks, IT_THREADS, 0, s>>>(
                        dev, (int)table.size(), lr, beta1, beta2, eps, weight_decay, lr / bc1, bc2_sqrt));
    CU_LAUNCHED();
    CU_TRY(cudaFreeAsync(dev, s));
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

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(adamw_step);
IT_CUDA_MIRRORS(adamw_step_multi);
IT_CUDA_MIRRORS(sgd_step);
