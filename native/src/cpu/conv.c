/* 2-D convolution as im2col + sgemm (depthwise layers: direct loops over the taps). The columns of several samples are laid side by side
 * (a block of `nb` samples, as many as fit a scratch budget), so that each group's product is
 * one large sgemm: out[g] [Cout/G, nb*L] = W[g] [Cout/G, K] @ col [K, nb*L], where K = Cin/G *
 * kh * kw and L = out_h * out_w. The weight gradient accumulates over the blocks in batch
 * order and the bias gradient sums each channel in batch order: the same result for any
 * thread count. OpenMP runs the copies (im2col, col2im, the shuffles between the product's
 * layout and NCHW); sgemm threads itself. */
#include "common.h"

#define COL_BUDGET ((int64_t)1 << 23) /* floats of scratch per block (32 MB) */
#define SKINNY ((int64_t)1 << 16)     /* a weight gradient with fewer outputs runs sgemm on one thread */

typedef struct conv_dims {
    int64_t N, C, H, W, Co, kh, kw, sh, sw, ph, pw, dh, dw, G;
    int64_t Cg, Cog, OH, OW, L, K; /* per-group channels, output size, column rows */
} conv_dims;

static conv_dims dims_of(const it_conv2d_params *p) {
    conv_dims d = {p->batch, p->in_channels, p->height, p->width, p->out_channels, p->kernel_h,
                   p->kernel_w, p->stride_h, p->stride_w, p->pad_h, p->pad_w, p->dilation_h,
                   p->dilation_w, p->groups, 0, 0, 0, 0, 0, 0};
    d.Cg = d.C / d.G;
    d.Cog = d.Co / d.G;
    d.OH = (d.H + 2 * d.ph - d.dh * (d.kh - 1) - 1) / d.sh + 1;
    d.OW = (d.W + 2 * d.pw - d.dw * (d.kw - 1) - 1) / d.sw + 1;
    d.L = d.OH * d.OW;
    d.K = d.Cg * d.kh * d.kw;
    return d;
}

/* Every size of a conv2d call: each in range, their products bounded, the output at least
 * 1 x 1. Shared with the CUDA library through the entry points below. */
static it_status check_conv(const char *fn, it_device device, it_dtype dtype,
                            const it_conv2d_params *p) {
    IT_CHECK_DEVICE(device, fn);
    IT_CHECK_PTR(p, fn);
    IT_REQUIRE(dtype == IT_FLOAT32, IT_ERR_NOT_SUPPORTED,
               "%s: dtype %s is not supported (float32 only)", fn, it_dtype_name(dtype));
    IT_CHECK_SIZE(p->batch, fn);
    const int64_t positive[] = {p->in_channels, p->height, p->width, p->out_channels, p->kernel_h,
                                p->kernel_w, p->stride_h, p->stride_w, p->dilation_h,
                                p->dilation_w, p->groups};
    static const char *names[] = {"in_channels", "height", "width", "out_channels", "kernel_h",
                                  "kernel_w", "stride_h", "stride_w", "dilation_h",
                                  "dilation_w", "groups"};
    for (int i = 0; i < 11; i++)
        IT_CHECK_ARG(positive[i] > 0 && positive[i] <= IT_MAX_ELEMENTS,
                     "%s: %s must be in [1, 2^58], got %lld", fn, names[i], (long long)positive[i]);
    IT_CHECK_ARG(p->pad_h >= 0 && p->pad_w >= 0 && p->pad_h <= IT_MAX_ELEMENTS &&
                 p->pad_w <= IT_MAX_ELEMENTS, "%s: padding must be in [0, 2^58], got (%lld, %lld)",
                 fn, (long long)p->pad_h, (long long)p->pad_w);
    IT_CHECK_ARG(p->in_channels % p->groups == 0 && p->out_channels % p->groups == 0,
                 "%s: in_channels %lld and out_channels %lld must both be divisible by groups %lld",
                 fn, (long long)p->in_channels, (long long)p->out_channels, (long long)p->groups);
    IT_CHECK_PRODUCT(fn, p->batch, p->in_channels, p->height, p->width);
    IT_CHECK_PRODUCT(fn, p->out_channels, p->in_channels, p->kernel_h, p->kernel_w);
    IT_CHECK_PRODUCT(fn, p->dilation_h, p->kernel_h);
    IT_CHECK_PRODUCT(fn, p->dilation_w, p->kernel_w);
    conv_dims d = dims_of(p);
    IT_CHECK_ARG(d.H + 2 * d.ph - d.dh * (d.kh - 1) - 1 >= 0 && d.W + 2 * d.pw - d.dw * (d.kw - 1) - 1 >= 0,
                 "%s: the (dilated) kernel %lld x %lld is larger than the padded input %lld x %lld", fn,
                 (long long)(d.dh * (d.kh - 1) + 1), (long long)(d.dw * (d.kw - 1) + 1),
                 (long long)(d.H + 2 * d.ph), (long long)(d.W + 2 * d.pw));
    IT_CHECK_PRODUCT(fn, p->batch, p->out_channels, d.OH, d.OW);
    IT_CHECK_PRODUCT(fn, d.K, d.L); /* one sample's columns */
    return IT_OK;
}

