// Filling, casting and copying, the twins of cpu/copy.c: fill, arange and cast store any dtype
// from a double (int64 to and from int32 exactly), strided copies walk the merged dimensions,
// concatenation and its inverse copy blocks, triangles keep one side of a diagonal.
#include "common.cuh"

namespace {

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

template <typename E>
__global__ void copy_strided_kernel(E *out, const E *inp, Strided s, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t off[2];
        offsets(s, i, 2, off);
        out[off[0]] = inp[off[1]];
    }
}

// ---- dtypes as values: store any dtype from a double (fill, arange, cast) ------------------
__device__ void store_any(int dtype, void *p, int64_t i, double v) {
    switch (dtype) {
    case IT_FLOAT32: ((float *)p)[i] = (float)v; break;
    case IT_BFLOAT16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16((float)v); break;
    case IT_FLOAT16: ((__half *)p)[i] = __float2half((float)v); break;
    case IT_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case IT_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    case IT_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case IT_FLOAT64: ((double *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = v != 0.0; break;  // IT_BOOL
    }
}

__global__ void fill_kernel(int dtype, void *out, double value, int64_t n) {
    GRID_STRIDE(i, n) store_any(dtype, out, i, value);
}

__global__ void arange_kernel(int dtype, void *out, double start, double step, int64_t n) {
    GRID_STRIDE(i, n) store_any(dtype, out, i, start + (double)i * step);
}

// int64 through double would lose bits past 2^53: copied exactly when both sides are integers
__global__ void cast_kernel(void *out, int out_dtype, const void *inp, int inp_dtype, int64_t n) {
    GRID_STRIDE(i, n) {
        if (out_dtype == IT_INT64 && inp_dtype == IT_INT64) ((int64_t *)out)[i] = ((const int64_t *)inp)[i];
        else if (out_dtype == IT_INT64 && inp_dtype == IT_INT32) ((int64_t *)out)[i] = ((const int32_t *)inp)[i];
        else if (out_dtype == IT_INT32 && inp_dtype == IT_INT64) ((int32_t *)out)[i] = (int32_t)((const int64_t *)inp)[i];
        else store_any(out_dtype, out, i, load_f64(inp_dtype, inp, i));
    }
}

// float32 / bfloat16 / float16 among themselves (autocast's weight copies, their gradients back):
// typed loads through float, each 16-bit value exact in float32, rounded to nearest even as the
// double route above rounds, at a fraction of its cost
// (V at a time: contiguous-kernel vectors, common.cuh)
template <typename O, typename I, int V> __global__ void cast_float_kernel(O *out, const I *inp, int64_t n) {
    GRID_STRIDE(p, n / V) {
        Vec<I, V> x = ((const Vec<I, V> *)inp)[p];
        Vec<O, V> y;
#pragma unroll
        for (int e = 0; e < V; e++) y.x[e] = from_f<O>(to_f(x.x[e]));
        ((Vec<O, V> *)out)[p] = y;
    }
    GRID_STRIDE(i, n % V) out[n / V * V + i] = from_f<O>(to_f(inp[n / V * V + i]));
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

it_status it_cuda_fill(it_device device, it_dtype dtype, void *out, double value, int64_t n) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    fill_kernel<<<it_blocks(n), IT_THREADS, 0, it_cuda_stream(device)>>>((int)dtype, out, value, n);
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_arange(it_device device, it_dtype dtype, void *out, double start, double step,
                         int64_t n) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    arange_kernel<<<it_blocks(n), IT_THREADS, 0, it_cuda_stream(device)>>>((int)dtype, out, start, step, n);
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_cast(it_device device, void *out, it_dtype out_dtype, const void *inp,
                       it_dtype inp_dtype, int64_t n) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    if (out_dtype == inp_dtype) {
        CU_TRY(cudaMemcpyAsync(out, inp, (size_t)n * dtype_bytes(out_dtype), cudaMemcpyDeviceToDevice, s));
        return IT_OK;
    }
    auto floating = [](it_dtype d) { return d == IT_FLOAT32 || d == IT_BFLOAT16 || d == IT_FLOAT16; };
    if (floating(out_dtype) && floating(inp_dtype)) {
        const bool vec = vec_aligned({out, inp});
        IT_FLOAT_SWITCH(inp_dtype, "it_cast", {
            using I = T;
            IT_FLOAT_SWITCH(out_dtype, "it_cast", {
                constexpr int V = 16 / (sizeof(T) > sizeof(I) ? sizeof(T) : sizeof(I));
                if (vec)
                    cast_float_kernel<T, I, V><<<it_blocks(n / V), IT_THREADS, 0, s>>>((T *)out, (const I *)inp, n);
                else
                    cast_float_kernel<T, I, 1><<<it_blocks(n), IT_THREADS, 0, s>>>((T *)out, (const I *)inp, n);
            });
        });
    } else {
        cast_kernel<<<it_blocks(n), IT_THREADS, 0, s>>>(out, (int)out_dtype, inp, (int)inp_dtype, n);
    }
    CU_LAUNCHED();
    return IT_OK;
}

// Where the innermost dimension is contiguous on both sides (a permute that keeps the last one,
// as the attention heads' split and merge), whole 16-byte chunks are one element: an eighth of
// the index arithmetic of 16-bit elements, and vector loads. *st becomes the chunks' shapes.
struct alignas(16) Chunk16 {
    uint32_t w[4];
};
static bool as_chunks(Strided *st, size_t bytes, const void *out, const void *inp) {
    int last = st->ndim - 1;
    if (last < 0 || bytes >= 16 || (uintptr_t)out % 16 || (uintptr_t)inp % 16) return false;
    int64_t per = 16 / (int64_t)bytes;
    if (st->stride[0][last] != 1 || st->stride[1][last] != 1 || st->shape[last] % per) return false;
    for (int d = 0; d < last; d++)
        if (st->stride[0][d] % per || st->stride[1][d] % per) return false;
    for (int d = 0; d < last; d++) st->stride[0][d] /= per, st->stride[1][d] /= per;
    st->shape[last] /= per;
    return true;
}

it_status it_cuda_copy_strided(it_device device, it_dtype dtype, void *out, const int64_t *out_strides,
                               const void *inp, const int64_t *inp_strides, const int64_t *shape,
                               int32_t ndim) {
    int64_t n;
    Strided st = strided(shape, ndim, {out_strides, inp_strides}, &n);
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    if (as_chunks(&st, dtype_bytes(dtype), out, inp)) {
        int64_t chunks = n / (16 / (int64_t)dtype_bytes(dtype));
        copy_strided_kernel<Chunk16><<<it_blocks(chunks), IT_THREADS, 0, s>>>((Chunk16 *)out, (const Chunk16 *)inp, st,
                                                                             chunks);
        CU_LAUNCHED();
        return IT_OK;
    }
    BY_SIZE(dtype_bytes(dtype), "it_copy_strided",
            copy_strided_kernel<E><<<it_blocks(n), IT_THREADS, 0, s>>>((E *)out, (const E *)inp, st, n));
    CU_LAUNCHED();
    return IT_OK;
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(concat);
IT_CUDA_MIRRORS(split);
IT_CUDA_MIRRORS(triangle);
IT_CUDA_MIRRORS(fill);
IT_CUDA_MIRRORS(arange);
IT_CUDA_MIRRORS(cast);
IT_CUDA_MIRRORS(copy_strided);
