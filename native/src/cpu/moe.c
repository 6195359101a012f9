/* The token movements and products of a mixture-of-experts layer: the routing order (a
 * stable counting sort of the expert ids), the permutation and the weighted scatter back
 * (each token sums its own assignments, in their order: no atomics, the same bits for any
 * thread count) with its backward, and the experts' products as one grouped call over the
 * experts' consecutive rows (one BLAS product per expert, each threaded by BLAS: the experts'
 * products are large enough to use every core, and a BLAS call per thread would need the
 * library's thread count changed around the loop). */
#include <omp.h>

#include "common.h"

/* ---- the routing order --------------------------------------------------------------- */
it_status it_moe_sort(it_device device, int64_t *rows, int64_t *slots, int64_t *counts,
                      const int64_t *expert_ids, const uint8_t *keep, int64_t tokens,
                      int64_t top_k, int64_t num_experts) {
    const char *fn = "it_moe_sort";
    IT_CHECK_DEVICE(device, fn);
    IT_CHECK_SIZE(tokens, fn);
    IT_CHECK_SIZE(top_k, fn);
    IT_CHECK_ARG(num_experts > 0 && num_experts <= INT32_MAX,
                 "%s: num_experts must be in [1, 2^31 - 1], got %lld", fn, (long long)num_experts);
    IT_CHECK_PRODUCT(fn, 8, tokens, top_k);
    IT_CHECK_PTR(counts, fn);
    int64_t n = tokens * top_k;
    if (n > 0) {
        IT_CHECK_PTR(rows, fn);
        IT_CHECK_PTR(slots, fn);
        IT_CHECK_PTR(expert_ids, fn);
    }
    IT_DISPATCH(moe_sort, device, rows, slots, counts, expert_ids, keep, tokens, top_k, num_experts);
    for (int64_t i = 0; i < n; i++) { /* every id, kept or not: nothing is written for a bad one */
        int64_t e = expert_ids[i];
        IT_REQUIRE(e >= 0 && e < num_experts, IT_ERR_INDEX_OUT_OF_RANGE,
                   "%s: expert id %lld (token %lld, choice %lld) outside [0, %lld)", fn, (long long)e,
                   (long long)(i / top_k), (long long)(i % top_k), (long long)num_experts);
    }
    int64_t *next = (int64_t *)it_scratch_alloc((size_t)num_experts * sizeof(int64_t));
    IT_REQUIRE(next, IT_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld experts", fn, (long long)num_experts);
    memset(counts, 0, (size_t)num_experts * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++)
        if (!keep || keep[i]) counts[expert_ids[i]]++;
    for (int64_t e = 0, at = 0; e < num_experts; e++) {
        next[e] = at;
        at += counts[e];
    }
    for (int64_t i = 0; i < n; i++) { /* in flat order: stable by token, then choice */
        if (keep && !keep[i]) continue;
        int64_t at = next[expert_ids[i]]++;
        rows[at] = i / top_k;
        slots[at] = i;
    }
    it_scratch_free(next);
    return IT_OK;
}

/* ---- permutation and the weighted scatter back ---------------------------------------- */
static it_status check_rows(const char *fn, it_device device, it_dtype dtype, const int64_t *rows,
                            int64_t assignments, int64_t tokens, int64_t cols, int need_float) {
    IT_CHECK_DEVICE(device, fn);
    if (need_float)
        IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64, IT_ERR_NOT_SUPPORTED,
                   "%s: dtype %s is not supported (a floating-point dtype)", fn, it_dtype_name(dtype));
    else
        IT_CHECK_ARG(it_dtype_size(dtype) != 0, "%s: unknown dtype %d", fn, (int)dtype);
    IT_CHECK_SIZE(assignments, fn);
    IT_CHECK_SIZE(tokens, fn);
    IT_CHECK_SIZE(cols, fn);
    IT_CHECK_PRODUCT(fn, 8, assignments, cols);
    IT_CHECK_PRODUCT(fn, 8, tokens, cols);
    IT_CHECK_ARG(assignments == 0 || rows != NULL, "%s: rows is NULL", fn);
    return IT_OK;
}

/* Rows named outside [0, tokens) (on the CPU, where the host may read them). */
static it_status check_row_values(const char *fn, const int64_t *rows, int64_t assignments, int64_t tokens) {
    for (int64_t a = 0; a < assignments; a++)
        IT_REQUIRE(rows[a] >= 0 && rows[a] < tokens, IT_ERR_INDEX_OUT_OF_RANGE,
                   "%s: rows[%lld] = %lld outside [0, %lld)", fn, (long long)a, (long long)rows[a],
                   (long long)tokens);
    return IT_OK;
}