/* Samples per block: as many as fit the budget with their columns and outputs, at least one. */
static int64_t block_samples(const conv_dims *d) {
    int64_t per = (d->K + d->Cog) * d->L;
    int64_t nb = per > 0 ? COL_BUDGET / per : d->N;
    return nb < 1 ? 1 : (nb > d->N ? d->N : nb);
}

/* col [K, nb*L]: row (c, ki, kj), column (n, oy, ox) holds the input pixel the kernel tap
 * (ki, kj) of channel c of group g sees at output (oy, ox) of sample n0 + n (0 in padding). */
static void im2col(float *col, const float *x, const conv_dims *d, int64_t n0, int64_t nb, int64_t g) {
    int64_t width = nb * d->L;
#pragma omp parallel for collapse(2) schedule(static) if (d->K * width > 32768)
    for (int64_t r = 0; r < d->K; r++) {
        for (int64_t n = 0; n < nb; n++) {
            int64_t c = r / (d->kh * d->kw), ki = r / d->kw % d->kh, kj = r % d->kw;
            const float *plane = x + ((n0 + n) * d->C + g * d->Cg + c) * d->H * d->W;
            float *dst = col + r * width + n * d->L;
            for (int64_t oy = 0; oy < d->OH; oy++) {
                int64_t iy = oy * d->sh - d->ph + ki * d->dh;
                float *row = dst + oy * d->OW;
                if (iy < 0 || iy >= d->H) {
                    memset(row, 0, (size_t)d->OW * sizeof(float));
                    continue;
                }
                for (int64_t ox = 0; ox < d->OW; ox++) {
                    int64_t ix = ox * d->sw - d->pw + kj * d->dw;
                    row[ox] = ix >= 0 && ix < d->W ? plane[iy * d->W + ix] : 0.0f;
                }
            }
        }
    }
}

/* The adjoint of im2col: dx[n0 + n, channels of group g] = the sum of col's entries that read
 * each pixel. Each (sample, channel) plane is written by one thread, in a fixed order. */
static void col2im(float *dx, const float *col, const conv_dims *d, int64_t n0, int64_t nb, int64_t g) {
    int64_t width = nb * d->L;
#pragma omp parallel for collapse(2) schedule(static) if (d->K * width > 32768)
    for (int64_t n = 0; n < nb; n++) {
        for (int64_t c = 0; c < d->Cg; c++) {
            float *plane = dx + ((n0 + n) * d->C + g * d->Cg + c) * d->H * d->W;
            memset(plane, 0, (size_t)(d->H * d->W) * sizeof(float));
            for (int64_t ki = 0; ki < d->kh; ki++)
                for (int64_t kj = 0; kj < d->kw; kj++) {
                    const float *src = col + ((c * d->kh + ki) * d->kw + kj) * width + n * d->L;
                    for (int64_t oy = 0; oy < d->OH; oy++) {
                        int64_t iy = oy * d->sh - d->ph + ki * d->dh;
                        if (iy < 0 || iy >= d->H) continue;
                        for (int64_t ox = 0; ox < d->OW; ox++) {
                            int64_t ix = ox * d->sw - d->pw + kj * d->dw;
                            if (ix >= 0 && ix < d->W) plane[iy * d->W + ix] += src[oy * d->OW + ox];
                        }
                    }
                }
        }
    }
}

