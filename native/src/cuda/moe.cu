// The mixture-of-experts kernels, the twins of cpu/moe.c: the routing order, the permutation
// and the weighted scatter back with its backward, and the experts' grouped products.
// Deterministic as on the CPU: the sort is a stable counting sort over fixed chunks; the
// scatter back has each token sum its own rows in their order (integer atomics only build the
// token's list, which is then put in order); no float atomics anywhere.
#include <limits.h>

#include <vector>

#include "common.cuh"

namespace {

// ---- the routing order ------------------------------------------------------------------------
// The n assignments in `chunks` fixed chunks of `chunk`: table[c][e] counts chunk c's kept
// assignments to expert e, then becomes where they start among expert e's.
__global__ void sort_count_kernel(int64_t *table, const int64_t *ids, const uint8_t *keep, int64_t n,
                                  int64_t chunk, int64_t chunks, int64_t experts, int *bad) {
    GRID_STRIDE(c, chunks) {
        int64_t *row = table + c * experts;
        for (int64_t e = 0; e < experts; e++) row[e] = 0;
        int64_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        for (int64_t i = c * chunk; i < end; i++) {
            int64_t e = ids[i];
            if (e < 0 || e >= experts) {
                *bad = 1;
                continue;
            }
            if (!keep || keep[i]) row[e]++;
        }
    }
}

// per expert: each chunk's start within the expert (an exclusive sum down the column), and the total
__global__ void sort_column_kernel(int64_t *table, int64_t *counts, int64_t chunks, int64_t experts) {
    GRID_STRIDE(e, experts) {
        int64_t run = 0;
        for (int64_t c = 0; c < chunks; c++) {
            int64_t v = table[c * experts + e];
            table[c * experts + e] = run;
            run += v;
        }
        counts[e] = run;
    }
}

// out[0] = 0, out[i + 1] = in[0] + ... + in[i]: one block, each thread a fixed segment.
__global__ void exclusive_scan_kernel(int64_t *out, const int64_t *in, int64_t n) {
    __shared__ int64_t part[1024];
    int64_t seg = (n + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * seg;
    int64_t hi = lo + seg < n ? lo + seg : n, s = 0;
    for (int64_t i = lo; i < hi; i++) s += in[i];
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int64_t t = 0, run = 0; t < (int64_t)blockDim.x; t++) {
            int64_t v = part[t];
            part[t] = run;
            run += v;
        }
    __syncthreads();
    s = part[threadIdx.x];
    if (threadIdx.x == 0) out[0] = 0;
    for (int64_t i = lo; i < hi; i++) {
        s += in[i];
        out[i + 1] = s;
    }
}

__global__ void sort_place_kernel(int64_t *rows, int64_t *slots, int64_t *table, const int64_t *starts,
                                  const int64_t *ids, const uint8_t *keep, int64_t n, int64_t top_k,
                                  int64_t chunk, int64_t chunks, int64_t experts) {
    GRID_STRIDE(c, chunks) {
        int64_t *row = table + c * experts;
        int64_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
        for (int64_t i = c * chunk; i < end; i++) {
            int64_t e = ids[i];
            if (e < 0 || e >= experts || (keep && !keep[i])) continue;
            int64_t at = starts[e] + row[e]++;
            rows[at] = i / top_k;
            slots[at] = i;
        }
    }
}

// ---- permutation and the scatter back -----------------------------------------------------------
template <typename E>
__global__ void permute_kernel(E *out, const E *x, const int64_t *rows, int64_t assignments, int64_t tokens,
                               int64_t cols, int *bad) {
    GRID_STRIDE(i, assignments * cols) {
        int64_t a = i / cols, t = rows[a];
        if (t < 0 || t >= tokens) {
            *bad = 1;
            continue;
        }
        out[i] = x[t * cols + i % cols];
    }
}

// each token's number of rows (integer atomics: the same counts in any order)
__global__ void token_count_kernel(unsigned long long *counts, const int64_t *rows, int64_t assignments,
                                   int64_t tokens, int *bad) {
    GRID_STRIDE(a, assignments) {
        int64_t t = rows[a];
        if (t < 0 || t >= tokens) {
            *bad = 1;
            continue;
        }
        atomicAdd(counts + t, 1ULL);
    }
}

__global__ void token_place_kernel(int64_t *order, unsigned long long *fill, const int64_t *offsets,
                                   const int64_t *rows, int64_t assignments, int64_t tokens) {
    GRID_STRIDE(a, assignments) {
        int64_t t = rows[a];
        if (t < 0 || t >= tokens) continue;
        order[offsets[t] + (int64_t)atomicAdd(fill + t, 1ULL)] = a;
    }
}

// a token's list in increasing row order (insertion sort: a token has top_k rows)
__global__ void token_order_kernel(int64_t *order, const int64_t *offsets, int64_t tokens) {
    GRID_STRIDE(t, tokens) {
        for (int64_t p = offsets[t] + 1; p < offsets[t + 1]; p++) {
            int64_t v = order[p], q = p;
            for (; q > offsets[t] && order[q - 1] > v; q--) order[q] = order[q - 1];
            order[q] = v;
        }
    }
}

template <typename T>
__global__ void unpermute_kernel(T *out, const T *y, const T *weights, const int64_t *order, const int64_t *offsets,
                                 int64_t tokens, int64_t cols) {
    using A = typename Acc<T>::type;
    GRID_STRIDE(i, tokens * cols) {
        int64_t t = i / cols, c = i % cols;
        A acc = 0;
        for (int64_t p = offsets[t]; p < offsets[t + 1]; p++) {
            int64_t a = order[p];
            acc += (weights ? load_acc(weights, a) : (A)1) * load_acc(y, a * cols + c);
        }
        store_acc(out, i, acc);
    }
}

// a block per assignment: dy's row, and the dot of y's row with the token's gradient
template <typename T>
__global__ void unpermute_backward_kernel(T *dy, T *dweights, const T *dout, const T *y, const T *weights,
                                          const int64_t *rows, int64_t tokens, int64_t cols, int *bad) {
    using A = typename Acc<T>::type;
    int64_t a = blockIdx.x, t = rows[a];
    if (t < 0 || t >= tokens) {  // the whole block leaves: no barrier is left waiting
        if (threadIdx.x == 0) *bad = 1;
        return;
    }
    A w = dy ? load_acc(weights, a) : (A)0, s = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        A g = load_acc(dout, t * cols + c);
        if (dy) store_acc(dy, a * cols + c, w * g);
        if (dweights) s += load_acc(y, a * cols + c) * g;
    }
    if (dweights) {
        s = block_combine<A>(IT_SUM, s);
        if (threadIdx.x == 0) store_acc(dweights, a, s);
    }
}

}  // namespace

