// What every CUDA source of libinfinitrain_cuda.so shares: errors, the device check, the
// current stream, dtype loads and stores, launch sizes. libinfinitrain has already checked
// each call's arguments (sizes, overflow, NULL pointers) before it reaches an it_cuda_<op>.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include <initializer_list>
#include <type_traits>

#include "../cuda_bridge.h"
#include "infinitrain.h"

// A kernel's dynamic shared memory as a T * (nvcc wants one type per extern __shared__ name, so
// every kernel takes the same byte array; the emulated GPU defines its own)
#ifndef IT_DYNAMIC_SHARED
#define IT_DYNAMIC_SHARED(T, name)                                    \
    extern __shared__ __align__(16) unsigned char it_dynamic_shared[]; \
    T *name = (T *)it_dynamic_shared
#endif

// libinfinitrain finds it_cuda_<op> by name (dlsym) and calls it through a pointer of
// it_<op>'s type: a signature that drifted would be undefined behaviour no test sees, so each
// file states, for every entry point it defines, that the two types are the same.
#define IT_CUDA_MIRRORS(op)                                                                  \
    static_assert(std::is_same<decltype(it_cuda_##op), decltype(it_##op)>::value,           \
                  "it_cuda_" #op " must have the type of it_" #op " in infinitrain.h")

// ---- errors ---------------------------------------------------------------------------
// The message of the last failure on this thread; libinfinitrain copies it into
// it_last_error() (it_cuda_failed).
it_status it_cuda_error(it_status status, const char *fmt, ...);

#define CU_TRY(expr)                                                                         \
    do {                                                                                     \
        cudaError_t err_ = (expr);                                                           \
        if (err_ != cudaSuccess) {                                                           \
            cudaGetLastError(); /* clear a sticky-free error so the next call can succeed */ \
            return it_cuda_error(err_ == cudaErrorMemoryAllocation ? IT_ERR_OUT_OF_MEMORY      \
                                                                    : IT_ERR_CUDA,             \
                                 "%s (%s)", cudaGetErrorString(err_), #expr);                \
        }                                                                                    \
    } while (0)
#define IT_CU_TRY(expr)                                                                      \
    do {                                                                                     \
        it_status st_ = (expr);                                                              \
        if (st_ != IT_OK) return st_;                                                        \
    } while (0)
// A kernel launch: its configuration errors are reported at once, not at a later sync.
#define CU_LAUNCHED() CU_TRY(cudaPeekAtLastError())

// ---- devices and streams ------------------------------------------------------------------
// Makes `device` current on this thread after checking that it exists.
it_status it_cuda_use(it_device device);
// This thread's current stream for `device` (its own stream unless it_cuda_set_stream chose
// another). Kernels are queued on it and return without waiting.
cudaStream_t it_cuda_stream(it_device device);

// An input outside its range (an embedding id, a cross-entropy target, multinomial weights) cannot be reported by
// the kernel that meets it without a host synchronisation: the kernel sets this device's flag
// (it_cuda_index_flag gives its address) and the next synchronisation the host does anyway
// (a copy to host memory, a stream or device sync) reports IT_ERR_INDEX_OUT_OF_RANGE.
it_status it_cuda_index_flag(it_device device, int **flag);
it_status it_cuda_check_index_flag(it_device device);

// ---- cuBLAS (matmul.cu) -------------------------------------------------------------------
// it_matmul's CUDA twin, for kernels made of products (the experts' grouped products).
extern "C" it_status it_cuda_matmul(it_device device, it_dtype dtype, void *c, const void *a, const void *b,
                                    int64_t batch, int64_t m, int64_t n, int64_t k, int32_t trans_a,
                                    int32_t trans_b, float alpha, float beta, int64_t stride_a,
                                    int64_t stride_b, int64_t stride_c);
// This thread's cuBLAS handle for `device`, set to its current stream.
it_status it_cuda_blas_handle(it_device device, void **handle);
// An entry point of the cuBLAS found, by name; NULL when it lacks it (an older library).
void *it_cuda_blas_symbol(const char *name);

// ---- dtypes ---------------------------------------------------------------------------------
static inline size_t dtype_bytes(it_dtype dt) {
    switch (dt) {
    case IT_FLOAT32: case IT_INT32: return 4;
    case IT_BFLOAT16: case IT_FLOAT16: return 2;
    case IT_INT64: case IT_FLOAT64: return 8;
    default: return 1;  // IT_UINT8, IT_BOOL
    }
}

template <typename T> __device__ __forceinline__ float to_f(T x) { return (float)x; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x) { return (T)x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);  // round to nearest even, as the CPU kernels
}
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half(x); }

// Any dtype's element i as a double (casts, fills, sampling); bool reads as 0 or 1.
__device__ __forceinline__ double load_f64(int dtype, const void *p, int64_t i) {
    switch (dtype) {
    case IT_FLOAT32: return ((const float *)p)[i];
    case IT_BFLOAT16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case IT_FLOAT16: return __half2float(((const __half *)p)[i]);
    case IT_INT32: return ((const int32_t *)p)[i];
    case IT_INT64: return (double)((const int64_t *)p)[i];
    case IT_FLOAT64: return ((const double *)p)[i];
    case IT_UINT8: return ((const uint8_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0;  // IT_BOOL
    }
}

// ---- random numbers: the CPU's counter-based streams (src/cpu/random.c) -----------------------
// Element `counter` of the stream `key` is a hash of the pair, so a seed draws the same numbers
// on the CPU and on any GPU, whatever the launch configuration.
#define IT_RNG_FN __host__ __device__ __forceinline__
#include "../random_bits.h"

// The type a kernel computes in: float for float32/bfloat16/float16, double for float64;
// load_acc/store_acc read and write an element through it (16-bit results rounded once).
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <typename T> __device__ __forceinline__ typename Acc<T>::type load_acc(const T *p, int64_t i) {
    return (typename Acc<T>::type)to_f(p[i]);
}
template <> __device__ __forceinline__ double load_acc<double>(const double *p, int64_t i) { return p[i]; }
template <typename T> __device__ __forceinline__ void store_acc(T *p, int64_t i, typename Acc<T>::type v) {
    p[i] = from_f<T>((float)v);
}
template <> __device__ __forceinline__ void store_acc<double>(double *p, int64_t i, double v) { p[i] = v; }

// Calls body.template operator()<T>() with T the C++ type of a floating dtype; other dtypes
// are IT_ERR_NOT_SUPPORTED.
#define IT_FLOAT_SWITCH(dtype, fn, ...)                                                      \
    switch (dtype) {                                                                         \
    case IT_FLOAT32: { using T = float; __VA_ARGS__; break; }                                \
    case IT_BFLOAT16: { using T = __nv_bfloat16; __VA_ARGS__; break; }                       \
    case IT_FLOAT16: { using T = __half; __VA_ARGS__; break; }                               \
    default:                                                                                 \
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "dtype %d is not supported on CUDA",       \
                             (int)(dtype));                                                  \
    }

// float64 too (elementwise ops, reductions): T is double, else as IT_FLOAT_SWITCH.
#define FLOAT_OR_DOUBLE(dtype, fn, ...)                                                       \
    if ((dtype) == IT_FLOAT64) {                                                              \
        using T = double;                                                                     \
        __VA_ARGS__;                                                                          \
    } else {                                                                                  \
        IT_FLOAT_SWITCH(dtype, fn, __VA_ARGS__)                                               \
    }

// Ops that only move elements: E is an unsigned type of the dtype's size.
#define BY_SIZE(size, fn, ...)                                                                \
    switch (size) {                                                                           \
    case 1: { using E = uint8_t; __VA_ARGS__; break; }                                        \
    case 2: { using E = uint16_t; __VA_ARGS__; break; }                                       \
    case 4: { using E = uint32_t; __VA_ARGS__; break; }                                       \
    case 8: { using E = uint64_t; __VA_ARGS__; break; }                                       \
    default: return it_cuda_error(IT_ERR_NOT_SUPPORTED, "element size %d", (int)(size));      \
    }

// An index tensor's element n (int32 or int64): embedding ids, targets.
__device__ __forceinline__ int64_t index_at(const void *idx, int is64, int64_t n) {
    return is64 ? ((const int64_t *)idx)[n] : ((const int32_t *)idx)[n];
}

// ---- launch sizes --------------------------------------------------------------------------
static constexpr int IT_THREADS = 256;
static inline unsigned int it_blocks(int64_t n, int threads = IT_THREADS) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned int)(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);  // grid-stride beyond
}
#define GRID_STRIDE(i, n)                                                                    \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)blockDim.x * gridDim.x)

