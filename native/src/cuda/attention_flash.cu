// Flash attention on tensor cores: the 16-bit path of it_attention_forward / _backward (see
// attention.cu, which routes here and keeps the one-warp-per-row kernels as the reference for
// float32, bias, dropout and head sizes other than 64 and 128).
//
// FlashAttention-2's algorithm (Dao, 2023) with the products on tensor cores through the WMMA
// API (16x16x16 tiles, 16-bit operands, float32 accumulators), which the emulated GPU models, so
// CI runs these kernels too. The layout: q, out, dq [B, H, Tq, D]; k, v, dk, dv [B, KV, Tk, D];
// lse [B, H, Tq] in natural log, -inf for a row that sees no key. Causal masks align to the
// bottom right (query i sees keys j <= i + Tk - Tq), as everywhere in the library.
//
// Forward: a block of 4 warps takes 64 query rows of one head; each warp owns 16 of them. Tiles
// of BC keys stream through shared memory; S = Q K^T lands in the warp's float32 buffer, the
// online softmax (running max and sum in log2 units, the scale folded into exp2) runs there, P
// goes back to 16 bits and O += P V stays in accumulator fragments, rescaled row by row through
// a fragment that holds each element's row index (the element-to-lane map is unspecified, but
// the same for every fragment of one type). Key tiles past the causal diagonal are never read.
// Backward, deterministic (no atomics), FlashAttention-2's dK/dV pass and a separate dQ pass as
// Triton's tutorial has them: P is recomputed from the saved lse, dS = P (dP - delta) with
// delta = rowsum(dO * O) from attention.cu's pre-pass.
#include <mma.h>

#include "attention_flash.cuh"

using namespace nvcuda;

