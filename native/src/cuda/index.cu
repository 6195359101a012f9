// Moving data by index: concatenation and its inverse, triangles, gather / index_select,
// scatter_add / index_add and running sums. Accumulations run in a fixed order per output
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

__device__ __forceinline__ int64_t idx_at(const void *idx, int is64, int64_t j) {
    return is64 ? ((const int64_t *)idx)[j] : ((const int32_t *)idx)[j];
}
__device__ __forceinline__ bool wrap(int64_t *t, int64_t n) {
    if (*t < 0) *t += n;
    return *t >= 0 && *t < n;
}

template <typename E>
__global__ void copy_block(E *dst, int64_t dst_stride, const E *src, int64_t src_stride, int64_t outer,
                           int64_t width) {
    GRID_STRIDE(e, outer * width) {
        int64_t o = e / width, c = e % width;
        dst[o * dst_stride + c] = src[o * src_stride + c];
    }
}

template <typename T>
__global__ void triangle_kernel(T *out, const T *inp, int64_t batch, int64_t rows, int64_t cols,
                                int64_t diagonal, int upper, T fill) {
    GRID_STRIDE(e, batch * rows * cols) {
        int64_t c = e % cols, r = (e / cols) % rows;
        bool keep = upper ? c - r >= diagonal : c - r <= diagonal;
        out[e] = keep ? inp[e] : fill;
    }
}

// gather: out[o, j, i] = inp[o, index[o, j, i], i]; select: index[j] shared by every (o, i)
template <typename E>
__global__ void gather_kernel(E *out, const E *inp, const void *idx, int is64, int shared, int64_t outer,
                              int64_t n, int64_t k, int64_t inner, int *bad) {
    GRID_STRIDE(e, outer * k * inner) {
        int64_t i = e % inner, j = (e / inner) % k, o = e / (inner * k);
        int64_t t = idx_at(idx, is64, shared ? j : e);
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
            int64_t t = idx_at(idx, is64, shared ? j : e);
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


it_status concat_or_split(it_device device, it_dtype dtype, void *joined, void *const *parts,
                          const int64_t *sizes, int32_t num, int64_t outer, int64_t inner, int split,
                          const char *fn) {
    int64_t total = 0;
    for (int i = 0; i < num; i++) total += sizes[i];
    if (total * outer * inner == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int64_t at = 0;
    for (int p = 0; p < num; p++) {
        int64_t width = sizes[p] * inner;
        if (width) {
            BY_SIZE(dtype_bytes(dtype), fn, {
                E *j = (E *)joined + at * inner;
                if (split)
                    copy_block<E><<<it_blocks(outer * width), IT_THREADS, 0, s>>>((E *)parts[p], width, j,
                                                                                  total * inner, outer, width);
                else
                    copy_block<E><<<it_blocks(outer * width), IT_THREADS, 0, s>>>(j, total * inner,
                                                                                  (const E *)parts[p], width,
                                                                                  outer, width);
            });
            CU_LAUNCHED();
        }
        at += sizes[p];
    }
    return IT_OK;
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
}  // namespace

extern "C" {

it_status it_cuda_concat(it_device device, it_dtype dtype, void *out, const void *const *inputs,
                         const int64_t *sizes, int32_t num_inputs, int64_t outer, int64_t inner) {
    return concat_or_split(device, dtype, out, (void *const *)inputs, sizes, num_inputs, outer, inner, 0,
                           "it_concat");
}

it_status it_cuda_split(it_device device, it_dtype dtype, void *const *outputs, const void *inp,
                        const int64_t *sizes, int32_t num_outputs, int64_t outer, int64_t inner) {
    return concat_or_split(device, dtype, (void *)inp, outputs, sizes, num_outputs, outer, inner, 1,
                           "it_split");
}

it_status it_cuda_triangle(it_device device, it_dtype dtype, void *out, const void *inp, int64_t batch,
                           int64_t rows, int64_t cols, int64_t diagonal, int32_t upper, double fill_value) {
    if (batch * rows * cols == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int64_t n = batch * rows * cols;
    switch (dtype) {
    case IT_FLOAT32: triangle_kernel<float><<<it_blocks(n), IT_THREADS, 0, s>>>((float *)out, (const float *)inp, batch, rows, cols, diagonal, upper, (float)fill_value); break;
    case IT_FLOAT64: triangle_kernel<double><<<it_blocks(n), IT_THREADS, 0, s>>>((double *)out, (const double *)inp, batch, rows, cols, diagonal, upper, fill_value); break;
    case IT_BFLOAT16: triangle_kernel<__nv_bfloat16><<<it_blocks(n), IT_THREADS, 0, s>>>((__nv_bfloat16 *)out, (const __nv_bfloat16 *)inp, batch, rows, cols, diagonal, upper, __float2bfloat16((float)fill_value)); break;
    case IT_FLOAT16: triangle_kernel<__half><<<it_blocks(n), IT_THREADS, 0, s>>>((__half *)out, (const __half *)inp, batch, rows, cols, diagonal, upper, __float2half((float)fill_value)); break;
    case IT_INT32: triangle_kernel<int32_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int32_t *)out, (const int32_t *)inp, batch, rows, cols, diagonal, upper, (int32_t)fill_value); break;
    case IT_INT64: triangle_kernel<int64_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int64_t *)out, (const int64_t *)inp, batch, rows, cols, diagonal, upper, (int64_t)fill_value); break;
    default: triangle_kernel<uint8_t><<<it_blocks(n), IT_THREADS, 0, s>>>((uint8_t *)out, (const uint8_t *)inp, batch, rows, cols, diagonal, upper, (uint8_t)(fill_value != 0.0)); break;
    }
    CU_LAUNCHED();
    return IT_OK;
}

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

}  // extern "C"
