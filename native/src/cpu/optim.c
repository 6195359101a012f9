/* Fused optimizer updates: one pass over parameter, gradient and state. The arithmetic
 * follows torch.optim's single-tensor code path so that losses match PyTorch step by step.
 * Every multiply-add is an explicit fmaf and no other product meets a sum, so the compiler has
 * nothing to contract: the update gives the same bits on every CPU and as cuda/optim.cu on a GPU
 * (which spells it the same way), so that an optimizer offloaded to the host updates a GPU's
 * weights exactly as the GPU would. */
#include "common.h"

IT_HOT static void adamw_f32(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay,
                             float step_size, float bc2_sqrt) {
    float decay = 1.0f - lr * weight_decay;
    for (int64_t i = 0; i < n; i++) {
        float pi = p[i] * decay;
        float mi = fmaf(1.0f - beta1, g[i] - m[i], m[i]);
        float vi = fmaf(v[i], beta2, (1.0f - beta2) * g[i] * g[i]);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        p[i] = fmaf(-step_size, mi / denom, pi);
        m[i] = mi;
        v[i] = vi;
    }
}

static it_status check_adamw(it_device device, it_dtype dtype, float lr, float beta1, float beta2, float eps,
                             float weight_decay, int64_t step, const char *fn) {
    IT_CHECK_DEVICE(device, fn);
    IT_CHECK_FLOAT(dtype, fn);
    IT_CHECK_ARG(step >= 1, "%s: step must be >= 1 (1-based), got %lld", fn, (long long)step);
    IT_CHECK_ARG(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
                 "%s: betas must be in [0, 1), got (%g, %g)", fn, beta1, beta2);
    IT_CHECK_FINITE(lr, fn);
    IT_CHECK_FINITE(eps, fn);
    IT_CHECK_FINITE(weight_decay, fn);
    return IT_OK;
}

static void adamw_cpu(it_dtype dtype, void *param, const void *grad, float *m, float *v, int64_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int64_t step);

it_status it_adamw_step(it_device device, it_dtype dtype, void *param, const void *grad,
                        float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                        float eps, float weight_decay, int64_t step) {
    IT_TRY(check_adamw(device, dtype, lr, beta1, beta2, eps, weight_decay, step, "it_adamw_step"));
    IT_CHECK_SIZE(n, "it_adamw_step");
    if (n == 0) return IT_OK;
    IT_CHECK_ARG(param && grad && m && v, "it_adamw_step: NULL pointer");
    IT_DISPATCH(adamw_step, device, dtype, param, grad, m, v, n, lr, beta1, beta2, eps,
                weight_decay, step);
    adamw_cpu(dtype, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step);
    return IT_OK;
}

it_status it_adamw_step_multi(it_device device, it_dtype dtype, void *const *params, const void *const *grads,
                              float *const *exp_avgs, float *const *exp_avg_sqs, const int64_t *sizes,
                              int32_t num_inputs, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int64_t step) {
    const char *fn = "it_adamw_step_multi";
    IT_TRY(check_adamw(device, dtype, lr, beta1, beta2, eps, weight_decay, step, fn));
    IT_CHECK_ARG(num_inputs >= 0, "%s: num_inputs must be >= 0, got %d", fn, (int)num_inputs);
    if (num_inputs == 0) return IT_OK;
    IT_CHECK_ARG(params && grads && exp_avgs && exp_avg_sqs && sizes, "%s: NULL array", fn);
    for (int32_t i = 0; i < num_inputs; i++) {
        IT_CHECK_ARG(sizes[i] >= 0 && sizes[i] <= IT_MAX_ELEMENTS, "%s: sizes[%d] must be in [0, 2^58], got %lld",
                     fn, (int)i, (long long)sizes[i]);
        IT_CHECK_ARG(sizes[i] == 0 || (params[i] && grads[i] && exp_avgs[i] && exp_avg_sqs[i]),
                     "%s: NULL pointer for tensor %d", fn, (int)i);
    }
    IT_DISPATCH(adamw_step_multi, device, dtype, params, grads, exp_avgs, exp_avg_sqs, sizes, num_inputs, lr,
                beta1, beta2, eps, weight_decay, step);
    for (int32_t i = 0; i < num_inputs; i++)
        if (sizes[i])
            adamw_cpu(dtype, params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], sizes[i], lr, beta1, beta2, eps,
                      weight_decay, step);
    return IT_OK;
}

