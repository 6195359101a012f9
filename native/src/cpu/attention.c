/* Scaled-dot-product attention with grouped-query heads, llm.c/flash style: the forward pass
 * keeps only the output and the per-row log-sum-exp; the backward pass recomputes the
 * attention probabilities from them. Work is split over (batch, head) pairs, each thread
 * running single-threaded sgemm on its own [Tq, Tk] scratch.
 *
 * Queries and keys may differ in length (context parallelism computes blocks of a longer
 * sequence). Causal masking is aligned to the bottom right: query row i sees key j when
 * j <= i + (Tk - Tq), so a query block that ends where the keys end is masked as one causal
 * sequence. The backward pass takes the log-sum-exp and output of the whole row, which may
 * span more keys than this block (ring attention): its gradients are then this block's part.
 *
 * it_attention_options adds an additive bias to the scores (masks: -inf) and dropout on the
 * probabilities; the dropout mask is a hash of (seed, row, key), recomputed by the backward
 * pass, so neither is ever stored. */
#include "common.h"
#include "random_bits.h"

/* The number of keys query row i sees. */
static inline int64_t visible(int64_t i, int64_t Tq, int64_t Tk, int causal) {
    return causal ? i + (Tk - Tq) + 1 : Tk;
}

/* Adds the bias rows of (b, h) to the visible part of scores s [Tq, Tk]. */
IT_HOT static void add_bias(float *s, const float *bias, int64_t stride_query, int64_t Tq,
                            int64_t Tk, int causal) {
    for (int64_t i = 0; i < Tq; i++) {
        float *row = s + i * Tk;
        const float *brow = bias + i * stride_query;
        int64_t n = visible(i, Tq, Tk, causal);
        for (int64_t j = 0; j < n; j++) row[j] += brow[j];
    }
}

/* exp(x - m), exactly 0 for a masked (-inf) score. */
static inline float masked_exp(float x, float m) { return x == -INFINITY ? 0.0f : it_expf(x - m); }

/* Masked softmax of scores s [Tq, Tk] in place; writes lse [Tq] (-inf for a row with every
 * key masked out, whose probabilities are all 0). */
IT_HOT static void masked_softmax(float *s, float *lse, int64_t Tq, int64_t Tk, int causal) {
    for (int64_t i = 0; i < Tq; i++) {
        float *row = s + i * Tk;
        int64_t n = visible(i, Tq, Tk, causal);
        float m = it_vmax(row, n);
        if (m == -INFINITY) {
            memset(row, 0, (size_t)Tk * 4);
            lse[i] = -INFINITY;
            continue;
        }
        for (int64_t j = 0; j < n; j++) row[j] = masked_exp(row[j], m);
        float sum = it_vsum(row, n);
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; j++) row[j] *= inv;
        for (int64_t j = n; j < Tk; j++) row[j] = 0.0f;
        lse[i] = m + logf(sum);
    }
}

/* p = exp(s - lse) where visible, 0 elsewhere (recomputed probabilities). */
IT_HOT static void masked_probs(float *s, const float *lse, int64_t Tq, int64_t Tk, int causal) {
    for (int64_t i = 0; i < Tq; i++) {
        float *row = s + i * Tk;
        int64_t n = lse[i] == -INFINITY ? 0 : visible(i, Tq, Tk, causal);
        for (int64_t j = 0; j < n; j++) row[j] = masked_exp(row[j], lse[i]);
        for (int64_t j = n; j < Tk; j++) row[j] = 0.0f;
    }
}

/* The dropout of rows first_row.. of a [Tq, Tk] block of the first Tk of all_keys keys:
 * dst = src * keep / (1 - p). */
typedef struct { uint64_t key, drop_below; float keep_scale; } dropout_plan;

static dropout_plan plan_dropout(const it_attention_options *o) {
    dropout_plan d = {0, 0, 1.0f};
    if (!o || o->dropout_p <= 0.0f) return d;
    d.key = attention_dropout_key(o->seed);
    d.drop_below = (uint64_t)((double)o->dropout_p * 4294967296.0);
    d.keep_scale = o->dropout_p < 1.0f ? 1.0f / (1.0f - o->dropout_p) : 0.0f;
    return d;
}

