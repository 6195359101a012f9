/* What this build is: version, BLAS, SIMD level, OpenMP threads, CUDA. */
#include <omp.h>
#include <stdio.h>

#include "common.h"

#ifndef IT_BLAS_DESC
#define IT_BLAS_DESC "unknown BLAS"
#endif

const char *it_version(void) { return "0.1.0"; }

static const char *it_simd_level(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        return "x86-64-v4 (AVX-512)";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "x86-64-v3 (AVX2+FMA)";
    return "x86-64 baseline (SSE2)";
#else
    return "compiler default";
#endif
}

const char *it_build_info(void) {
    static _Thread_local char info[1024];
    snprintf(info, sizeof info,
             "infinitrain %s; BLAS: %s; SIMD: %s; bfloat16 products: %s; OpenMP: %d threads; CUDA: %s",
             it_version(), IT_BLAS_DESC, it_simd_level(), it_bf16_path_name(it_bf16_matmul_path()),
             omp_get_max_threads(), it_cuda_describe());
    return info;
}