it_status it_moe_permute(it_device device, it_dtype dtype, void *out, const void *x,
                         const int64_t *rows, int64_t assignments, int64_t tokens, int64_t cols) {
    const char *fn = "it_moe_permute";
    IT_TRY(check_rows(fn, device, dtype, rows, assignments, tokens, cols, 0));
    if (assignments * cols == 0) return IT_OK;
    IT_CHECK_ARG(out && x, "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(out, x, fn);
    IT_DISPATCH(moe_permute, device, dtype, out, x, rows, assignments, tokens, cols);
    IT_TRY(check_row_values(fn, rows, assignments, tokens));
    size_t row_bytes = (size_t)cols * it_dtype_size(dtype);
#pragma omp parallel for schedule(static) if (assignments * cols > 32768)
    for (int64_t a = 0; a < assignments; a++)
        memcpy((char *)out + a * row_bytes, (const char *)x + rows[a] * row_bytes, row_bytes);
    return IT_OK;
}

/* Each token's assignments in their order, as offsets [tokens + 1] into order [assignments]:
 * a stable counting sort of rows. */
static it_status token_lists(const char *fn, const int64_t *rows, int64_t assignments, int64_t tokens,
                             int64_t **offsets_out, int64_t **order_out) {
    int64_t *offsets = (int64_t *)it_scratch_alloc((size_t)(tokens + 1 + assignments) * sizeof(int64_t));
    IT_REQUIRE(offsets, IT_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    int64_t *order = offsets + tokens + 1;
    memset(offsets, 0, (size_t)(tokens + 1) * sizeof(int64_t));
    for (int64_t a = 0; a < assignments; a++) offsets[rows[a] + 1]++;
    for (int64_t t = 0; t < tokens; t++) offsets[t + 1] += offsets[t];
    for (int64_t a = 0; a < assignments; a++) order[offsets[rows[a]]++] = a;
    for (int64_t t = tokens; t > 0; t--) offsets[t] = offsets[t - 1]; /* the cursors ran one list ahead */
    offsets[0] = 0;
    *offsets_out = offsets;
    *order_out = order;
    return IT_OK;
}

static double weight_at(it_dtype dt, const void *w, int64_t a) {
    return w ? it_load_f64(dt, w, a) : 1.0;
}

it_status it_moe_unpermute(it_device device, it_dtype dtype, void *out, const void *y,
                           const void *weights, const int64_t *rows, int64_t assignments,
                           int64_t tokens, int64_t cols) {
    const char *fn = "it_moe_unpermute";
    IT_TRY(check_rows(fn, device, dtype, rows, assignments, tokens, cols, 1));
    if (tokens * cols == 0) return IT_OK;
    IT_CHECK_ARG(out && (y || assignments == 0), "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(out, y, fn);
    IT_CHECK_NO_ALIAS(out, weights, fn);
    IT_CHECK_NO_ALIAS(out, rows, fn);
    IT_DISPATCH(moe_unpermute, device, dtype, out, y, weights, rows, assignments, tokens, cols);
    IT_TRY(check_row_values(fn, rows, assignments, tokens));
    int64_t *offsets, *order;
    IT_TRY(token_lists(fn, rows, assignments, tokens, &offsets, &order));
    int failed = 0;
#pragma omp parallel if (tokens * cols > 16384)
    {
        float *scratch = dtype == IT_FLOAT64 ? NULL : (float *)it_scratch_alloc((size_t)cols * 2 * sizeof(float));
        if (dtype != IT_FLOAT64 && !scratch) failed = 1;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) {
            if (dtype == IT_FLOAT64) {
                double *o = (double *)out + t * cols;
                for (int64_t c = 0; c < cols; c++) o[c] = 0.0;
                for (int64_t p = offsets[t]; p < offsets[t + 1]; p++) {
                    int64_t a = order[p];
                    double w = weight_at(dtype, weights, a);
                    const double *v = (const double *)y + a * cols;
                    for (int64_t c = 0; c < cols; c++) o[c] += w * v[c];
                }
                continue;
            }
            if (!scratch) continue;
            float *acc = it_row_dest(dtype, out, t * cols, scratch);
            for (int64_t c = 0; c < cols; c++) acc[c] = 0.0f;
            for (int64_t p = offsets[t]; p < offsets[t + 1]; p++) {
                int64_t a = order[p];
                float w = (float)weight_at(dtype, weights, a);
                const float *v = it_row_load(dtype, y, a * cols, cols, scratch + cols);
                for (int64_t c = 0; c < cols; c++) acc[c] += w * v[c];
            }
            it_row_store(dtype, out, t * cols, acc, cols);
        }
        it_scratch_free(scratch);
    }
    it_scratch_free(offsets);
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return IT_OK;
}

it_status it_moe_unpermute_backward(it_device device, it_dtype dtype, void *dy, void *dweights,
                                    const void *dout, const void *y, const void *weights,
                                    const int64_t *rows, int64_t assignments, int64_t tokens,
                                    int64_t cols) {
    const char *fn = "it_moe_unpermute_backward";
    IT_TRY(check_rows(fn, device, dtype, rows, assignments, tokens, cols, 1));
    if (assignments == 0 || (!dy && !dweights)) return IT_OK;
    IT_CHECK_ARG(dout || tokens * cols == 0, "%s: dout is NULL", fn);
    IT_CHECK_ARG(!dy || weights, "%s: dy needs the weights", fn);
    IT_CHECK_ARG(!dweights || y || cols == 0, "%s: dweights needs y", fn);
    IT_CHECK_NO_ALIAS(dy, dout, fn);
    IT_CHECK_NO_ALIAS(dy, y, fn);
    IT_CHECK_NO_ALIAS(dweights, dout, fn);
    IT_CHECK_NO_ALIAS(dweights, y, fn);
    IT_CHECK_NO_ALIAS(dweights, dy, fn);
    IT_DISPATCH(moe_unpermute_backward, device, dtype, dy, dweights, dout, y, weights, rows, assignments,
                tokens, cols);
    IT_TRY(check_row_values(fn, rows, assignments, tokens));
    int failed = 0;
#pragma omp parallel if (assignments * cols > 16384)
    {
        float *scratch = dtype == IT_FLOAT64 ? NULL : (float *)it_scratch_alloc((size_t)cols * 3 * sizeof(float));
        if (dtype != IT_FLOAT64 && !scratch) failed = 1;
#pragma omp for schedule(static)
        for (int64_t a = 0; a < assignments; a++) {
            int64_t t = rows[a];
            if (dtype == IT_FLOAT64) {
                const double *g = (const double *)dout + t * cols, *v = y ? (const double *)y + a * cols : NULL;
                if (dy) {
                    double w = ((const double *)weights)[a];
                    for (int64_t c = 0; c < cols; c++) ((double *)dy)[a * cols + c] = w * g[c];
                }
                if (dweights) {
                    double s = 0.0;
                    for (int64_t c = 0; c < cols; c++) s += v[c] * g[c];
                    ((double *)dweights)[a] = s;
                }
                continue;
            }
            if (!scratch) continue;
            const float *g = it_row_load(dtype, dout, t * cols, cols, scratch);
            if (dy) {
                float w = (float)it_load_f64(dtype, weights, a);
                float *d = it_row_dest(dtype, dy, a * cols, scratch + cols);
                for (int64_t c = 0; c < cols; c++) d[c] = w * g[c];
                it_row_store(dtype, dy, a * cols, d, cols);
            }
            if (dweights) {
                const float *v = it_row_load(dtype, y, a * cols, cols, scratch + 2 * cols);
                float s = 0.0f;
                for (int64_t c = 0; c < cols; c++) s += v[c] * g[c];
                it_store_f64(dtype, dweights, a, s);
            }
        }
        it_scratch_free(scratch);
    }
    IT_REQUIRE(!failed, IT_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return IT_OK;
}

/* ---- the grouped products -------------------------------------------------------------- */
/* What all three forms check: sizes, the groups' counts (each >= 0, summing to rows, the sum
 * formed without overflow) and the pointer arrays (a group with rows needs its matrix). */
static it_status check_groups(const char *fn, it_device device, it_dtype dtype, const void *const *mats,
                              const int64_t *group_sizes, int64_t groups, int64_t rows, int64_t in_features,
                              int64_t out_features, int every_group) {
    IT_CHECK_DEVICE(device, fn);
    IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64, IT_ERR_NOT_SUPPORTED,
               "%s: dtype %s is not supported (a floating-point dtype)", fn, it_dtype_name(dtype));
    IT_CHECK_SIZE(groups, fn);
    IT_CHECK_SIZE(rows, fn);
    IT_CHECK_SIZE(in_features, fn);
    IT_CHECK_SIZE(out_features, fn);
    IT_CHECK_PRODUCT(fn, 8, rows, in_features);
    IT_CHECK_PRODUCT(fn, 8, rows, out_features);
    IT_CHECK_PRODUCT(fn, 8, in_features, out_features);
    IT_CHECK_ARG(rows < INT32_MAX && in_features < INT32_MAX && out_features < INT32_MAX,
                 "%s: a dimension does not fit BLAS's 32-bit integers (rows %lld, in %lld, out %lld)", fn,
                 (long long)rows, (long long)in_features, (long long)out_features);
    IT_CHECK_ARG(groups == 0 || (group_sizes && mats), "%s: group_sizes or the matrices' array is NULL", fn);
    int64_t total = 0;
    for (int64_t g = 0; g < groups; g++) {
        int64_t n = group_sizes[g];
        IT_CHECK_ARG(n >= 0 && n <= rows - total, "%s: group %lld has %lld rows; the group sizes must be >= 0 "
                     "and sum to the %lld rows (%lld before it)", fn, (long long)g, (long long)n, (long long)rows,
                     (long long)total);
        total += n;
        IT_CHECK_ARG(mats[g] || ((n == 0 || in_features * out_features == 0) && !every_group),
                     "%s: the matrix of group %lld (%lld rows) is NULL", fn, (long long)g, (long long)n);
    }
    IT_CHECK_ARG(total == rows, "%s: the group sizes sum to %lld, not to the %lld rows", fn, (long long)total,
                 (long long)rows);
    return IT_OK;
}

/* One group's product: row-major C [m, n] = op(A) [m, k] @ op(B) [k, n]. */
typedef struct {
    void *c;
    const void *a, *b;
    int64_t m, n, k;
    int trans_a, trans_b;
} product;

/* Many products (an expert's share of the tokens each) run side by side, one per OpenMP thread
 * on a single-threaded BLAS (and the bf16 kernels, which run on the calling thread alone inside
 * a parallel region), as attention's heads do: a threaded call per expert would wake and join
 * every thread once per expert. Few products, and those on AMX tiles, run one after the other,
 * each on every thread. Either way an output element is one product's, computed whole by one
 * kernel. */
static it_status run_products_of(it_dtype dtype, const product *ps, int64_t count) {
    it_device cpu = {IT_CPU, 0};
    int threads = omp_get_max_threads();
    int amx = (dtype == IT_BFLOAT16 && it_bf16_matmul_path() == IT_BF16_AMX);
    if (amx || threads == 1 || count < 2 * threads) {
        for (int64_t i = 0; i < count; i++)
            IT_TRY(it_matmul(cpu, dtype, ps[i].c, ps[i].a, ps[i].b, 1, ps[i].m, ps[i].n, ps[i].k, ps[i].trans_a,
                             ps[i].trans_b, 1.0f, 0.0f, 0, 0, 0));
        return IT_OK;
    }
    int blas_threads = it_blas_set_threads_local(1);
    it_status failed = IT_OK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; i++) {
        const product *p = ps + i;
        it_status st = it_matmul(cpu, dtype, p->c, p->a, p->b, 1, p->m, p->n, p->k, p->trans_a, p->trans_b, 1.0f,
                                 0.0f, 0, 0, 0);
        if (st != IT_OK) {
#pragma omp critical(it_moe_products)
            failed = st;
        }
    }
    it_blas_set_threads_local(blas_threads);
    /* the product's own message is on the thread that ran it */
    IT_REQUIRE(failed == IT_OK, failed, "it_moe_grouped_linear: an expert's product failed (%s)",
               it_status_name(failed));
    return IT_OK;
}

/* Runs the `count` products in ps (from it_scratch_alloc) and frees them. */
static it_status run_products(it_dtype dtype, product *ps, int64_t count) {
    it_status st = run_products_of(dtype, ps, count);
    it_scratch_free(ps);
    return st;
}

static product *new_products(int64_t groups) {
    return (product *)it_scratch_alloc((size_t)(groups > 0 ? groups : 1) * sizeof(product));
}

it_status it_moe_grouped_linear_forward(it_device device, it_dtype dtype, void *out, const void *x,
                                        const void *const *weights, const int64_t *group_sizes,
                                        int64_t groups, int64_t rows, int64_t in_features,
                                        int64_t out_features) {
    const char *fn = "it_moe_grouped_linear_forward";
    IT_TRY(check_groups(fn, device, dtype, weights, group_sizes, groups, rows, in_features, out_features, 0));
    if (rows * out_features == 0) return IT_OK;
    IT_CHECK_ARG(out && (x || in_features == 0), "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(out, x, fn);
    IT_DISPATCH(moe_grouped_linear_forward, device, dtype, out, x, weights, group_sizes, groups, rows,
                in_features, out_features);
    size_t es = it_dtype_size(dtype);
    if (in_features == 0) { /* a product over nothing */
        memset(out, 0, (size_t)(rows * out_features) * es);
        return IT_OK;
    }
    product *ps = new_products(groups);
    IT_REQUIRE(ps, IT_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld groups", fn, (long long)groups);
    int64_t count = 0;
    for (int64_t g = 0, at = 0; g < groups; at += group_sizes[g++]) {
        if (group_sizes[g])
            ps[count++] = (product){(char *)out + at * out_features * es, (const char *)x + at * in_features * es,
                                    weights[g], group_sizes[g], out_features, in_features, 0, 1};
    }
    return run_products(dtype, ps, count);
}

it_status it_moe_grouped_linear_backward_input(it_device device, it_dtype dtype, void *dx,
                                               const void *dout, const void *const *weights,
                                               const int64_t *group_sizes, int64_t groups,
                                               int64_t rows, int64_t in_features,
                                               int64_t out_features) {
    const char *fn = "it_moe_grouped_linear_backward_input";
    IT_TRY(check_groups(fn, device, dtype, weights, group_sizes, groups, rows, in_features, out_features, 0));
    if (rows * in_features == 0) return IT_OK;
    IT_CHECK_ARG(dx && (dout || out_features == 0), "%s: NULL pointer", fn);
    IT_CHECK_NO_ALIAS(dx, dout, fn);
    IT_DISPATCH(moe_grouped_linear_backward_input, device, dtype, dx, dout, weights, group_sizes, groups, rows,
                in_features, out_features);
    size_t es = it_dtype_size(dtype);
    if (out_features == 0) {
        memset(dx, 0, (size_t)(rows * in_features) * es);
        return IT_OK;
    }
    product *ps = new_products(groups);
    IT_REQUIRE(ps, IT_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld groups", fn, (long long)groups);
    int64_t count = 0;
    for (int64_t g = 0, at = 0; g < groups; at += group_sizes[g++]) {
        if (group_sizes[g])
            ps[count++] = (product){(char *)dx + at * in_features * es, (const char *)dout + at * out_features * es,
                                    weights[g], group_sizes[g], in_features, out_features, 0, 0};
    }
    return run_products(dtype, ps, count);
}

it_status it_moe_grouped_linear_backward_weight(it_device device, it_dtype dtype,
                                                void *const *dweights, const void *dout,
                                                const void *x, const int64_t *group_sizes,
                                                int64_t groups, int64_t rows, int64_t in_features,
                                                int64_t out_features) {
    const char *fn = "it_moe_grouped_linear_backward_weight";
    IT_TRY(check_groups(fn, device, dtype, (const void *const *)dweights, group_sizes, groups, rows, in_features,
                        out_features, in_features * out_features > 0));
    if (in_features * out_features == 0 || groups == 0) return IT_OK;
    IT_CHECK_ARG(rows == 0 || (dout && x), "%s: NULL pointer", fn);
    for (int64_t g = 0; g < groups; g++) {
        IT_CHECK_NO_ALIAS(dweights[g], dout, fn);
        IT_CHECK_NO_ALIAS(dweights[g], x, fn);
    }
    IT_DISPATCH(moe_grouped_linear_backward_weight, device, dtype, dweights, dout, x, group_sizes, groups, rows,
                in_features, out_features);
    size_t es = it_dtype_size(dtype);
    product *ps = new_products(groups);
    IT_REQUIRE(ps, IT_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld groups", fn, (long long)groups);
    int64_t count = 0;
    for (int64_t g = 0, at = 0; g < groups; at += group_sizes[g++]) {
        if (!group_sizes[g]) /* an expert without rows still gets its (zero) gradient */
            memset(dweights[g], 0, (size_t)(in_features * out_features) * es);
        else
            ps[count++] = (product){dweights[g], (const char *)dout + at * out_features * es,
                                    (const char *)x + at * in_features * es, out_features, in_features,
                                    group_sizes[g], 1, 0};
    }
    return run_products(dtype, ps, count);
}