/* Between NCHW's [n, g*Cog + o, L] and the product's layout [o, n*L] for group g. */
static void gather_group(float *dst, const float *src, const conv_dims *d, int64_t n0, int64_t nb, int64_t g) {
#pragma omp parallel for collapse(2) schedule(static) if (d->Cog * nb * d->L > 32768)
    for (int64_t o = 0; o < d->Cog; o++)
        for (int64_t n = 0; n < nb; n++)
            memcpy(dst + (o * nb + n) * d->L, src + ((n0 + n) * d->Co + g * d->Cog + o) * d->L,
                   (size_t)d->L * sizeof(float));
}

static void scatter_group(float *dst, const float *src, const float *bias, const conv_dims *d, int64_t n0,
                          int64_t nb, int64_t g) {
#pragma omp parallel for collapse(2) schedule(static) if (d->Cog * nb * d->L > 32768)
    for (int64_t o = 0; o < d->Cog; o++)
        for (int64_t n = 0; n < nb; n++) {
            float *y = dst + ((n0 + n) * d->Co + g * d->Cog + o) * d->L;
            const float *s = src + (o * nb + n) * d->L;
            float b = bias ? bias[g * d->Cog + o] : 0.0f;
            for (int64_t l = 0; l < d->L; l++) y[l] = s[l] + b;
        }
}

/* ---- depthwise (one input and one output channel per group) -------------------------------- */
/* Here each group's product is [1, 9] @ [9, L]: sgemm's call and the column copy cost more than
 * the arithmetic, so the taps run directly over each (sample, channel) plane. */
static int depthwise(const conv_dims *d) { return d->Cg == 1 && d->Cog == 1; }

/* For tap (ki, kj): the outputs [o0, o1) along one side whose input i = o s - pad + k dil is in [0, in). */
static void tap_range(int64_t k, int64_t s, int64_t pad, int64_t dil, int64_t in, int64_t out, int64_t *o0,
                      int64_t *o1) {
    int64_t off = k * dil - pad;  /* i = o s + off */
    int64_t lo = off >= 0 ? 0 : (-off + s - 1) / s, hi = in - off <= 0 ? 0 : (in - off - 1) / s + 1;
    *o0 = lo;
    *o1 = hi < out ? hi : out;
}

static void depthwise_forward(float *out, const float *x, const float *w, const float *bias, const conv_dims *d) {
#pragma omp parallel for schedule(static) if (d->N * d->C * d->L > 32768)
    for (int64_t p = 0; p < d->N * d->C; p++) {
        int64_t c = p % d->C;
        const float *plane = x + p * d->H * d->W, *taps = w + c * d->kh * d->kw;
        float *y = out + p * d->L;
        for (int64_t l = 0; l < d->L; l++) y[l] = bias ? bias[c] : 0.0f;
        for (int64_t ki = 0; ki < d->kh; ki++)
            for (int64_t kj = 0; kj < d->kw; kj++) {
                int64_t y0, y1, x0, x1;
                tap_range(ki, d->sh, d->ph, d->dh, d->H, d->OH, &y0, &y1);
                tap_range(kj, d->sw, d->pw, d->dw, d->W, d->OW, &x0, &x1);
                float t = taps[ki * d->kw + kj];
                for (int64_t oy = y0; oy < y1; oy++) {
                    const float *row = plane + (oy * d->sh - d->ph + ki * d->dh) * d->W - d->pw + kj * d->dw;
                    for (int64_t ox = x0; ox < x1; ox++) y[oy * d->OW + ox] += t * row[ox * d->sw];
                }
            }
    }
}