// Over contiguous tensors a thread takes V elements at once, 16 bytes of the widest operand in one
// vector load (llm.c's Packed128), where every pointer is aligned to it, and the last n % V one by
// one; each element's arithmetic is the one-at-a-time kernel's, and so are the bits. V = 1 is the
// one-at-a-time kernel.
template <typename T, int V> struct alignas(sizeof(T) * V) Vec {
    T x[V];
};
static inline bool vec_aligned(std::initializer_list<const void *> pointers) {
    for (const void *p : pointers)
        if ((uintptr_t)p % 16) return false;
    return true;
}

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float warp_sums[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // warp_sums may still be read by a previous call
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? warp_sums[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float block_max(float v) {
    __shared__ float warp_max[32];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) warp_max[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? warp_max[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---- strided operands: binary ops, comparisons, where, strided copies --------------------------
namespace {

// Shapes and strides of up to IT_MAX_DIMS (16) dimensions, passed by value to a kernel. The
// library has merged the dimensions that can be (it_collapse_dims): a contiguous operand over
// a contiguous output is one dimension, read without a division.
struct Strided {
    int ndim;
    int64_t shape[16];
    int64_t stride[3][16];  // up to three operands (where: cond, a, b)
};

__device__ __forceinline__ void offsets(const Strided &s, int64_t i, int operands, int64_t *off) {
    if (s.ndim == 1) {
        for (int k = 0; k < operands; k++) off[k] = i * s.stride[k][0];
        return;
    }
    for (int k = 0; k < operands; k++) off[k] = 0;
    for (int d = s.ndim - 1; d >= 0; d--) {
        int64_t idx = i % s.shape[d];
        i /= s.shape[d];
        for (int k = 0; k < operands; k++) off[k] += idx * s.stride[k][d];
    }
}

// The operands' strides over `shape`, and the element count in *numel.
inline Strided strided(const int64_t *shape, int32_t ndim, std::initializer_list<const int64_t *> strides,
                int64_t *numel) {
    Strided s;
    s.ndim = ndim;
    *numel = 1;
    for (int d = 0; d < ndim; d++) {
        s.shape[d] = shape[d];
        *numel *= shape[d];
        int k = 0;
        for (const int64_t *st : strides) s.stride[k++][d] = st[d];
    }
    return s;
}

}  // namespace

// ---- rows: what the reductions, the norms and the loss share ---------------------------------
namespace {

// Few outputs over long rows would leave most of the GPU idle with a thread per output (the
// sum of a whole gradient for its norm: one thread, 38M elements). Then n is cut into chunks,
// each reduced by a block (inner == 1) or a thread (inner > 1) into a partial, and a second
// pass combines each output's partials in chunk order: deterministic, as the first pass.
constexpr int64_t kEnoughOutputs = 65536;  // outputs at or above which a thread per output is enough
constexpr int64_t kRowChunk = 8192;        // inner == 1: elements per block

template <typename C> __device__ __forceinline__ C combine(int op, C a, C b) {
    switch (op) {
    case IT_MAX: return a != a ? a : (b != b ? b : (a > b ? a : b));  // NaN wins
    case IT_MIN: return a != a ? a : (b != b ? b : (a < b ? a : b));
    default: return a + b;  // IT_SUM, IT_MEAN
    }
}

template <typename C> __device__ __forceinline__ C identity(int op) {
    return op == IT_MAX ? C(-INFINITY) : (op == IT_MIN ? C(INFINITY) : C(0));
}

// `v` combined over the block (blockDim.x a multiple of 32); every thread gets it
template <typename C> __device__ C block_combine(int op, C v) {
    __shared__ C part[32];
    for (int o = 16; o > 0; o >>= 1) v = combine(op, v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // part may still be read by a previous call
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? part[lane] : identity<C>(op);
    for (int o = 16; o > 0; o >>= 1) v = combine(op, v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename T> __device__ float row_max(const T *x, int64_t C) {
    float m = -INFINITY;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m = fmaxf(m, to_f(x[c]));
    return block_max(m);
}


// Rows as blocks: the grid's x dimension holds up to 2^31 - 1 blocks.
inline unsigned int row_blocks(int64_t rows) { return (unsigned int)rows; }
inline it_status check_rows(int64_t rows, const char *fn) {
    if (rows > 2147483647LL)
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "%lld rows exceed one launch's 2^31 - 1 blocks", (long long)rows);
    return IT_OK;
}

}  // namespace
