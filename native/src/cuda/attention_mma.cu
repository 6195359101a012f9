// Flash attention with its tiles in registers: FlashAttention-2 (Dao, 2023) on mma.sync, the
// 16-bit path of it_attention_forward / _backward (attention_flash.cu routes here unless
// INFINITRAIN_CUDA_ATTENTION asks for its WMMA kernels or the reference ones).
//
// Each warp owns 16 rows (queries in the forward and dQ passes, keys in the dK/dV pass); a block
// of 4 warps owns 64. The tiles the warps share (K and V, or Q and dO) stream through shared
// memory in two stages with cp.async, the next tile landing while the warp computes on this one,
// and reach the tensor cores through ldmatrix (transposed where the product wants the other
// side). Scores, probabilities and their gradients never leave the registers: two accumulator
// tiles of S are one A operand of P V (mma.cuh). The online softmax runs in log2 units with the
// scale folded into exp2; each lane keeps a partial row sum, and the four lanes of a row add
// theirs once at the end. Key tiles past the causal diagonal are never read.
//
// The backward is deterministic (no atomics): a dK/dV pass over key blocks (summing the query
// heads of a grouped-query group) and a dQ pass over query blocks, P recomputed from the saved
// log-sum-exp, dS = P (dP - delta) with delta = rowsum(dO * O) from attention.cu's pre-pass.
// Layouts as attention_flash.cu: q, out, dq [B, H, Tq, D]; k, v, dk, dv [B, KV, Tk, D]; lse
// [B, H, Tq] natural log, -inf for a row that sees no key; causal masks bottom-right aligned.
#include "attention_flash.cuh"
#include "mma.cuh"

namespace {
constexpr int kWarps = 4, kThreads = 32 * kWarps, kRows = 16 * kWarps;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// rows [first, first + ROWS) of a [total, D] matrix into shared memory of row stride LD,
// asynchronously; rows past the end read as zeros (no NaN reaches a product)
template <typename T, int D, int LD, int ROWS>
__device__ __forceinline__ void async_rows(T *dst, const T *src, int64_t first, int64_t total) {
    constexpr int kChunks = D / 8, kPer = ROWS * kChunks / kThreads;  // 16 bytes each; copies a thread
    static_assert(ROWS * kChunks % kThreads == 0, "every thread issues the same number of copies");
    const int64_t rest = total - first;
    const int rows = rest > ROWS ? ROWS : (rest > 0 ? (int)rest : 0);  // rows that exist
    const T *base = src + first * D;
#pragma unroll
    for (int it = 0; it < kPer; it++) {
        const int i = threadIdx.x + it * kThreads, r = i / kChunks, c = (i % kChunks) * 8;
        const bool valid = r < rows;
        cp_async16(dst + r * LD + c, valid ? base + r * D + c : src, valid);
    }
}

// The operands from a tile in shared memory of row stride LD:
// the A operand of rows [r0, r0 + 16) and columns [c0, c0 + 16)
template <int LD, typename T> __device__ __forceinline__ void load_a(uint32_t (&a)[4], const T *s, int r0, int c0) {
    const int lane = threadIdx.x & 31;
    ldmatrix_x4(a, s + (r0 + (lane & 15)) * LD + c0 + (lane >> 4) * 8);
}
// B operands for columns n0..n0+15 of a product whose B[k][n] is the tile's [n][k] (the tile's
// rows are B's columns: K for Q K^T): b[0], b[1] for n0..n0+7, b[2], b[3] for n0+8..n0+15
template <int LD, typename T> __device__ __forceinline__ void load_bt(uint32_t (&b)[4], const T *s, int n0, int k0) {
    const int lane = threadIdx.x & 31;
    ldmatrix_x4(b, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * LD + k0 + ((lane >> 3) & 1) * 8);
}
// the same where B[k][n] is the tile's [k][n] (V for P V)
template <int LD, typename T> __device__ __forceinline__ void load_b(uint32_t (&b)[4], const T *s, int n0, int k0) {
    const int lane = threadIdx.x & 31;
    ldmatrix_x4_trans(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8);
}

// acc[0 .. N/8) += A B for the warp's 16 rows: A as D/16 operands in registers, B^T the tile's
// rows [0, N) (scores: Q K^T, dO V^T, K Q^T, V dO^T)
template <typename T, int D, int N, int LD>
__device__ __forceinline__ void product_bt(float (&acc)[N / 8][4], const uint32_t (&a)[D / 16][4], const T *s) {
#pragma unroll
    for (int c = 0; c < D / 16; c++)
#pragma unroll
        for (int n = 0; n < N / 16; n++) {
            uint32_t b[4];
            load_bt<LD>(b, s, 16 * n, 16 * c);
            mma_16816<T>(acc[2 * n], a[c], b[0], b[1]);
            mma_16816<T>(acc[2 * n + 1], a[c], b[2], b[3]);
        }
}
// acc[0 .. D/8) += P B for the warp's 16 rows: P the K-wide accumulator tiles p (packed to 16
// bits: the A operands), B the tile's rows [0, K) (P V, dS K, P^T dO, dS^T Q)
template <typename T, int D, int K, int LD>
__device__ __forceinline__ void product_pb(float (&acc)[D / 8][4], const float (&p)[K / 8][4], const T *s) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        const uint32_t a[4] = {pack2<T>(p[2 * kk][0], p[2 * kk][1]), pack2<T>(p[2 * kk][2], p[2 * kk][3]),
                               pack2<T>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               pack2<T>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int n = 0; n < D / 16; n++) {
            uint32_t b[4];
            load_b<LD>(b, s, 16 * n, 16 * kk);
            mma_16816<T>(acc[2 * n], a, b[0], b[1]);
            mma_16816<T>(acc[2 * n + 1], a, b[2], b[3]);
        }
    }
}

