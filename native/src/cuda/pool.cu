// Max, average and adaptive-average pooling, the twins of cpu/pool.c (float32). Forward: one
// thread per output value. Backward: one thread per input pixel, gathering from the outputs
// whose window covers it (in output order), so that overlapping windows need no atomics.
#include "common.cuh"

namespace {

struct Pool {
    int64_t P, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
};

int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t dil, int ceil_mode) {
    int64_t out = (in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? s - 1 : 0)) / s + 1;
    if (ceil_mode && (out - 1) * s >= in + pad) out--;
    return out;
}

Pool pool_of(const it_pool2d_params *p) {
    return Pool{p->planes, p->height, p->width, p->kernel_h, p->kernel_w, p->stride_h, p->stride_w, p->pad_h,
                p->pad_w, p->dilation_h, p->dilation_w,
                pooled_size(p->height, p->kernel_h, p->stride_h, p->pad_h, p->dilation_h, p->ceil_mode),
                pooled_size(p->width, p->kernel_w, p->stride_w, p->pad_w, p->dilation_w, p->ceil_mode)};
}

// The outputs along one side whose window (start o*s - pad, taps every dil, k of them) can cover
// input position i: [lo, hi], clipped to the output.
__device__ void covering(int64_t i, int64_t k, int64_t s, int64_t pad, int64_t dil, int64_t out, int64_t *lo,
                         int64_t *hi) {
    int64_t last = i + pad, first = i + pad - dil * (k - 1);  // window starts (+pad) that can reach i
    *lo = first <= 0 ? 0 : (first + s - 1) / s;
    *hi = last / s < out - 1 ? last / s : out - 1;
}

__global__ void max_pool_fwd(float *out, int64_t *idx, const float *x, Pool d) {
    GRID_STRIDE(e, d.P * d.OH * d.OW) {
        int64_t ox = e % d.OW, oy = e / d.OW % d.OH, p = e / (d.OW * d.OH);
        const float *plane = x + p * d.H * d.W;
        float best = -INFINITY;
        int64_t at = -1;
        for (int64_t ki = 0; ki < d.kh && !(at >= 0 && isnan(best)); ki++) {
            int64_t iy = oy * d.sh - d.ph + ki * d.dh;
            if (iy < 0 || iy >= d.H) continue;
            for (int64_t kj = 0; kj < d.kw; kj++) {
                int64_t ix = ox * d.sw - d.pw + kj * d.dw;
                if (ix < 0 || ix >= d.W) continue;
                float v = plane[iy * d.W + ix];
                if (at < 0 || v > best || isnan(v)) {
                    best = v;
                    at = iy * d.W + ix;
                    if (isnan(v)) break;  // NaN wins: the first one is kept
                }
            }
        }
        out[e] = best;
        idx[e] = at;
    }
}

// Gathers, for pixel i of its plane, every output whose recorded index is i. An index outside
// the plane is counted in *bad (reported at the host's next synchronisation).
__global__ void max_pool_bwd(float *dx, const float *dout, const int64_t *idx, Pool d, int *bad) {
    GRID_STRIDE(e, d.P * d.H * d.W) {
        int64_t i = e % (d.H * d.W), p = e / (d.H * d.W), iy = i / d.W, ix = i % d.W;
        int64_t y0, y1, x0, x1;
        covering(iy, d.kh, d.sh, d.ph, d.dh, d.OH, &y0, &y1);
        covering(ix, d.kw, d.sw, d.pw, d.dw, d.OW, &x0, &x1);
        const int64_t *at = idx + p * d.OH * d.OW;
        const float *g = dout + p * d.OH * d.OW;
        float s = 0.0f;
        for (int64_t oy = y0; oy <= y1; oy++)
            for (int64_t ox = x0; ox <= x1; ox++)
                if (at[oy * d.OW + ox] == i) s += g[oy * d.OW + ox];
        dx[e] = s;
        if (ix == 0 && iy == 0)  // one thread per plane checks its indices
            for (int64_t o = 0; o < d.OH * d.OW; o++)
                if (at[o] < 0 || at[o] >= d.H * d.W) *bad = 1;
    }
}