IT_HOT static void apply_dropout(float *dst, const float *src, const dropout_plan *d,
                                 uint64_t first_row, int64_t Tq, int64_t Tk, int64_t all_keys) {
    for (int64_t i = 0; i < Tq; i++)
        for (int64_t j = 0; j < Tk; j++)
            dst[i * Tk + j] = attention_keeps(d->key, first_row + (uint64_t)i, all_keys, j, d->drop_below)
                                  ? src[i * Tk + j] * d->keep_scale : 0.0f;
}

/* dS = P * (dP - rowsum(dO * O)), in place in dp [Tq, Tk]. With dropout, dp holds the
 * gradient of the dropped probabilities P' and dP = dP' * keep / (1 - p); rowsum(dO * O) is
 * still sum_j P'_ij dP'_ij, since O = P' V. */
IT_HOT static void softmax_grad(float *dp, const float *p, const float *dout, const float *out,
                                int64_t Tq, int64_t Tk, int64_t D, const dropout_plan *drop,
                                uint64_t first_row, int64_t all_keys) {
    if (drop->drop_below) apply_dropout(dp, dp, drop, first_row, Tq, Tk, all_keys);
    for (int64_t i = 0; i < Tq; i++) {
        float di = it_vdot(dout + i * D, out + i * D, D);
        for (int64_t j = 0; j < Tk; j++) dp[i * Tk + j] = p[i * Tk + j] * (dp[i * Tk + j] - di);
    }
}

static it_status check_attention(const char *fn, it_dtype dtype, int64_t B, int64_t H,
                                 int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, int causal,
                                 const it_attention_options *o) {
    IT_CHECK_FLOAT(dtype, fn);
    IT_CHECK_SIZE(B, fn);
    IT_CHECK_SIZE(Tq, fn);
    IT_CHECK_SIZE(Tk, fn);
    IT_CHECK_ARG(H > 0 && Hkv > 0 && D > 0, "%s: heads, kv_heads and head_dim must be > 0", fn);
    IT_CHECK_ARG(H % Hkv == 0, "%s: heads (%lld) must be a multiple of kv_heads (%lld)", fn,
                 (long long)H, (long long)Hkv);
    IT_CHECK_ARG(!causal || Tk >= Tq, "%s: causal attention needs at least as many keys (%lld) "
                 "as queries (%lld)", fn, (long long)Tk, (long long)Tq);
    IT_CHECK_ARG(Tq < INT32_MAX && Tk < INT32_MAX && D < INT32_MAX, "%s: sequence lengths "
                 "(%lld, %lld) and head_dim (%lld) must be below 2^31 (the BLAS takes int32 "
                 "sizes)", fn, (long long)Tq, (long long)Tk, (long long)D);
    IT_CHECK_PRODUCT(fn, B, H, Tq, D);
    IT_CHECK_PRODUCT(fn, B, Hkv, Tk, D);
    IT_CHECK_PRODUCT(fn, 16, Tq + Tk, Tk + D);  /* a thread's scratch: 3 Tq x Tk, 4 Tq x D, 4 Tk x D */
    if (o) {
        IT_CHECK_ARG(o->dropout_p >= 0.0f && o->dropout_p <= 1.0f, "%s: dropout_p must be in "
                     "[0, 1], got %g", fn, (double)o->dropout_p);
        const int64_t most = (int64_t)1 << 62;  /* so that stride + 1 below cannot overflow */
        IT_CHECK_ARG(o->bias_stride_batch >= 0 && o->bias_stride_head >= 0 &&
                     o->bias_stride_query >= 0 && o->bias_stride_batch < most &&
                     o->bias_stride_head < most && o->bias_stride_query < most,
                     "%s: bias strides must be in [0, 2^62), got %lld, %lld, %lld", fn,
                     (long long)o->bias_stride_batch, (long long)o->bias_stride_head,
                     (long long)o->bias_stride_query);
        /* the last element the bias strides reach stays within an addressable extent */
        IT_CHECK_PRODUCT(fn, 4, B, o->bias_stride_batch + 1);
        IT_CHECK_PRODUCT(fn, 4, H, o->bias_stride_head + 1);
        IT_CHECK_PRODUCT(fn, 4, Tq + Tk, o->bias_stride_query + 1);
    }
    return IT_OK;
}