extern "C" it_status it_cuda_moe_sort(it_device device, int64_t *rows, int64_t *slots, int64_t *counts,
                                      const int64_t *expert_ids, const uint8_t *keep, int64_t tokens,
                                      int64_t top_k, int64_t num_experts) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int64_t n = tokens * top_k;
    if (n == 0) {
        CU_TRY(cudaMemsetAsync(counts, 0, (size_t)num_experts * sizeof(int64_t), s));
        return IT_OK;
    }
    // chunks of at least 256 assignments, and a table of at most 2^22 counts
    int64_t by_size = (n + 255) / 256, by_table = ((int64_t)1 << 22) / num_experts;
    int64_t chunks = by_size < by_table ? by_size : (by_table > 0 ? by_table : 1);
    int64_t chunk = (n + chunks - 1) / chunks;
    int *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    int64_t *table;
    CU_TRY(cudaMallocAsync((void **)&table, (size_t)(chunks * num_experts + num_experts + 1) * sizeof(int64_t), s));
    int64_t *starts = table + chunks * num_experts;
    sort_count_kernel<<<it_blocks(chunks, 64), 64, 0, s>>>(table, expert_ids, keep, n, chunk, chunks, num_experts,
                                                           bad);
    sort_column_kernel<<<it_blocks(num_experts, 64), 64, 0, s>>>(table, counts, chunks, num_experts);
    exclusive_scan_kernel<<<1, 1024, 0, s>>>(starts, counts, num_experts);
    sort_place_kernel<<<it_blocks(chunks, 64), 64, 0, s>>>(rows, slots, table, starts, expert_ids, keep, n, top_k,
                                                           chunk, chunks, num_experts);
    CU_LAUNCHED();
    CU_TRY(cudaFreeAsync(table, s));
    return IT_OK;
}

