// The optimizer updates (AdamW, SGD with momentum), the twins of cpu/optim.c.
#include "common.cuh"

namespace {

template <typename T>
__global__ void adamw_kernel(T *p, const T *g, float *m, float *v, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float step_size, float bc2_sqrt) {
    float decay = 1.0f - lr * weight_decay;
    GRID_STRIDE(i, n) {
        float gi = to_f(g[i]);
        float pi = to_f(p[i]) * decay;
        float mi = fmaf(1.0f - beta1, gi - m[i], m[i]);  // fmaf as cpu/optim.c spells it: the same bits
        float vi = fmaf(v[i], beta2, (1.0f - beta2) * gi * gi);
        p[i] = from_f<T>(fmaf(-step_size, mi / (sqrtf(vi) / bc2_sqrt + eps), pi));
        m[i] = mi;
        v[i] = vi;
    }
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
IT_CUDA_MIRRORS(sgd_step);