/* The bias rows of (b, h), or NULL. */
static inline const float *bias_of(const it_attention_options *o, int64_t b, int64_t h) {
    return o && o->bias ? o->bias + b * o->bias_stride_batch + h * o->bias_stride_head : NULL;
}

/* Causal attention is computed in blocks of QUERY_BLOCK query rows, each against only the
 * keys its last row sees: rows [i0, i1) see keys [0, i1 + Tk - Tq), so the masked upper
 * triangle is mostly never computed (T = 256 in blocks of 64: 62% of the full products).
 * Thanks to the bottom-right alignment a block is itself a causal [i1 - i0, kn] problem, so the
 * helpers above run on it unchanged. Non-causal blocks take every key. */
#define QUERY_BLOCK 64
static inline int64_t block_keys(int64_t i1, int64_t Tq, int64_t Tk, int causal) {
    return causal ? visible(i1 - 1, Tq, Tk, causal) : Tk;
}

it_status it_attention_forward(it_device device, it_dtype dtype, void *out, float *lse,
                               const void *q, const void *k, const void *v, int64_t batch,
                               int64_t heads, int64_t kv_heads, int64_t q_len, int64_t kv_len,
                               int64_t head_dim, float scale, int causal,
                               const it_attention_options *options) {
    IT_CHECK_DEVICE(device, "it_attention_forward");
    IT_TRY(check_attention("it_attention_forward", dtype, batch, heads, kv_heads, q_len, kv_len,
                           head_dim, causal, options));
    if (batch * q_len == 0) return IT_OK;
    IT_CHECK_ARG(out && lse && q && k && v, "it_attention_forward: NULL pointer");
    IT_CHECK_ARG(kv_len > 0, "it_attention_forward: a query row needs at least one key");
    IT_DISPATCH(attention_forward, device, dtype, out, lse, q, k, v, batch, heads, kv_heads, q_len,
                kv_len, head_dim, scale, causal, options);
    const int64_t Tq = q_len, Tk = kv_len, D = head_dim, group = heads / kv_heads;
    const int64_t QD = Tq * D, KD = Tk * D;
    const dropout_plan drop = plan_dropout(options);
    int failed = 0;
    int blas_threads = it_blas_set_threads_local(1);
#pragma omp parallel
    {
        int16_t conv = dtype != IT_FLOAT32;
        float *s = (float *)it_scratch_alloc((size_t)(Tq * Tk + (conv ? 2 * QD + 2 * KD : 0)) * 4);
        if (!s) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < batch * heads; bh++) {
            if (!s) continue;
            int64_t b = bh / heads, h = bh % heads, kvh = b * kv_heads + h / group;
            float *qb = s + Tq * Tk, *kb = qb + QD, *vb = kb + KD, *ob = vb + KD;
            const float *qf = it_row_load(dtype, q, bh * QD, QD, qb);
            const float *kf = it_row_load(dtype, k, kvh * KD, KD, kb);
            const float *vf = it_row_load(dtype, v, kvh * KD, KD, vb);
            const float *bias = bias_of(options, b, h);
            float *of = it_row_dest(dtype, out, bh * QD, ob);
            for (int64_t i0 = 0; i0 < Tq; i0 += QUERY_BLOCK) {
                int64_t nq = Tq - i0 < QUERY_BLOCK ? Tq - i0 : QUERY_BLOCK;
                int64_t kn = block_keys(i0 + nq, Tq, Tk, causal);
                it_sgemm(0, 1, nq, kn, D, scale, qf + i0 * D, D, kf, D, 0.0f, s, kn);
                if (bias) add_bias(s, bias + i0 * options->bias_stride_query, options->bias_stride_query, nq, kn, causal);
                masked_softmax(s, lse + bh * Tq + i0, nq, kn, causal);
                if (drop.drop_below) apply_dropout(s, s, &drop, (uint64_t)(bh * Tq + i0), nq, kn, Tk);
                it_sgemm(0, 0, nq, D, kn, 1.0f, s, kn, vf, D, 0.0f, of + i0 * D, D);
            }
            it_row_store(dtype, out, bh * QD, of, QD);
        }
        it_scratch_free(s);
    }
    it_blas_set_threads_local(blas_threads);
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_attention_forward: out of memory for a "
               "%lld x %lld score block", (long long)Tq, (long long)Tk);
    return IT_OK;
}

