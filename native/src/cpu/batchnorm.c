/* Batch normalisation of [batch, channels, spatial] per channel. A channel's statistics are
 * summed by one thread, samples in order, in double: the same result for any thread count, and
 * the variance from a second pass over (x - mean) so that a large mean costs no precision. */
#include "common.h"

static it_status check_batchnorm(const char *fn, it_device device, it_dtype dtype, int64_t batch,
                                 int64_t channels, int64_t spatial, int32_t training) {
    IT_CHECK_DEVICE(device, fn);
    IT_REQUIRE(dtype == IT_FLOAT32, IT_ERR_NOT_SUPPORTED,
               "%s: dtype %s is not supported (float32 only)", fn, it_dtype_name(dtype));
    IT_CHECK_SIZE(batch, fn);
    IT_CHECK_SIZE(spatial, fn);
    IT_CHECK_ARG(channels > 0 && channels <= IT_MAX_ELEMENTS, "%s: channels must be in [1, 2^58], got %lld", fn,
                 (long long)channels);
    IT_CHECK_FLAG(training, fn);
    IT_CHECK_PRODUCT(fn, batch, channels, spatial);
    return IT_OK;
}

/* The M = batch * spatial values of channel c: sample n's run starts at (n * C + c) * S. */
#define CHANNEL_RUN(base, n) ((base) + ((n) * C + c) * S)

it_status it_batchnorm_forward(it_device device, it_dtype dtype, void *out, float *save_mean,
                               float *save_rstd, float *running_mean, float *running_var,
                               const void *inp, const void *weight, const void *bias,
                               int64_t batch, int64_t channels, int64_t spatial,
                               int32_t training, float momentum, float eps) {
    const char *fn = "it_batchnorm_forward";
    IT_TRY(check_batchnorm(fn, device, dtype, batch, channels, spatial, training));
    IT_CHECK_FINITE(momentum, fn);
    IT_CHECK_FINITE(eps, fn);
    IT_CHECK_ARG(eps >= 0, "%s: eps must be >= 0, got %g", fn, (double)eps);
    IT_CHECK_ARG((running_mean == NULL) == (running_var == NULL),
                 "%s: running_mean and running_var go together (both or neither)", fn);
    IT_CHECK_ARG(training || running_mean, "%s: evaluation (training = 0) needs the running statistics", fn);
    IT_CHECK_ARG(!training || batch * spatial > 1,
                 "%s: training needs more than one value per channel, got batch %lld x spatial %lld", fn,
                 (long long)batch, (long long)spatial);
    IT_CHECK_ARG(save_mean && save_rstd && ((out && inp) || batch * spatial == 0), "%s: NULL pointer", fn);
    IT_CHECK_ARG(weight || !bias, "%s: a bias needs a weight", fn);
    IT_DISPATCH(batchnorm_forward, device, dtype, out, save_mean, save_rstd, running_mean, running_var, inp,
                weight, bias, batch, channels, spatial, training, momentum, eps);
    const int64_t C = channels, S = spatial, M = batch * spatial;
    const float *x = (const float *)inp, *w = (const float *)weight, *b = (const float *)bias;
    float *y = (float *)out;
#pragma omp parallel for schedule(static) if (M * C > 32768)
    for (int64_t c = 0; c < C; c++) {
        float mean, rstd;
        if (training) {
            double sum = 0.0, sq = 0.0;
            for (int64_t n = 0; n < batch; n++) {
                const float *run = CHANNEL_RUN(x, n);
                for (int64_t s = 0; s < S; s++) sum += run[s];
            }
            double m = sum / (double)M;
            for (int64_t n = 0; n < batch; n++) {
                const float *run = CHANNEL_RUN(x, n);
                for (int64_t s = 0; s < S; s++) sq += (run[s] - m) * (run[s] - m);
            }
            mean = (float)m;
            rstd = (float)(1.0 / sqrt(sq / (double)M + eps));
            if (running_mean) {
                running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * m);
                running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * sq / (double)(M - 1));
            }
        } else {
            mean = running_mean[c];
            rstd = (float)(1.0 / sqrt((double)running_var[c] + eps));
        }
        save_mean[c] = mean;
        save_rstd[c] = rstd;
        /* y = (x - mean) * rstd * w + b = x * scale + shift */
        float scale = rstd * (w ? w[c] : 1.0f), shift = (b ? b[c] : 0.0f) - mean * scale;
        for (int64_t n = 0; n < batch; n++) {
            const float *run = CHANNEL_RUN(x, n);
            float *dst = CHANNEL_RUN(y, n);
            for (int64_t s = 0; s < S; s++) dst[s] = run[s] * scale + shift;
        }
    }
    return IT_OK;
}

it_status it_batchnorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                                void *dbias, const void *dout, const void *inp,
                                const void *weight, const float *save_mean,
                                const float *save_rstd, int64_t batch, int64_t channels,
                                int64_t spatial, int32_t training) {
    const char *fn = "it_batchnorm_backward";
    IT_TRY(check_batchnorm(fn, device, dtype, batch, channels, spatial, training));
    IT_CHECK_ARG(save_mean && save_rstd && ((dout && inp) || batch * spatial == 0), "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(dinp, dout, fn);
    IT_CHECK_NO_ALIAS(dinp, inp, fn);
    IT_DISPATCH(batchnorm_backward, device, dtype, dinp, dweight, dbias, dout, inp, weight, save_mean, save_rstd,
                batch, channels, spatial, training);
    const int64_t C = channels, S = spatial, M = batch * spatial;
    const float *x = (const float *)inp, *dy = (const float *)dout, *w = (const float *)weight;
    float *dx = (float *)dinp;
#pragma omp parallel for schedule(static) if (M * C > 32768)
    for (int64_t c = 0; c < C; c++) {
        float mean = save_mean[c], rstd = save_rstd[c];
        double sum_dy = 0.0, sum_dy_xhat = 0.0;
        for (int64_t n = 0; n < batch; n++) {
            const float *g = CHANNEL_RUN(dy, n), *run = CHANNEL_RUN(x, n);
            for (int64_t s = 0; s < S; s++) {
                sum_dy += g[s];
                sum_dy_xhat += g[s] * (run[s] - mean) * rstd;
            }
        }
        if (dweight) ((float *)dweight)[c] = (float)sum_dy_xhat;
        if (dbias) ((float *)dbias)[c] = (float)sum_dy;
        if (!dx) continue;
        /* training: dx = w rstd (dy - mean(dy) - xhat mean(dy xhat)); the statistics depend on x.
         * evaluation: they are constants, dx = w rstd dy. */
        float k = rstd * (w ? w[c] : 1.0f);
        float mean_dy = training && M ? (float)(sum_dy / (double)M) : 0.0f;
        float mean_dy_xhat = training && M ? (float)(sum_dy_xhat / (double)M) : 0.0f;
        for (int64_t n = 0; n < batch; n++) {
            const float *g = CHANNEL_RUN(dy, n), *run = CHANNEL_RUN(x, n);
            float *d = CHANNEL_RUN(dx, n);
            for (int64_t s = 0; s < S; s++)
                d[s] = k * (g[s] - mean_dy - (run[s] - mean) * rstd * mean_dy_xhat);
        }
    }
    return IT_OK;
}
