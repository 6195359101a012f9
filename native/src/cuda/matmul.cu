// Matrix products through cuBLAS. cuBLAS is opened at run time by its soname (the CUDA 13
// wheel's libcublas.so.13, else CUDA 12's), so that this library builds with the toolkit's
// runtime alone and a machine without cuBLAS gets a clear error, not a failed import. The
// few entry points used are declared here as the cuBLAS C API defines them.
#include <dlfcn.h>
#include <limits.h>
#include <mutex>

#include "common.cuh"

namespace {
typedef int cublasStatus_t;  // CUBLAS_STATUS_SUCCESS = 0
typedef struct cublasContext *cublasHandle_t;
constexpr int OP_N = 0, OP_T = 1;                        // cublasOperation_t
constexpr int COMPUTE_32F = 68, COMPUTE_64F = 70;        // cublasComputeType_t
constexpr int GEMM_DEFAULT = -1;                         // cublasGemmAlgo_t

struct Cublas {
    void *lib = nullptr;
    char why[512] = "";
    cublasStatus_t (*create)(cublasHandle_t *) = nullptr;
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
    cublasStatus_t (*gemm)(cublasHandle_t, int, int, int, int, int, const void *, const void *,
                           cudaDataType, int, long long, const void *, cudaDataType, int,
                           long long, const void *, void *, cudaDataType, int, long long, int,
                           int, int) = nullptr;
};
Cublas cublas;
std::once_flag cublas_once;

// The cuBLAS of this library's own CUDA major version (the toolkit it was built with: its
// runtime is linked in), never another's: libcublas.so.13 for a CUDA 13 build, .12 for 12.
#define IT_CUDA_MAJOR (CUDART_VERSION / 1000)

void open_cublas() {
    char versioned[32];
    snprintf(versioned, sizeof versioned, "libcublas.so.%d", IT_CUDA_MAJOR);
    const char *names[] = {versioned, "libcublas.so"};
    char first[256] = "";
    for (const char *name : names) {
        if ((cublas.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
        if (!first[0]) snprintf(first, sizeof first, "%s", dlerror());
    }
    if (!cublas.lib) {
        snprintf(cublas.why, sizeof cublas.why, "not found (%s); install it with pip install "
                 "'infinitrain[cuda%d]' (this library was built with CUDA %d)", first, IT_CUDA_MAJOR,
                 IT_CUDA_MAJOR);
        return;
    }
    cublas.create = (decltype(cublas.create))dlsym(cublas.lib, "cublasCreate_v2");
    cublas.set_stream = (decltype(cublas.set_stream))dlsym(cublas.lib, "cublasSetStream_v2");
    cublas.gemm = (decltype(cublas.gemm))dlsym(cublas.lib, "cublasGemmStridedBatchedEx");
    if (!cublas.create || !cublas.set_stream || !cublas.gemm) {
        snprintf(cublas.why, sizeof cublas.why, "the cuBLAS library found lacks cublasCreate_v2, "
                 "cublasSetStream_v2 or cublasGemmStridedBatchedEx");
        cublas.lib = nullptr;
    }
}

// One handle per (thread, device): a cuBLAS handle must not be used by two threads at once.
thread_local cublasHandle_t handles[64];

it_status handle_for(it_device device, cublasHandle_t *out) {
    std::call_once(cublas_once, open_cublas);
    if (!cublas.lib) return it_cuda_error(IT_ERR_NO_CUDA, "cuBLAS %s (cuda:%d)", cublas.why,
                                          (int)device.index);
    cublasHandle_t &h = handles[device.index];
    if (!h && cublas.create(&h) != 0)
        return it_cuda_error(IT_ERR_CUDA, "cublasCreate failed on cuda:%d", (int)device.index);
    if (cublas.set_stream(h, it_cuda_stream(device)) != 0)
        return it_cuda_error(IT_ERR_CUDA, "cublasSetStream failed");
    *out = h;
    return IT_OK;
}
}  // namespace

const char *it_cuda_blas_status(void) {
    std::call_once(cublas_once, open_cublas);
    if (!cublas.lib) return cublas.why;
    static char where[600];
    Dl_info info;  // the file the loader chose: a wheel's, or the system's
    void *sym = (void *)cublas.create;
    snprintf(where, sizeof where, "%s", sym && dladdr(sym, &info) && info.dli_fname ? info.dli_fname : "found");
    return where;
}

it_status it_cuda_blas_handle(it_device device, void **handle) {
    cublasHandle_t h = nullptr;
    IT_CU_TRY(handle_for(device, &h));
    *handle = (void *)h;
    return IT_OK;
}

void *it_cuda_blas_symbol(const char *name) {
    std::call_once(cublas_once, open_cublas);
    return cublas.lib ? dlsym(cublas.lib, name) : nullptr;
}

// Row-major C [M, N] = op(A) [M, K] @ op(B) [K, N] is column-major C^T = op(B)^T op(A)^T:
// cuBLAS gets B first, then A, with the leading dimensions of their row-major storage.
extern "C" it_status it_cuda_matmul(it_device device, it_dtype dtype, void *c, const void *a,
                                    const void *b, int64_t batch, int64_t m, int64_t n, int64_t k,
                                    int32_t trans_a, int32_t trans_b, float alpha, float beta,
                                    int64_t stride_a, int64_t stride_b, int64_t stride_c) {
    if (batch * m * n == 0) return IT_OK;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX)
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "cuBLAS takes sizes up to 2^31 - 1, got "
                             "batch %lld, %lld x %lld x %lld", (long long)batch, (long long)m,
                             (long long)n, (long long)k);
    IT_CU_TRY(it_cuda_use(device));
    cublasHandle_t h;
    IT_CU_TRY(handle_for(device, &h));
    cudaDataType type;
    int compute = COMPUTE_32F;
    switch (dtype) {
    case IT_FLOAT32: type = CUDA_R_32F; break;
    case IT_BFLOAT16: type = CUDA_R_16BF; break;
    case IT_FLOAT16: type = CUDA_R_16F; break;
    case IT_FLOAT64: type = CUDA_R_64F; compute = COMPUTE_64F; break;
    default:
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "dtype %d is not supported on CUDA", (int)dtype);
    }
    double alpha64 = alpha, beta64 = beta;
    const void *pa = compute == COMPUTE_64F ? (const void *)&alpha64 : (const void *)&alpha;
    const void *pb = compute == COMPUTE_64F ? (const void *)&beta64 : (const void *)&beta;
    int lda = trans_a ? (int)m : (int)k, ldb = trans_b ? (int)k : (int)n;
    cublasStatus_t st = cublas.gemm(h, trans_b ? OP_T : OP_N, trans_a ? OP_T : OP_N, (int)n, (int)m,
                                    (int)k, pa, b, type, ldb, stride_b, a, type, lda, stride_a, pb,
                                    c, type, (int)n, stride_c, (int)batch, compute, GEMM_DEFAULT);
    if (st != 0) return it_cuda_error(IT_ERR_CUDA, "cublasGemmStridedBatchedEx failed "
                                      "with status %d", st);
    return IT_OK;
}

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(matmul);
