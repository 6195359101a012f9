// Scaled-dot-product attention with grouped-query heads, fused: no Tq x Tk matrix is
// stored. Causal masking is aligned to the bottom right (query i sees keys j <= i + Tk - Tq),
// as in cpu/attention.c. One warp per query row streams over the keys it may see with an online softmax
// (running max and sum), each lane holding head_dim / 32 of the accumulator. The backward pass
// recomputes the probabilities from the saved log-sum-exp, in three deterministic passes:
// delta_i = dO_i . O_i; dq per query row; dk and dv per key row, summed over the query heads
// that read it and the later positions, in a fixed order (no atomics).
//
// it_attention_options adds a bias to the scores (-inf masks a key out: skipped, and a row with
// every key masked gives zeros) and dropout on the probabilities, whose mask is the CPU's hash
// of (seed, row, key), recomputed in the backward pass.
//
// These row kernels are the reference: 16-bit calls with head size 64 or 128 and no bias or
// dropout run on tensor cores in attention_flash.cu instead (INFINITRAIN_CUDA_ATTENTION=reference
// keeps them here), and are tested against these and the CPU.
#include "attention_flash.cuh"
#include "common.cuh"

namespace {
constexpr int kMaxPerLane = 8;  // head_dim up to 256

// it_attention_options as the kernels read it (passed by value)
struct Extras {
    const float *bias;
    int64_t sb, sh, sq;
    uint64_t key, drop_below;
    float keep_scale;
};

Extras extras_of(const it_attention_options *o) {
    Extras e = {nullptr, 0, 0, 0, 0, 0, 1.0f};
    if (!o) return e;
    e.bias = o->bias;
    e.sb = o->bias_stride_batch, e.sh = o->bias_stride_head, e.sq = o->bias_stride_query;
    if (o->dropout_p > 0.0f) {
        e.key = attention_dropout_key(o->seed);
        e.drop_below = (uint64_t)((double)o->dropout_p * 4294967296.0);
        e.keep_scale = o->dropout_p < 1.0f ? 1.0f / (1.0f - o->dropout_p) : 0.0f;
    }
    return e;
}

// the bias of score (b, h, i, j)
__device__ __forceinline__ float bias_at(const Extras &e, int64_t b, int64_t h, int64_t i, int64_t j) {
    return e.bias ? e.bias[b * e.sb + h * e.sh + i * e.sq + j] : 0.0f;
}

// what dropout multiplies probability j of query row `row` by: 0 or 1 / (1 - p)
__device__ __forceinline__ float dropped(const Extras &e, int64_t row, int64_t Tk, int64_t j) {
    if (!e.drop_below) return 1.0f;
    return attention_keeps(e.key, (uint64_t)row, Tk, j, e.drop_below) ? e.keep_scale : 0.0f;
}

template <typename T>
__global__ void attention_fwd(T *out, float *lse, const T *q, const T *k, const T *v, int64_t BH,
                              int64_t H, int64_t group, int64_t Tq, int64_t Tk, int causal, int D,
                              float scale, Extras ex) {
    int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b, h, t)
    int lane = threadIdx.x & 31;
    if (row >= BH * Tq) return;
    int64_t t = row % Tq, bh = row / Tq, b = bh / H, h = bh % H;
    int64_t kvh = b * (H / group) + h / group;
    int64_t last = causal ? t + Tk - Tq : Tk - 1;  // the last key this row sees
    const T *qr = q + row * D;
    const T *kb = k + kvh * Tk * D, *vb = v + kvh * Tk * D;
    float qv[kMaxPerLane], acc[kMaxPerLane];
    int per = (D + 31) / 32;
    for (int j = 0; j < per; j++) {
        int d = lane + 32 * j;
        qv[j] = d < D ? to_f(qr[d]) * scale : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t s = 0; s <= last; s++) {
        float dot = 0.0f;
        for (int j = 0; j < per; j++) {
            int d = lane + 32 * j;
            if (d < D) dot += qv[j] * to_f(kb[s * D + d]);
        }
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        dot += bias_at(ex, b, h, t, s);
        if (dot == -INFINITY) continue;  // masked out
        float m_new = fmaxf(m, dot), corr = expf(m - m_new), p = expf(dot - m_new);
        l = l * corr + p;
        float pv = p * dropped(ex, row, Tk, s);  // l sums the probabilities before dropout
        for (int j = 0; j < per; j++) {
            int d = lane + 32 * j;
            acc[j] = acc[j] * corr + (d < D ? pv * to_f(vb[s * D + d]) : 0.0f);
        }
        m = m_new;
    }
    for (int j = 0; j < per; j++) {
        int d = lane + 32 * j;
        if (d < D) out[row * D + d] = from_f<T>(l > 0.0f ? acc[j] / l : 0.0f);
    }
    if (lane == 0) lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// delta[row] = dO . O
template <typename T>
__global__ void attention_delta(float *delta, const T *dout, const T *out, int64_t rows, int D) {
    int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s += to_f(dout[row * D + d]) * to_f(out[row * D + d]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) delta[row] = s;
}

// dq_i = scale * sum over the keys s it sees of p_is (dO_i . v_s - delta_i) k_s
template <typename T>
__global__ void attention_dq(T *dq, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                             const float *delta, int64_t BH, int64_t H, int64_t group, int64_t Tq,
                             int64_t Tk, int causal, int D, float scale, Extras ex) {
    int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= BH * Tq) return;
    int64_t t = row % Tq, bh = row / Tq, b = bh / H, h = bh % H;
    int64_t kvh = b * (H / group) + h / group;
    int64_t last = causal ? t + Tk - Tq : Tk - 1;
    const T *kb = k + kvh * Tk * D, *vb = v + kvh * Tk * D;
    float qv[kMaxPerLane], dov[kMaxPerLane], acc[kMaxPerLane];
    int per = (D + 31) / 32;
    for (int j = 0; j < per; j++) {
        int d = lane + 32 * j;
        qv[j] = d < D ? to_f(q[row * D + d]) : 0.0f;
        dov[j] = d < D ? to_f(dout[row * D + d]) : 0.0f;
        acc[j] = 0.0f;
    }
    float l = lse[row], dl = delta[row];
    if (l == -INFINITY) last = -1;  // every key masked out: no gradient
    for (int64_t s = 0; s <= last; s++) {
        float qk = 0.0f, dv = 0.0f;
        for (int j = 0; j < per; j++) {
            int d = lane + 32 * j;
            if (d < D) {
                qk += qv[j] * to_f(kb[s * D + d]);
                dv += dov[j] * to_f(vb[s * D + d]);
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            qk += __shfl_xor_sync(0xffffffffu, qk, o);
            dv += __shfl_xor_sync(0xffffffffu, dv, o);
        }
        float sc = qk * scale + bias_at(ex, b, h, t, s);
        float ds = sc == -INFINITY ? 0.0f : expf(sc - l) * (dv * dropped(ex, row, Tk, s) - dl);
        for (int j = 0; j < per; j++) {
            int d = lane + 32 * j;
            if (d < D) acc[j] += ds * to_f(kb[s * D + d]);
        }
    }
    for (int j = 0; j < per; j++) {
        int d = lane + 32 * j;
        if (d < D) dq[row * D + d] = from_f<T>(acc[j] * scale);
    }
}

// for key row s of kv head g: dk_s = scale * sum over its query heads and the query rows i
// that see it of ds_is q_i, dv_s = sum of p_is dO_i
template <typename T>
__global__ void attention_dkv(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                              const float *lse, const float *delta, int64_t BKV, int64_t H, int64_t group,
                              int64_t Tq, int64_t Tk, int causal, int D, float scale, Extras ex) {
    int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b, g, s)
    int lane = threadIdx.x & 31;
    if (row >= BKV * Tk) return;
    int64_t s = row % Tk, bg = row / Tk, KV = H / group, b = bg / KV, g = bg % KV;
    int64_t first = causal ? (s > Tk - Tq ? s - (Tk - Tq) : 0) : 0;  // the first query row that sees it
    float kv_[kMaxPerLane], vv[kMaxPerLane], ak[kMaxPerLane], av[kMaxPerLane];
    int per = (D + 31) / 32;
    for (int j = 0; j < per; j++) {
        int d = lane + 32 * j;
        kv_[j] = d < D ? to_f(k[row * D + d]) : 0.0f;
        vv[j] = d < D ? to_f(v[row * D + d]) : 0.0f;
        ak[j] = av[j] = 0.0f;
    }
    for (int64_t hq = g * group; hq < (g + 1) * group; hq++) {
        int64_t base = (b * H + hq) * Tq;
        for (int64_t i = first; i < Tq; i++) {
            int64_t qi = base + i;
            float qk = 0.0f, dov = 0.0f;
            for (int j = 0; j < per; j++) {
                int d = lane + 32 * j;
                if (d < D) {
                    qk += to_f(q[qi * D + d]) * kv_[j];
                    dov += to_f(dout[qi * D + d]) * vv[j];
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                qk += __shfl_xor_sync(0xffffffffu, qk, o);
                dov += __shfl_xor_sync(0xffffffffu, dov, o);
            }
            float sc = qk * scale + bias_at(ex, b, hq, i, s), l = lse[qi];
            if (sc == -INFINITY || l == -INFINITY) continue;  // masked out
            float p = expf(sc - l), keep = dropped(ex, qi, Tk, s);
            float ds = p * (dov * keep - delta[qi]), pv = p * keep;
            for (int j = 0; j < per; j++) {
                int d = lane + 32 * j;
                if (d < D) {
                    ak[j] += ds * to_f(q[qi * D + d]);
                    av[j] += pv * to_f(dout[qi * D + d]);
                }
            }
        }
    }
    for (int j = 0; j < per; j++) {
        int d = lane + 32 * j;
        if (d < D) {
            dk[row * D + d] = from_f<T>(ak[j] * scale);
            dv[row * D + d] = from_f<T>(av[j]);
        }
    }
}

// one thread per (row, d): the log-sum-exp merge of a block into the float32 running result
template <typename T>
__global__ void attention_merge_kernel(float *out, float *lse, const T *bout, const float *blse,
                                       int64_t groups, int64_t rows, int64_t brows, int64_t offset,
                                       int64_t D) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= groups * brows * D) return;
    int64_t r = idx / D, d = idx % D, g = r / brows, i = r % brows, at = g * rows + offset + i;
    float a = lse[at], b = blse[r], m = fmaxf(a, b);
    if (b == -INFINITY) return;  // every key of the block masked out: nothing to add
    float wa = expf(a - m), wb = expf(b - m), sum = wa + wb;
    out[at * D + d] = (out[at * D + d] * wa + to_f(bout[idx]) * wb) / sum;
}