it_status it_attention_backward(it_device device, it_dtype dtype, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v,
                                const void *out, const float *lse, int64_t batch,
                                int64_t heads, int64_t kv_heads, int64_t q_len, int64_t kv_len,
                                int64_t head_dim, float scale, int causal,
                                const it_attention_options *options) {
    IT_CHECK_DEVICE(device, "it_attention_backward");
    IT_TRY(check_attention("it_attention_backward", dtype, batch, heads, kv_heads, q_len, kv_len,
                           head_dim, causal, options));
    if (batch * q_len == 0 || kv_len == 0) return IT_OK;
    IT_CHECK_ARG(dq && dk && dv && dout && q && k && v && out && lse,
                 "it_attention_backward: NULL pointer");
    IT_DISPATCH(attention_backward, device, dtype, dq, dk, dv, dout, q, k, v, out, lse, batch,
                heads, kv_heads, q_len, kv_len, head_dim, scale, causal, options);
    const int64_t Tq = q_len, Tk = kv_len, D = head_dim, group = heads / kv_heads;
    const int64_t QD = Tq * D, KD = Tk * D;
    const dropout_plan drop = plan_dropout(options);
    int failed = 0;
    int blas_threads = it_blas_set_threads_local(1);
    /* One task per kv head: its group of query heads is walked in order, accumulating dK and
     * dV, so no two threads write the same memory and sums are ordered. */
#pragma omp parallel
    {
        /* p, dp [Tq,Tk] (and the dropped p' with dropout); q, do, o, dq [Tq,D] (converted
         * when 16-bit); k, v, dk, dv [Tk,D] */
        int64_t blocks = drop.drop_below ? 3 : 2;
        float *s = (float *)it_scratch_alloc((size_t)(blocks * Tq * Tk + 4 * QD + 4 * KD) * 4);
        if (!s) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t bg = 0; bg < batch * kv_heads; bg++) {
            if (!s) continue;
            float *p = s, *dp = p + Tq * Tk, *qb = dp + Tq * Tk, *gb = qb + QD, *ob = gb + QD;
            float *dqb = ob + QD, *kb = dqb + QD, *vb = kb + KD, *dkf = vb + KD, *dvf = dkf + KD;
            float *pd = drop.drop_below ? dvf + KD : p;  /* the probabilities that reached V */
            int64_t b = bg / kv_heads;
            const float *kf = it_row_load(dtype, k, bg * KD, KD, kb);
            const float *vf = it_row_load(dtype, v, bg * KD, KD, vb);
            memset(dkf, 0, (size_t)KD * 4);
            memset(dvf, 0, (size_t)KD * 4);
            for (int64_t hh = 0; hh < group; hh++) {
                int64_t h = (bg % kv_heads) * group + hh, bh = b * heads + h;
                const float *qf = it_row_load(dtype, q, bh * QD, QD, qb);
                const float *gf = it_row_load(dtype, dout, bh * QD, QD, gb);
                const float *of = it_row_load(dtype, out, bh * QD, QD, ob);
                const float *bias = bias_of(options, b, h);
                float *dqf = it_row_dest(dtype, dq, bh * QD, dqb);
                for (int64_t i0 = 0; i0 < Tq; i0 += QUERY_BLOCK) {
                    int64_t nq = Tq - i0 < QUERY_BLOCK ? Tq - i0 : QUERY_BLOCK;
                    int64_t kn = block_keys(i0 + nq, Tq, Tk, causal);
                    const float *qi = qf + i0 * D, *gi = gf + i0 * D;
                    uint64_t row0 = (uint64_t)(bh * Tq + i0);
                    it_sgemm(0, 1, nq, kn, D, scale, qi, D, kf, D, 0.0f, p, kn);
                    if (bias) add_bias(p, bias + i0 * options->bias_stride_query, options->bias_stride_query, nq, kn, causal);
                    masked_probs(p, lse + bh * Tq + i0, nq, kn, causal);
                    if (drop.drop_below) apply_dropout(pd, p, &drop, row0, nq, kn, Tk);
                    it_sgemm(1, 0, kn, D, nq, 1.0f, pd, kn, gi, D, 1.0f, dvf, D);  /* dV += P'^T dO */
                    it_sgemm(0, 1, nq, kn, D, 1.0f, gi, D, vf, D, 0.0f, dp, kn);   /* dP' = dO V^T */
                    softmax_grad(dp, p, gi, of + i0 * D, nq, kn, D, &drop, row0, Tk); /* dS */
                    it_sgemm(0, 0, nq, D, kn, scale, dp, kn, kf, D, 0.0f, dqf + i0 * D, D); /* dQ = s dS K */
                    it_sgemm(1, 0, kn, D, nq, scale, dp, kn, qi, D, 1.0f, dkf, D); /* dK += s dS^T Q */
                }
                it_row_store(dtype, dq, bh * QD, dqf, QD);
            }
            if (dtype == IT_FLOAT32) {
                memcpy((float *)dk + bg * KD, dkf, (size_t)KD * 4);
                memcpy((float *)dv + bg * KD, dvf, (size_t)KD * 4);
            } else {
                it_row_store(dtype, dk, bg * KD, dkf, KD);
                it_row_store(dtype, dv, bg * KD, dvf, KD);
            }
        }
        it_scratch_free(s);
    }
    it_blas_set_threads_local(blas_threads);
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_attention_backward: out of memory for "
               "%lld x %lld score blocks", (long long)Tq, (long long)Tk);
    return IT_OK;
}

