// The tensor-core attention kernels of attention_flash.cu, as attention.cu's entry points call them.
#pragma once

#include <stdlib.h>
#include <string.h>

#include "common.cuh"

struct FlashShape {
    int64_t B, H, KV, Tq, Tk, D;
    int causal;
    float scale;
};

// Whether the flash kernels take this call: 16-bit q/k/v, head size 64 or 128, no bias or
// dropout, 16-byte aligned pointers. The rest goes to the reference kernels of attention.cu, as
// does every call when INFINITRAIN_CUDA_ATTENTION=reference.
// IT_OK, or an error naming a value of INFINITRAIN_CUDA_ATTENTION (reference, wmma, mma) or
// INFINITRAIN_FLASH_DKV_TILE (32, 64) that is none of those
it_status flash_attention_settings();
bool flash_attention_applies(it_dtype dtype, const FlashShape &f, const it_attention_options *options,
                             std::initializer_list<const void *> pointers);
void flash_attention_forward(cudaStream_t s, it_dtype dtype, const FlashShape &f, void *out, float *lse,
                             const void *q, const void *k, const void *v);
// delta: rowsum(dO * O) per query row, [B, H, Tq] float32
void flash_attention_backward(cudaStream_t s, it_dtype dtype, const FlashShape &f, void *dq, void *dk, void *dv,
                              const void *dout, const void *q, const void *k, const void *v, const float *lse,
                              const float *delta);

// The same on mma.sync with the tiles in registers (attention_mma.cu): what the two above run
// unless INFINITRAIN_CUDA_ATTENTION is wmma (or reference)
void mma_attention_forward(cudaStream_t s, it_dtype dtype, const FlashShape &f, void *out, float *lse,
                           const void *q, const void *k, const void *v);
void mma_attention_backward(cudaStream_t s, it_dtype dtype, const FlashShape &f, void *dq, void *dk, void *dv,
                            const void *dout, const void *q, const void *k, const void *v, const float *lse,
                            const float *delta);
