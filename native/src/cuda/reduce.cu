// Reductions over a dimension (sum, mean, max, min) and arg-max/arg-min, the twins of
// cpu/reduce.c. A row is handled by one block (sums in float32 through warp shuffles,
// block_combine in common.cuh); few outputs over long rows are cut into chunks reduced in two
// deterministic passes.
#include "common.cuh"

namespace {

// inner == 1: block b reduces chunk b % chunks of row b / chunks; with one chunk per row it
// writes the output, else a partial
template <typename T>
__global__ void row_chunks(int op, T *out, typename Acc<T>::type *partial, const T *inp, int64_t n,
                           int64_t chunks) {
    using C = typename Acc<T>::type;
    int64_t o = blockIdx.x / chunks, start = (blockIdx.x % chunks) * kRowChunk;
    int64_t end = start + kRowChunk < n ? start + kRowChunk : n;
    const T *x = inp + o * n;
    C acc = identity<C>(op);
    for (int64_t j = start + threadIdx.x; j < end; j += blockDim.x) acc = combine(op, acc, load_acc(x, j));
    acc = block_combine(op, acc);
    if (threadIdx.x == 0) {
        if (chunks > 1) {
            partial[blockIdx.x] = acc;
        } else {
            if (op == IT_MEAN) acc /= (C)n;
            store_acc(out, o, acc);
        }
    }
}

template <typename T>
__global__ void row_partials(int op, T *out, const typename Acc<T>::type *partial, int64_t n, int64_t chunks) {
    using C = typename Acc<T>::type;
    C acc = identity<C>(op);
    for (int64_t j = threadIdx.x; j < chunks; j += blockDim.x)
        acc = combine(op, acc, partial[blockIdx.x * chunks + j]);
    acc = block_combine(op, acc);
    if (threadIdx.x == 0) {
        if (op == IT_MEAN) acc /= (C)n;
        store_acc(out, blockIdx.x, acc);
    }
}

// inner > 1: a thread per (o, chunk, i) sums rows [chunk * len, ...) of columns i .. i + V - 1
// (V at a time: one vector load a row, common.cuh) into partial[(o * chunks + chunk) * inner + i];
// then a thread per output combines its chunks
template <typename T, int V>
__global__ void column_chunks(int op, typename Acc<T>::type *partial, const T *inp, int64_t outer, int64_t n,
                              int64_t inner, int64_t chunks, int64_t len) {
    using C = typename Acc<T>::type;
    const int64_t vecs = inner / V;
    GRID_STRIDE(w, outer * chunks * vecs) {
        int64_t i = (w % vecs) * V, c = (w / vecs) % chunks, o = w / (vecs * chunks);
        int64_t end = (c + 1) * len < n ? (c + 1) * len : n;
        C acc[V];
#pragma unroll
        for (int e = 0; e < V; e++) acc[e] = identity<C>(op);
        for (int64_t j = c * len; j < end; j++) {
            Vec<T, V> x = *(const Vec<T, V> *)(inp + (o * n + j) * inner + i);
#pragma unroll
            for (int e = 0; e < V; e++) acc[e] = combine(op, acc[e], load_acc(x.x, e));
        }
#pragma unroll
        for (int e = 0; e < V; e++) partial[(o * chunks + c) * inner + i + e] = acc[e];
    }
}

// a warp per output: lane l combines chunks l, l + 32, ... in order, then the lanes combine in a
// fixed tree (deterministic; a thread walking hundreds of chunks alone left the GPU idle)
template <typename T>
__global__ void column_partials(int op, T *out, const typename Acc<T>::type *partial, int64_t outer, int64_t n,
                                int64_t inner, int64_t chunks) {
    using C = typename Acc<T>::type;
    const int lane = threadIdx.x & 31;
    for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < outer * inner;
         w += (int64_t)blockDim.x * gridDim.x / 32) {  // whole warps: every lane takes the same w
        int64_t o = w / inner, i = w % inner;
        const C *p = partial + o * chunks * inner + i;
        C acc = identity<C>(op);
        for (int64_t c = lane; c < chunks; c += 32) acc = combine(op, acc, p[c * inner]);
        for (int d = 16; d > 0; d >>= 1) acc = combine(op, acc, __shfl_xor_sync(0xffffffffu, acc, d));
        if (op == IT_MEAN) acc /= (C)n;
        if (lane == 0) store_acc(out, w, acc);
    }
}

// [outer, n, inner] -> [outer, inner]: a thread per output, in order along n
template <typename T>
__global__ void reduce_kernel(int op, T *out, const T *inp, int64_t outer, int64_t n, int64_t inner) {
    using C = typename Acc<T>::type;
    GRID_STRIDE(w, outer * inner) {
        int64_t o = w / inner, i = w % inner;
        const T *x = inp + o * n * inner + i;
        C acc = load_acc(x, 0);
        for (int64_t j = 1; j < n; j++) acc = combine(op, acc, load_acc(x, j * inner));
        if (op == IT_MEAN) acc /= (C)n;
        store_acc(out, w, acc);
    }
}