static void adamw_cpu(it_dtype dtype, void *param, const void *grad, float *m, float *v, int64_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay, int64_t step) {
    float bc1 = 1.0f - powf(beta1, (float)step);
    float bc2_sqrt = sqrtf(1.0f - powf(beta2, (float)step));
    float step_size = lr / bc1;
    int64_t nchunks = (n + IT_CHUNK - 1) / IT_CHUNK;
#pragma omp parallel if (nchunks > 4)
    {
        float pb[IT_CHUNK], gb[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t off = c * IT_CHUNK, len = n - off < IT_CHUNK ? n - off : IT_CHUNK;
            float *p = dtype == IT_FLOAT32 ? (float *)param + off
                                           : (it_convert_to_f32(dtype, (uint16_t *)param + off, pb, len), pb);
            const float *g = it_row_load(dtype, grad, off, len, gb);
            adamw_f32(p, g, m + off, v + off, len, lr, beta1, beta2, eps, weight_decay,
                      step_size, bc2_sqrt);
            it_row_store(dtype, param, off, p, len);
        }
    }
}

IT_HOT static void sgd_f32(float *p, const float *g, float *buf, int64_t n, float lr,
                           float momentum, float dampening, float weight_decay, int nesterov,
                           int first_step) {
    for (int64_t i = 0; i < n; i++) {
        float d = fmaf(weight_decay, p[i], g[i]);
        if (buf) {
            float b = first_step ? d : fmaf(momentum, buf[i], (1.0f - dampening) * d);
            buf[i] = b;
            d = nesterov ? fmaf(momentum, b, d) : b;
        }
        p[i] = fmaf(-lr, d, p[i]);
    }
}

it_status it_sgd_step(it_device device, it_dtype dtype, void *param, const void *grad,
                      float *momentum_buf, int64_t n, float lr, float momentum, float dampening,
                      float weight_decay, int32_t nesterov, int32_t first_step) {
    IT_CHECK_DEVICE(device, "it_sgd_step");
    IT_CHECK_FLOAT(dtype, "it_sgd_step");
    IT_CHECK_SIZE(n, "it_sgd_step");
    IT_CHECK_FINITE(lr, "it_sgd_step");
    IT_CHECK_FINITE(momentum, "it_sgd_step");
    IT_CHECK_FINITE(dampening, "it_sgd_step");
    IT_CHECK_FINITE(weight_decay, "it_sgd_step");
    IT_CHECK_FLAG(nesterov, "it_sgd_step");
    IT_CHECK_FLAG(first_step, "it_sgd_step");
    IT_CHECK_ARG(momentum == 0.0f || momentum_buf != NULL,
                 "it_sgd_step: momentum %g needs a momentum buffer", momentum);
    IT_CHECK_ARG(!nesterov || (momentum > 0 && dampening == 0),
                 "it_sgd_step: Nesterov momentum needs momentum > 0 and zero dampening");
    if (n == 0) return IT_OK;
    IT_CHECK_ARG(param && grad, "it_sgd_step: NULL pointer");
    IT_DISPATCH(sgd_step, device, dtype, param, grad, momentum_buf, n, lr, momentum, dampening,
                weight_decay, nesterov, first_step);
    float *buf = momentum != 0.0f ? momentum_buf : NULL;
    int64_t nchunks = (n + IT_CHUNK - 1) / IT_CHUNK;
#pragma omp parallel if (nchunks > 4)
    {
        float pb[IT_CHUNK], gb[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t off = c * IT_CHUNK, len = n - off < IT_CHUNK ? n - off : IT_CHUNK;
            float *p = dtype == IT_FLOAT32 ? (float *)param + off
                                           : (it_convert_to_f32(dtype, (uint16_t *)param + off, pb, len), pb);
            const float *g = it_row_load(dtype, grad, off, len, gb);
            sgd_f32(p, g, buf ? buf + off : NULL, len, lr, momentum, dampening, weight_decay,
                    nesterov, first_step);
            it_row_store(dtype, param, off, p, len);
        }
    }
    return IT_OK;
}