it_status it_attention_merge(it_device device, it_dtype dtype, float *out, float *lse,
                             const void *block_out, const float *block_lse, int64_t groups,
                             int64_t rows, int64_t block_rows, int64_t row_offset,
                             int64_t head_dim) {
    IT_CHECK_DEVICE(device, "it_attention_merge");
    IT_CHECK_FLOAT(dtype, "it_attention_merge");
    IT_CHECK_SIZE(groups, "it_attention_merge");
    IT_CHECK_SIZE(block_rows, "it_attention_merge");
    IT_CHECK_SIZE(rows, "it_attention_merge");
    IT_CHECK_ARG(head_dim > 0, "it_attention_merge: head_dim must be positive, got %lld", (long long)head_dim);
    IT_CHECK_RANGE(row_offset, block_rows, rows, "it_attention_merge");
    IT_CHECK_PRODUCT("it_attention_merge", groups, rows, head_dim);
    if (groups * block_rows == 0) return IT_OK;
    IT_CHECK_ARG(out && lse && block_out && block_lse, "it_attention_merge: NULL pointer");
    IT_DISPATCH(attention_merge, device, dtype, out, lse, block_out, block_lse, groups, rows,
                block_rows, row_offset, head_dim);
    const int64_t D = head_dim;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < groups * block_rows; r++) {
        int64_t g = r / block_rows, i = r % block_rows, at = g * rows + row_offset + i;
        float a = lse[at], b = block_lse[r];
        if (b == -INFINITY) continue; /* every key of the block masked out: nothing to add */
        float m = a > b ? a : b;
        float wa = it_expf(a - m), wb = it_expf(b - m), sum = wa + wb;
        float *o = out + at * D;
        for (int64_t d = 0; d < D; d++)
            o[d] = (o[d] * wa + (float)it_load_f64(dtype, block_out, r * D + d) * wb) / sum;
        lse[at] = m + logf(sum);
    }
    return IT_OK;
}