namespace {
constexpr int kWarps = 4, kThreads = 32 * kWarps, kRows = 16 * kWarps;  // 64 rows a block
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

template <typename T> using RowA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T> using RowB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T> using ColB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using Accum = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

struct alignas(16) Chunk {  // 8 16-bit values: one vector load
    uint32_t w[4];
};

// rows [first, first + rows) of a [total, D] matrix into shared memory of row stride LD,
// rows past the end zero (so that they add nothing, and no NaN, to any product)
template <typename T, int D, int LD>
__device__ __forceinline__ void load_rows(T *dst, const T *src, int64_t first, int64_t total, int rows) {
    constexpr int kChunks = D / 8;
    for (int i = threadIdx.x; i < rows * kChunks; i += kThreads) {
        int r = i / kChunks, c = (i % kChunks) * 8;
        Chunk v = {{0, 0, 0, 0}};
        if (first + r < total) v = *(const Chunk *)(src + (first + r) * D + c);
        *(Chunk *)(dst + r * LD + c) = v;
    }
}

// a fragment whose element e holds its own row index: acc.x[e] belongs to row (int)rows.x[e]
__device__ __forceinline__ void row_index(Accum &rows, float *table) {
    for (int i = threadIdx.x; i < 256; i += kThreads) table[i] = (float)(i / 16);
    __syncthreads();
    wmma::load_matrix_sync(rows, table, 16, wmma::mem_row_major);
}

// out rows [row0, row0 + 16) of a [total, D] matrix from the warp's accumulators, times `factor`
// of each row (the 16 rows' factors in `row_factor`), through the warp's float buffer `stage`
template <typename T, int D, int LDS>
__device__ __forceinline__ void store_rows(T *out, int64_t row0, int64_t total, Accum (&acc)[D / 16],
                                           float *stage, const float *row_factor) {
    int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 8;
    for (int n = 0; n < D / 16; n++) {
        wmma::store_matrix_sync(stage, acc[n], LDS, wmma::mem_row_major);
        __syncwarp();
        if (row0 + r < total)
            for (int c = c0; c < c0 + 8; c++)
                out[(row0 + r) * D + 16 * n + c] = from_f<T>(stage[r * LDS + c] * row_factor[r]);
        __syncwarp();
    }
}

// The two score-shaped products of the backward passes, 16 columns n of each into the warp's
// float buffers: S = A B^T and dP = C E^T, A and C the warp's rows in fragments, B and E tiles
// of rows in shared memory (dQ's pass: Q K^T and dO V^T; dK/dV's: K Q^T and V dO^T)
template <typename T, int D, int LDK, int LDS>
__device__ __forceinline__ void scores_and_dp(float *S, float *dP, const RowA<T> (&a)[D / 16], const T *b,
                                              const RowA<T> (&c)[D / 16], const T *e, int n) {
    Accum s, p;
    wmma::fill_fragment(s, 0.0f);
    wmma::fill_fragment(p, 0.0f);
    for (int k = 0; k < D / 16; k++) {
        ColB<T> bf, ef;
        wmma::load_matrix_sync(bf, b + 16 * n * LDK + 16 * k, LDK);
        wmma::mma_sync(s, a[k], bf, s);
        wmma::load_matrix_sync(ef, e + 16 * n * LDK + 16 * k, LDK);
        wmma::mma_sync(p, c[k], ef, p);
    }
    wmma::store_matrix_sync(S + 16 * n, s, LDS, wmma::mem_row_major);
    wmma::store_matrix_sync(dP + 16 * n, p, LDS, wmma::mem_row_major);
}

// ---- forward ------------------------------------------------------------------------------------
template <typename T, int D, int BC>
__global__ void __launch_bounds__(kThreads) flash_forward(T *out, float *lse, const T *q, const T *k, const T *v,
                                                          int64_t H, int64_t group, int64_t Tq, int64_t Tk,
                                                          int causal, float scale) {
    static_assert(2 * BC >= kRows, "the K/V tiles stage the Q tile");
    constexpr int LDK = D + 8, LDS = BC + 4, LDP = BC + 8;  // padded rows: fewer bank conflicts
    __shared__ __align__(32) T kv[2 * BC * LDK];             // K tile, then V tile
    __shared__ __align__(32) float sbuf[kWarps][16 * LDS];   // each warp's scores
    __shared__ __align__(32) T pbuf[kWarps][16 * LDP];       // each warp's probabilities
    __shared__ __align__(32) float table[256];
    __shared__ float factor[kWarps][16];
    const int w = threadIdx.x / 32, lane = threadIdx.x & 31, my = lane >> 1, half = lane & 1;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh % H, kvh = b * (H / group) + h / group;
    const int64_t q0 = (int64_t)blockIdx.x * kRows, row0 = q0 + 16 * w, my_row = row0 + my, shift = Tk - Tq;
    const T *kb = k + kvh * Tk * D, *vb = v + kvh * Tk * D;
    T *vs = kv + BC * LDK;
    float *S = sbuf[w];
    T *P = pbuf[w];

    Accum rows;
    row_index(rows, table);
    load_rows<T, D, LDK>(kv, q + bh * Tq * D, q0, Tq, kRows);
    __syncthreads();
    RowA<T> qf[D / 16];
    for (int c = 0; c < D / 16; c++) wmma::load_matrix_sync(qf[c], kv + 16 * w * LDK + 16 * c, LDK);
    Accum o[D / 16];
    for (int n = 0; n < D / 16; n++) wmma::fill_fragment(o[n], 0.0f);
    __syncthreads();

    const float sl2 = scale * kLog2e;
    float m = -INFINITY, l = 0.0f;  // my row's running max (log2 units) and sum
    const int64_t my_last = causal ? (my_row + shift < Tk ? my_row + shift : Tk - 1) : Tk - 1;
    int64_t block_last = causal ? q0 + kRows - 1 + shift : Tk - 1;  // the last key any row here sees
    if (block_last > Tk - 1) block_last = Tk - 1;
    const int64_t tiles = block_last < 0 ? 0 : block_last / BC + 1;
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t k0 = t * BC;
        load_rows<T, D, LDK>(kv, kb, k0, Tk, BC);
        load_rows<T, D, LDK>(vs, vb, k0, Tk, BC);
        __syncthreads();
        for (int n = 0; n < BC / 16; n++) {  // S = Q K^T
            Accum s;
            wmma::fill_fragment(s, 0.0f);
            for (int c = 0; c < D / 16; c++) {
                ColB<T> kf;
                wmma::load_matrix_sync(kf, kv + 16 * n * LDK + 16 * c, LDK);
                wmma::mma_sync(s, qf[c], kf, s);
            }
            wmma::store_matrix_sync(S + 16 * n, s, LDS, wmma::mem_row_major);
        }
        __syncwarp();
        // online softmax: lanes 2r and 2r + 1 share row r, every other column each (the two
        // lanes of a row then fall in different banks of the padded rows)
        float *srow = S + my * LDS;
        T *prow = P + my * LDP;
        float mx = -INFINITY;
        for (int j = half; j < BC; j += 2)
            if (k0 + j <= my_last) mx = fmaxf(mx, srow[j] * sl2);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_new = fmaxf(m, mx), base = m_new == -INFINITY ? 0.0f : m_new;  // no key seen yet: 0
        float sum = 0.0f;
        for (int j = half; j < BC; j += 2) {
            float p = k0 + j <= my_last ? exp2f(srow[j] * sl2 - base) : 0.0f;
            prow[j] = from_f<T>(p);
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        const float alpha = exp2f(m - base);
        l = l * alpha + sum;
        m = m_new;
        if (!half) factor[w][my] = alpha;
        __syncwarp();
        for (int n = 0; n < D / 16; n++)
            for (int e = 0; e < o[n].num_elements; e++) o[n].x[e] *= factor[w][(int)rows.x[e]];
        for (int c = 0; c < BC / 16; c++) {  // O += P V
            RowA<T> pf;
            wmma::load_matrix_sync(pf, P + 16 * c, LDP);
            for (int n = 0; n < D / 16; n++) {
                RowB<T> vf;
                wmma::load_matrix_sync(vf, vs + 16 * c * LDK + 16 * n, LDK);
                wmma::mma_sync(o[n], pf, vf, o[n]);
            }
        }
        __syncthreads();  // every warp is done with this K/V tile
    }
    if (!half) {
        factor[w][my] = l > 0.0f ? 1.0f / l : 0.0f;
        if (my_row < Tq) lse[bh * Tq + my_row] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
    }
    __syncwarp();
    store_rows<T, D, LDS>(out + bh * Tq * D, row0, Tq, o, S, factor[w]);
}

// ---- backward: dQ over query blocks ------------------------------------------------------------
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_backward_dq(T *dq, const T *dout, const T *q, const T *k,
                                                              const T *v, const float *lse, const float *delta,
                                                              int64_t H, int64_t group, int64_t Tq, int64_t Tk,
                                                              int causal, float scale) {
    constexpr int BC = 32, LDK = D + 8, LDS = BC + 4, LDP = BC + 8;
    __shared__ __align__(32) T kv[2 * BC * LDK];
    __shared__ __align__(32) float sbuf[kWarps][16 * LDS];   // scores, then probabilities
    __shared__ __align__(32) float dpbuf[kWarps][16 * LDS];  // dP = dO V^T
    __shared__ __align__(32) T dsbuf[kWarps][16 * LDP];      // dS
    __shared__ __align__(32) float factor[kWarps][16];
    const int w = threadIdx.x / 32, lane = threadIdx.x & 31, my = lane >> 1, half = lane & 1;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh % H, kvh = b * (H / group) + h / group;
    const int64_t q0 = (int64_t)blockIdx.x * kRows, row0 = q0 + 16 * w, my_row = row0 + my, shift = Tk - Tq;
    const T *kb = k + kvh * Tk * D, *vb = v + kvh * Tk * D;
    T *vs = kv + BC * LDK;
    float *S = sbuf[w], *dP = dpbuf[w];
    T *dS = dsbuf[w];

    RowA<T> qf[D / 16], df[D / 16];
    load_rows<T, D, LDK>(kv, q + bh * Tq * D, q0, Tq, kRows);
    __syncthreads();
    for (int c = 0; c < D / 16; c++) wmma::load_matrix_sync(qf[c], kv + 16 * w * LDK + 16 * c, LDK);
    __syncthreads();
    load_rows<T, D, LDK>(kv, dout + bh * Tq * D, q0, Tq, kRows);
    __syncthreads();
    for (int c = 0; c < D / 16; c++) wmma::load_matrix_sync(df[c], kv + 16 * w * LDK + 16 * c, LDK);
    __syncthreads();
    Accum acc[D / 16];
    for (int n = 0; n < D / 16; n++) wmma::fill_fragment(acc[n], 0.0f);

    const float sl2 = scale * kLog2e;
    const float row_lse = my_row < Tq ? lse[bh * Tq + my_row] : -INFINITY;
    const float lse2 = row_lse * kLog2e, my_delta = my_row < Tq ? delta[bh * Tq + my_row] : 0.0f;
    int64_t my_last = causal ? (my_row + shift < Tk ? my_row + shift : Tk - 1) : Tk - 1;
    if (row_lse == -INFINITY) my_last = -1;  // a row that saw no key has no gradient
    int64_t block_last = causal ? q0 + kRows - 1 + shift : Tk - 1;
    if (block_last > Tk - 1) block_last = Tk - 1;
    const int64_t tiles = block_last < 0 ? 0 : block_last / BC + 1;
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t k0 = t * BC;
        load_rows<T, D, LDK>(kv, kb, k0, Tk, BC);
        load_rows<T, D, LDK>(vs, vb, k0, Tk, BC);
        __syncthreads();
        for (int n = 0; n < BC / 16; n++) scores_and_dp<T, D, LDK, LDS>(S, dP, qf, kv, df, vs, n);  // Q K^T, dO V^T
        __syncwarp();
        for (int j = half; j < BC; j += 2) {
            float p = k0 + j <= my_last ? exp2f(S[my * LDS + j] * sl2 - lse2) : 0.0f;
            dS[my * LDP + j] = from_f<T>(p * (dP[my * LDS + j] - my_delta));
        }
        __syncwarp();
        for (int c = 0; c < BC / 16; c++) {  // dQ += dS K
            RowA<T> sf;
            wmma::load_matrix_sync(sf, dS + 16 * c, LDP);
            for (int n = 0; n < D / 16; n++) {
                RowB<T> kf;
                wmma::load_matrix_sync(kf, kv + 16 * c * LDK + 16 * n, LDK);
                wmma::mma_sync(acc[n], sf, kf, acc[n]);
            }
        }
        __syncthreads();
    }
    if (!half) factor[w][my] = scale;
    __syncwarp();
    store_rows<T, D, LDS>(dq + bh * Tq * D, row0, Tq, acc, S, factor[w]);
}