// One side of an average window: [start, end) inside the input and its share of the divisor.
__device__ void window(int64_t o, int64_t s, int64_t pad, int64_t k, int64_t in, int include_pad, int64_t *start,
                       int64_t *end, int64_t *count) {
    int64_t a = o * s - pad, b = a + k < in + pad ? a + k : in + pad;
    *start = a < 0 ? 0 : a;
    *end = b > in ? in : b;
    *count = include_pad ? b - a : *end - *start;
}

__global__ void avg_pool_fwd(float *out, const float *x, Pool d, int include_pad) {
    GRID_STRIDE(e, d.P * d.OH * d.OW) {
        int64_t ox = e % d.OW, oy = e / d.OW % d.OH, p = e / (d.OW * d.OH);
        int64_t y0, y1, ny, x0, x1, nx;
        window(oy, d.sh, d.ph, d.kh, d.H, include_pad, &y0, &y1, &ny);
        window(ox, d.sw, d.pw, d.kw, d.W, include_pad, &x0, &x1, &nx);
        const float *plane = x + p * d.H * d.W;
        float s = 0.0f;
        for (int64_t iy = y0; iy < y1; iy++)
            for (int64_t ix = x0; ix < x1; ix++) s += plane[iy * d.W + ix];
        out[e] = ny * nx > 0 ? s / (float)(ny * nx) : 0.0f;
    }
}

__global__ void avg_pool_bwd(float *dx, const float *dout, Pool d, int include_pad) {
    GRID_STRIDE(e, d.P * d.H * d.W) {
        int64_t ix = e % d.W, iy = e / d.W % d.H, p = e / (d.W * d.H);
        int64_t y0, y1, x0, x1;
        covering(iy, d.kh, d.sh, d.ph, 1, d.OH, &y0, &y1);
        covering(ix, d.kw, d.sw, d.pw, 1, d.OW, &x0, &x1);
        const float *g = dout + p * d.OH * d.OW;
        float s = 0.0f;
        for (int64_t oy = y0; oy <= y1; oy++) {
            int64_t a0, a1, ny;
            window(oy, d.sh, d.ph, d.kh, d.H, include_pad, &a0, &a1, &ny);
            if (iy < a0 || iy >= a1) continue;
            for (int64_t ox = x0; ox <= x1; ox++) {
                int64_t b0, b1, nx;
                window(ox, d.sw, d.pw, d.kw, d.W, include_pad, &b0, &b1, &nx);
                if (ix >= b0 && ix < b1 && ny * nx > 0) s += g[oy * d.OW + ox] / (float)(ny * nx);
            }
        }
        dx[e] = s;
    }
}

__device__ int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return o * in / out; }
__device__ int64_t adaptive_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

__global__ void adaptive_fwd(float *out, const float *x, int64_t P, int64_t H, int64_t W, int64_t OH, int64_t OW) {
    GRID_STRIDE(e, P * OH * OW) {
        int64_t ox = e % OW, oy = e / OW % OH, p = e / (OW * OH);
        int64_t y0 = adaptive_start(oy, H, OH), y1 = adaptive_end(oy, H, OH);
        int64_t x0 = adaptive_start(ox, W, OW), x1 = adaptive_end(ox, W, OW);
        float s = 0.0f;
        for (int64_t iy = y0; iy < y1; iy++)
            for (int64_t ix = x0; ix < x1; ix++) s += x[(p * H + iy) * W + ix];
        out[e] = s / (float)((y1 - y0) * (x1 - x0));
    }
}