extern "C" it_status it_cuda_moe_permute(it_device device, it_dtype dtype, void *out, const void *x,
                                         const int64_t *rows, int64_t assignments, int64_t tokens, int64_t cols) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    BY_SIZE(dtype_bytes(dtype), "it_moe_permute",
            permute_kernel<E><<<it_blocks(assignments * cols), IT_THREADS, 0, s>>>(
                (E *)out, (const E *)x, rows, assignments, tokens, cols, bad));
    CU_LAUNCHED();
    return IT_OK;
}

extern "C" it_status it_cuda_moe_unpermute(it_device device, it_dtype dtype, void *out, const void *y,
                                           const void *weights, const int64_t *rows, int64_t assignments,
                                           int64_t tokens, int64_t cols) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    // each token's rows, in order: counts, offsets [tokens + 1], then the list
    int64_t *buf;
    CU_TRY(cudaMallocAsync((void **)&buf, (size_t)(3 * tokens + 1 + assignments) * sizeof(int64_t), s));
    unsigned long long *count = (unsigned long long *)buf, *fill = count + tokens;
    int64_t *offsets = buf + 2 * tokens, *order = offsets + tokens + 1;
    CU_TRY(cudaMemsetAsync(buf, 0, (size_t)(2 * tokens) * sizeof(int64_t), s));
    if (assignments) {
        token_count_kernel<<<it_blocks(assignments), IT_THREADS, 0, s>>>(count, rows, assignments, tokens, bad);
    }
    exclusive_scan_kernel<<<1, 1024, 0, s>>>(offsets, (const int64_t *)count, tokens);
    if (assignments) {
        token_place_kernel<<<it_blocks(assignments), IT_THREADS, 0, s>>>(order, fill, offsets, rows, assignments,
                                                                          tokens);
        token_order_kernel<<<it_blocks(tokens), IT_THREADS, 0, s>>>(order, offsets, tokens);
    }
    FLOAT_OR_DOUBLE(dtype, "it_moe_unpermute",
                    unpermute_kernel<T><<<it_blocks(tokens * cols), IT_THREADS, 0, s>>>(
                        (T *)out, (const T *)y, (const T *)weights, order, offsets, tokens, cols));
    CU_LAUNCHED();
    CU_TRY(cudaFreeAsync(buf, s));
    return IT_OK;
}