// the warp's 16 rows [row0, row0 + 16) of a [total, D] output from accumulators, row r's times f[r / 8]
template <typename T, int D>
__device__ __forceinline__ void store_rows(T *out, int64_t row0, int64_t total, const float (&acc)[D / 8][4],
                                           const float (&f)[2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int64_t r = row0 + g + 8 * i;
        if (r >= total) continue;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *(uint32_t *)(out + r * D + 8 * n + 2 * t) = pack2<T>(acc[n][2 * i] * f[i], acc[n][2 * i + 1] * f[i]);
    }
}

template <int N> __device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// Causal query blocks in reverse order: the last ones see the most keys, and the GPU ends on the
// light ones instead of waiting on a heavy straggler
__device__ __forceinline__ unsigned int heavy_first(int causal) {
    return causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
}

// ---- forward ------------------------------------------------------------------------------------
template <typename T, int D, int BC>
__global__ void __launch_bounds__(kThreads) mma_forward(T *out, float *lse, const T *q, const T *k, const T *v,
                                                        int64_t H, int64_t group, int64_t Tq, int64_t Tk,
                                                        int causal, float scale) {
    constexpr int LD = D + 8, STAGE = 2 * BC * LD;  // a stage: a K tile and a V tile (padded rows)
    static_assert(2 * STAGE >= kRows * LD, "the stages hold the Q tile first");
    IT_DYNAMIC_SHARED(T, smem);
    const int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh % H, kvh = b * (H / group) + h / group;
    const int64_t q0 = (int64_t)heavy_first(causal) * kRows, row0 = q0 + 16 * w, shift = Tk - Tq;
    const T *kb = k + kvh * Tk * D, *vb = v + kvh * Tk * D;

    async_rows<T, D, LD, kRows>(smem, q + bh * Tq * D, q0, Tq);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qa[D / 16][4];
#pragma unroll
    for (int c = 0; c < D / 16; c++) load_a<LD>(qa[c], smem, 16 * w, 16 * c);
    __syncthreads();

    int64_t last[2];  // the last key each of my two rows sees
#pragma unroll
    for (int i = 0; i < 2; i++) {
        last[i] = causal ? row0 + g + 8 * i + shift : Tk - 1;
        if (last[i] > Tk - 1) last[i] = Tk - 1;
    }
    int64_t block_last = causal ? q0 + kRows - 1 + shift : Tk - 1, warp_last = causal ? row0 + 15 + shift : Tk - 1;
    if (block_last > Tk - 1) block_last = Tk - 1;
    const int64_t tiles = block_last < 0 ? 0 : block_last / BC + 1;
    if (tiles > 0) {
        async_rows<T, D, LD, BC>(smem, kb, 0, Tk);
        async_rows<T, D, LD, BC>(smem + BC * LD, vb, 0, Tk);
        cp_async_commit();
    }
    const float sl2 = scale * kLog2e;
    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    zero(o);
    for (int64_t j = 0; j < tiles; j++) {
        if (j + 1 < tiles) {  // the next tile lands in the other stage while this one is used
            T *next = smem + ((j + 1) & 1) * STAGE;
            async_rows<T, D, LD, BC>(next, kb, (j + 1) * BC, Tk);
            async_rows<T, D, LD, BC>(next + BC * LD, vb, (j + 1) * BC, Tk);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const T *ks = smem + (j & 1) * STAGE, *vs = ks + BC * LD;
        const int64_t k0 = j * BC;
        if (k0 <= warp_last) {  // a warp whose rows see none of these keys skips them
            float s[BC / 8][4];
            zero(s);
            product_bt<T, D, BC, LD>(s, qa, ks);
            // whether some row of the warp must not see some key of the tile (the same for the warp)
            const bool masked = k0 + BC > Tk || (causal && k0 + BC - 1 > row0 + shift);
#pragma unroll
            for (int i = 0; i < 2; i++) {  // the online softmax of row g + 8i
                const int64_t lim = last[i] - k0;  // the last column of the tile my row sees
                const int seen = lim < 0 ? -1 : (lim > BC ? BC : (int)lim);
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < BC / 8; n++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float x = !masked || 8 * n + 2 * t + e <= seen ? s[n][2 * i + e] * sl2 : -INFINITY;
                        s[n][2 * i + e] = x;
                        mx = fmaxf(mx, x);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m[i], mx), base = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: 0
                const float alpha = exp2f(m[i] - base);
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < BC / 8; n++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float p = exp2f(s[n][2 * i + e] - base);
                        s[n][2 * i + e] = p;
                        sum += p;
                    }
                l[i] = l[i] * alpha + sum;  // my lanes' part of the row sum
                m[i] = m_new;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    o[n][2 * i] *= alpha;
                    o[n][2 * i + 1] *= alpha;
                }
            }
            product_pb<T, D, BC, LD>(o, s, vs);
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        inv[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        const int64_t r = row0 + g + 8 * i;
        if (t == 0 && r < Tq) lse[bh * Tq + r] = l[i] > 0.0f ? (m[i] + log2f(l[i])) * kLn2 : -INFINITY;
    }
    store_rows<T, D>(out + bh * Tq * D, row0, Tq, o, inv);
}