// after every element of the row has used the old lse
__global__ void attention_merge_lse(float *lse, const float *blse, int64_t groups, int64_t rows,
                                    int64_t brows, int64_t offset) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= groups * brows) return;
    int64_t at = (r / brows) * rows + offset + r % brows;
    float a = lse[at], b = blse[r], m = fmaxf(a, b);
    if (b == -INFINITY) return;
    lse[at] = m + logf(expf(a - m) + expf(b - m));
}

constexpr int kWarpsPerBlock = 4;
unsigned int warp_blocks(int64_t rows) { return (unsigned int)((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

it_status check_sizes(int64_t head_dim, int64_t rows, const char *fn) {
    if (head_dim > 32 * kMaxPerLane)
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "head_dim %lld is above the CUDA kernel's %d", (long long)head_dim, 32 * kMaxPerLane);
    if ((rows + kWarpsPerBlock - 1) / kWarpsPerBlock > 2147483647LL)
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "too many rows for one launch");
    return IT_OK;
}
}  // namespace

extern "C" {

it_status it_cuda_attention_forward(it_device device, it_dtype dtype, void *out, float *lse, const void *q,
                                    const void *k, const void *v, int64_t batch, int64_t heads,
                                    int64_t kv_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
                                    float scale, int causal, const it_attention_options *options) {
    if (batch * q_len == 0) return IT_OK;
    int64_t rows = batch * heads * q_len;
    IT_CU_TRY(check_sizes(head_dim, rows, "it_attention_forward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    FlashShape f = {batch, heads, kv_heads, q_len, kv_len, head_dim, causal, scale};
    IT_CU_TRY(flash_attention_settings());
    if (flash_attention_applies(dtype, f, options, {out, q, k, v})) {
        flash_attention_forward(s, dtype, f, out, lse, q, k, v);
        CU_LAUNCHED();
        return IT_OK;
    }
    int64_t group = heads / kv_heads;
    IT_FLOAT_SWITCH(dtype, "it_attention_forward",
                    attention_fwd<T><<<warp_blocks(rows), 32 * kWarpsPerBlock, 0, s>>>(
                        (T *)out, lse, (const T *)q, (const T *)k, (const T *)v, batch * heads, heads, group,
                        q_len, kv_len, causal, (int)head_dim, scale, extras_of(options)));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_attention_backward(it_device device, it_dtype dtype, void *dq, void *dk, void *dv,
                                     const void *dout, const void *q, const void *k, const void *v,
                                     const void *out, const float *lse, int64_t batch, int64_t heads,
                                     int64_t kv_heads, int64_t q_len, int64_t kv_len, int64_t head_dim,
                                     float scale, int causal, const it_attention_options *options) {
    if (batch * q_len == 0 || kv_len == 0) return IT_OK;
    int64_t rows = batch * heads * q_len, kv_rows = batch * kv_heads * kv_len;
    IT_CU_TRY(check_sizes(head_dim, rows, "it_attention_backward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int64_t group = heads / kv_heads;
    Extras ex = extras_of(options);
    IT_CU_TRY(flash_attention_settings());
    float *delta;
    CU_TRY(cudaMallocAsync((void **)&delta, (size_t)rows * sizeof(float), s));
    FlashShape f = {batch, heads, kv_heads, q_len, kv_len, head_dim, causal, scale};
    bool flash = flash_attention_applies(dtype, f, options, {dq, dk, dv, dout, q, k, v});
    IT_FLOAT_SWITCH(dtype, "it_attention_backward", {
        attention_delta<T><<<warp_blocks(rows), 32 * kWarpsPerBlock, 0, s>>>(
            delta, (const T *)dout, (const T *)out, rows, (int)head_dim);
        if (flash) {
            flash_attention_backward(s, dtype, f, dq, dk, dv, dout, q, k, v, lse, delta);
        } else {
            attention_dq<T><<<warp_blocks(rows), 32 * kWarpsPerBlock, 0, s>>>(
                (T *)dq, (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse, delta, batch * heads,
                heads, group, q_len, kv_len, causal, (int)head_dim, scale, ex);
            attention_dkv<T><<<warp_blocks(kv_rows), 32 * kWarpsPerBlock, 0, s>>>(
                (T *)dk, (T *)dv, (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse, delta,
                batch * kv_heads, heads, group, q_len, kv_len, causal, (int)head_dim, scale, ex);
        }
    });
    cudaError_t launched = cudaPeekAtLastError();
    CU_TRY(cudaFreeAsync(delta, s));
    CU_TRY(launched);
    return IT_OK;
}

it_status it_cuda_attention_merge(it_device device, it_dtype dtype, float *out, float *lse,
                                  const void *block_out, const float *block_lse, int64_t groups,
                                  int64_t rows, int64_t block_rows, int64_t row_offset,
                                  int64_t head_dim) {
    int64_t n = groups * block_rows * head_dim, r = groups * block_rows;
    if (n == 0) return IT_OK;
    if ((n + 255) / 256 > 2147483647LL)
        return it_cuda_error(IT_ERR_NOT_SUPPORTED, "too many elements for one launch");
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    IT_FLOAT_SWITCH(dtype, "it_attention_merge",
                    attention_merge_kernel<T><<<(unsigned int)((n + 255) / 256), 256, 0, s>>>(
                        out, lse, (const T *)block_out, block_lse, groups, rows, block_rows,
                        row_offset, head_dim));
    attention_merge_lse<<<(unsigned int)((r + 255) / 256), 256, 0, s>>>(lse, block_lse, groups, rows,
                                                                         block_rows, row_offset);
    CU_LAUNCHED();
    return IT_OK;
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(attention_forward);
IT_CUDA_MIRRORS(attention_backward);
IT_CUDA_MIRRORS(attention_merge);
