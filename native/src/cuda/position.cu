// Embedding lookups and rotary positions, the twins of cpu/position.c. The embedding gradient
// adds each table row's incoming rows in token order, as the CPU does, so the bits are the
// CPU's and the same from run to run (no float atomics). The tokens are first grouped by id
// with a counting sort whose integer atomics only decide where a group lies; a group's tokens
// are then put in order by counting, for each, its group's smaller positions; then a thread per
// (group, column) walks its group: every dout element is read once.
#include "common.cuh"

namespace {

template <typename T>
__global__ void embedding_fwd(T *out, const void *idx, int is64, const T *w, int64_t n, int64_t V,
                              int64_t C, int *bad) {
    GRID_STRIDE(e, n * C) {
        int64_t row = e / C, c = e % C, t = index_at(idx, is64, row);
        if (t < 0 || t >= V) {
            *bad = 1;  // reported at the host's next synchronisation
            out[e] = from_f<T>(0.0f);
        } else {
            out[e] = w[t * C + c];
        }
    }
}

__global__ void embedding_count(int *count, const void *idx, int is64, int64_t n, int64_t V) {
    GRID_STRIDE(i, n) {
        int64_t t = index_at(idx, is64, i);
        if (t >= 0 && t < V) atomicAdd(&count[t], 1);
    }
}

// start[t] = the tokens of ids below t (start[V] = all of them); count is zeroed for the fill.
// One block: each thread sums a contiguous run of ids, the runs' sums are scanned in order.
__global__ void embedding_starts(int *start, int *count, int64_t V) {
    __shared__ int run_start[1024];
    int64_t per = (V + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * per, hi = lo + per < V ? lo + per : V;
    int sum = 0;
    for (int64_t t = lo; t < hi; t++) sum += count[t];
    run_start[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
        for (unsigned int k = 0; k < blockDim.x; k++) {
            int c = run_start[k];
            run_start[k] = total;
            total += c;
        }
        start[V] = total;
    }
    __syncthreads();
    int at = run_start[threadIdx.x];
    for (int64_t t = lo; t < hi; t++) {
        start[t] = at;
        at += count[t];
        count[t] = 0;
    }
}

// Each token into its id's group, in whatever order the atomics give...
__global__ void embedding_fill(int *grouped, int *count, const int *start, const void *idx, int is64, int64_t n,
                               int64_t V) {
    GRID_STRIDE(i, n) {
        int64_t t = index_at(idx, is64, i);
        if (t >= 0 && t < V) grouped[start[t] + atomicAdd(&count[t], 1)] = (int)i;
    }
}

// ...then in token order: a token's place in its group is the number of its group's tokens
// before it.
__global__ void embedding_order(int *ordered, const int *grouped, const int *start, const void *idx, int is64,
                                int64_t n, int64_t V) {
    GRID_STRIDE(i, n) {
        int64_t t = index_at(idx, is64, i);
        if (t < 0 || t >= V) continue;
        int lo = start[t], hi = start[t + 1], before = 0;
        for (int k = lo; k < hi; k++) before += grouped[k] < (int)i;
        ordered[lo + before] = (int)i;
    }
}

// A thread per (token slot, column); the slot that begins a group adds the group's rows in
// order, rounding to T after each addition as the CPU does.
template <typename T>
__global__ void embedding_bwd(T *dw, const T *dout, const int *ordered, const int *start, const void *idx,
                              int is64, int64_t n, int64_t V, int64_t C) {
    GRID_STRIDE(e, n * C) {
        int64_t slot = e / C, c = e % C;
        if (slot >= start[V]) continue;  // past the ids in range: an id outside the table (the forward reports it)
        int64_t t = index_at(idx, is64, ordered[slot]);
        if (start[t] != slot) continue;
        int end = start[t + 1];
        float acc = to_f(dw[t * C + c]);
        for (int k = (int)slot; k < end; k++) acc = to_f(from_f<T>(acc + to_f(dout[(int64_t)ordered[k] * C + c])));
        dw[t * C + c] = from_f<T>(acc);
    }
}

// x [B, T, H, D]: the pair (2i, 2i+1) of position t turned by sign * angle(t, i)
template <typename T>
__global__ void rope_kernel(T *out, const T *inp, const float *cs, const float *sn, int64_t T_,
                            int64_t H, int64_t D, float sign, int64_t pairs) {
    int64_t half = D / 2;
    GRID_STRIDE(p, pairs) {
        int64_t i = p % half, row = p / half, t = (row / H) % T_;
        float x0 = to_f(inp[row * D + 2 * i]), x1 = to_f(inp[row * D + 2 * i + 1]);
        float c = cs[t * half + i], s = sign * sn[t * half + i];
        out[row * D + 2 * i] = from_f<T>(x0 * c - x1 * s);
        out[row * D + 2 * i + 1] = from_f<T>(x0 * s + x1 * c);
    }
}

}  // namespace

extern "C" {

it_status it_cuda_embedding_forward(it_device device, it_dtype dtype, void *out, const void *indices,
                                    it_dtype index_dtype, const void *weight, int64_t n,
                                    int64_t num_embeddings, int64_t cols) {
    if (n * cols == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int is64 = index_dtype == IT_INT64;
    int *bad_ptr;  // an id outside the table: zeros here, an error at the next synchronisation
    IT_CU_TRY(it_cuda_index_flag(device, &bad_ptr));
    IT_FLOAT_SWITCH(dtype, "it_embedding_forward",
                    embedding_fwd<T><<<it_blocks(n * cols), IT_THREADS, 0, s>>>(
                        (T *)out, indices, is64, (const T *)weight, n, num_embeddings, cols, bad_ptr));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_embedding_backward(it_device device, it_dtype dtype, void *dweight, const void *dout,
                                     const void *indices, it_dtype index_dtype, int64_t n,
                                     int64_t num_embeddings, int64_t cols) {
    if (n * cols == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int is64 = index_dtype == IT_INT64;
    if (n > INT32_MAX || num_embeddings >= INT32_MAX)
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "it_embedding_backward: %lld ids into %lld rows: the CUDA kernel "
                             "counts both in 32 bits", (long long)n, (long long)num_embeddings);
    int64_t V = num_embeddings;
    int *scratch;  // count[V], start[V + 1], grouped[n], ordered[n]
    CU_TRY(cudaMallocAsync((void **)&scratch, (size_t)(2 * V + 1 + 2 * n) * sizeof(int), s));
    int *count = scratch, *start = count + V, *grouped = start + V + 1, *ordered = grouped + n;
    CU_TRY(cudaMemsetAsync(count, 0, (size_t)V * sizeof(int), s));
    embedding_count<<<it_blocks(n), IT_THREADS, 0, s>>>(count, indices, is64, n, V);
    embedding_starts<<<1, 1024, 0, s>>>(start, count, V);
    embedding_fill<<<it_blocks(n), IT_THREADS, 0, s>>>(grouped, count, start, indices, is64, n, V);
    embedding_order<<<it_blocks(n), IT_THREADS, 0, s>>>(ordered, grouped, start, indices, is64, n, V);
    IT_FLOAT_SWITCH(dtype, "it_embedding_backward",
                    embedding_bwd<T><<<it_blocks(n * cols), IT_THREADS, 0, s>>>(
                        (T *)dweight, (const T *)dout, ordered, start, indices, is64, n, V, cols));
    CU_LAUNCHED();
    CU_TRY(cudaFreeAsync(scratch, s));
    return IT_OK;
}

static it_status rope(it_device device, it_dtype dtype, void *out, const void *inp, const float *cos,
                      const float *sin, int64_t B, int64_t seq, int64_t H, int64_t D, float sign,
                      const char *fn) {
    if (B * seq * H == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int64_t pairs = B * seq * H * (D / 2);  // in place is safe: each pair is read, then written
    IT_FLOAT_SWITCH(dtype, fn,
                    rope_kernel<T><<<it_blocks(pairs), IT_THREADS, 0, s>>>(
                        (T *)out, (const T *)inp, cos, sin, seq, H, D, sign, pairs));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_rope_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                               const float *cos, const float *sin, int64_t batch, int64_t seq,
                               int64_t heads, int64_t head_dim) {
    return rope(device, dtype, out, inp, cos, sin, batch, seq, heads, head_dim, 1.0f, "it_rope_forward");
}

it_status it_cuda_rope_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                                const float *cos, const float *sin, int64_t batch, int64_t seq,
                                int64_t heads, int64_t head_dim) {
    return rope(device, dtype, dinp, dout, cos, sin, batch, seq, heads, head_dim, -1.0f, "it_rope_backward");
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(embedding_forward);
IT_CUDA_MIRRORS(embedding_backward);
IT_CUDA_MIRRORS(rope_forward);
IT_CUDA_MIRRORS(rope_backward);
