/* What every CPU kernel file includes: the helpers by concern, strided iteration and the AMX
 * products. Not part of the ABI. */
#ifndef IT_COMMON_H
#define IT_COMMON_H

#include "device.h"
#include "dtypes.h"
#include "runtime.h"
#include "scratch.h"
#include "status.h"
#include "vmath.h"

/* ---- strided iteration ---------------------------------------------------------------- */
/* Merges neighbouring dimensions that are contiguous with each other in every operand, and
 * drops size-1 dimensions, so that strided kernels run long inner loops. `strides` holds
 * `nops` arrays of ndim strides. Returns the new ndim (>= 1); shape/strides are rewritten. */
int it_collapse_dims(int ndim, int64_t *shape, int64_t *const *strides, int nops);

/* Element offset of the start of row r (the last dimension is the row). */
static inline int64_t it_row_offset(int64_t r, const int64_t *shape, const int64_t *strides,
                                    int ndim) {
    int64_t off = 0;
    for (int d = ndim - 2; d >= 0; d--) {
        int64_t i = r % shape[d];
        r /= shape[d];
        off += i * strides[d];
    }
    return off;
}
#define IT_MAX_DIMS 16

/* bfloat16 products without sgemm: on Intel AMX tiles (cpu/matmul_amx.c), with AVX512-BF16's
 * VDPBF16PS, and with AVX2 FMAs on operands widened while packed (both cpu/matmul_bf16.c).
 * *_ready() says whether this CPU (and, for AMX, the kernel) allows them; each computes
 * C = alpha op(A) op(B) + beta C for one row-major problem. it_bf16_matmul_path() is the one
 * the products take (cpu/matmul.c). */
int it_amx_ready(void);
it_status it_matmul_bf16_amx(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                             int64_t k, int trans_a, int trans_b, float alpha, float beta);
int it_avx512_bf16_ready(void);
int it_avx2_fma_ready(void);
it_status it_matmul_bf16_avx2(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                              int64_t k, int trans_a, int trans_b, float alpha, float beta);
it_status it_matmul_bf16_avx512(uint16_t *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n,
                                int64_t k, int trans_a, int trans_b, float alpha, float beta);
typedef enum { IT_BF16_SGEMM, IT_BF16_AVX2, IT_BF16_AVX512, IT_BF16_AMX } it_bf16_path;
it_bf16_path it_bf16_matmul_path(void);
const char *it_bf16_path_name(it_bf16_path path);

#endif
