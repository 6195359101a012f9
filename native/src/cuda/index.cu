// Moving data by index, the twins of cpu/index.c: comparisons and selection (where), gather /
// index_select, scatter_add / index_add, running sums and top-k. Accumulations run in a fixed order per output
// (one thread per (outer, inner) column walking the indexed axis), so they are deterministic.
// Indices may be negative (counted from the end); one outside [-n, n) raises the device's
// index flag, reported at the host's next synchronisation, and is skipped.
#include <type_traits>

#include "common.cuh"

namespace {
// Arithmetic in the type the CPU kernels use: 16-bit floats widen to float, the rest stay as
// they are; narrow rounds back once.
template <typename T> __device__ __forceinline__ T widen(T x) { return x; }
__device__ __forceinline__ float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float widen(__half x) { return __half2float(x); }
template <typename T, typename A> __device__ __forceinline__ T narrow(A v) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value)
        return from_f<T>((float)v);
    else
        return (T)v;
}

__device__ __forceinline__ bool wrap(int64_t *t, int64_t n) {
    if (*t < 0) *t += n;
    return *t >= 0 && *t < n;
}


// gather: out[o, j, i] = inp[o, index[o, j, i], i]; select: index[j] shared by every (o, i)
template <typename E>
__global__ void gather_kernel(E *out, const E *inp, const void *idx, int is64, int shared, int64_t outer,
                              int64_t n, int64_t k, int64_t inner, int *bad) {
    GRID_STRIDE(e, outer * k * inner) {
        int64_t i = e % inner, j = (e / inner) % k, o = e / (inner * k);
        int64_t t = index_at(idx, is64, shared ? j : e);
        if (!wrap(&t, n)) {
            *bad = 1;
            continue;
        }
        out[e] = inp[(o * n + t) * inner + i];
    }
}

// scatter_add: out[o, index[o, j, i], i] += src[o, j, i]; index_add: index[j] shared
template <typename T>
__global__ void scatter_add_kernel(T *out, const T *src, const void *idx, int is64, int shared,
                                   int64_t outer, int64_t n, int64_t k, int64_t inner, int *bad) {
    GRID_STRIDE(w, outer * inner) {
        int64_t o = w / inner, i = w % inner;
        for (int64_t j = 0; j < k; j++) {
            int64_t e = (o * k + j) * inner + i;
            int64_t t = index_at(idx, is64, shared ? j : e);
            if (!wrap(&t, n)) {
                *bad = 1;
                continue;
            }
            int64_t d = (o * n + t) * inner + i;
            out[d] = narrow<T>(widen(out[d]) + widen(src[e]));
        }
    }
}

// A: the running sum's type, as on the CPU: float for float32/bfloat16/float16, int64 for
// int64 (exact), double for the rest
template <typename T, typename A>
__global__ void cumsum_kernel(T *out, const T *inp, int64_t outer, int64_t n, int64_t inner) {
    GRID_STRIDE(w, outer * inner) {
        int64_t o = w / inner, i = w % inner;
        A acc = 0;
        for (int64_t j = 0; j < n; j++) {
            int64_t e = (o * n + j) * inner + i;
            acc += (A)widen(inp[e]);
            out[e] = narrow<T>(acc);
        }
    }
}

// Calls __VA_ARGS__ with T the C++ type of any dtype but bool (the library has refused bool).
#define ANY_BUT_BOOL(dtype, fn, ...)                                                          \
    switch (dtype) {                                                                          \
    case IT_INT32: { using T = int32_t; __VA_ARGS__; break; }                                 \
    case IT_INT64: { using T = int64_t; __VA_ARGS__; break; }                                 \
    case IT_UINT8: { using T = uint8_t; __VA_ARGS__; break; }                                 \
    default: FLOAT_OR_DOUBLE(dtype, fn, __VA_ARGS__)                                          \
    }