/* dx per (sample, channel) plane; dw per channel, samples in order */
static void depthwise_backward(float *dx, float *dw, const float *dout, const float *x, const float *w,
                               const conv_dims *d) {
    if (dx) {
#pragma omp parallel for schedule(static) if (d->N * d->C * d->L > 32768)
        for (int64_t p = 0; p < d->N * d->C; p++) {
            const float *g = dout + p * d->L, *taps = w + p % d->C * d->kh * d->kw;
            float *plane = dx + p * d->H * d->W;
            memset(plane, 0, (size_t)(d->H * d->W) * sizeof(float));
            for (int64_t ki = 0; ki < d->kh; ki++)
                for (int64_t kj = 0; kj < d->kw; kj++) {
                    int64_t y0, y1, x0, x1;
                    tap_range(ki, d->sh, d->ph, d->dh, d->H, d->OH, &y0, &y1);
                    tap_range(kj, d->sw, d->pw, d->dw, d->W, d->OW, &x0, &x1);
                    float t = taps[ki * d->kw + kj];
                    for (int64_t oy = y0; oy < y1; oy++) {
                        float *row = plane + (oy * d->sh - d->ph + ki * d->dh) * d->W - d->pw + kj * d->dw;
                        for (int64_t ox = x0; ox < x1; ox++) row[ox * d->sw] += t * g[oy * d->OW + ox];
                    }
                }
        }
    }
    if (dw) {
#pragma omp parallel for schedule(static) if (d->N * d->C * d->L > 32768)
        for (int64_t c = 0; c < d->C; c++)
            for (int64_t ki = 0; ki < d->kh; ki++)
                for (int64_t kj = 0; kj < d->kw; kj++) {
                    int64_t y0, y1, x0, x1;
                    tap_range(ki, d->sh, d->ph, d->dh, d->H, d->OH, &y0, &y1);
                    tap_range(kj, d->sw, d->pw, d->dw, d->W, d->OW, &x0, &x1);
                    double s = 0.0;
                    for (int64_t n = 0; n < d->N; n++) {
                        const float *g = dout + (n * d->C + c) * d->L, *plane = x + (n * d->C + c) * d->H * d->W;
                        float part = 0.0f;
                        for (int64_t oy = y0; oy < y1; oy++) {
                            const float *row = plane + (oy * d->sh - d->ph + ki * d->dh) * d->W - d->pw + kj * d->dw;
                            for (int64_t ox = x0; ox < x1; ox++) part += g[oy * d->OW + ox] * row[ox * d->sw];
                        }
                        s += part;
                    }
                    dw[(c * d->kh + ki) * d->kw + kj] = (float)s;
                }
    }
}