// The outputs whose window holds input row i: o with start(o) <= i < end(o), a contiguous run
// found from i's position scaled to the output.
__global__ void adaptive_bwd(float *dx, const float *dout, int64_t P, int64_t H, int64_t W, int64_t OH, int64_t OW) {
    GRID_STRIDE(e, P * H * W) {
        int64_t ix = e % W, iy = e / W % H, p = e / (W * H);
        int64_t y0 = iy * OH / H, x0 = ix * OW / W;
        float s = 0.0f;
        for (int64_t oy = y0 > 0 ? y0 - 1 : 0; oy < OH && adaptive_start(oy, H, OH) <= iy; oy++) {
            int64_t a0 = adaptive_start(oy, H, OH), a1 = adaptive_end(oy, H, OH);
            if (iy < a0 || iy >= a1) continue;
            for (int64_t ox = x0 > 0 ? x0 - 1 : 0; ox < OW && adaptive_start(ox, W, OW) <= ix; ox++) {
                int64_t b0 = adaptive_start(ox, W, OW), b1 = adaptive_end(ox, W, OW);
                if (ix >= b0 && ix < b1) s += dout[(p * OH + oy) * OW + ox] / (float)((a1 - a0) * (b1 - b0));
            }
        }
        dx[e] = s;
    }
}

}  // namespace

extern "C" {

it_status it_cuda_max_pool2d_forward(it_device device, it_dtype dtype, void *out, int64_t *indices,
                                     const void *inp, const it_pool2d_params *params) {
    Pool d = pool_of(params);
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    max_pool_fwd<<<it_blocks(d.P * d.OH * d.OW), IT_THREADS, 0, s>>>((float *)out, indices, (const float *)inp, d);
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_max_pool2d_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                                      const int64_t *indices, const it_pool2d_params *params) {
    Pool d = pool_of(params);
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    max_pool_bwd<<<it_blocks(d.P * d.H * d.W), IT_THREADS, 0, s>>>((float *)dinp, (const float *)dout, indices, d,
                                                                    bad);
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_avg_pool2d_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                                     const it_pool2d_params *params, int32_t count_include_pad) {
    Pool d = pool_of(params);
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    avg_pool_fwd<<<it_blocks(d.P * d.OH * d.OW), IT_THREADS, 0, s>>>((float *)out, (const float *)inp, d,
                                                                      count_include_pad);
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_avg_pool2d_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                                      const it_pool2d_params *params, int32_t count_include_pad) {
    Pool d = pool_of(params);
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    avg_pool_bwd<<<it_blocks(d.P * d.H * d.W), IT_THREADS, 0, s>>>((float *)dinp, (const float *)dout, d,
                                                                    count_include_pad);
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_adaptive_avg_pool2d_forward(it_device device, it_dtype dtype, void *out,
                                              const void *inp, int64_t planes, int64_t height,
                                              int64_t width, int64_t out_h, int64_t out_w) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    adaptive_fwd<<<it_blocks(planes * out_h * out_w), IT_THREADS, 0, s>>>((float *)out, (const float *)inp, planes,
                                                                           height, width, out_h, out_w);
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_adaptive_avg_pool2d_backward(it_device device, it_dtype dtype, void *dinp,
                                               const void *dout, int64_t planes, int64_t height,
                                               int64_t width, int64_t out_h, int64_t out_w) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    adaptive_bwd<<<it_blocks(planes * height * width), IT_THREADS, 0, s>>>((float *)dinp, (const float *)dout,
                                                                            planes, height, width, out_h, out_w);
    CU_LAUNCHED();
    return IT_OK;
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(max_pool2d_forward);
IT_CUDA_MIRRORS(max_pool2d_backward);
IT_CUDA_MIRRORS(avg_pool2d_forward);
IT_CUDA_MIRRORS(avg_pool2d_backward);
IT_CUDA_MIRRORS(adaptive_avg_pool2d_forward);
IT_CUDA_MIRRORS(adaptive_avg_pool2d_backward);