it_status gather(it_device device, it_dtype dtype, void *out, const void *inp, const void *index,
                 it_dtype index_dtype, int64_t outer, int64_t n, int64_t k, int64_t inner, int shared,
                 const char *fn) {
    if (outer * k * inner == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    BY_SIZE(dtype_bytes(dtype), fn,
            gather_kernel<E><<<it_blocks(outer * k * inner), IT_THREADS, 0, s>>>(
                (E *)out, (const E *)inp, index, index_dtype == IT_INT64, shared, outer, n, k, inner, bad));
    CU_LAUNCHED();
    return IT_OK;
}

it_status scatter_add(it_device device, it_dtype dtype, void *out, const void *src, const void *index,
                      it_dtype index_dtype, int64_t outer, int64_t n, int64_t k, int64_t inner, int shared,
                      const char *fn) {
    if (outer * k * inner == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    ANY_BUT_BOOL(dtype, fn,
                    scatter_add_kernel<T><<<it_blocks(outer * inner), IT_THREADS, 0, s>>>(
                        (T *)out, (const T *)src, index, index_dtype == IT_INT64, shared, outer, n, k, inner,
                        bad));
    CU_LAUNCHED();
    return IT_OK;
}
// top-k of each row: one thread per row with the CPU kernel's insertion-sorted best-k buffer,
// so ties and NaN order as on the CPU (rows are few when sampling; n is a vocabulary)
__device__ bool ranks_before(double va, int64_t ia, double vb, int64_t ib, int largest) {
    bool na = va != va, nb = vb != vb;  // NaN counts as the largest value
    if (na || nb) return na && nb ? ia < ib : (largest ? na : nb);
    if (va != vb) return largest ? va > vb : va < vb;
    return ia < ib;  // ties: the lower index first
}

__global__ void topk_kernel(int dtype, size_t es, void *values, int64_t *indices, const void *inp,
                            double *best, int64_t rows, int64_t n, int64_t k, int largest) {
    GRID_STRIDE(r, rows) {
        double *bv = best + r * k;
        int64_t *bi = indices + r * k, filled = 0;
        for (int64_t j = 0; j < n; j++) {
            double v = load_f64(dtype, inp, r * n + j);
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
        for (int64_t j = 0; j < k; j++) {  // the values as stored, whatever the dtype
            const char *src = (const char *)inp + (size_t)(r * n + bi[j]) * es;
            char *dst = (char *)values + (size_t)(r * k + j) * es;
            for (size_t b = 0; b < es; b++) dst[b] = src[b];
        }
    }
}

template <typename T> __device__ bool compare(int op, T a, T b) {
    switch (op) {
    case IT_EQ: return a == b;
    case IT_NE: return a != b;
    case IT_LT: return a < b;
    case IT_LE: return a <= b;
    case IT_GT: return a > b;
    default: return a >= b;  // IT_GE
    }
}

template <typename T>
__global__ void compare_kernel(int op, uint8_t *out, const T *a, const T *b, Strided s, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t off[2];
        offsets(s, i, 2, off);
        out[i] = compare(op, load_acc(a, off[0]), load_acc(b, off[1]));
    }
}

template <typename E>  // E: a type of the element's size; `where` only moves bytes
__global__ void where_kernel(E *out, const uint8_t *cond, const E *a, const E *b, Strided s, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t off[3];
        offsets(s, i, 3, off);
        out[i] = cond[off[0]] ? a[off[1]] : b[off[2]];
    }
}

}  // namespace

