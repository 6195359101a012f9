// Kernels that break the CUDA programming model, one per command-line case: the emulated GPU
// must report each (tests/test_cuda_emulated.py runs them). Built like the library's sources.
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>
#include <mma.h>

__global__ void barrier_in_one_branch(float *out) {
    if (threadIdx.x % 32 < 16) __syncthreads();  // half of each warp waits here, half at the shuffle
    else out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void shuffle_in_partial_warp(float *out) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
}

__global__ void shared_read_without_barrier(float *out) {
    __shared__ float part[64];
    part[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = part[63 - threadIdx.x];  // no __syncthreads(): the last warp has not written
}

__global__ void shared_read_after_barrier(float *out) {
    __shared__ float part[64];
    part[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = part[63 - threadIdx.x];
}

// cp.async: the copies land when the thread waits for them; a read before the wait is stale
__global__ void async_copy(float *out, const float *src, int wait) {
    __shared__ __align__(16) float part[64];
    part[threadIdx.x] = -1.0f;
    __syncthreads();
    if (threadIdx.x < 16) cp_async16(part + 4 * threadIdx.x, src + 4 * threadIdx.x, true);
    cp_async_commit();
    if (wait) cp_async_wait<0>();
    __syncthreads();
    out[threadIdx.x] = part[threadIdx.x];
}

// dynamic shared memory past 48 KB: refused unless the kernel was allowed it
__global__ void dynamic_shared(float *out, const float *src) {
    IT_DYNAMIC_SHARED(float, part);
    part[16383 - threadIdx.x] = src[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = part[16383 - threadIdx.x];
}

// an ldmatrix one row past the end of the block's dynamic shared memory
__global__ void ldmatrix_past_shared(float *out) {
    IT_DYNAMIC_SHARED(unsigned char, part);
    uint32_t r[4];
    ldmatrix_x4(r, part + 16 * (threadIdx.x % 32) + 16);  // rows 1..32 of a 32-row (512-byte) buffer
    out[threadIdx.x] = (float)r[0];
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    float *out;
    cudaMallocAsync((void **)&out, 64 * sizeof(float), 0);
    cudaMemsetAsync(out, 0, 64 * sizeof(float), 0);
    float *src, expected[64];
    for (int i = 0; i < 64; i++) expected[i] = (float)(63 - i);
    cudaMallocAsync((void **)&src, sizeof expected, 0);
    cudaMemcpyAsync(src, expected, sizeof expected, cudaMemcpyDefault, 0);
    if (!strcmp(what, "divergent-barrier")) barrier_in_one_branch<<<1, 64, 0, 0>>>(out);
    else if (!strcmp(what, "partial-warp-shuffle")) shuffle_in_partial_warp<<<1, 48, 0, 0>>>(out);
    else if (!strcmp(what, "too-many-threads")) shared_read_after_barrier<<<1, 2048, 0, 0>>>(out);
    else if (!strcmp(what, "race")) shared_read_without_barrier<<<1, 64, 0, 0>>>(out);
    else if (!strcmp(what, "no-race")) shared_read_after_barrier<<<1, 64, 0, 0>>>(out);
    else if (!strcmp(what, "async-copy-waited")) async_copy<<<1, 64, 0, 0>>>(out, src, 1);
    else if (!strcmp(what, "async-copy-unwaited")) async_copy<<<1, 64, 0, 0>>>(out, src, 0);
    else if (!strcmp(what, "big-shared")) dynamic_shared<<<1, 64, 64 * 1024, 0>>>(out, src);
    else if (!strcmp(what, "big-shared-allowed")) {
        cudaFuncSetAttribute(dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
        dynamic_shared<<<1, 64, 64 * 1024, 0>>>(out, src);
    } else if (!strcmp(what, "ldmatrix-past-shared")) ldmatrix_past_shared<<<1, 64, 512, 0>>>(out);
    else return 2;
    cudaError_t launch = cudaGetLastError();
    float host[64];
    cudaMemcpyAsync(host, out, sizeof host, cudaMemcpyDefault, 0);
    cudaError_t run = cudaStreamSynchronize(0);
    int wrong = 0;
    for (int i = 0; i < 64; i++) wrong += host[i] != (float)(63 - i);
    printf("launch: %s\nrun: %s\nwrong: %d\n", cudaGetErrorString(launch), cudaGetErrorString(run), wrong);
    return 0;
}
