// Batch normalisation, the twin of cpu/batchnorm.c (float32): one block per channel sums the
// channel's batch * spatial values (block_sum: a fixed order for a fixed launch), then
// normalises them. The variance is a second pass over (x - mean), as on the CPU.
#include "common.cuh"

namespace {

// value j of channel c, j in [0, N * S): sample j / S, position j % S
__device__ __forceinline__ int64_t at(int64_t j, int64_t c, int64_t C, int64_t S) { return (j / S * C + c) * S + j % S; }

__global__ void bn_fwd(float *out, float *save_mean, float *save_rstd, float *running_mean, float *running_var,
                       const float *x, const float *w, const float *b, int64_t N, int64_t C, int64_t S,
                       int training, float momentum, float eps) {
    int64_t M = N * S;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        float mean, rstd;
        if (training) {
            float s = 0.0f;
            for (int64_t j = threadIdx.x; j < M; j += blockDim.x) s += x[at(j, c, C, S)];
            mean = block_sum(s) / (float)M;
            float q = 0.0f;
            for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
                float d = x[at(j, c, C, S)] - mean;
                q += d * d;
            }
            q = block_sum(q);
            rstd = rsqrtf(q / (float)M + eps);
            if (running_mean && threadIdx.x == 0) {
                running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
                running_var[c] = (1.0f - momentum) * running_var[c] + momentum * q / (float)(M - 1);
            }
        } else {
            mean = running_mean[c];
            rstd = rsqrtf(running_var[c] + eps);
        }
        if (threadIdx.x == 0) {
            save_mean[c] = mean;
            save_rstd[c] = rstd;
        }
        float scale = rstd * (w ? w[c] : 1.0f), shift = (b ? b[c] : 0.0f) - mean * scale;
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) out[at(j, c, C, S)] = x[at(j, c, C, S)] * scale + shift;
    }
}

__global__ void bn_bwd(float *dx, float *dw, float *db, const float *dy, const float *x, const float *w,
                       const float *save_mean, const float *save_rstd, int64_t N, int64_t C, int64_t S, int training) {
    int64_t M = N * S;
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        float mean = save_mean[c], rstd = save_rstd[c], sg = 0.0f, sgx = 0.0f;
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
            float g = dy[at(j, c, C, S)];
            sg += g;
            sgx += g * (x[at(j, c, C, S)] - mean) * rstd;
        }
        sg = block_sum(sg);
        sgx = block_sum(sgx);
        if (threadIdx.x == 0) {
            if (dw) dw[c] = sgx;
            if (db) db[c] = sg;
        }
        if (!dx) continue;
        // training: dx = w rstd (dy - mean(dy) - xhat mean(dy xhat)); evaluation: w rstd dy
        float k = rstd * (w ? w[c] : 1.0f);
        float mg = training && M ? sg / (float)M : 0.0f, mgx = training && M ? sgx / (float)M : 0.0f;
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
            int64_t i = at(j, c, C, S);
            dx[i] = k * (dy[i] - mg - (x[i] - mean) * rstd * mgx);
        }
    }
}

unsigned int channel_blocks(int64_t C) { return (unsigned int)(C < 65535 * 32 ? C : 65535 * 32); }

}  // namespace

extern "C" {

it_status it_cuda_batchnorm_forward(it_device device, it_dtype dtype, void *out, float *save_mean,
                                    float *save_rstd, float *running_mean, float *running_var,
                                    const void *inp, const void *weight, const void *bias,
                                    int64_t batch, int64_t channels, int64_t spatial,
                                    int32_t training, float momentum, float eps) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    bn_fwd<<<channel_blocks(channels), IT_THREADS, 0, s>>>(
        (float *)out, save_mean, save_rstd, running_mean, running_var, (const float *)inp, (const float *)weight,
        (const float *)bias, batch, channels, spatial, training, momentum, eps);
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_batchnorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                                     void *dbias, const void *dout, const void *inp,
                                     const void *weight, const float *save_mean,
                                     const float *save_rstd, int64_t batch, int64_t channels,
                                     int64_t spatial, int32_t training) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    bn_bwd<<<channel_blocks(channels), IT_THREADS, 0, s>>>(
        (float *)dinp, (float *)dweight, (float *)dbias, (const float *)dout, (const float *)inp,
        (const float *)weight, save_mean, save_rstd, batch, channels, spatial, training);
    CU_LAUNCHED();
    return IT_OK;
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(batchnorm_forward);
IT_CUDA_MIRRORS(batchnorm_backward);
