// libcublas.so.13 for the emulated GPU: the entry points libinfinitrain_cuda.so opens,
// computed by their documented meaning (column-major, op(A) op(B), beta == 0 never reads C,
// float accumulation for CUBLAS_COMPUTE_32F, double for 64F), queued on the handle's stream
// like the real library's kernels.
#pragma GCC optimize("O3")
#include <algorithm>
#include <vector>

#include "emulated_cuda.h"

namespace {
struct Handle {
    cudaStream_t stream = 0;
};

double load(int type, const void *p, long long i) {
    switch (type) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_16BF: return (float)((const __nv_bfloat16 *)p)[i];
    default: return (float)((const __half *)p)[i];
    }
}
void store(int type, void *p, long long i, double v) {
    switch (type) {
    case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
    case CUDA_R_64F: ((double *)p)[i] = v; break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16((float)v); break;
    default: ((__half *)p)[i] = __float2half((float)v); break;
    }
}
// Sum of a[l] * b[l] in eight running sums (any order is cuBLAS's; this one vectorises).
template <typename Acc> Acc dot(const Acc *a, const Acc *b, int k) {
    Acc part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int l = 0;
    for (; l + 8 <= k; l += 8)
        for (int u = 0; u < 8; u++) part[u] += a[l + u] * b[l + u];
    Acc s = 0;
    for (int u = 0; u < 8; u++) s += part[u];
    for (; l < k; l++) s += a[l] * b[l];
    return s;
}

// C = alpha op(A) op(B) + beta C per batch, column-major: the rows of op(A) and the columns
// of op(B) are first copied out as contiguous vectors of the accumulation type.
template <typename Acc>
void gemm(int transa, int transb, int m, int n, int k, double alpha, const void *A, int lda,
          long long stride_a, const void *B, int ldb, long long stride_b, double beta, void *C,
          int ldc, long long stride_c, int batch, int type) {
    std::vector<Acc> rows((size_t)m * k), cols((size_t)n * k);
    for (int b = 0; b < batch; b++) {
        for (int i = 0; i < m; i++)
            for (int l = 0; l < k; l++)
                rows[(size_t)i * k + l] = (Acc)load(type, A, b * stride_a + (transa ? l + (long long)i * lda
                                                                                    : i + (long long)l * lda));
        for (int j = 0; j < n; j++)
            for (int l = 0; l < k; l++)
                cols[(size_t)j * k + l] = (Acc)load(type, B, b * stride_b + (transb ? j + (long long)l * ldb
                                                                                    : l + (long long)j * ldb));
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                long long ic = b * stride_c + i + (long long)j * ldc;
                double v = alpha * (double)dot(&rows[(size_t)i * k], &cols[(size_t)j * k], k);
                if (beta != 0) v += beta * load(type, C, ic);
                store(type, C, ic, v);
            }
    }
}
}  // namespace

extern "C" int cublasCreate_v2(void **handle) {
    *handle = new Handle;
    return 0;
}
extern "C" int cublasSetStream_v2(void *handle, cudaStream_t stream) {
    ((Handle *)handle)->stream = stream;
    return 0;
}

// CUBLAS_STATUS_INVALID_VALUE (7) where the real library refuses the arguments.
extern "C" int cublasGemmStridedBatchedEx(void *handle, int transa, int transb, int m, int n, int k,
                                          const void *alpha, const void *A, int a_type, int lda,
                                          long long stride_a, const void *B, int b_type, int ldb,
                                          long long stride_b, const void *beta, void *C, int c_type,
                                          int ldc, long long stride_c, int batch, int compute, int algo) {
    const int COMPUTE_32F = 68, COMPUTE_64F = 70;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || a_type != b_type || a_type != c_type) return 7;
    if (lda < (transa ? k : m) || lda < 1 || ldb < (transb ? n : k) || ldb < 1 || ldc < m || ldc < 1)
        return 7;
    if (compute != COMPUTE_32F && compute != COMPUTE_64F) return 7;
    if ((compute == COMPUTE_64F) != (c_type == CUDA_R_64F)) return 7;
    double al = compute == COMPUTE_64F ? *(const double *)alpha : *(const float *)alpha;
    double be = compute == COMPUTE_64F ? *(const double *)beta : *(const float *)beta;
    int type = c_type;
    emu::enqueue_task(((Handle *)handle)->stream, [=] {
        if (compute == COMPUTE_64F) gemm<double>(transa, transb, m, n, k, al, A, lda, stride_a, B, ldb,
                                                 stride_b, be, C, ldc, stride_c, batch, type);
        else gemm<float>(transa, transb, m, n, k, al, A, lda, stride_a, B, ldb, stride_b, be, C, ldc,
                         stride_c, batch, type);
    });
    return 0;
}

// The grouped product (cuBLAS 12.5): per group i, group_size[i] problems of the group's
// shapes, alpha and beta (host arrays); the matrices' pointer arrays are in device memory, read
// when the work runs, as the real kernels read them.
extern "C" int cublasGemmGroupedBatchedEx(void *handle, const int *transa, const int *transb, const int *m,
                                          const int *n, const int *k, const void *alpha, const void *const *A,
                                          int a_type, const int *lda, const void *const *B, int b_type,
                                          const int *ldb, const void *beta, void *const *C, int c_type,
                                          const int *ldc, int group_count, const int *group_size, int compute) {
    const int COMPUTE_32F = 68, COMPUTE_64F = 70;
    if (group_count < 0 || a_type != b_type || a_type != c_type) return 7;
    if (compute != COMPUTE_32F && compute != COMPUTE_64F) return 7;
    if ((compute == COMPUTE_64F) != (c_type == CUDA_R_64F)) return 7;
    struct Group { int ta, tb, m, n, k, lda, ldb, ldc, size; double alpha, beta; };
    std::vector<Group> groups;
    for (int i = 0; i < group_count; i++) {
        Group g{transa[i], transb[i], m[i], n[i], k[i], lda[i], ldb[i], ldc[i], group_size[i],
                compute == COMPUTE_64F ? ((const double *)alpha)[i] : ((const float *)alpha)[i],
                compute == COMPUTE_64F ? ((const double *)beta)[i] : ((const float *)beta)[i]};
        if (g.m < 0 || g.n < 0 || g.k < 0 || g.size < 0) return 7;
        if (g.lda < std::max(1, g.ta ? g.k : g.m) || g.ldb < std::max(1, g.tb ? g.n : g.k) || g.ldc < std::max(1, g.m))
            return 7;
        groups.push_back(g);
    }
    emu::enqueue_task(((Handle *)handle)->stream, [=] {
        long long idx = 0;
        for (const Group &g : groups)
            for (int j = 0; j < g.size; j++, idx++) {
                if (compute == COMPUTE_64F) gemm<double>(g.ta, g.tb, g.m, g.n, g.k, g.alpha, A[idx], g.lda, 0, B[idx],
                                                         g.ldb, 0, g.beta, C[idx], g.ldc, 0, 1, c_type);
                else gemm<float>(g.ta, g.tb, g.m, g.n, g.k, g.alpha, A[idx], g.lda, 0, B[idx], g.ldb, 0, g.beta,
                                 C[idx], g.ldc, 0, 1, c_type);
            }
    });
    return 0;
}