// ---- backward: dK and dV over key blocks, summed over the query heads that share them ---------
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_backward_dkv(T *dk, T *dv, const T *dout, const T *q,
                                                               const T *k, const T *v, const float *lse,
                                                               const float *delta, int64_t H, int64_t group,
                                                               int64_t Tq, int64_t Tk, int causal, float scale) {
    constexpr int BQ = 32, LDK = D + 8, LDS = BQ + 4, LDP = BQ + 8;  // query tiles of 32 rows
    __shared__ __align__(32) T qd[2 * BQ * LDK];                    // Q tile, then dO tile
    __shared__ __align__(32) float sbuf[kWarps][16 * LDS];          // S^T, then P^T
    __shared__ __align__(32) float dpbuf[kWarps][16 * LDS];         // dP^T = V dO^T
    __shared__ __align__(32) T pbuf[kWarps][16 * LDP];              // P^T, then dS^T
    __shared__ float lse2[BQ], dl[BQ], factor[kWarps][16];
    const int w = threadIdx.x / 32, lane = threadIdx.x & 31, my = lane >> 1, half = lane & 1;
    const int64_t KV = H / group, bg = blockIdx.y, b = bg / KV, g = bg % KV;
    const int64_t k0 = (int64_t)blockIdx.x * kRows, key0 = k0 + 16 * w, my_key = key0 + my, shift = Tk - Tq;
    T *dos = qd + BQ * LDK;
    float *S = sbuf[w], *dP = dpbuf[w];
    T *P = pbuf[w];

    RowA<T> kf[D / 16], vf[D / 16];
    load_rows<T, D, LDK>(qd, k + bg * Tk * D, k0, Tk, kRows);
    __syncthreads();
    for (int c = 0; c < D / 16; c++) wmma::load_matrix_sync(kf[c], qd + 16 * w * LDK + 16 * c, LDK);
    __syncthreads();
    load_rows<T, D, LDK>(qd, v + bg * Tk * D, k0, Tk, kRows);
    __syncthreads();
    for (int c = 0; c < D / 16; c++) wmma::load_matrix_sync(vf[c], qd + 16 * w * LDK + 16 * c, LDK);
    __syncthreads();
    Accum dka[D / 16], dva[D / 16];
    for (int n = 0; n < D / 16; n++) {
        wmma::fill_fragment(dka[n], 0.0f);
        wmma::fill_fragment(dva[n], 0.0f);
    }

    const float sl2 = scale * kLog2e;
    // the first query that sees this block's first key; the first that sees my key
    int64_t first = causal ? k0 - shift : 0, my_first = causal ? my_key - shift : 0;
    if (first < 0) first = 0;
    const bool my_key_real = my_key < Tk;
    for (int64_t hq = g * group; hq < (g + 1) * group; hq++) {
        const int64_t bh = b * H + hq;
        const T *qb = q + bh * Tq * D, *db = dout + bh * Tq * D;
        for (int64_t i0 = first / BQ * BQ; i0 < Tq; i0 += BQ) {
            load_rows<T, D, LDK>(qd, qb, i0, Tq, BQ);
            load_rows<T, D, LDK>(dos, db, i0, Tq, BQ);
            for (int i = threadIdx.x; i < BQ; i += kThreads) {
                float x = i0 + i < Tq ? lse[bh * Tq + i0 + i] : -INFINITY;
                lse2[i] = x * kLog2e;  // -inf: a query that saw no key, no probability
                dl[i] = i0 + i < Tq ? delta[bh * Tq + i0 + i] : 0.0f;
            }
            __syncthreads();
            for (int n = 0; n < BQ / 16; n++)  // S^T = K Q^T, dP^T = V dO^T
                scores_and_dp<T, D, LDK, LDS>(S, dP, kf, qd, vf, dos, n);
            __syncwarp();
            for (int j = half; j < BQ; j += 2) {
                bool seen = my_key_real && i0 + j >= my_first && lse2[j] != -INFINITY;
                float p = seen ? exp2f(S[my * LDS + j] * sl2 - lse2[j]) : 0.0f;
                S[my * LDS + j] = p;
                P[my * LDP + j] = from_f<T>(p);
            }
            __syncwarp();
            for (int c = 0; c < BQ / 16; c++) {  // dV += P^T dO
                RowA<T> pf;
                wmma::load_matrix_sync(pf, P + 16 * c, LDP);
                for (int n = 0; n < D / 16; n++) {
                    RowB<T> df;
                    wmma::load_matrix_sync(df, dos + 16 * c * LDK + 16 * n, LDK);
                    wmma::mma_sync(dva[n], pf, df, dva[n]);
                }
            }
            __syncwarp();
            for (int j = half; j < BQ; j += 2)
                P[my * LDP + j] = from_f<T>(S[my * LDS + j] * (dP[my * LDS + j] - dl[j]));
            __syncwarp();
            for (int c = 0; c < BQ / 16; c++) {  // dK += dS^T Q
                RowA<T> sf;
                wmma::load_matrix_sync(sf, P + 16 * c, LDP);
                for (int n = 0; n < D / 16; n++) {
                    RowB<T> qf;
                    wmma::load_matrix_sync(qf, qd + 16 * c * LDK + 16 * n, LDK);
                    wmma::mma_sync(dka[n], sf, qf, dka[n]);
                }
            }
            __syncthreads();  // every warp is done with this Q/dO tile
        }
    }
    if (!half) factor[w][my] = scale;
    __syncwarp();
    store_rows<T, D, LDS>(dk + bg * Tk * D, key0, Tk, dka, S, factor[w]);
    if (!half) factor[w][my] = 1.0f;
    __syncwarp();
    store_rows<T, D, LDS>(dv + bg * Tk * D, key0, Tk, dva, S, factor[w]);
}

