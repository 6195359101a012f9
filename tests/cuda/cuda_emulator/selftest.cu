// Kernels that break the CUDA programming model, one per command-line case: the emulated GPU
// must report each (tests/test_cuda_emulated.py runs them). Built like the library's sources.
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

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

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    float *out;
    cudaMallocAsync((void **)&out, 64 * sizeof(float), 0);
    cudaMemsetAsync(out, 0, 64 * sizeof(float), 0);
    if (!strcmp(what, "divergent-barrier")) barrier_in_one_branch<<<1, 64, 0, 0>>>(out);
    else if (!strcmp(what, "partial-warp-shuffle")) shuffle_in_partial_warp<<<1, 48, 0, 0>>>(out);
    else if (!strcmp(what, "too-many-threads")) shared_read_after_barrier<<<1, 2048, 0, 0>>>(out);
    else if (!strcmp(what, "race")) shared_read_without_barrier<<<1, 64, 0, 0>>>(out);
    else if (!strcmp(what, "no-race")) shared_read_after_barrier<<<1, 64, 0, 0>>>(out);
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
