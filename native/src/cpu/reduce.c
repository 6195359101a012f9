/* Sum, mean, max, min and argmax over the middle axis of [outer, n, inner].
 * Long sums are cut into fixed blocks whose partial sums are added in order, so results do
 * not depend on the thread count. */
#include "common.h"

#include <omp.h>

IT_HOT static float block_sum(const float *x, int64_t n) { return it_vsum(x, n); }

static float block_extreme(const float *x, int64_t n, int is_max) {
    float m = x[0];
    for (int64_t i = 1; i < n; i++) {
        if (x[i] != x[i]) return x[i];
        m = is_max ? (x[i] > m ? x[i] : m) : (x[i] < m ? x[i] : m);
    }
    return m;
}

static float combine(it_reduce_op op, float acc, float v) {
    if (op == IT_SUM || op == IT_MEAN) return acc + v;
    if (acc != acc || v != v) return acc != acc ? acc : v;
    return op == IT_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
}

/* float64: one output at a time, summed in order in double precision. */
static void reduce_f64(it_reduce_op op, double *out, const double *inp, int64_t outer, int64_t n,
                       int64_t inner) {
#pragma omp parallel for schedule(static) if (outer * n * inner > 32768)
    for (int64_t w = 0; w < outer * inner; w++) {
        int64_t o = w / inner, i = w % inner;
        const double *x = inp + o * n * inner + i;
        double acc = op == IT_SUM || op == IT_MEAN ? 0.0 : x[0];
        for (int64_t j = 0; j < n; j++) {
            double v = x[j * inner];
            if (op == IT_SUM || op == IT_MEAN) acc += v;
            else if (acc != acc || v != v) acc = acc != acc ? acc : v;
            else acc = op == IT_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
        }
        out[w] = op == IT_MEAN ? acc / (double)n : acc;
    }
}

it_status it_reduce(it_device device, it_reduce_op op, it_dtype dtype, void *out, const void *inp,
                    int64_t outer, int64_t n, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_reduce");
    IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64, IT_ERR_NOT_SUPPORTED,
               "it_reduce: dtype %s is not supported (a floating-point dtype)", it_dtype_name(dtype));
    IT_CHECK_ARG(op >= IT_SUM && op <= IT_MIN, "it_reduce: unknown op %d", (int)op);
    IT_CHECK_SIZE(outer, "it_reduce");
    IT_CHECK_SIZE(inner, "it_reduce");
    IT_CHECK_SIZE(n, "it_reduce");
    IT_REQUIRE(n > 0 || op == IT_SUM, IT_ERR_INVALID_ARGUMENT,
               "it_reduce: mean/max/min of an empty dimension is undefined");
    IT_CHECK_PRODUCT("it_reduce", 8, outer, n, inner);
    IT_CHECK_PRODUCT("it_reduce", 8, outer, inner);
    if (outer * inner == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_reduce");
    IT_CHECK_ARG(inp != NULL || n == 0, "it_reduce: inp is NULL");
    IT_DISPATCH(reduce, device, op, dtype, out, inp, outer, n, inner);
    if (dtype == IT_FLOAT64) {
        reduce_f64(op, (double *)out, (const double *)inp, outer, n, inner);
        return IT_OK;
    }

    if (inner == 1) {
        int64_t nblocks = n > 0 ? (n + IT_SUM_BLOCK - 1) / IT_SUM_BLOCK : 1;
        float *partial = (float *)it_scratch_alloc((size_t)(outer * nblocks) * sizeof(float));
        IT_REQUIRE(partial, IT_ERR_OUT_OF_MEMORY, "it_reduce: out of memory");
#pragma omp parallel if (outer * n > 32768)
        {
            float buf[IT_SUM_BLOCK];
#pragma omp for schedule(static)
            for (int64_t w = 0; w < outer * nblocks; w++) {
                int64_t o = w / nblocks, off = (w % nblocks) * IT_SUM_BLOCK;
                int64_t len = n - off < IT_SUM_BLOCK ? n - off : IT_SUM_BLOCK;
                if (len <= 0) { partial[w] = 0.0f; continue; }
                const float *x = it_row_load(dtype, inp, o * n + off, len, buf);
                partial[w] = (op == IT_SUM || op == IT_MEAN) ? block_sum(x, len)
                                                            : block_extreme(x, len, op == IT_MAX);
            }
#pragma omp for schedule(static)
            for (int64_t o = 0; o < outer; o++) {
                float acc = partial[o * nblocks];
                for (int64_t b = 1; b < nblocks; b++) acc = combine(op, acc, partial[o * nblocks + b]);
                if (op == IT_MEAN) acc /= (float)n;
                it_row_store(dtype, out, o, &acc, 1);
                if (dtype == IT_FLOAT32) ((float *)out)[o] = acc;
            }
        }
        it_scratch_free(partial);
        return IT_OK;
    }

    /* Columns are split among the threads (each column summed over n in order, so the split
     * changes no bits): a bias gradient ([1, tokens, 768]) is one output row, which chunks of
     * IT_CHUNK columns would leave to a single thread. */
    int64_t width = IT_CHUNK, threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (outer < 2 * threads) {
        int64_t even = (inner + 2 * threads - 1) / (2 * threads);
        even = (even + 63) / 64 * 64;  /* whole cache lines of columns */
        width = even < width ? even : width;
    }
    int64_t nchunks = (inner + width - 1) / width;
#pragma omp parallel if (outer * n * inner > 32768)
    {
        float acc[IT_CHUNK], buf[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t w = 0; w < outer * nchunks; w++) {
            int64_t o = w / nchunks, i0 = (w % nchunks) * width;
            int64_t len = inner - i0 < width ? inner - i0 : width;
            for (int64_t i = 0; i < len; i++) acc[i] = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                const float *x = it_row_load(dtype, inp, (o * n + j) * inner + i0, len, buf);
                if (j == 0) memcpy(acc, x, (size_t)len * sizeof(float));
                else for (int64_t i = 0; i < len; i++) acc[i] = combine(op, acc[i], x[i]);
            }
            if (op == IT_MEAN) for (int64_t i = 0; i < len; i++) acc[i] /= (float)n;
            if (dtype == IT_FLOAT32) memcpy((float *)out + o * inner + i0, acc, (size_t)len * 4);
            else it_row_store(dtype, out, o * inner + i0, acc, len);
        }
    }
    return IT_OK;
}

