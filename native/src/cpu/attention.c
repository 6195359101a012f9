/* Causal scaled-dot-product attention with grouped-query heads, llm.c/flash style: the forward
 * pass keeps only the output and the per-row log-sum-exp; the backward pass recomputes the
 * attention probabilities from them. Work is split over (batch, head) pairs, each thread
 * running single-threaded sgemm on its own [T, T] scratch. */
#include "common.h"

/* Causal softmax of scores s [T, T] in place (row i attends to j <= i); writes lse [T]. */
IT_HOT static void causal_softmax(float *s, float *lse, int64_t T) {
    for (int64_t i = 0; i < T; i++) {
        float *row = s + i * T;
        float m = it_vmax(row, i + 1);
        for (int64_t j = 0; j <= i; j++) row[j] = it_expf(row[j] - m);
        float sum = it_vsum(row, i + 1);
        float inv = 1.0f / sum;
        for (int64_t j = 0; j <= i; j++) row[j] *= inv;
        for (int64_t j = i + 1; j < T; j++) row[j] = 0.0f;
        lse[i] = m + logf(sum);
    }
}

/* p = exp(s - lse) below the diagonal, 0 above (recomputed probabilities). */
IT_HOT static void causal_probs(float *s, const float *lse, int64_t T) {
    for (int64_t i = 0; i < T; i++) {
        float *row = s + i * T;
        for (int64_t j = 0; j <= i; j++) row[j] = it_expf(row[j] - lse[i]);
        for (int64_t j = i + 1; j < T; j++) row[j] = 0.0f;
    }
}

/* dS = P * (dP - rowsum(dO * O)), in place in dp. */
IT_HOT static void softmax_grad(float *dp, const float *p, const float *dout, const float *out,
                                int64_t T, int64_t D) {
    for (int64_t i = 0; i < T; i++) {
        float di = it_vdot(dout + i * D, out + i * D, D);
        for (int64_t j = 0; j < T; j++) dp[i * T + j] = p[i * T + j] * (dp[i * T + j] - di);
    }
}

static it_status check_attention(const char *fn, it_dtype dtype, int64_t B, int64_t H,
                                 int64_t Hkv, int64_t T, int64_t D) {
    IT_CHECK_FLOAT(dtype, fn);
    IT_CHECK_SIZE(B, fn);
    IT_CHECK_SIZE(T, fn);
    IT_CHECK_ARG(H > 0 && Hkv > 0 && D > 0, "%s: heads, kv_heads and head_dim must be > 0", fn);
    IT_CHECK_ARG(H % Hkv == 0, "%s: heads (%lld) must be a multiple of kv_heads (%lld)", fn,
                 (long long)H, (long long)Hkv);
    IT_CHECK_ARG(T < INT32_MAX && D < INT32_MAX, "%s: seq (%lld) and head_dim (%lld) must be "
                 "below 2^31 (the BLAS takes int32 sizes)", fn, (long long)T, (long long)D);
    IT_CHECK_PRODUCT(fn, B, H, T, D);
    IT_CHECK_PRODUCT(fn, 16, T, T + D);  /* a thread's scratch: 2 T x T and 8 T x D floats */
    return IT_OK;
}

it_status it_attention_forward(it_device device, it_dtype dtype, void *out, float *lse,
                               const void *q, const void *k, const void *v, int64_t batch,
                               int64_t heads, int64_t kv_heads, int64_t seq, int64_t head_dim,
                               float scale) {
    IT_CHECK_DEVICE(device, "it_attention_forward");
    IT_TRY(check_attention("it_attention_forward", dtype, batch, heads, kv_heads, seq, head_dim));
    if (batch * seq == 0) return IT_OK;
    IT_CHECK_ARG(out && lse && q && k && v, "it_attention_forward: NULL pointer");
    IT_DISPATCH(attention_forward, device, dtype, out, lse, q, k, v, batch, heads, kv_heads, seq,
                head_dim, scale);
    const int64_t T = seq, D = head_dim, group = heads / kv_heads, TD = T * D;
    int failed = 0;
    int blas_threads = it_blas_set_threads_local(1);
#pragma omp parallel
    {
        int16_t conv = dtype != IT_FLOAT32;
        float *s = (float *)it_scratch_alloc((size_t)(T * T + (conv ? 4 * TD : 0)) * 4);
        if (!s) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < batch * heads; bh++) {
            if (!s) continue;
            int64_t b = bh / heads, h = bh % heads, kvh = b * kv_heads + h / group;
            float *qb = s + T * T, *kb = qb + TD, *vb = kb + TD, *ob = vb + TD;
            const float *qf = it_row_load(dtype, q, bh * TD, TD, qb);
            const float *kf = it_row_load(dtype, k, kvh * TD, TD, kb);
            const float *vf = it_row_load(dtype, v, kvh * TD, TD, vb);
            float *of = it_row_dest(dtype, out, bh * TD, ob);
            it_sgemm(0, 1, T, T, D, scale, qf, D, kf, D, 0.0f, s, T);
            causal_softmax(s, lse + bh * T, T);
            it_sgemm(0, 0, T, D, T, 1.0f, s, T, vf, D, 0.0f, of, D);
            it_row_store(dtype, out, bh * TD, of, TD);
        }
        it_scratch_free(s);
    }
    it_blas_set_threads_local(blas_threads);
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_attention_forward: out of memory for a "
               "%lld x %lld score block", (long long)T, (long long)T);
    return IT_OK;
}

