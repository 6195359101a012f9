/* Comparisons, selection (where), indexing along one axis (gather, scatter-add,
 * index_select, index_add), running sums and top-k. Values are moved as raw elements where
 * no arithmetic is needed, so every dtype works; arithmetic happens in double (float64 and
 * integers) or float32 (the 16-bit dtypes). */
#include "common.h"

static it_status check_strided(const char *fn, int32_t ndim, const int64_t *shape,
                               const int64_t *const *strides, int nops, int64_t *numel) {
    IT_CHECK_ARG(ndim >= 0 && ndim <= IT_MAX_DIMS, "%s: ndim %d not in [0, %d]", fn, (int)ndim,
                 IT_MAX_DIMS);
    IT_CHECK_ARG(ndim == 0 || shape != NULL, "%s: shape is NULL", fn);
    for (int o = 0; o < nops; o++)
        IT_CHECK_ARG(ndim == 0 || strides[o] != NULL, "%s: strides of operand %d are NULL", fn, o);
    int64_t total = 1;
    for (int d = 0; d < ndim; d++) {
        IT_CHECK_SIZE(shape[d], fn);
        IT_CHECK_ARG(shape[d] == 0 || total <= INT64_MAX / shape[d],
                     "%s: the shape's element count overflows int64", fn);
        total *= shape[d];
    }
    *numel = total;
    return IT_OK;
}

/* The shape and the inputs' strides with the contiguous output's (st[0]), their dimensions
 * merged where every operand allows (it_collapse_dims): an elementwise op over contiguous
 * tensors becomes one dimension, for this loop and for the CUDA kernels. Returns the new ndim;
 * the inputs' strides are st[1..nin]. */
static int collapse(int32_t ndim, const int64_t *shape, const int64_t *const *in, int nin,
                    int64_t *sh, int64_t st[][IT_MAX_DIMS + 1]) {
    int64_t *rows[4] = {st[0], st[1], st[2], st[3]}, run = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        sh[d] = shape[d];
        st[0][d] = run;
        for (int o = 0; o < nin; o++) st[o + 1][d] = in[o][d];
        run *= shape[d];
    }
    return it_collapse_dims(ndim, sh, rows, nin + 1);
}

/* Offset of flat element e of a `shape` tensor read through `strides` (row-major order). */
static inline int64_t strided_offset(int64_t e, const int64_t *shape, const int64_t *strides,
                                     int ndim) {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        off += (e % shape[d]) * strides[d];
        e /= shape[d];
    }
    return off;
}

/* The comparison from the order of two values: lt/gt, or neither (equal, or unordered when a
 * NaN is involved, which only != accepts). */
static inline int compare_result(it_compare_op op, int lt, int gt, int unordered) {
    switch (op) {
    case IT_EQ: return !lt && !gt && !unordered;
    case IT_NE: return lt || gt || unordered;
    case IT_LT: return lt;
    case IT_LE: return lt || (!gt && !unordered);
    case IT_GT: return gt;
    case IT_GE: return gt || (!lt && !unordered);
    }
    return 0;
}

