// The CUDA programming model on the CPU, for testing libinfinitrain_cuda.so where there is no GPU.
//
// build.py compiles the unchanged sources of native/src/cuda/ with g++ against this header
// (cuda_runtime.h, cuda_bf16.h and cuda_fp16.h here all include it) after rewriting each
// launch `kernel<<<grid, block, smem, stream>>>(args)` into `emu_launch("kernel", kernel,
// grid, block, smem, stream)(args)`. What it models, and so what a test through it can catch:
// - every thread of a block is a fiber; __syncthreads() and the warp shuffles are real
//   barriers, so a reduction that reads a neighbour's value before it is written, a barrier
//   not reached by the whole block, or a full-warp shuffle in a partial warp is an error;
// - launch limits (threads per block, grid size, shared memory) as the hardware has them;
// - streams run their work lazily, only when something waits on it (a stream or event
//   synchronisation, a stream waiting on an event, a copy to the host): a legitimate CUDA
//   schedule, and the one under which a missing event wait between two streams gives a
//   wrong answer instead of a lucky right one;
// - memory from cudaMallocAsync is filled with NaN bytes when handed out and again when
//   freed, so reading unwritten or freed device memory shows in the results.
// cuBLAS and NCCL are emulated beside it by their documented meaning (cublas.cpp, nccl.cpp:
// communicators across processes, meeting through files). What it cannot tell: speed, the
// memory model of real hardware, bank conflicts, and anything about cuBLAS or NCCL themselves.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <utility>

// ---- what nvcc's keywords mean on one CPU thread -------------------------------------------
// the toolkit version it stands for (cuda_runtime_api.h defines it; cudaRuntimeGetVersion says it)
#define CUDART_VERSION 13000
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
// One block of one kernel runs at a time (the emulated runtime holds a lock while it runs
// kernels), so a block's shared memory is a static local.
#define __shared__ static

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {
enum State { RUNNABLE, AT_SYNCTHREADS, AT_SHUFFLE, DONE };
struct Fiber {  // a CUDA thread
    char *stack;          // null until it first runs, and again once it has ended
    void *stack_pointer;  // where its registers are saved while it waits
    uint3 index;
    int lane, warp;
    State state;
    uint64_t shuffles;  // how many this thread has done: its slot parity
};
extern Fiber *current;       // the CUDA thread running now
extern uint3 block_index;    // blockIdx of the block running now
extern dim3 block_size, grid_size;
inline const uint3 &thread_index() { return current->index; }
inline int lane() { return current->lane; }
void sync_block();                        // __syncthreads()
void sync_warp();                         // __syncwarp(): a barrier of the 32 lanes
const char *kernel_name();                // the kernel running now
void fail(const char *message);           // the kernel fails here (a launch failure, as on a GPU)
// A warp shuffle: every lane of the warp gives `value` and gets the value of lane `source`.
uint64_t shuffle(unsigned int mask, uint64_t value, int source);
}  // namespace emu

#define threadIdx (emu::thread_index())
#define blockIdx (emu::block_index)
#define blockDim (emu::block_size)
#define gridDim (emu::grid_size)

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
    if (mask != 0xffffffffu) emu::fail("__syncwarp with a partial mask: only full warps are used here");
    emu::sync_warp();
}
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

template <typename T> T emu_shuffle(unsigned int mask, T v, int source) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = emu::shuffle(mask, bits, source);
    memcpy(&v, &bits, sizeof v);
    return v;
}
template <typename T> T __shfl_xor_sync(unsigned int mask, T v, int lane_mask, int width = 32) {
    return emu_shuffle(mask, v, (emu::lane() ^ lane_mask) & (width - 1) | (emu::lane() & ~(width - 1)));
}
template <typename T> T __shfl_sync(unsigned int mask, T v, int src_lane, int width = 32) {
    return emu_shuffle(mask, v, (src_lane & (width - 1)) | (emu::lane() & ~(width - 1)));
}
template <typename T> T __shfl_down_sync(unsigned int mask, T v, unsigned int delta, int width = 32) {
    int l = emu::lane(), in_group = (l & (width - 1)) + (int)delta;
    return emu_shuffle(mask, v, in_group < width ? l + (int)delta : l);
}

// Atomics: one block runs at a time and a fiber only yields at a barrier, so a read-modify-write
// is never interleaved with another thread's.
template <typename T> T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }

// ---- 16-bit floats, converted as the CUDA headers do (round to nearest even) ----------------
struct __nv_bfloat16 {
    uint16_t bits;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f);
    operator float() const {
        uint32_t u = (uint32_t)bits << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
};
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) b.bits = (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    else b.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return b;
}
inline __nv_bfloat16::__nv_bfloat16(float f) : bits(__float2bfloat16(f).bits) {}
inline float __bfloat162float(__nv_bfloat16 b) { return (float)b; }

