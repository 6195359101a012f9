// 2-D convolution, the twin of cpu/conv.c, as direct kernels (float32; libinfinitrain has
// refused other dtypes): one thread per output value forward, one per input pixel for the input
// gradient (gathering the outputs whose window reads it), one block per weight for the weight
// gradient and one per output channel for the bias gradient, each summing in a fixed order: no
// atomics, so the same bits on every run. Direct kernels are simple and right for the small
// layers they serve; an im2col + cuBLAS path would be the step for large ones.
#include "common.cuh"

namespace {

struct Conv {
    int64_t N, C, H, W, Co, kh, kw, sh, sw, ph, pw, dh, dw, G, Cg, Cog, OH, OW;
};

Conv conv_of(const it_conv2d_params *p) {
    Conv d{p->batch, p->in_channels, p->height, p->width, p->out_channels, p->kernel_h, p->kernel_w,
           p->stride_h, p->stride_w, p->pad_h, p->pad_w, p->dilation_h, p->dilation_w, p->groups, 0, 0, 0, 0};
    d.Cg = d.C / d.G;
    d.Cog = d.Co / d.G;
    d.OH = (d.H + 2 * d.ph - d.dh * (d.kh - 1) - 1) / d.sh + 1;
    d.OW = (d.W + 2 * d.pw - d.dw * (d.kw - 1) - 1) / d.sw + 1;
    return d;
}

// out[n, o, oy, ox] = bias[o] + sum over the group's channels and the kernel taps
__global__ void conv_fwd(float *out, const float *x, const float *w, const float *bias, Conv d) {
    GRID_STRIDE(e, d.N * d.Co * d.OH * d.OW) {
        int64_t ox = e % d.OW, oy = e / d.OW % d.OH, o = e / (d.OW * d.OH) % d.Co, n = e / (d.OW * d.OH * d.Co);
        int64_t g = o / d.Cog;
        float s = bias ? bias[o] : 0.0f;
        for (int64_t c = 0; c < d.Cg; c++) {
            const float *plane = x + (n * d.C + g * d.Cg + c) * d.H * d.W;
            const float *taps = w + (o * d.Cg + c) * d.kh * d.kw;
            for (int64_t ki = 0; ki < d.kh; ki++) {
                int64_t iy = oy * d.sh - d.ph + ki * d.dh;
                if (iy < 0 || iy >= d.H) continue;
                for (int64_t kj = 0; kj < d.kw; kj++) {
                    int64_t ix = ox * d.sw - d.pw + kj * d.dw;
                    if (ix >= 0 && ix < d.W) s += plane[iy * d.W + ix] * taps[ki * d.kw + kj];
                }
            }
        }
        out[e] = s;
    }
}

// dx[n, c, iy, ix] = sum over the outputs whose window puts tap (ki, kj) on this pixel:
// oy = (iy + ph - ki dh) / sh when that divides exactly and lands inside the output
__global__ void conv_bwd_input(float *dx, const float *dout, const float *w, Conv d) {
    GRID_STRIDE(e, d.N * d.C * d.H * d.W) {
        int64_t ix = e % d.W, iy = e / d.W % d.H, c = e / (d.W * d.H) % d.C, n = e / (d.W * d.H * d.C);
        int64_t g = c / d.Cg, cg = c % d.Cg;
        float s = 0.0f;
        for (int64_t ki = 0; ki < d.kh; ki++) {
            int64_t ty = iy + d.ph - ki * d.dh;
            if (ty < 0 || ty % d.sh || ty / d.sh >= d.OH) continue;
            for (int64_t kj = 0; kj < d.kw; kj++) {
                int64_t tx = ix + d.pw - kj * d.dw;
                if (tx < 0 || tx % d.sw || tx / d.sw >= d.OW) continue;
                int64_t at = (ty / d.sh) * d.OW + tx / d.sw;
                for (int64_t og = 0; og < d.Cog; og++) {
                    int64_t o = g * d.Cog + og;
                    s += dout[(n * d.Co + o) * d.OH * d.OW + at] * w[((o * d.Cg + cg) * d.kh + ki) * d.kw + kj];
                }
            }
        }
        dx[e] = s;
    }
}

// dw[o, c, ki, kj] = sum over samples and outputs of dout * the pixel the tap saw (one block each)
__global__ void conv_bwd_weight(float *dw, const float *dout, const float *x, Conv d) {
    int64_t L = d.OH * d.OW;
    for (int64_t e = blockIdx.x; e < d.Co * d.Cg * d.kh * d.kw; e += gridDim.x) {
        int64_t kj = e % d.kw, ki = e / d.kw % d.kh, c = e / (d.kw * d.kh) % d.Cg, o = e / (d.kw * d.kh * d.Cg);
        int64_t g = o / d.Cog;
        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < d.N * L; j += blockDim.x) {
            int64_t n = j / L, oy = j % L / d.OW, ox = j % d.OW;
            int64_t iy = oy * d.sh - d.ph + ki * d.dh, ix = ox * d.sw - d.pw + kj * d.dw;
            if (iy >= 0 && iy < d.H && ix >= 0 && ix < d.W)
                s += dout[(n * d.Co + o) * L + oy * d.OW + ox] * x[((n * d.C + g * d.Cg + c) * d.H + iy) * d.W + ix];
        }
        s = block_sum(s);
        if (threadIdx.x == 0) dw[e] = s;
    }
}

__global__ void conv_bwd_bias(float *db, const float *dout, Conv d) {
    int64_t L = d.OH * d.OW;
    for (int64_t o = blockIdx.x; o < d.Co; o += gridDim.x) {
        float s = 0.0f;
        for (int64_t j = threadIdx.x; j < d.N * L; j += blockDim.x) s += dout[(j / L * d.Co + o) * L + j % L];
        s = block_sum(s);
        if (threadIdx.x == 0) db[o] = s;
    }
}

unsigned int item_blocks(int64_t n) { return (unsigned int)(n < 65535 * 32 ? (n > 0 ? n : 1) : 65535 * 32); }

}  // namespace

extern "C" {

it_status it_cuda_conv2d_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                                 const void *weight, const void *bias, const it_conv2d_params *params) {
    Conv d = conv_of(params);
    if (d.N == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    conv_fwd<<<it_blocks(d.N * d.Co * d.OH * d.OW), IT_THREADS, 0, s>>>(
        (float *)out, (const float *)inp, (const float *)weight, (const float *)bias, d);
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_conv2d_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                                  void *dbias, const void *dout, const void *inp, const void *weight,
                                  const it_conv2d_params *params) {
    Conv d = conv_of(params);
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    if (dinp && d.N) {
        conv_bwd_input<<<it_blocks(d.N * d.C * d.H * d.W), IT_THREADS, 0, s>>>(
            (float *)dinp, (const float *)dout, (const float *)weight, d);
        CU_LAUNCHED();
    }
    if (dweight) {  // with no samples: zeros (the sums are empty)
        conv_bwd_weight<<<item_blocks(d.Co * d.Cg * d.kh * d.kw), IT_THREADS, 0, s>>>(
            (float *)dweight, (const float *)dout, (const float *)inp, d);
        CU_LAUNCHED();
    }
    if (dbias) {
        conv_bwd_bias<<<item_blocks(d.Co), IT_THREADS, 0, s>>>((float *)dbias, (const float *)dout, d);
        CU_LAUNCHED();
    }
    return IT_OK;
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(conv2d_forward);
IT_CUDA_MIRRORS(conv2d_backward);