it_status it_compare(it_device device, it_compare_op op, it_dtype dtype, uint8_t *out,
                     const void *a, const int64_t *a_strides, const void *b,
                     const int64_t *b_strides, const int64_t *shape, int32_t ndim) {
    IT_CHECK_DEVICE(device, "it_compare");
    IT_CHECK_ARG(op >= IT_EQ && op <= IT_GE, "it_compare: unknown op %d", (int)op);
    IT_CHECK_ARG(it_dtype_size(dtype) != 0, "it_compare: unknown dtype %d", (int)dtype);
    const int64_t *strides[2] = {a_strides, b_strides};
    int64_t numel;
    IT_TRY(check_strided("it_compare", ndim, shape, strides, 2, &numel));
    if (numel == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_compare");
    IT_CHECK_PTR(a, "it_compare");
    IT_CHECK_PTR(b, "it_compare");
    int64_t sh[IT_MAX_DIMS + 1], st[4][IT_MAX_DIMS + 1];
    ndim = collapse(ndim, shape, strides, 2, sh, st);
    shape = sh, a_strides = st[1], b_strides = st[2];
    IT_DISPATCH(compare, device, op, dtype, out, a, a_strides, b, b_strides, shape, ndim);
    int exact_int = dtype == IT_INT64; /* doubles cannot hold every int64 */
#pragma omp parallel for schedule(static) if (numel > 32768)
    for (int64_t e = 0; e < numel; e++) {
        int64_t ia = strided_offset(e, shape, a_strides, ndim);
        int64_t ib = strided_offset(e, shape, b_strides, ndim);
        if (exact_int) {
            int64_t x = ((const int64_t *)a)[ia], y = ((const int64_t *)b)[ib];
            out[e] = (uint8_t)compare_result(op, x < y, x > y, 0);
        } else {
            double x = it_load_f64(dtype, a, ia), y = it_load_f64(dtype, b, ib);
            out[e] = (uint8_t)compare_result(op, x < y, x > y, x != x || y != y);
        }
    }
    return IT_OK;
}

it_status it_where(it_device device, it_dtype dtype, void *out, const uint8_t *cond,
                   const int64_t *cond_strides, const void *a, const int64_t *a_strides,
                   const void *b, const int64_t *b_strides, const int64_t *shape, int32_t ndim) {
    IT_CHECK_DEVICE(device, "it_where");
    IT_CHECK_ARG(it_dtype_size(dtype) != 0, "it_where: unknown dtype %d", (int)dtype);
    const int64_t *strides[3] = {cond_strides, a_strides, b_strides};
    int64_t numel;
    IT_TRY(check_strided("it_where", ndim, shape, strides, 3, &numel));
    if (numel == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_where");
    IT_CHECK_PTR(cond, "it_where");
    IT_CHECK_PTR(a, "it_where");
    IT_CHECK_PTR(b, "it_where");
    int64_t sh[IT_MAX_DIMS + 1], st[4][IT_MAX_DIMS + 1];
    ndim = collapse(ndim, shape, strides, 3, sh, st);
    shape = sh, cond_strides = st[1], a_strides = st[2], b_strides = st[3];
    IT_DISPATCH(where, device, dtype, out, cond, cond_strides, a, a_strides, b, b_strides, shape,
                ndim);
    size_t es = it_dtype_size(dtype);
#pragma omp parallel for schedule(static) if (numel > 32768)
    for (int64_t e = 0; e < numel; e++) {
        int take_a = cond[strided_offset(e, shape, cond_strides, ndim)] != 0;
        const char *src = take_a ? (const char *)a + strided_offset(e, shape, a_strides, ndim) * (int64_t)es
                                 : (const char *)b + strided_offset(e, shape, b_strides, ndim) * (int64_t)es;
        memcpy((char *)out + e * (int64_t)es, src, es);
    }
    return IT_OK;
}

/* ---- indexing along one axis ------------------------------------------------------------ */
static it_status check_axis(const char *fn, it_device device, it_dtype dtype, const void *x, const void *y,
                            const void *index, it_dtype index_dtype, int64_t outer, int64_t n,
                            int64_t k, int64_t inner, int64_t index_count) {
    IT_CHECK_ARG(it_dtype_size(dtype) != 0, "%s: unknown dtype %d", fn, (int)dtype);
    IT_CHECK_ARG(index_dtype == IT_INT32 || index_dtype == IT_INT64,
                 "%s: indices must be int32 or int64, got %s", fn, it_dtype_name(index_dtype));
    IT_CHECK_SIZE(outer, fn);
    IT_CHECK_SIZE(n, fn);
    IT_CHECK_SIZE(k, fn);
    IT_CHECK_SIZE(inner, fn);
    IT_CHECK_ARG((outer == 0 || (n <= INT64_MAX / outer && k <= INT64_MAX / outer)) &&
                     (inner == 0 || (outer * n <= INT64_MAX / inner && outer * k <= INT64_MAX / inner)),
                 "%s: sizes overflow int64", fn);
    if (outer * k * inner == 0) return IT_OK;
    IT_CHECK_PTR(x, fn);
    IT_CHECK_PTR(y, fn);
    IT_CHECK_PTR(index, fn);
    /* On the CPU every index is checked before anything is written, so an error leaves out
     * untouched. CUDA indices live in device memory, which the host must not read: the kernel
     * checks them and reports at the next synchronisation (it_cuda_check_index_flag). */
    if (device.type != IT_CPU) return IT_OK;
    for (int64_t i = 0; i < index_count; i++) {
        int64_t v = it_load_index(index_dtype, index, i);
        IT_REQUIRE(v >= -n && v < n, IT_ERR_INDEX_OUT_OF_RANGE,
                   "%s: index %lld is out of range for a dimension of size %lld", fn,
                   (long long)v, (long long)n);
    }
    return IT_OK;
}

static inline int64_t wrap_index(int64_t v, int64_t n) { return v < 0 ? v + n : v; }

it_status it_gather(it_device device, it_dtype dtype, void *out, const void *inp,
                    const void *index, it_dtype index_dtype, int64_t outer, int64_t n,
                    int64_t k, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_gather");
    IT_TRY(check_axis("it_gather", device, dtype, out, inp, index, index_dtype, outer, n, k, inner,
                      outer * k * inner));
    IT_DISPATCH(gather, device, dtype, out, inp, index, index_dtype, outer, n, k, inner);
    size_t es = it_dtype_size(dtype);
#pragma omp parallel for schedule(static) if (outer * k * inner > 32768)
    for (int64_t e = 0; e < outer * k * inner; e++) {
        int64_t o = e / (k * inner), i = e % inner;
        int64_t src = (o * n + wrap_index(it_load_index(index_dtype, index, e), n)) * inner + i;
        memcpy((char *)out + e * (int64_t)es, (const char *)inp + src * (int64_t)es, es);
    }
    return IT_OK;
}

it_status it_index_select(it_device device, it_dtype dtype, void *out, const void *inp,
                          const void *index, it_dtype index_dtype, int64_t outer, int64_t n,
                          int64_t k, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_index_select");
    IT_TRY(check_axis("it_index_select", device, dtype, out, inp, index, index_dtype, outer, n, k,
                      inner, k));
    IT_DISPATCH(index_select, device, dtype, out, inp, index, index_dtype, outer, n, k, inner);
    size_t es = it_dtype_size(dtype);
    size_t row = (size_t)inner * es;
#pragma omp parallel for schedule(static) if (outer * k * inner > 32768)
    for (int64_t r = 0; r < outer * k; r++) {
        int64_t o = r / k, j = r % k;
        int64_t src = o * n + wrap_index(it_load_index(index_dtype, index, j), n);
        memcpy((char *)out + (size_t)r * row, (const char *)inp + (size_t)src * row, row);
    }
    return IT_OK;
}

/* Scatter-adds run one thread per (outer, inner) column: two indices may name the same
 * destination, and the order of the additions is then fixed (ascending j) whatever the
 * thread count. */
static void add_at(it_dtype dtype, void *out, int64_t dst, const void *src, int64_t at) {
    it_store_f64(dtype, out, dst, it_load_f64(dtype, out, dst) + it_load_f64(dtype, src, at));
}

it_status it_scatter_add(it_device device, it_dtype dtype, void *out, const void *src,
                         const void *index, it_dtype index_dtype, int64_t outer, int64_t n,
                         int64_t k, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_scatter_add");
    IT_TRY(check_axis("it_scatter_add", device, dtype, out, src, index, index_dtype, outer, n, k, inner,
                      outer * k * inner));
    IT_REQUIRE(dtype != IT_BOOL, IT_ERR_NOT_SUPPORTED, "it_scatter_add: bool is not supported");
    IT_DISPATCH(scatter_add, device, dtype, out, src, index, index_dtype, outer, n, k, inner);
#pragma omp parallel for schedule(static) if (outer * k * inner > 32768)
    for (int64_t c = 0; c < outer * inner; c++) {
        int64_t o = c / inner, i = c % inner;
        for (int64_t j = 0; j < k; j++) {
            int64_t e = (o * k + j) * inner + i;
            int64_t dst = (o * n + wrap_index(it_load_index(index_dtype, index, e), n)) * inner + i;
            add_at(dtype, out, dst, src, e);
        }
    }
    return IT_OK;
}

it_status it_index_add(it_device device, it_dtype dtype, void *out, const void *src,
                       const void *index, it_dtype index_dtype, int64_t outer, int64_t n,
                       int64_t k, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_index_add");
    IT_TRY(check_axis("it_index_add", device, dtype, out, src, index, index_dtype, outer, n, k, inner, k));
    IT_REQUIRE(dtype != IT_BOOL, IT_ERR_NOT_SUPPORTED, "it_index_add: bool is not supported");
    IT_DISPATCH(index_add, device, dtype, out, src, index, index_dtype, outer, n, k, inner);
#pragma omp parallel for schedule(static) if (outer * k * inner > 32768)
    for (int64_t c = 0; c < outer * inner; c++) {
        int64_t o = c / inner, i = c % inner;
        for (int64_t j = 0; j < k; j++) {
            int64_t dst = (o * n + wrap_index(it_load_index(index_dtype, index, j), n)) * inner + i;
            add_at(dtype, out, dst, src, (o * k + j) * inner + i);
        }
    }
    return IT_OK;
}

it_status it_cumsum(it_device device, it_dtype dtype, void *out, const void *inp, int64_t outer,
                    int64_t n, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_cumsum");
    IT_REQUIRE(dtype != IT_BOOL && it_dtype_size(dtype) != 0, IT_ERR_NOT_SUPPORTED,
               "it_cumsum: dtype %d is not supported", (int)dtype);
    IT_CHECK_SIZE(outer, "it_cumsum");
    IT_CHECK_SIZE(n, "it_cumsum");
    IT_CHECK_SIZE(inner, "it_cumsum");
    IT_CHECK_PRODUCT("it_cumsum", outer, n, inner);
    if (outer * n * inner == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_cumsum");
    IT_CHECK_PTR(inp, "it_cumsum");
    IT_DISPATCH(cumsum, device, dtype, out, inp, outer, n, inner);
    int is_int = dtype == IT_INT32 || dtype == IT_INT64 || dtype == IT_UINT8;
#pragma omp parallel for schedule(static) if (outer * n * inner > 32768)
    for (int64_t c = 0; c < outer * inner; c++) {
        int64_t o = c / inner, i = c % inner;
        double acc = 0.0;
        float accf = 0.0f;
        int64_t acci = 0;
        for (int64_t j = 0; j < n; j++) {
            int64_t at = (o * n + j) * inner + i;
            if (dtype == IT_INT64) {
                acci += ((const int64_t *)inp)[at];
                ((int64_t *)out)[at] = acci;
            } else if (is_int || dtype == IT_FLOAT64) {
                acc += it_load_f64(dtype, inp, at);
                it_store_f64(dtype, out, at, acc);
            } else { /* float32 accumulation, as the other float32 kernels */
                accf += (float)it_load_f64(dtype, inp, at);
                it_store_f64(dtype, out, at, accf);
            }
        }
    }
    return IT_OK;
}

/* ---- top-k -------------------------------------------------------------------------- */
/* Does (va, ia) come before (vb, ib) in the output order? NaN ranks as the largest value;
 * equal values keep the lower index first (a stable order). */
static inline int ranks_before(double va, int64_t ia, double vb, int64_t ib, int largest) {
    int na = va != va, nb = vb != vb;
    if (na || nb) {
        if (na && nb) return ia < ib;
        return largest ? na : nb;
    }
    if (va != vb) return largest ? va > vb : va < vb;
    return ia < ib;
}

it_status it_topk(it_device device, it_dtype dtype, void *values, int64_t *indices,
                  const void *inp, int64_t rows, int64_t n, int64_t k, int32_t largest) {
    IT_CHECK_DEVICE(device, "it_topk");
    IT_REQUIRE(dtype != IT_BOOL && it_dtype_size(dtype) != 0, IT_ERR_NOT_SUPPORTED,
               "it_topk: dtype %d is not supported", (int)dtype);
    IT_CHECK_SIZE(rows, "it_topk");
    IT_CHECK_SIZE(n, "it_topk");
    IT_CHECK_ARG(k >= 0 && k <= n, "it_topk: k = %lld is not in [0, %lld]", (long long)k,
                 (long long)n);
    IT_CHECK_PRODUCT("it_topk", rows, n);
    IT_CHECK_FLAG(largest, "it_topk");
    if (rows * k == 0) return IT_OK;
    IT_CHECK_PTR(values, "it_topk");
    IT_CHECK_PTR(indices, "it_topk");
    IT_CHECK_PTR(inp, "it_topk");
    IT_DISPATCH(topk, device, dtype, values, indices, inp, rows, n, k, largest);
    /* Each row keeps its best k in a sorted buffer (insertion): O(n k), fine for the k of
     * sampling and tests; a row of n is read once. */
    double *best = (double *)it_scratch_alloc((size_t)rows * (size_t)k * sizeof(double));
    IT_REQUIRE(best, IT_ERR_OUT_OF_MEMORY, "it_topk: out of memory");
#pragma omp parallel for schedule(static) if (rows * n > 32768)
    for (int64_t r = 0; r < rows; r++) {
        double *bv = best + r * k;
        int64_t *bi = indices + r * k, filled = 0;
        for (int64_t j = 0; j < n; j++) {
            double v = it_load_f64(dtype, inp, r * n + j);
            if (filled == k && !ranks_before(v, j, bv[k - 1], bi[k - 1], largest)) continue;
            int64_t at = filled < k ? filled++ : k - 1;
            while (at > 0 && ranks_before(v, j, bv[at - 1], bi[at - 1], largest)) {
                bv[at] = bv[at - 1];
                bi[at] = bi[at - 1];
                at--;
            }
            bv[at] = v;
            bi[at] = j;
        }
        for (int64_t j = 0; j < k; j++) {
            int64_t src = r * n + bi[j];
            size_t es = it_dtype_size(dtype);
            memcpy((char *)values + (size_t)(r * k + j) * es, (const char *)inp + (size_t)src * es, es);
        }
    }
    it_scratch_free(best);
    return IT_OK;
}