/* Index of the first maximum (or minimum) along n; a NaN wins over any number. */
static it_status check_arg_extreme(const char *fn, it_dtype dtype, int64_t *out,
                                   const void *inp, int64_t outer, int64_t n, int64_t inner) {
    IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64, IT_ERR_NOT_SUPPORTED,
               "%s: dtype %s is not supported (a floating-point dtype)", fn, it_dtype_name(dtype));
    IT_CHECK_SIZE(outer, fn);
    IT_CHECK_SIZE(inner, fn);
    IT_CHECK_ARG(n > 0, "%s: the reduced dimension is empty", fn);
    IT_CHECK_PRODUCT(fn, 8, outer, n, inner);
    IT_CHECK_ARG(outer * inner == 0 || (out && inp), "%s: NULL pointer", fn);
    return IT_OK;
}

static it_status arg_extreme(int is_max, it_dtype dtype, int64_t *out, const void *inp,
                             int64_t outer, int64_t n, int64_t inner) {
    if (outer * inner == 0) return IT_OK;
#pragma omp parallel for schedule(static) if (outer * n * inner > 32768)
    for (int64_t w = 0; w < outer * inner; w++) {
        int64_t o = w / inner, i = w % inner, best = 0;
        double bestv = 0;
        for (int64_t j = 0; j < n; j++) {
            double v = it_load_f64(dtype, inp, (o * n + j) * inner + i);
            if (bestv != bestv && j > 0) break;
            int better = is_max ? v > bestv : v < bestv;
            if (j == 0 || better || v != v) { best = j; bestv = v; }
        }
        out[w] = best;
    }
    return IT_OK;
}

it_status it_argmax(it_device device, it_dtype dtype, int64_t *out, const void *inp,
                    int64_t outer, int64_t n, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_argmax");
    IT_TRY(check_arg_extreme("it_argmax", dtype, out, inp, outer, n, inner));
    IT_DISPATCH(argmax, device, dtype, out, inp, outer, n, inner);
    return arg_extreme(1, dtype, out, inp, outer, n, inner);
}

it_status it_argmin(it_device device, it_dtype dtype, int64_t *out, const void *inp,
                    int64_t outer, int64_t n, int64_t inner) {
    IT_CHECK_DEVICE(device, "it_argmin");
    IT_TRY(check_arg_extreme("it_argmin", dtype, out, inp, outer, n, inner));
    IT_DISPATCH(argmin, device, dtype, out, inp, outer, n, inner);
    return arg_extreme(0, dtype, out, inp, outer, n, inner);
}