extern "C" it_status it_cuda_moe_unpermute_backward(it_device device, it_dtype dtype, void *dy, void *dweights,
                                                    const void *dout, const void *y, const void *weights,
                                                    const int64_t *rows, int64_t assignments, int64_t tokens,
                                                    int64_t cols) {
    IT_CU_TRY(check_rows(assignments, "it_moe_unpermute_backward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    FLOAT_OR_DOUBLE(dtype, "it_moe_unpermute_backward",
                    unpermute_backward_kernel<T><<<row_blocks(assignments), 128, 0, s>>>(
                        (T *)dy, (T *)dweights, (const T *)dout, (const T *)y, (const T *)weights, rows, tokens,
                        cols, bad));
    CU_LAUNCHED();
    return IT_OK;
}

// ---- the grouped products ------------------------------------------------------------------
namespace {
// One row-major product C [m, n] = op(A) [m, k] @ op(B) [k, n] of a group.
struct Product {
    void *c;
    const void *a, *b;
    int64_t m, n, k;
    int trans_a, trans_b;
};

// The toolkit's grouped product where it has one (cuBLAS 12.5 and later), all the groups in one
// call; otherwise, or when the cuBLAS found lacks it, or an operand is not 16-byte aligned
// (the grouped kernels' requirement for 16-bit types), one cublasGemmEx-style product each.
#if CUDART_VERSION >= 12050
constexpr int OP_N = 0, OP_T = 1, COMPUTE_32F = 68, COMPUTE_64F = 70;
typedef int (*grouped_fn)(void *, const int *, const int *, const int *, const int *, const int *, const void *,
                          const void *const *, cudaDataType, const int *, const void *const *, cudaDataType,
                          const int *, const void *, void *const *, cudaDataType, const int *, int, const int *,
                          int);

it_status grouped(it_device device, it_dtype dtype, const std::vector<Product> &ps, bool *done) {
    *done = false;
    grouped_fn call = (grouped_fn)it_cuda_blas_symbol("cublasGemmGroupedBatchedEx");
    // the grouped call for the types cuBLAS documents it with; float64 goes one product at a time
    if (!call || dtype == IT_FLOAT64) return IT_OK;
    for (const Product &p : ps)
        if (((uintptr_t)p.a | (uintptr_t)p.b | (uintptr_t)p.c) % 16) return IT_OK;
    cudaDataType type = dtype == IT_FLOAT32 ? CUDA_R_32F : dtype == IT_BFLOAT16 ? CUDA_R_16BF
                      : dtype == IT_FLOAT16 ? CUDA_R_16F : CUDA_R_64F;
    int compute = dtype == IT_FLOAT64 ? COMPUTE_64F : COMPUTE_32F;
    size_t g = ps.size();
    // row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B first, then A
    std::vector<int> ta(g), tb(g), m(g), n(g), k(g), lda(g), ldb(g), ldc(g), size(g, 1);
    std::vector<float> alpha(g, 1.0f), beta(g, 0.0f);
    std::vector<double> alpha64(g, 1.0), beta64(g, 0.0);
    std::vector<const void *> ptrs(3 * g);
    for (size_t i = 0; i < g; i++) {
        const Product &p = ps[i];
        ta[i] = p.trans_b ? OP_T : OP_N, tb[i] = p.trans_a ? OP_T : OP_N;
        m[i] = (int)p.n, n[i] = (int)p.m, k[i] = (int)p.k;
        lda[i] = (int)(p.trans_b ? p.k : p.n), ldb[i] = (int)(p.trans_a ? p.m : p.k), ldc[i] = (int)p.n;
        ptrs[i] = p.b, ptrs[g + i] = p.a, ptrs[2 * g + i] = p.c;
    }
    void *handle;
    IT_CU_TRY(it_cuda_blas_handle(device, &handle));
    cudaStream_t s = it_cuda_stream(device);
    const void **dev;  // the pointer arrays live in device memory; the rest on the host
    CU_TRY(cudaMallocAsync((void **)&dev, 3 * g * sizeof(void *), s));
    CU_TRY(cudaMemcpyAsync(dev, ptrs.data(), 3 * g * sizeof(void *), cudaMemcpyHostToDevice, s));
    const void *al = compute == COMPUTE_64F ? (const void *)alpha64.data() : (const void *)alpha.data();
    const void *be = compute == COMPUTE_64F ? (const void *)beta64.data() : (const void *)beta.data();
    int st = call(handle, ta.data(), tb.data(), m.data(), n.data(), k.data(), al, dev, type, lda.data(), dev + g,
                  type, ldb.data(), be, (void *const *)(dev + 2 * g), type, ldc.data(), (int)g, size.data(),
                  compute);
    CU_TRY(cudaFreeAsync(dev, s));
    // a shape or type this cuBLAS does not take grouped (NOT_SUPPORTED 15, INVALID_VALUE 7): the
    // products one by one instead; anything else is an error
    if (st == 15 || st == 7) return IT_OK;
    if (st != 0)
        return it_cuda_error(IT_ERR_CUDA, "cublasGemmGroupedBatchedEx failed with status %d (%zu groups)", st, g);
    *done = true;
    return IT_OK;
}
#endif

it_status products(it_device device, it_dtype dtype, const std::vector<Product> &ps) {
    if (ps.empty()) return IT_OK;
#if CUDART_VERSION >= 12050
    bool done;
    IT_CU_TRY(grouped(device, dtype, ps, &done));
    if (done) return IT_OK;
#endif
    for (const Product &p : ps)
        IT_CU_TRY(it_cuda_matmul(device, dtype, p.c, p.a, p.b, 1, p.m, p.n, p.k, p.trans_a, p.trans_b, 1.0f, 0.0f,
                                 0, 0, 0));
    return IT_OK;
}

const char *at(const void *base, int64_t row, int64_t cols, it_dtype dtype) {
    return (const char *)base + (size_t)(row * cols) * dtype_bytes(dtype);
}
}  // namespace

extern "C" it_status it_cuda_moe_grouped_linear_forward(it_device device, it_dtype dtype, void *out, const void *x,
                                                        const void *const *weights, const int64_t *group_sizes,
                                                        int64_t groups, int64_t rows, int64_t in_features,
                                                        int64_t out_features) {
    IT_CU_TRY(it_cuda_use(device));
    if (in_features == 0) {  // a product over nothing
        CU_TRY(cudaMemsetAsync(out, 0, (size_t)(rows * out_features) * dtype_bytes(dtype), it_cuda_stream(device)));
        return IT_OK;
    }
    std::vector<Product> ps;
    for (int64_t g = 0, r = 0; g < groups; r += group_sizes[g++])
        if (group_sizes[g])
            ps.push_back({(void *)at(out, r, out_features, dtype), at(x, r, in_features, dtype), weights[g],
                          group_sizes[g], out_features, in_features, 0, 1});
    return products(device, dtype, ps);
}

extern "C" it_status it_cuda_moe_grouped_linear_backward_input(it_device device, it_dtype dtype, void *dx,
                                                               const void *dout, const void *const *weights,
                                                               const int64_t *group_sizes, int64_t groups,
                                                               int64_t rows, int64_t in_features,
                                                               int64_t out_features) {
    IT_CU_TRY(it_cuda_use(device));
    if (out_features == 0) {
        CU_TRY(cudaMemsetAsync(dx, 0, (size_t)(rows * in_features) * dtype_bytes(dtype), it_cuda_stream(device)));
        return IT_OK;
    }
    std::vector<Product> ps;
    for (int64_t g = 0, r = 0; g < groups; r += group_sizes[g++])
        if (group_sizes[g])
            ps.push_back({(void *)at(dx, r, in_features, dtype), at(dout, r, out_features, dtype), weights[g],
                          group_sizes[g], in_features, out_features, 0, 0});
    return products(device, dtype, ps);
}

extern "C" it_status it_cuda_moe_grouped_linear_backward_weight(it_device device, it_dtype dtype,
                                                                void *const *dweights, const void *dout,
                                                                const void *x, const int64_t *group_sizes,
                                                                int64_t groups, int64_t rows, int64_t in_features,
                                                                int64_t out_features) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    std::vector<Product> ps;
    for (int64_t g = 0, r = 0; g < groups; r += group_sizes[g++]) {
        if (group_sizes[g])
            ps.push_back({dweights[g], at(dout, r, out_features, dtype), at(x, r, in_features, dtype), out_features,
                          in_features, group_sizes[g], 1, 0});
        else  // an expert without rows still gets its (zero) gradient
            CU_TRY(cudaMemsetAsync(dweights[g], 0, (size_t)(in_features * out_features) * dtype_bytes(dtype), s));
    }
    return products(device, dtype, ps);
}

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(moe_sort);
IT_CUDA_MIRRORS(moe_permute);
IT_CUDA_MIRRORS(moe_unpermute);
IT_CUDA_MIRRORS(moe_unpermute_backward);
IT_CUDA_MIRRORS(moe_grouped_linear_forward);
IT_CUDA_MIRRORS(moe_grouped_linear_backward_input);
IT_CUDA_MIRRORS(moe_grouped_linear_backward_weight);