template <typename T, int D>
void launch_forward(cudaStream_t s, const FlashShape &f, void *out, float *lse, const void *q, const void *k,
                    const void *v) {
    constexpr int BC = D == 64 ? 64 : 32;  // what fits 48 KB of shared memory
    dim3 grid((unsigned int)((f.Tq + kRows - 1) / kRows), (unsigned int)(f.B * f.H));
    flash_forward<T, D, BC><<<grid, kThreads, 0, s>>>((T *)out, lse, (const T *)q, (const T *)k, (const T *)v,
                                                      f.H, f.H / f.KV, f.Tq, f.Tk, f.causal, f.scale);
}

template <typename T, int D>
void launch_backward(cudaStream_t s, const FlashShape &f, void *dq, void *dk, void *dv, const void *dout,
                     const void *q, const void *k, const void *v, const float *lse, const float *delta) {
    dim3 qgrid((unsigned int)((f.Tq + kRows - 1) / kRows), (unsigned int)(f.B * f.H));
    flash_backward_dq<T, D><<<qgrid, kThreads, 0, s>>>((T *)dq, (const T *)dout, (const T *)q, (const T *)k,
                                                       (const T *)v, lse, delta, f.H, f.H / f.KV, f.Tq, f.Tk,
                                                       f.causal, f.scale);
    dim3 kgrid((unsigned int)((f.Tk + kRows - 1) / kRows), (unsigned int)(f.B * f.KV));
    flash_backward_dkv<T, D><<<kgrid, kThreads, 0, s>>>((T *)dk, (T *)dv, (const T *)dout, (const T *)q,
                                                        (const T *)k, (const T *)v, lse, delta, f.H, f.H / f.KV,
                                                        f.Tq, f.Tk, f.causal, f.scale);
}

