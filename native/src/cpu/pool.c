/* Max, average and adaptive-average pooling over planes [H, W]. Every loop runs over planes in
 * parallel; a plane is read and written by one thread only, so the backward passes (which add
 * into overlapping windows) need no atomics and sum in a fixed order. */
#include "common.h"

typedef struct pool_dims {
    int64_t P, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW;
} pool_dims;

/* One side's output size: floor or ceil of the window count, less the last window when it
 * would start in the padding past the end. */
static int64_t pooled_size(int64_t in, int64_t k, int64_t s, int64_t pad, int64_t dil, int ceil_mode) {
    int64_t span = in + 2 * pad - dil * (k - 1) - 1;
    int64_t out = (span + (ceil_mode ? s - 1 : 0)) / s + 1;
    if (ceil_mode && (out - 1) * s >= in + pad) out--;
    return out;
}

static pool_dims dims_of(const it_pool2d_params *p) {
    pool_dims d = {p->planes, p->height, p->width, p->kernel_h, p->kernel_w, p->stride_h, p->stride_w,
                   p->pad_h, p->pad_w, p->dilation_h, p->dilation_w, 0, 0};
    d.OH = pooled_size(d.H, d.kh, d.sh, d.ph, d.dh, p->ceil_mode);
    d.OW = pooled_size(d.W, d.kw, d.sw, d.pw, d.dw, p->ceil_mode);
    return d;
}

static it_status check_pool(const char *fn, it_device device, it_dtype dtype, const it_pool2d_params *p,
                            int average) {
    IT_CHECK_DEVICE(device, fn);
    IT_CHECK_PTR(p, fn);
    IT_REQUIRE(dtype == IT_FLOAT32, IT_ERR_NOT_SUPPORTED,
               "%s: dtype %s is not supported (float32 only)", fn, it_dtype_name(dtype));
    IT_CHECK_SIZE(p->planes, fn);
    const int64_t positive[] = {p->height, p->width, p->kernel_h, p->kernel_w, p->stride_h, p->stride_w,
                                p->dilation_h, p->dilation_w};
    static const char *names[] = {"height", "width", "kernel_h", "kernel_w", "stride_h", "stride_w",
                                  "dilation_h", "dilation_w"};
    for (int i = 0; i < 8; i++)
        IT_CHECK_ARG(positive[i] > 0 && positive[i] <= IT_MAX_ELEMENTS,
                     "%s: %s must be in [1, 2^58], got %lld", fn, names[i], (long long)positive[i]);
    IT_CHECK_FLAG(p->ceil_mode, fn);
    IT_CHECK_ARG(p->pad_h >= 0 && p->pad_w >= 0 && p->pad_h <= p->kernel_h / 2 && p->pad_w <= p->kernel_w / 2,
                 "%s: padding (%lld, %lld) must be >= 0 and at most half the kernel (%lld, %lld)", fn,
                 (long long)p->pad_h, (long long)p->pad_w, (long long)p->kernel_h, (long long)p->kernel_w);
    IT_CHECK_ARG(!average || (p->dilation_h == 1 && p->dilation_w == 1),
                 "%s: average pooling takes no dilation, got (%lld, %lld)", fn, (long long)p->dilation_h,
                 (long long)p->dilation_w);
    IT_CHECK_PRODUCT(fn, p->planes, p->height, p->width);
    IT_CHECK_PRODUCT(fn, p->dilation_h, p->kernel_h);
    IT_CHECK_PRODUCT(fn, p->dilation_w, p->kernel_w);
    IT_CHECK_ARG(p->height + 2 * p->pad_h >= p->dilation_h * (p->kernel_h - 1) + 1 &&
                 p->width + 2 * p->pad_w >= p->dilation_w * (p->kernel_w - 1) + 1,
                 "%s: the (dilated) window is larger than the padded input %lld x %lld", fn,
                 (long long)(p->height + 2 * p->pad_h), (long long)(p->width + 2 * p->pad_w));
    return IT_OK;
}