struct __half {
    uint16_t bits;
    __half() = default;
    __half(float f);
    operator float() const;
};
inline __half __float2half(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
    __half h;
    if (mag > 0x7f800000u) { h.bits = (uint16_t)(sign | 0x7e00u); return h; }  // NaN
    if (mag >= 0x477ff000u) { h.bits = (uint16_t)(sign | 0x7c00u); return h; }  // rounds to inf
    if (mag < 0x38800000u) {  // a subnormal half (or zero): scale so that rounding is exact
        float a;
        memcpy(&a, &mag, 4);
        h.bits = (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));  // a / 2^-24
        return h;
    }
    uint32_t r = mag + 0xfffu + ((mag >> 13) & 1u) - (112u << 23);
    h.bits = (uint16_t)(sign | (r >> 13));
    return h;
}
inline __half::__half(float f) : bits(__float2half(f).bits) {}
inline __half::operator float() const {
    uint32_t sign = (uint32_t)(bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1fu, man = bits & 0x3ffu;
    float f;
    if (exp == 0) {
        f = (float)man / 16777216.0f;  // man * 2^-24
        uint32_t u;
        memcpy(&u, &f, 4);
        u |= sign;
        memcpy(&f, &u, 4);
        return f;
    }
    uint32_t u = sign | (exp == 31 ? (0xffu << 23) | (man << 13) : ((exp + 112u) << 23) | (man << 13));
    memcpy(&f, &u, 4);
    return f;
}
inline float __half2float(__half h) { return (float)h; }

// ---- the runtime API used by libinfinitrain_cuda.so ----------------------------------------
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719,
};
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef struct emu_pool *cudaMemPool_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                      cudaMemcpyDeviceToDevice, cudaMemcpyDefault };
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4, cudaMemPoolAttrReservedMemCurrent = 5,
                       cudaMemPoolAttrReservedMemHigh = 6 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocPortable 0x01
struct cudaDeviceProp {
    char name[256];
    int major, minor;
    size_t totalGlobalMem;
};

extern "C" {
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void *value);
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void *value);
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep);
}

// A __device__ variable is a host global here; its "device address" is its address.
template <typename T> cudaError_t cudaGetSymbolAddress(void **p, T &symbol) {
    *p = (void *)&symbol;
    return cudaSuccess;
}
template <typename T>
cudaError_t cudaMemcpyFromSymbol(void *dst, const T &symbol, size_t n, size_t offset = 0,
                                 cudaMemcpyKind = cudaMemcpyDeviceToHost) {
    memcpy(dst, (const char *)&symbol + offset, n);
    return cudaSuccess;
}
template <typename T>
cudaError_t cudaMemcpyToSymbol(T &symbol, const void *src, size_t n, size_t offset = 0,
                               cudaMemcpyKind = cudaMemcpyHostToDevice) {
    memcpy((char *)&symbol + offset, src, n);
    return cudaSuccess;
}

// ---- launches ------------------------------------------------------------------------------
namespace emu {
// Queues `thread_body` to run as every thread of the grid on `stream` (checks the launch
// configuration first and records an invalid one as the runtime's last error).
void launch_grid(const char *name, const void *kernel, dim3 grid, dim3 block, size_t shared_bytes,
                 cudaStream_t stream, std::function<void()> thread_body);
// the block's dynamic shared memory (extern __shared__): the launch's bytes, 0xff (NaN) until written
unsigned char *dynamic_shared();
size_t dynamic_shared_bytes();  // the launch's dynamic shared memory, 0 if none

// Queues host work on `stream`, run in order with its kernels (the emulated cuBLAS and NCCL).
void enqueue_task(cudaStream_t stream, std::function<void()> task);

template <typename... P> struct Launch {
    const char *name;
    void (*kernel)(P...);
    dim3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
    template <typename... A> void operator()(A &&...args) const {
        // the arguments are copied at the launch, as CUDA copies kernel parameters
        std::tuple<typename std::decay<P>::type...> params(std::forward<A>(args)...);
        auto k = kernel;
        launch_grid(name, (const void *)k, grid, block, shared_bytes, stream, [k, params] { std::apply(k, params); });
    }
};
}  // namespace emu

// IT_DYNAMIC_SHARED(T, name) of common.cuh: a kernel's dynamic shared memory as a T *
#define IT_DYNAMIC_SHARED(T, name) T *name = (T *)emu::dynamic_shared()
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
// allows a kernel more than 48 KB of dynamic shared memory, up to the H100's 227 KB
extern "C" cudaError_t emu_func_set_attribute(const void *kernel, cudaFuncAttribute attribute, int value);
template <typename... P> cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attribute, int value) {
    return emu_func_set_attribute((const void *)kernel, attribute, value);
}

template <typename... P>
emu::Launch<P...> emu_launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block,
                             size_t shared_bytes = 0, cudaStream_t stream = 0) {
    return emu::Launch<P...>{name, kernel, grid, block, shared_bytes, stream};
}