bool aligned(const void *p) { return (uintptr_t)p % 16 == 0; }

// INFINITRAIN_CUDA_ATTENTION: reference (the row kernels), wmma (the kernels here) or, by
// default, mma (attention_mma.cu: on an H200, 1.8x these at GPT-2's shape). Read at every call (a
// getenv is far below a launch), so a test can compare the kernels in one process.
const char *attention_choice() {
    const char *choice = getenv("INFINITRAIN_CUDA_ATTENTION");
    return choice ? choice : "mma";
}
}  // namespace

it_status flash_attention_settings() {
    const char *choice = attention_choice(), *tile = getenv("INFINITRAIN_FLASH_DKV_TILE");
    if (strcmp(choice, "reference") && strcmp(choice, "wmma") && strcmp(choice, "mma"))
        return it_cuda_error(IT_ERR_INVALID_ARGUMENT,
                             "INFINITRAIN_CUDA_ATTENTION=%s: expected reference, wmma or mma (or unset)", choice);
    if (tile && strcmp(tile, "32") && strcmp(tile, "64"))
        return it_cuda_error(IT_ERR_INVALID_ARGUMENT, "INFINITRAIN_FLASH_DKV_TILE=%s: expected 32 or 64 (or unset)",
                             tile);
    return IT_OK;
}