it_status it_attention_backward(it_device device, it_dtype dtype, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v,
                                const void *out, const float *lse, int64_t batch,
                                int64_t heads, int64_t kv_heads, int64_t seq,
                                int64_t head_dim, float scale) {
    IT_CHECK_DEVICE(device, "it_attention_backward");
    IT_TRY(check_attention("it_attention_backward", dtype, batch, heads, kv_heads, seq, head_dim));
    if (batch * seq == 0) return IT_OK;
    IT_CHECK_ARG(dq && dk && dv && dout && q && k && v && out && lse,
                 "it_attention_backward: NULL pointer");
    IT_DISPATCH(attention_backward, device, dtype, dq, dk, dv, dout, q, k, v, out, lse, batch,
                heads, kv_heads, seq, head_dim, scale);
    const int64_t T = seq, D = head_dim, group = heads / kv_heads, TD = T * D;
    int failed = 0;
    int blas_threads = it_blas_set_threads_local(1);
    /* One task per kv head: its group of query heads is walked in order, accumulating dK and
     * dV, so no two threads write the same memory and sums are ordered. */
#pragma omp parallel
    {
        /* p, dp [T,T]; q, do, o, dq [T,D] (converted when 16-bit); k, v, dk, dv accumulators */
        float *s = (float *)it_scratch_alloc((size_t)(2 * T * T + 8 * TD) * 4);
        if (!s) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t bg = 0; bg < batch * kv_heads; bg++) {
            if (!s) continue;
            float *p = s, *dp = p + T * T, *qb = dp + T * T, *gb = qb + TD, *ob = gb + TD;
            float *dqb = ob + TD, *kb = dqb + TD, *vb = kb + TD, *dkf = vb + TD, *dvf = dkf + TD;
            int64_t b = bg / kv_heads;
            const float *kf = it_row_load(dtype, k, bg * TD, TD, kb);
            const float *vf = it_row_load(dtype, v, bg * TD, TD, vb);
            memset(dkf, 0, (size_t)TD * 4);
            memset(dvf, 0, (size_t)TD * 4);
            for (int64_t hh = 0; hh < group; hh++) {
                int64_t bh = b * heads + (bg % kv_heads) * group + hh;
                const float *qf = it_row_load(dtype, q, bh * TD, TD, qb);
                const float *gf = it_row_load(dtype, dout, bh * TD, TD, gb);
                const float *of = it_row_load(dtype, out, bh * TD, TD, ob);
                float *dqf = it_row_dest(dtype, dq, bh * TD, dqb);
                it_sgemm(0, 1, T, T, D, scale, qf, D, kf, D, 0.0f, p, T);
                causal_probs(p, lse + bh * T, T);
                it_sgemm(1, 0, T, D, T, 1.0f, p, T, gf, D, 1.0f, dvf, D);   /* dV += P^T dO */
                it_sgemm(0, 1, T, T, D, 1.0f, gf, D, vf, D, 0.0f, dp, T);   /* dP = dO V^T */
                softmax_grad(dp, p, gf, of, T, D);                          /* dS */
                it_sgemm(0, 0, T, D, T, scale, dp, T, kf, D, 0.0f, dqf, D); /* dQ = s dS K */
                it_sgemm(1, 0, T, D, T, scale, dp, T, qf, D, 1.0f, dkf, D); /* dK += s dS^T Q */
                it_row_store(dtype, dq, bh * TD, dqf, TD);
            }
            if (dtype == IT_FLOAT32) {
                memcpy((float *)dk + bg * TD, dkf, (size_t)TD * 4);
                memcpy((float *)dv + bg * TD, dvf, (size_t)TD * 4);
            } else {
                it_row_store(dtype, dk, bg * TD, dkf, TD);
                it_row_store(dtype, dv, bg * TD, dvf, TD);
            }
        }
        it_scratch_free(s);
    }
    it_blas_set_threads_local(blas_threads);
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_attention_backward: out of memory for "
               "%lld x %lld score blocks", (long long)T, (long long)T);
    return IT_OK;
}
