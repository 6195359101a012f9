/* Fused softmax + cross-entropy (llm.c's fused classifier, split into forward/backward so that
 * only the per-row log-sum-exp is kept between the two instead of the probabilities). */
#include "common.h"

static inline int64_t load_index(it_dtype dt, const void *p, int64_t i) {
    return dt == IT_INT64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* next: the row read after this one. Its lines are fetched into L2 while this row's exponentials
 * keep the core busy (one line per 16 of them: the same pace), so that its max pass, the only
 * one that would wait on memory, reads from cache; a row of GPT-2's vocabulary is 200 KB. */
IT_HOT static float row_logsumexp(const float *x, int64_t V, const float *next) {
    float m = it_vmax(x, V);
    float acc[IT_LANES] = {0};
    int64_t c = 0;
    for (; c + IT_LANES <= V; c += IT_LANES) {
        if (next) {
            __builtin_prefetch(next + c, 0, 2);
            __builtin_prefetch(next + c + 16, 0, 2);
        }
        for (int j = 0; j < IT_LANES; j++) acc[j] += it_expf(x[c + j] - m);
    }
    for (; c < V; c++) acc[c % IT_LANES] += it_expf(x[c] - m);
    return m + logf(it_lanes_total(acc));
}

IT_HOT static void row_dlogits(float *d, const float *x, float lse, int64_t target, float g,
                               int64_t V, int64_t Vp) {
    for (int64_t c = 0; c < V; c++) d[c] = it_expf(x[c] - lse) * g;
    for (int64_t c = V; c < Vp; c++) d[c] = 0.0f;
    if (target >= 0) d[target] -= g;
}

static it_status check_ce(const char *fn, it_dtype dtype, it_dtype target_dtype, int64_t rows,
                          int64_t vocab, int64_t padded_vocab) {
    IT_CHECK_FLOAT(dtype, fn);
    IT_CHECK_ARG(target_dtype == IT_INT32 || target_dtype == IT_INT64,
                 "%s: targets must be int32 or int64, got %s", fn, it_dtype_name(target_dtype));
    IT_CHECK_SIZE(rows, fn);
    IT_CHECK_ARG(vocab > 0 && padded_vocab >= vocab,
                 "%s: need 0 < vocab (%lld) <= padded_vocab (%lld)", fn, (long long)vocab,
                 (long long)padded_vocab);
    IT_CHECK_PRODUCT(fn, 8, rows, padded_vocab);
    IT_CHECK_PRODUCT(fn, 8, padded_vocab);
    return IT_OK;
}

it_status it_cross_entropy_forward(it_device device, it_dtype dtype, float *losses, float *lse,
                                   const void *logits, const void *targets,
                                   it_dtype target_dtype, int64_t rows, int64_t vocab,
                                   int64_t padded_vocab, int64_t ignore_index) {
    IT_CHECK_DEVICE(device, "it_cross_entropy_forward");
    IT_TRY(check_ce("it_cross_entropy_forward", dtype, target_dtype, rows, vocab, padded_vocab));
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(losses && lse && logits && targets, "it_cross_entropy_forward: NULL pointer");
    IT_DISPATCH(cross_entropy_forward, device, dtype, losses, lse, logits, targets, target_dtype,
                rows, vocab, padded_vocab, ignore_index);
    int64_t bad_row = -1, bad_target = 0;
    int failed = 0;
#pragma omp parallel if (rows * vocab > 16384)
    {
        float *xb = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)vocab * 4);
        int broken = dtype != IT_FLOAT32 && !xb;
        if (broken) failed = 1;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            if (broken) continue;
            int64_t t = load_index(target_dtype, targets, n);
            const float *x = it_row_load(dtype, logits, n * padded_vocab, vocab, xb);
            /* (a prefetch never faults: past the last row it reads nothing) */
            float l = row_logsumexp(x, vocab, dtype == IT_FLOAT32 ? x + padded_vocab : NULL);
            lse[n] = l;
            if (t == ignore_index) { losses[n] = 0.0f; continue; }
            if (t < 0 || t >= vocab) {
#pragma omp critical
                if (bad_row < 0 || n < bad_row) { bad_row = n; bad_target = t; }
                losses[n] = NAN;
                continue;
            }
            losses[n] = l - x[t];
        }
        it_scratch_free(xb);
    }
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_cross_entropy_forward: out of memory");
    IT_REQUIRE(bad_row < 0, IT_ERR_INDEX_OUT_OF_RANGE,
               "cross_entropy: target %lld at position %lld is outside the vocabulary "
               "[0, %lld) (and is not ignore_index %lld)", (long long)bad_target,
               (long long)bad_row, (long long)vocab, (long long)ignore_index);
    return IT_OK;
}

it_status it_cross_entropy_backward(it_device device, it_dtype dtype, void *dlogits,
                                    const void *logits, const float *lse, const void *targets,
                                    it_dtype target_dtype, const float *dlosses, int64_t rows,
                                    int64_t vocab, int64_t padded_vocab, int64_t ignore_index) {
    IT_CHECK_DEVICE(device, "it_cross_entropy_backward");
    IT_TRY(check_ce("it_cross_entropy_backward", dtype, target_dtype, rows, vocab, padded_vocab));
    if (rows == 0) return IT_OK;
    IT_CHECK_ARG(dlogits && logits && lse && targets && dlosses,
                 "it_cross_entropy_backward: NULL pointer");
    IT_DISPATCH(cross_entropy_backward, device, dtype, dlogits, logits, lse, targets,
                target_dtype, dlosses, rows, vocab, padded_vocab, ignore_index);
    int64_t Vp = padded_vocab;
    int bad = 0, failed = 0;
#pragma omp parallel if (rows * vocab > 16384)
    {
        float *scratch = dtype == IT_FLOAT32 ? NULL : (float *)it_scratch_alloc((size_t)Vp * 8);
        float *xb = scratch, *db = scratch ? scratch + Vp : NULL;
        int broken = dtype != IT_FLOAT32 && !scratch;
        if (broken) failed = 1;
#pragma omp for schedule(static)
        for (int64_t n = 0; n < rows; n++) {
            if (broken) continue;
            int64_t t = load_index(target_dtype, targets, n);
            float *d = it_row_dest(dtype, dlogits, n * Vp, db);
            if (t == ignore_index) {
                memset(d, 0, (size_t)Vp * 4);
            } else if (t < 0 || t >= vocab) {
                bad = 1;
                memset(d, 0, (size_t)Vp * 4);
            } else {
                const float *x = it_row_load(dtype, logits, n * Vp, vocab, xb);
                row_dlogits(d, x, lse[n], t, dlosses[n], vocab, Vp);
            }
            it_row_store(dtype, dlogits, n * Vp, d, Vp);
        }
        it_scratch_free(scratch);
    }
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "it_cross_entropy_backward: out of memory");
    IT_REQUIRE(!bad, IT_ERR_INDEX_OUT_OF_RANGE,
               "cross_entropy backward: a target is outside the vocabulary [0, %lld)",
               (long long)vocab);
    return IT_OK;
}