bool flash_attention_applies(it_dtype dtype, const FlashShape &f, const it_attention_options *options,
                             std::initializer_list<const void *> pointers) {
    if (!strcmp(attention_choice(), "reference")) return false;  // the row kernels
    if (dtype != IT_BFLOAT16 && dtype != IT_FLOAT16) return false;
    if (f.D != 64 && f.D != 128) return false;
    if (options && (options->bias || options->dropout_p > 0.0f)) return false;
    if (f.B * f.H > 65535 || (f.Tq + kRows - 1) / kRows > 2147483647LL) return false;
    for (const void *p : pointers)
        if (!aligned(p)) return false;
    return true;
}

void flash_attention_forward(cudaStream_t s, it_dtype dtype, const FlashShape &f, void *out, float *lse,
                             const void *q, const void *k, const void *v) {
    if (!strcmp(attention_choice(), "mma")) return mma_attention_forward(s, dtype, f, out, lse, q, k, v);
    if (dtype == IT_BFLOAT16)
        f.D == 64 ? launch_forward<__nv_bfloat16, 64>(s, f, out, lse, q, k, v)
                  : launch_forward<__nv_bfloat16, 128>(s, f, out, lse, q, k, v);
    else
        f.D == 64 ? launch_forward<__half, 64>(s, f, out, lse, q, k, v)
                  : launch_forward<__half, 128>(s, f, out, lse, q, k, v);
}

void flash_attention_backward(cudaStream_t s, it_dtype dtype, const FlashShape &f, void *dq, void *dk, void *dv,
                              const void *dout, const void *q, const void *k, const void *v, const float *lse,
                              const float *delta) {
    if (!strcmp(attention_choice(), "mma"))
        return mma_attention_backward(s, dtype, f, dq, dk, dv, dout, q, k, v, lse, delta);
    if (dtype == IT_BFLOAT16)
        f.D == 64 ? launch_backward<__nv_bfloat16, 64>(s, f, dq, dk, dv, dout, q, k, v, lse, delta)
                  : launch_backward<__nv_bfloat16, 128>(s, f, dq, dk, dv, dout, q, k, v, lse, delta);
    else
        f.D == 64 ? launch_backward<__half, 64>(s, f, dq, dk, dv, dout, q, k, v, lse, delta)
                  : launch_backward<__half, 128>(s, f, dq, dk, dv, dout, q, k, v, lse, delta);
}