it_status it_conv2d_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                            const void *weight, const void *bias, const it_conv2d_params *params) {
    const char *fn = "it_conv2d_forward";
    IT_TRY(check_conv(fn, device, dtype, params));
    if (params->batch == 0) return IT_OK;
    IT_CHECK_ARG(out && inp && weight, "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(out, inp, fn);
    IT_DISPATCH(conv2d_forward, device, dtype, out, inp, weight, bias, params);
    conv_dims d = dims_of(params);
    if (depthwise(&d)) {
        depthwise_forward((float *)out, (const float *)inp, (const float *)weight, (const float *)bias, &d);
        return IT_OK;
    }
    int64_t nb_max = block_samples(&d);
    float *col = (float *)it_scratch_alloc((size_t)((d.K + d.Cog) * nb_max * d.L) * sizeof(float));
    IT_REQUIRE(col, IT_ERR_OUT_OF_MEMORY, "%s: out of memory for the im2col columns", fn);
    float *prod = col + d.K * nb_max * d.L;
    for (int64_t n0 = 0; n0 < d.N; n0 += nb_max) {
        int64_t nb = d.N - n0 < nb_max ? d.N - n0 : nb_max;
        for (int64_t g = 0; g < d.G; g++) {
            im2col(col, (const float *)inp, &d, n0, nb, g);
            it_sgemm(0, 0, d.Cog, nb * d.L, d.K, 1.0f, (const float *)weight + g * d.Cog * d.K, d.K, col,
                     nb * d.L, 0.0f, prod, nb * d.L);
            scatter_group((float *)out, prod, (const float *)bias, &d, n0, nb, g);
        }
    }
    it_scratch_free(col);
    return IT_OK;
}

/* dbias[o] = the sum of dout over samples and positions, samples in order. */
static void bias_grad(float *dbias, const float *dout, const conv_dims *d) {
#pragma omp parallel for schedule(static) if (d->N * d->Co * d->L > 32768)
    for (int64_t o = 0; o < d->Co; o++) {
        double s = 0.0;
        for (int64_t n = 0; n < d->N; n++) s += it_vsum(dout + (n * d->Co + o) * d->L, d->L);
        dbias[o] = (float)s;
    }
}

it_status it_conv2d_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                             void *dbias, const void *dout, const void *inp, const void *weight,
                             const it_conv2d_params *params) {
    const char *fn = "it_conv2d_backward";
    IT_TRY(check_conv(fn, device, dtype, params));
    IT_CHECK_ARG(dout && (!dinp || weight) && (!dweight || inp), "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(dinp, dout, fn);
    IT_CHECK_NO_ALIAS(dinp, weight, fn);
    IT_DISPATCH(conv2d_backward, device, dtype, dinp, dweight, dbias, dout, inp, weight, params);
    conv_dims d = dims_of(params);
    if (dweight) memset(dweight, 0, (size_t)(d.Co * d.K) * sizeof(float));
    if (dbias) {
        memset(dbias, 0, (size_t)d.Co * sizeof(float));
        if (d.N) bias_grad((float *)dbias, (const float *)dout, &d);
    }
    if (d.N == 0 || (!dinp && !dweight)) return IT_OK;
    if (depthwise(&d)) {
        depthwise_backward((float *)dinp, (float *)dweight, (const float *)dout, (const float *)inp,
                           (const float *)weight, &d);
        return IT_OK;
    }
    int64_t nb_max = block_samples(&d);
    float *col = (float *)it_scratch_alloc((size_t)((d.K + d.Cog) * nb_max * d.L) * sizeof(float));
    IT_REQUIRE(col, IT_ERR_OUT_OF_MEMORY, "%s: out of memory for the im2col columns", fn);
    float *grad = col + d.K * nb_max * d.L;
    for (int64_t n0 = 0; n0 < d.N; n0 += nb_max) {
        int64_t nb = d.N - n0 < nb_max ? d.N - n0 : nb_max, width = nb * d.L;
        for (int64_t g = 0; g < d.G; g++) {
            gather_group(grad, (const float *)dout, &d, n0, nb, g);
            if (dweight) { /* dW[g] += dout[g] [Cog, width] @ col^T [width, K] */
                im2col(col, (const float *)inp, &d, n0, nb, g);
                /* few outputs over a long sum: OpenBLAS's threads only wait on each other there
                 * (64 x 64 over 8192 took 8 ms on one thread, 800 ms on two of a busy machine) */
                int threads = d.Cog * d.K < SKINNY ? it_blas_set_threads_local(1) : 0;
                it_sgemm(0, 1, d.Cog, d.K, width, 1.0f, grad, width, col, width, 1.0f,
                         (float *)dweight + g * d.Cog * d.K, d.K);
                if (threads > 1) it_blas_set_threads_local(threads);
            }
            if (dinp) { /* dcol = W[g]^T [K, Cog] @ dout[g] [Cog, width], then back to pixels */
                it_sgemm(1, 0, d.K, width, d.Cog, 1.0f, (const float *)weight + g * d.Cog * d.K, d.K, grad,
                         width, 0.0f, col, width);
                col2im((float *)dinp, col, &d, n0, nb, g);
            }
        }
    }
    it_scratch_free(col);
    return IT_OK;
}