template <typename T>
__global__ void arg_kernel(int is_max, int64_t *out, const T *inp, int64_t outer, int64_t n, int64_t inner) {
    using C = typename Acc<T>::type;
    GRID_STRIDE(w, outer * inner) {
        int64_t o = w / inner, i = w % inner, best = 0;
        const T *x = inp + o * n * inner + i;
        C bv = load_acc(x, 0);
        for (int64_t j = 1; j < n && bv == bv; j++) {  // the first NaN wins
            C v = load_acc(x, j * inner);
            if (v != v || (is_max ? v > bv : v < bv)) { bv = v; best = j; }
        }
        out[w] = best;
    }
}

}  // namespace

extern "C" {

it_status it_cuda_reduce(it_device device, it_reduce_op op, it_dtype dtype, void *out,
                         const void *inp, int64_t outer, int64_t n, int64_t inner) {
    if (outer * inner == 0) return IT_OK;
    if (n == 0) return it_cuda_error(IT_ERR_INVALID_ARGUMENT, "the reduced dimension is empty");
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int64_t outputs = outer * inner;
    if (outputs >= kEnoughOutputs || n <= 256) {
        FLOAT_OR_DOUBLE(dtype, "it_reduce",
                        reduce_kernel<T><<<it_blocks(outputs), IT_THREADS, 0, s>>>(
                            (int)op, (T *)out, (const T *)inp, outer, n, inner));
        CU_LAUNCHED();
        return IT_OK;
    }
    // chunks along n: for rows, blocks of kRowChunk; for columns, enough threads to fill the GPU,
    // each walking at least 64 rows
    int64_t chunks, len;
    const int64_t vector = 16 / dtype_bytes(dtype);  // columns a thread takes where rows are aligned vectors
    const bool vec = inner > 1 && inner % vector == 0 && vec_aligned({inp}) && (inner * dtype_bytes(dtype)) % 16 == 0;
    if (inner == 1) {
        len = kRowChunk;
        chunks = (n + len - 1) / len;
        if (outer * chunks > 2147483647LL)
            return it_cuda_error(IT_ERR_NOT_SUPPORTED, "it_reduce: %lld rows of %lld are too many blocks",
                                 (long long)outer, (long long)n);
    } else {  // (columns V at a time count as one output here: as many threads either way)
        int64_t v = vec ? vector : 1, want = (kEnoughOutputs * v + outputs - 1) / outputs, most = (n + 63) / 64;
        chunks = want < most ? want : most;
        len = (n + chunks - 1) / chunks;
        chunks = (n + len - 1) / len;
    }
    size_t acc_bytes = dtype == IT_FLOAT64 ? sizeof(double) : sizeof(float);
    void *partial = nullptr;
    bool partials = inner > 1 || chunks > 1;
    if (partials) CU_TRY(cudaMallocAsync(&partial, (size_t)(outputs * chunks) * acc_bytes, s));
    FLOAT_OR_DOUBLE(dtype, "it_reduce", {
        using C = typename Acc<T>::type;
        if (inner == 1) {
            row_chunks<T><<<(unsigned int)(outer * chunks), IT_THREADS, 0, s>>>((int)op, (T *)out, (C *)partial,
                                                                              (const T *)inp, n, chunks);
            if (chunks > 1)
                row_partials<T><<<(unsigned int)outer, IT_THREADS, 0, s>>>((int)op, (T *)out, (const C *)partial,
                                                                          n, chunks);
        } else {
            constexpr int V = 16 / sizeof(T);
            if (vec)
                column_chunks<T, V><<<it_blocks(outputs / V * chunks), IT_THREADS, 0, s>>>(
                    (int)op, (C *)partial, (const T *)inp, outer, n, inner, chunks, len);
            else
                column_chunks<T, 1><<<it_blocks(outputs * chunks), IT_THREADS, 0, s>>>(
                    (int)op, (C *)partial, (const T *)inp, outer, n, inner, chunks, len);
            column_partials<T><<<it_blocks(outputs * 32), IT_THREADS, 0, s>>>((int)op, (T *)out, (const C *)partial,
                                                                             outer, n, inner, chunks);
        }
    });
    cudaError_t launched = cudaPeekAtLastError();
    if (partials) CU_TRY(cudaFreeAsync(partial, s));
    CU_TRY(launched);
    return IT_OK;
}

static it_status arg_extreme(it_device device, int is_max, it_dtype dtype, int64_t *out,
                             const void *inp, int64_t outer, int64_t n, int64_t inner) {
    if (outer * inner == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    FLOAT_OR_DOUBLE(dtype, is_max ? "it_argmax" : "it_argmin",
                    arg_kernel<T><<<it_blocks(outer * inner), IT_THREADS, 0, s>>>(
                        is_max, out, (const T *)inp, outer, n, inner));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_argmax(it_device device, it_dtype dtype, int64_t *out, const void *inp,
                         int64_t outer, int64_t n, int64_t inner) {
    return arg_extreme(device, 1, dtype, out, inp, outer, n, inner);
}

it_status it_cuda_argmin(it_device device, it_dtype dtype, int64_t *out, const void *inp,
                         int64_t outer, int64_t n, int64_t inner) {
    return arg_extreme(device, 0, dtype, out, inp, outer, n, inner);
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(reduce);
IT_CUDA_MIRRORS(argmax);
IT_CUDA_MIRRORS(argmin);
