// The fused softmax + cross-entropy over rows of logits, the twin of cpu/loss.c.
#include "common.cuh"

namespace {

// A target outside [0, vocab) that is not ignore_index gets a NaN loss and raises the device's
// index flag, reported at the host's next synchronisation (reading the loss, say).
// One read of the row: each thread keeps a running max and its sum of exponentials (the online
// softmax), K elements at a time (one vector load where the rows are whole aligned vectors), then
// the block combines the pairs.
template <typename T, int K>
__global__ void ce_fwd(float *losses, float *lse, const T *logits, const void *targets, int is64,
                       int64_t V, int64_t Vp, int64_t ignore, int *bad) {
    int64_t n = blockIdx.x;
    const T *x = logits + n * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int64_t c = (int64_t)threadIdx.x * K; c < V; c += (int64_t)blockDim.x * K) {
        Vec<T, K> v = *(const Vec<T, K> *)(x + c);
#pragma unroll
        for (int e = 0; e < K; e++) {
            if (c + e >= V) break;  // the padded columns past the vocabulary
            float z = to_f(v.x[e]);
            if (z > m) {
                s = s * expf(m - z) + 1.0f;
                m = z;
            } else if (z != -INFINITY) {  // (a masked logit adds nothing, and no NaN of -inf - -inf)
                s += expf(z - m);
            }
        }
    }
    const float row_m = block_max(m);
    float l = row_m + logf(block_sum(m == -INFINITY ? 0.0f : s * expf(m - row_m)));
    if (threadIdx.x == 0) {
        lse[n] = l;
        int64_t t = index_at(targets, is64, n);
        bool out_of_range = t != ignore && (t < 0 || t >= V);
        if (out_of_range) *bad = 1;
        losses[n] = t == ignore ? 0.0f : (out_of_range ? NAN : l - to_f(x[t]));
    }
}

// dlogits = (softmax - onehot(target)) * dloss, zero on padded columns; may alias logits
// (K elements a thread at a time, as ce_fwd)
template <typename T, int K>
__global__ void ce_bwd(T *dlogits, const T *logits, const float *lse, const void *targets, int is64,
                       const float *dlosses, int64_t V, int64_t Vp, int64_t ignore) {
    int64_t n = blockIdx.x;
    int64_t t = index_at(targets, is64, n);
    bool skip = t == ignore || t < 0 || t >= V;
    float l = lse[n], g = dlosses[n];
    for (int64_t c = (int64_t)threadIdx.x * K; c < Vp; c += (int64_t)blockDim.x * K) {
        Vec<T, K> v = *(const Vec<T, K> *)(logits + n * Vp + c);
#pragma unroll
        for (int e = 0; e < K; e++) {
            float d = 0.0f;
            if (!skip && c + e < V) d = (expf(to_f(v.x[e]) - l) - (c + e == t ? 1.0f : 0.0f)) * g;
            v.x[e] = from_f<T>(d);
        }
        *(Vec<T, K> *)(dlogits + n * Vp + c) = v;
    }
}

// K: elements a thread takes at once, 16 bytes where every row is a whole number of aligned vectors
template <typename T> bool ce_vectors(int64_t Vp, std::initializer_list<const void *> pointers) {
    return Vp % (16 / (int64_t)sizeof(T)) == 0 && vec_aligned(pointers);
}

}  // namespace

extern "C" {

it_status it_cuda_cross_entropy_forward(it_device device, it_dtype dtype, float *losses, float *lse,
                                        const void *logits, const void *targets, it_dtype target_dtype,
                                        int64_t rows, int64_t vocab, int64_t padded_vocab,
                                        int64_t ignore_index) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(check_rows(rows, "it_cross_entropy_forward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int is64 = target_dtype == IT_INT64, *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    IT_FLOAT_SWITCH(dtype, "it_cross_entropy_forward", {
        constexpr int K = 16 / sizeof(T);
        if (ce_vectors<T>(padded_vocab, {logits}))
            ce_fwd<T, K><<<row_blocks(rows), IT_THREADS * 2, 0, s>>>(losses, lse, (const T *)logits, targets, is64,
                                                                   vocab, padded_vocab, ignore_index, bad);
        else
            ce_fwd<T, 1><<<row_blocks(rows), IT_THREADS * 2, 0, s>>>(losses, lse, (const T *)logits, targets, is64,
                                                                   vocab, padded_vocab, ignore_index, bad);
    });
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_cross_entropy_backward(it_device device, it_dtype dtype, void *dlogits,
                                         const void *logits, const float *lse, const void *targets,
                                         it_dtype target_dtype, const float *dlosses, int64_t rows,
                                         int64_t vocab, int64_t padded_vocab, int64_t ignore_index) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(check_rows(rows, "it_cross_entropy_backward"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int is64 = target_dtype == IT_INT64;
    IT_FLOAT_SWITCH(dtype, "it_cross_entropy_backward", {
        constexpr int K = 16 / sizeof(T);
        if (ce_vectors<T>(padded_vocab, {dlogits, logits}))
            ce_bwd<T, K><<<row_blocks(rows), IT_THREADS * 2, 0, s>>>((T *)dlogits, (const T *)logits, lse, targets,
                                                                   is64, dlosses, vocab, padded_vocab, ignore_index);
        else
            ce_bwd<T, 1><<<row_blocks(rows), IT_THREADS * 2, 0, s>>>((T *)dlogits, (const T *)logits, lse, targets,
                                                                   is64, dlosses, vocab, padded_vocab, ignore_index);
    });
    CU_LAUNCHED();
    return IT_OK;
}

}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(cross_entropy_forward);
IT_CUDA_MIRRORS(cross_entropy_backward);