/* ---- max pooling --------------------------------------------------------------------------- */
static void max_pool_plane(float *y, int64_t *idx, const float *x, const pool_dims *d) {
    for (int64_t oy = 0; oy < d->OH; oy++)
        for (int64_t ox = 0; ox < d->OW; ox++) {
            float best = -INFINITY;
            int64_t at = -1;
            for (int64_t ki = 0; ki < d->kh; ki++) {
                int64_t iy = oy * d->sh - d->ph + ki * d->dh;
                if (iy < 0 || iy >= d->H) continue;
                for (int64_t kj = 0; kj < d->kw; kj++) {
                    int64_t ix = ox * d->sw - d->pw + kj * d->dw;
                    if (ix < 0 || ix >= d->W) continue;
                    float v = x[iy * d->W + ix];
                    if (at < 0 || v > best || isnan(v)) {
                        best = v;
                        at = iy * d->W + ix;
                        if (isnan(v)) goto found;  /* NaN wins: the first one is kept */
                    }
                }
            }
        found:
            y[oy * d->OW + ox] = best;
            idx[oy * d->OW + ox] = at;
        }
}

it_status it_max_pool2d_forward(it_device device, it_dtype dtype, void *out, int64_t *indices,
                                const void *inp, const it_pool2d_params *params) {
    const char *fn = "it_max_pool2d_forward";
    IT_TRY(check_pool(fn, device, dtype, params, 0));
    if (params->planes == 0) return IT_OK;
    IT_CHECK_ARG(out && indices && inp, "%s: NULL pointer", fn);
    IT_DISPATCH(max_pool2d_forward, device, dtype, out, indices, inp, params);
    pool_dims d = dims_of(params);
#pragma omp parallel for schedule(static) if (d.P * d.H * d.W > 32768)
    for (int64_t p = 0; p < d.P; p++)
        max_pool_plane((float *)out + p * d.OH * d.OW, indices + p * d.OH * d.OW,
                       (const float *)inp + p * d.H * d.W, &d);
    return IT_OK;
}

it_status it_max_pool2d_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                                 const int64_t *indices, const it_pool2d_params *params) {
    const char *fn = "it_max_pool2d_backward";
    IT_TRY(check_pool(fn, device, dtype, params, 0));
    if (params->planes == 0) return IT_OK;
    IT_CHECK_ARG(dinp && indices && dout, "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(dinp, dout, fn);
    IT_DISPATCH(max_pool2d_backward, device, dtype, dinp, dout, indices, params);
    pool_dims d = dims_of(params);
    int64_t HW = d.H * d.W, OL = d.OH * d.OW, bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad) if (d.P * HW > 32768)
    for (int64_t p = 0; p < d.P; p++) {
        float *dx = (float *)dinp + p * HW;
        const float *dy = (const float *)dout + p * OL;
        const int64_t *at = indices + p * OL;
        memset(dx, 0, (size_t)HW * sizeof(float));
        for (int64_t o = 0; o < OL; o++) {
            if (at[o] < 0 || at[o] >= HW) bad++;
            else dx[at[o]] += dy[o];
        }
    }
    IT_REQUIRE(!bad, IT_ERR_INDEX_OUT_OF_RANGE, "%s: %lld indices outside their plane of %lld pixels", fn,
               (long long)bad, (long long)HW);
    return IT_OK;
}

/* ---- average pooling ----------------------------------------------------------------------- */
/* The window of output o along one side, clipped to the input, and its divisor's share: the
 * window clipped to the padded input with count_include_pad, else to the input. */
static void window(int64_t o, int64_t s, int64_t pad, int64_t k, int64_t in, int include_pad,
                   int64_t *start, int64_t *end, int64_t *count) {
    int64_t a = o * s - pad, b = a + k;
    if (b > in + pad) b = in + pad;
    int64_t padded = b - a;
    *start = a < 0 ? 0 : a;
    *end = b > in ? in : b;
    *count = include_pad ? padded : *end - *start;
}