extern "C" {


it_status it_cuda_gather(it_device device, it_dtype dtype, void *out, const void *inp, const void *index,
                         it_dtype index_dtype, int64_t outer, int64_t n, int64_t k, int64_t inner) {
    return gather(device, dtype, out, inp, index, index_dtype, outer, n, k, inner, 0, "it_gather");
}

it_status it_cuda_index_select(it_device device, it_dtype dtype, void *out, const void *inp,
                               const void *index, it_dtype index_dtype, int64_t outer, int64_t n, int64_t k,
                               int64_t inner) {
    return gather(device, dtype, out, inp, index, index_dtype, outer, n, k, inner, 1, "it_index_select");
}

it_status it_cuda_scatter_add(it_device device, it_dtype dtype, void *out, const void *src,
                              const void *index, it_dtype index_dtype, int64_t outer, int64_t n, int64_t k,
                              int64_t inner) {
    return scatter_add(device, dtype, out, src, index, index_dtype, outer, n, k, inner, 0, "it_scatter_add");
}

it_status it_cuda_index_add(it_device device, it_dtype dtype, void *out, const void *src, const void *index,
                            it_dtype index_dtype, int64_t outer, int64_t n, int64_t k, int64_t inner) {
    return scatter_add(device, dtype, out, src, index, index_dtype, outer, n, k, inner, 1, "it_index_add");
}

it_status it_cuda_cumsum(it_device device, it_dtype dtype, void *out, const void *inp, int64_t outer,
                         int64_t n, int64_t inner) {
    if (outer * n * inner == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    ANY_BUT_BOOL(dtype, "it_cumsum", {
        using A = typename std::conditional<std::is_same<T, int64_t>::value, int64_t,
                  typename std::conditional<std::is_integral<T>::value || std::is_same<T, double>::value,
                                            double, float>::type>::type;
        cumsum_kernel<T, A><<<it_blocks(outer * inner), IT_THREADS, 0, s>>>((T *)out, (const T *)inp, outer,
                                                                            n, inner);
    });
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_topk(it_device device, it_dtype dtype, void *values, int64_t *indices, const void *inp,
                       int64_t rows, int64_t n, int64_t k, int32_t largest) {
    if (rows * k == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    double *best;
    CU_TRY(cudaMallocAsync((void **)&best, (size_t)(rows * k) * sizeof(double), s));
    topk_kernel<<<it_blocks(rows, 64), 64, 0, s>>>((int)dtype, dtype_bytes(dtype), values, indices, inp, best,
                                                   rows, n, k, largest);
    cudaError_t launched = cudaPeekAtLastError();
    CU_TRY(cudaFreeAsync(best, s));
    CU_TRY(launched);
    return IT_OK;
}

it_status it_cuda_compare(it_device device, it_compare_op op, it_dtype dtype, uint8_t *out,
                          const void *a, const int64_t *a_strides, const void *b,
                          const int64_t *b_strides, const int64_t *shape, int32_t ndim) {
    int64_t n;
    Strided st = strided(shape, ndim, {a_strides, b_strides}, &n);
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    switch (dtype) {
    case IT_INT32: compare_kernel<int32_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, out, (const int32_t *)a, (const int32_t *)b, st, n); break;
    case IT_INT64: compare_kernel<int64_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, out, (const int64_t *)a, (const int64_t *)b, st, n); break;
    case IT_UINT8:
    case IT_BOOL: compare_kernel<uint8_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, out, (const uint8_t *)a, (const uint8_t *)b, st, n); break;
    default:
        FLOAT_OR_DOUBLE(dtype, "it_compare",
                        compare_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, out, (const T *)a, (const T *)b, st, n));
    }
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_where(it_device device, it_dtype dtype, void *out, const uint8_t *cond,
                        const int64_t *cond_strides, const void *a, const int64_t *a_strides,
                        const void *b, const int64_t *b_strides, const int64_t *shape, int32_t ndim) {
    int64_t n;
    Strided st = strided(shape, ndim, {cond_strides, a_strides, b_strides}, &n);
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    BY_SIZE(dtype_bytes(dtype), "it_where",
            where_kernel<E><<<it_blocks(n), IT_THREADS, 0, s>>>((E *)out, cond, (const E *)a, (const E *)b, st, n));
    CU_LAUNCHED();
    return IT_OK;
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(gather);
IT_CUDA_MIRRORS(index_select);
IT_CUDA_MIRRORS(scatter_add);
IT_CUDA_MIRRORS(index_add);
IT_CUDA_MIRRORS(cumsum);
IT_CUDA_MIRRORS(topk);
IT_CUDA_MIRRORS(compare);
IT_CUDA_MIRRORS(where);
