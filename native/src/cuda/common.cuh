// What every CUDA source of libinfinitrain_cuda.so shares: errors, the device check, the
// current stream, dtype loads and stores, launch sizes. libinfinitrain has already checked
// each call's arguments (sizes, overflow, NULL pointers) before it reaches an it_cuda_<op>.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "../cuda_bridge.h"
#include "infinitrain.h"

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
__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__device__ __forceinline__ uint64_t random_bits(uint64_t key, uint64_t counter) {
    return mix64(mix64(counter * 0x9e3779b97f4a7c15ull + key) ^ key);
}
__device__ __forceinline__ double uniform_open0(uint64_t bits) {  // (0, 1], 53 bits
    return ((double)(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

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

// ---- launch sizes --------------------------------------------------------------------------
static constexpr int IT_THREADS = 256;
static inline unsigned int it_blocks(int64_t n, int threads = IT_THREADS) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned int)(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);  // grid-stride beyond
}
#define GRID_STRIDE(i, n)                                                                    \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                \
         i += (int64_t)blockDim.x * gridDim.x)

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