static void avg_pool_plane(float *y, const float *x, const pool_dims *d, int include_pad) {
    for (int64_t oy = 0; oy < d->OH; oy++) {
        int64_t y0, y1, ny;
        window(oy, d->sh, d->ph, d->kh, d->H, include_pad, &y0, &y1, &ny);
        for (int64_t ox = 0; ox < d->OW; ox++) {
            int64_t x0, x1, nx;
            window(ox, d->sw, d->pw, d->kw, d->W, include_pad, &x0, &x1, &nx);
            float s = 0.0f;
            for (int64_t iy = y0; iy < y1; iy++)
                for (int64_t ix = x0; ix < x1; ix++) s += x[iy * d->W + ix];
            y[oy * d->OW + ox] = ny * nx > 0 ? s / (float)(ny * nx) : 0.0f;
        }
    }
}

static void avg_pool_backward_plane(float *dx, const float *dy, const pool_dims *d, int include_pad) {
    memset(dx, 0, (size_t)(d->H * d->W) * sizeof(float));
    for (int64_t oy = 0; oy < d->OH; oy++) {
        int64_t y0, y1, ny;
        window(oy, d->sh, d->ph, d->kh, d->H, include_pad, &y0, &y1, &ny);
        for (int64_t ox = 0; ox < d->OW; ox++) {
            int64_t x0, x1, nx;
            window(ox, d->sw, d->pw, d->kw, d->W, include_pad, &x0, &x1, &nx);
            if (ny * nx == 0) continue;
            float g = dy[oy * d->OW + ox] / (float)(ny * nx);
            for (int64_t iy = y0; iy < y1; iy++)
                for (int64_t ix = x0; ix < x1; ix++) dx[iy * d->W + ix] += g;
        }
    }
}

it_status it_avg_pool2d_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                                const it_pool2d_params *params, int32_t count_include_pad) {
    const char *fn = "it_avg_pool2d_forward";
    IT_TRY(check_pool(fn, device, dtype, params, 1));
    IT_CHECK_FLAG(count_include_pad, fn);
    if (params->planes == 0) return IT_OK;
    IT_CHECK_ARG(out && inp, "%s: NULL pointer", fn);
    IT_DISPATCH(avg_pool2d_forward, device, dtype, out, inp, params, count_include_pad);
    pool_dims d = dims_of(params);
#pragma omp parallel for schedule(static) if (d.P * d.H * d.W > 32768)
    for (int64_t p = 0; p < d.P; p++)
        avg_pool_plane((float *)out + p * d.OH * d.OW, (const float *)inp + p * d.H * d.W, &d, count_include_pad);
    return IT_OK;
}

it_status it_avg_pool2d_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                                 const it_pool2d_params *params, int32_t count_include_pad) {
    const char *fn = "it_avg_pool2d_backward";
    IT_TRY(check_pool(fn, device, dtype, params, 1));
    IT_CHECK_FLAG(count_include_pad, fn);
    if (params->planes == 0) return IT_OK;
    IT_CHECK_ARG(dinp && dout, "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(dinp, dout, fn);
    IT_DISPATCH(avg_pool2d_backward, device, dtype, dinp, dout, params, count_include_pad);
    pool_dims d = dims_of(params);
#pragma omp parallel for schedule(static) if (d.P * d.H * d.W > 32768)
    for (int64_t p = 0; p < d.P; p++)
        avg_pool_backward_plane((float *)dinp + p * d.H * d.W, (const float *)dout + p * d.OH * d.OW, &d,
                                count_include_pad);
    return IT_OK;
}

/* ---- adaptive average pooling -------------------------------------------------------------- */
static inline int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return o * in / out; }
static inline int64_t adaptive_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

