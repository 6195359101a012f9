// Tensor-core building blocks in PTX, for kernels that keep their tiles in registers: the warp
// product mma.sync.m16n8k16 (16-bit operands, float32 accumulators), ldmatrix (a warp loads
// four 8x8 tiles of 16-bit values from shared memory straight into mma's operand layout,
// transposed or not) and cp.async (global to shared memory without passing through registers,
// so the next tile loads while the warp computes on this one).
//
// Register layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"): with g = lane / 4 and
// t = lane % 4, an A operand (16 x 16, row-major) is four 32-bit registers of two values each:
// a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1], a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9];
// a B operand (16 x 8) is b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; the accumulator (16 x 8)
// is d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1]. So two accumulator tiles side by side
// (columns 0-7 and 8-15) are, packed to 16 bits, exactly one A operand: FlashAttention-2's
// probabilities never leave the registers.
//
// The emulated GPU (tests/cuda/cuda_emulator/include/mma.h) defines the same functions with the
// same layouts, warp-collective, so CI runs the kernels built on them.
#pragma once

#include <mma.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "common.cuh"

// two floats as one register of two 16-bit values, the first in the low half (on a GPU one
// conversion instruction for both, the same rounding as two)
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
#else
    T a = from_f<T>(lo), b = from_f<T>(hi);
    uint16_t x, y;
    memcpy(&x, &a, 2);
    memcpy(&y, &b, 2);
    return (uint32_t)x | ((uint32_t)y << 16);
#endif
}

#if defined(__CUDACC__)
__device__ __forceinline__ uint32_t shared_address(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// d += a b: a 16x16 A operand, a 16x8 B operand (b0, b1), float32 accumulators
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__)
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// four 8x8 tiles: lanes 8i..8i+7 give the addresses of tile i's rows (16 bytes each, 16-byte
// aligned, in shared memory); r[i] is tile i's element pair at [g][2t..2t+1]
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *row) {
#if defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
#endif
}
// the same, each tile transposed: r[i] is tile i's pair at [2t][g] and [2t+1][g]
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) {
#if defined(__CUDA_ARCH__)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row)));
#endif
}

// 16 bytes from global to shared memory, asynchronously; zeros instead when !valid (src is
// then not read, but must still be a valid address)
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
#endif
}
// closes this thread's group of copies issued since the last commit
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// waits until at most N of this thread's committed groups are still in flight (then a
// __syncthreads makes every thread's copies visible to the block)
template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
#endif  // __CUDACC__: the emulated GPU's mma.h has them