// ---- backward: dQ over query blocks ------------------------------------------------------------
template <typename T, int D, int BC>
__global__ void __launch_bounds__(kThreads) mma_backward_dq(T *dq, const T *dout, const T *q, const T *k,
                                                            const T *v, const float *lse, const float *delta,
                                                            int64_t H, int64_t group, int64_t Tq, int64_t Tk,
                                                            int causal, float scale) {
    constexpr int LD = D + 8, STAGE = 2 * BC * LD;
    static_assert(2 * STAGE >= 2 * kRows * LD, "the stages hold the Q and dO tiles first");
    IT_DYNAMIC_SHARED(T, smem);
    const int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh % H, kvh = b * (H / group) + h / group;
    const int64_t q0 = (int64_t)heavy_first(causal) * kRows, row0 = q0 + 16 * w, shift = Tk - Tq;
    const T *kb = k + kvh * Tk * D, *vb = v + kvh * Tk * D;

    async_rows<T, D, LD, kRows>(smem, q + bh * Tq * D, q0, Tq);
    async_rows<T, D, LD, kRows>(smem + kRows * LD, dout + bh * Tq * D, q0, Tq);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qa[D / 16][4], da[D / 16][4];
#pragma unroll
    for (int c = 0; c < D / 16; c++) {
        load_a<LD>(qa[c], smem, 16 * w, 16 * c);
        load_a<LD>(da[c], smem + kRows * LD, 16 * w, 16 * c);
    }
    __syncthreads();

    const float sl2 = scale * kLog2e;
    float lse2[2], dl[2];
    int64_t last[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int64_t r = row0 + g + 8 * i;
        const float x = r < Tq ? lse[bh * Tq + r] : -INFINITY;
        lse2[i] = r < Tq ? x * kLog2e : INFINITY;  // a row past the end: p = 0 with no mask
        dl[i] = r < Tq ? delta[bh * Tq + r] : 0.0f;
        last[i] = causal ? r + shift : Tk - 1;
        if (last[i] > Tk - 1) last[i] = Tk - 1;
        if (x == -INFINITY) last[i] = -1;  // a row that saw no key has no gradient
    }
    int64_t block_last = causal ? q0 + kRows - 1 + shift : Tk - 1, warp_last = causal ? row0 + 15 + shift : Tk - 1;
    if (block_last > Tk - 1) block_last = Tk - 1;
    const int64_t tiles = block_last < 0 ? 0 : block_last / BC + 1;
    if (tiles > 0) {
        async_rows<T, D, LD, BC>(smem, kb, 0, Tk);
        async_rows<T, D, LD, BC>(smem + BC * LD, vb, 0, Tk);
        cp_async_commit();
    }
    float acc[D / 8][4];
    zero(acc);
    for (int64_t j = 0; j < tiles; j++) {
        if (j + 1 < tiles) {
            T *next = smem + ((j + 1) & 1) * STAGE;
            async_rows<T, D, LD, BC>(next, kb, (j + 1) * BC, Tk);
            async_rows<T, D, LD, BC>(next + BC * LD, vb, (j + 1) * BC, Tk);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const T *ks = smem + (j & 1) * STAGE, *vs = ks + BC * LD;
        const int64_t k0 = j * BC;
        if (k0 <= warp_last) {
            float s[BC / 8][4], dp[BC / 8][4];
            zero(s);
            zero(dp);
            product_bt<T, D, BC, LD>(s, qa, ks);   // S = Q K^T
            product_bt<T, D, BC, LD>(dp, da, vs);  // dP = dO V^T
            // a tile every row of the warp sees whole (those rows then saw a key: their lse is finite)
            const bool masked = k0 + BC > Tk || (causal && k0 + BC - 1 > row0 + shift);
            int seen[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int64_t lim = last[i] - k0;
                seen[i] = lim < 0 ? -1 : (lim > BC ? BC : (int)lim);
            }
#pragma unroll
            for (int n = 0; n < BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1;
                    float p = !masked || 8 * n + 2 * t + (e & 1) <= seen[i] ? exp2f(s[n][e] * sl2 - lse2[i]) : 0.0f;
                    s[n][e] = p * (dp[n][e] - dl[i]);  // dS
                }
            product_pb<T, D, BC, LD>(acc, s, ks);  // dQ += dS K
        }
        __syncthreads();
    }
    const float f[2] = {scale, scale};
    store_rows<T, D>(dq + bh * Tq * D, row0, Tq, acc, f);
}

// ---- backward: dK and dV over key blocks, summed over the query heads that share them ---------
template <typename T, int D, int BQ>
__global__ void __launch_bounds__(kThreads) mma_backward_dkv(T *dk, T *dv, const T *dout, const T *q, const T *k,
                                                             const T *v, const float *lse, const float *delta,
                                                             int64_t H, int64_t group, int64_t Tq, int64_t Tk,
                                                             int causal, float scale) {
    constexpr int LD = D + 8, STAGE = 2 * BQ * LD;  // a stage: a Q tile and a dO tile
    IT_DYNAMIC_SHARED(T, smem);  // K, V of the block's keys, two stages, then each stage's lse and delta
    T *ks = smem, *vs = smem + kRows * LD, *stages = smem + 2 * kRows * LD;
    float *rows = (float *)(stages + 2 * STAGE);  // [stage][lse in log2 units | delta][BQ]
    const int w = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t KV = H / group, bg = blockIdx.y, b = bg / KV, kvh = bg % KV;
    const int64_t k0 = (int64_t)blockIdx.x * kRows, key0 = k0 + 16 * w, shift = Tk - Tq;

    async_rows<T, D, LD, kRows>(ks, k + bg * Tk * D, k0, Tk);
    async_rows<T, D, LD, kRows>(vs, v + bg * Tk * D, k0, Tk);
    cp_async_commit();
    // the first query that sees the block's first key (and any key of the block after it)
    int64_t first = causal ? k0 - shift : 0;
    if (first < 0) first = 0;
    const int64_t i_first = first / BQ * BQ, per_head = i_first < Tq ? (Tq - i_first + BQ - 1) / BQ : 0;
    const int64_t tiles = per_head * group;  // (head, query tile) pairs, heads outer
    auto issue = [&](int64_t j) {
        const int64_t bh = b * H + kvh * group + j / per_head, i0 = i_first + (j % per_head) * BQ;
        T *st = stages + (j & 1) * STAGE;
        async_rows<T, D, LD, BQ>(st, q + bh * Tq * D, i0, Tq);
        async_rows<T, D, LD, BQ>(st + BQ * LD, dout + bh * Tq * D, i0, Tq);
        cp_async_commit();
        float *r = rows + (j & 1) * 2 * BQ;  // read by the tile's products once the barrier has passed
        for (int i = threadIdx.x; i < BQ; i += kThreads) {
            const bool real = i0 + i < Tq;  // a query past the end: +inf, so p = 0 with no mask
            r[i] = real ? lse[bh * Tq + i0 + i] * kLog2e : INFINITY;
            r[BQ + i] = real ? delta[bh * Tq + i0 + i] : 0.0f;
        }
    };
    if (tiles > 0) issue(0);
    else cp_async_wait<0>();  // (K and V are never read: nothing left in flight at the exit)

    const float sl2 = scale * kLog2e;
    float dka[D / 8][4], dva[D / 8][4];
    zero(dka);
    zero(dva);
    for (int64_t j = 0; j < tiles; j++) {
        if (j + 1 < tiles) {
            issue(j + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int64_t i0 = i_first + (j % per_head) * BQ;
        const T *qs = stages + (j & 1) * STAGE, *dos = qs + BQ * LD;
        const float *l2s = rows + (j & 1) * 2 * BQ, *dls = l2s + BQ;
        if (!causal || i0 + BQ - 1 >= key0 - shift) {  // some query of the tile sees one of my keys
            uint32_t a[D / 16][4];
            float s[BQ / 8][4], dp[BQ / 8][4];
            zero(s);
            zero(dp);
#pragma unroll
            for (int c = 0; c < D / 16; c++) load_a<LD>(a[c], ks, 16 * w, 16 * c);
            product_bt<T, D, BQ, LD>(s, a, qs);  // S^T = K Q^T
#pragma unroll
            for (int c = 0; c < D / 16; c++) load_a<LD>(a[c], vs, 16 * w, 16 * c);
            product_bt<T, D, BQ, LD>(dp, a, dos);  // dP^T = V dO^T
            // a tile whose every query sees every key of the warp needs no mask (those queries saw a
            // key, so their lse is finite); the same for the whole warp
            const bool masked = key0 + 16 > Tk || (causal && i0 < key0 + 15 - shift);
            // a column j sees my key key0 + g + 8i where j >= key - shift - i0 (and key < Tk)
            int from[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int64_t key = key0 + g + 8 * i, lim = causal ? key - shift - i0 : 0;
                from[i] = key >= Tk ? BQ : (lim < 0 ? 0 : (lim > BQ ? BQ : (int)lim));
            }
#pragma unroll
            for (int n = 0; n < BQ / 8; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {  // the query of columns 8n + 2t + e
                    const int col = 8 * n + 2 * t + e;
                    const float l2 = l2s[col], dl = dls[col];
#pragma unroll
                    for (int i = 0; i < 2; i++) {  // my keys key0 + g + 8i
                        const bool seen = !masked || (col >= from[i] && l2 != -INFINITY);
                        const float p = seen ? exp2f(s[n][2 * i + e] * sl2 - l2) : 0.0f;
                        s[n][2 * i + e] = p;
                        dp[n][2 * i + e] = p * (dp[n][2 * i + e] - dl);  // dS^T
                    }
                }
            product_pb<T, D, BQ, LD>(dva, s, dos);  // dV += P^T dO
            product_pb<T, D, BQ, LD>(dka, dp, qs);  // dK += dS^T Q
        }
        __syncthreads();
    }
    const float fk[2] = {scale, scale}, fv[2] = {1.0f, 1.0f};
    store_rows<T, D>(dk + bg * Tk * D, key0, Tk, dka, fk);
    store_rows<T, D>(dv + bg * Tk * D, key0, Tk, dva, fv);
}

// shared memory above 48 KB needs the kernel's consent (per device, so asked at every launch)
template <typename K> bool allow_shared(K kernel, size_t bytes) {
    return bytes <= 48 * 1024 ||
           cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) == cudaSuccess;
}

// tile sizes: key tiles of 64 (d 128 in dQ: 32, for registers); dK/dV's query tiles 64 (d 128: 32)
template <int D> constexpr int kTile = D == 64 ? 64 : 32;

template <typename T, int D>
void launch_forward(cudaStream_t s, const FlashShape &f, void *out, float *lse, const void *q, const void *k,
                    const void *v) {
    constexpr int BC = 64;
    const size_t bytes = 2 * 2 * BC * (D + 8) * sizeof(T);
    dim3 grid((unsigned int)((f.Tq + kRows - 1) / kRows), (unsigned int)(f.B * f.H));
    if (!allow_shared(mma_forward<T, D, BC>, bytes)) return;  // the launch error stays for CU_LAUNCHED
    mma_forward<T, D, BC><<<grid, kThreads, bytes, s>>>((T *)out, lse, (const T *)q, (const T *)k, (const T *)v,
                                                        f.H, f.H / f.KV, f.Tq, f.Tk, f.causal, f.scale);
}

template <typename T, int D, int BQ = kTile<D>>
void launch_backward(cudaStream_t s, const FlashShape &f, void *dq, void *dk, void *dv, const void *dout,
                     const void *q, const void *k, const void *v, const float *lse, const float *delta) {
    const char *dkv_tile = getenv("INFINITRAIN_FLASH_DKV_TILE");  // 32: the variant to time against 64 at d 64
    if (D == 64 && BQ == 64 && dkv_tile && !strcmp(dkv_tile, "32"))
        return launch_backward<T, D, 32>(s, f, dq, dk, dv, dout, q, k, v, lse, delta);
    constexpr int BC = kTile<D>;
    const size_t q_bytes = 2 * 2 * BC * (D + 8) * sizeof(T),
                 kv_bytes = (2 * kRows + 2 * 2 * BQ) * (D + 8) * sizeof(T) + 2 * 2 * BQ * sizeof(float);
    if (!allow_shared(mma_backward_dq<T, D, BC>, q_bytes) || !allow_shared(mma_backward_dkv<T, D, BQ>, kv_bytes))
        return;
    dim3 qgrid((unsigned int)((f.Tq + kRows - 1) / kRows), (unsigned int)(f.B * f.H));
    mma_backward_dq<T, D, BC><<<qgrid, kThreads, q_bytes, s>>>((T *)dq, (const T *)dout, (const T *)q, (const T *)k,
                                                               (const T *)v, lse, delta, f.H, f.H / f.KV, f.Tq,
                                                               f.Tk, f.causal, f.scale);
    dim3 kgrid((unsigned int)((f.Tk + kRows - 1) / kRows), (unsigned int)(f.B * f.KV));
    mma_backward_dkv<T, D, BQ><<<kgrid, kThreads, kv_bytes, s>>>((T *)dk, (T *)dv, (const T *)dout, (const T *)q,
                                                                 (const T *)k, (const T *)v, lse, delta, f.H,
                                                                 f.H / f.KV, f.Tq, f.Tk, f.causal, f.scale);
}
}  // namespace

void mma_attention_forward(cudaStream_t s, it_dtype dtype, const FlashShape &f, void *out, float *lse,
                           const void *q, const void *k, const void *v) {
    if (dtype == IT_BFLOAT16)
        f.D == 64 ? launch_forward<__nv_bfloat16, 64>(s, f, out, lse, q, k, v)
                  : launch_forward<__nv_bfloat16, 128>(s, f, out, lse, q, k, v);
    else
        f.D == 64 ? launch_forward<__half, 64>(s, f, out, lse, q, k, v)
                  : launch_forward<__half, 128>(s, f, out, lse, q, k, v);
}

void mma_attention_backward(cudaStream_t s, it_dtype dtype, const FlashShape &f, void *dq, void *dk, void *dv,
                            const void *dout, const void *q, const void *k, const void *v, const float *lse,
                            const float *delta) {
    if (dtype == IT_BFLOAT16)
        f.D == 64 ? launch_backward<__nv_bfloat16, 64>(s, f, dq, dk, dv, dout, q, k, v, lse, delta)
                  : launch_backward<__nv_bfloat16, 128>(s, f, dq, dk, dv, dout, q, k, v, lse, delta);
    else
        f.D == 64 ? launch_backward<__half, 64>(s, f, dq, dk, dv, dout, q, k, v, lse, delta)
                  : launch_backward<__half, 128>(s, f, dq, dk, dv, dout, q, k, v, lse, delta);
}