static it_status check_adaptive(const char *fn, it_device device, it_dtype dtype, int64_t planes, int64_t H,
                                int64_t W, int64_t OH, int64_t OW) {
    IT_CHECK_DEVICE(device, fn);
    IT_REQUIRE(dtype == IT_FLOAT32, IT_ERR_NOT_SUPPORTED,
               "%s: dtype %s is not supported (float32 only)", fn, it_dtype_name(dtype));
    IT_CHECK_SIZE(planes, fn);
    IT_CHECK_ARG(H > 0 && W > 0 && OH > 0 && OW > 0 && H <= IT_MAX_ELEMENTS && W <= IT_MAX_ELEMENTS &&
                 OH <= IT_MAX_ELEMENTS && OW <= IT_MAX_ELEMENTS,
                 "%s: sizes must be in [1, 2^58], got input %lld x %lld, output %lld x %lld", fn, (long long)H,
                 (long long)W, (long long)OH, (long long)OW);
    IT_CHECK_PRODUCT(fn, planes, H, W);
    IT_CHECK_PRODUCT(fn, planes, OH, OW);
    IT_CHECK_PRODUCT(fn, H, OH);  /* o * in in the window bounds */
    IT_CHECK_PRODUCT(fn, W, OW);
    return IT_OK;
}

it_status it_adaptive_avg_pool2d_forward(it_device device, it_dtype dtype, void *out,
                                         const void *inp, int64_t planes, int64_t height,
                                         int64_t width, int64_t out_h, int64_t out_w) {
    const char *fn = "it_adaptive_avg_pool2d_forward";
    IT_TRY(check_adaptive(fn, device, dtype, planes, height, width, out_h, out_w));
    if (planes == 0) return IT_OK;
    IT_CHECK_ARG(out && inp, "%s: NULL pointer", fn);
    IT_DISPATCH(adaptive_avg_pool2d_forward, device, dtype, out, inp, planes, height, width, out_h, out_w);
#pragma omp parallel for schedule(static) if (planes * height * width > 32768)
    for (int64_t p = 0; p < planes; p++) {
        const float *x = (const float *)inp + p * height * width;
        float *y = (float *)out + p * out_h * out_w;
        for (int64_t oy = 0; oy < out_h; oy++) {
            int64_t y0 = adaptive_start(oy, height, out_h), y1 = adaptive_end(oy, height, out_h);
            for (int64_t ox = 0; ox < out_w; ox++) {
                int64_t x0 = adaptive_start(ox, width, out_w), x1 = adaptive_end(ox, width, out_w);
                float s = 0.0f;
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++) s += x[iy * width + ix];
                y[oy * out_w + ox] = s / (float)((y1 - y0) * (x1 - x0));
            }
        }
    }
    return IT_OK;
}

it_status it_adaptive_avg_pool2d_backward(it_device device, it_dtype dtype, void *dinp,
                                          const void *dout, int64_t planes, int64_t height,
                                          int64_t width, int64_t out_h, int64_t out_w) {
    const char *fn = "it_adaptive_avg_pool2d_backward";
    IT_TRY(check_adaptive(fn, device, dtype, planes, height, width, out_h, out_w));
    if (planes == 0) return IT_OK;
    IT_CHECK_ARG(dinp && dout, "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(dinp, dout, fn);
    IT_DISPATCH(adaptive_avg_pool2d_backward, device, dtype, dinp, dout, planes, height, width, out_h, out_w);
#pragma omp parallel for schedule(static) if (planes * height * width > 32768)
    for (int64_t p = 0; p < planes; p++) {
        float *dx = (float *)dinp + p * height * width;
        const float *dy = (const float *)dout + p * out_h * out_w;
        memset(dx, 0, (size_t)(height * width) * sizeof(float));
        for (int64_t oy = 0; oy < out_h; oy++) {
            int64_t y0 = adaptive_start(oy, height, out_h), y1 = adaptive_end(oy, height, out_h);
            for (int64_t ox = 0; ox < out_w; ox++) {
                int64_t x0 = adaptive_start(ox, width, out_w), x1 = adaptive_end(ox, width, out_w);
                float g = dy[oy * out_w + ox] / (float)((y1 - y0) * (x1 - x0));
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++) dx[iy * width + ix] += g;
            }
        }
    }
    return IT_OK;
}
