// The sampling helpers: top-k of each row and multinomial draws, one thread per row with the
// CPU kernels' algorithms (an insertion-sorted best-k buffer; a cumulative walk over the
// weights), so ties, NaN and the drawn categories are the same on both devices. Rows are
// few when sampling (a batch); n is a vocabulary.
#include "common.cuh"

namespace {
__device__ bool ranks_before(double va, int64_t ia, double vb, int64_t ib, int largest) {
    bool na = va != va, nb = vb != vb;  // NaN counts as the largest value
    if (na || nb) return na && nb ? ia < ib : (largest ? na : nb);
    if (va != vb) return largest ? va > vb : va < vb;
    return ia < ib;  // ties: the lower index first
}

__global__ void topk_kernel(int dtype, size_t es, void *values, int64_t *indices, const void *inp,
                            double *best, int64_t rows, int64_t n, int64_t k, int largest) {
    GRID_STRIDE(r, rows) {
        double *bv = best + r * k;
        int64_t *bi = indices + r * k, filled = 0;
        for (int64_t j = 0; j < n; j++) {
            double v = load_f64(dtype, inp, r * n + j);
            if (filled == k && !ranks_before(v, j, bv[k - 1], bi[k - 1], largest)) continue;
            int64_t at = filled < k ? filled++ : k - 1;
            while (at > 0 && ranks_before(v, j, bv[at - 1], bi[at - 1], largest)) {
                bv[at] = bv[at - 1];
                bi[at] = bi[at - 1];
                at--;
            }
            bv[at] = v;
            bi[at] = j;
        }
        for (int64_t j = 0; j < k; j++) {  // the values as stored, whatever the dtype
            const char *src = (const char *)inp + (size_t)(r * n + bi[j]) * es;
            char *dst = (char *)values + (size_t)(r * k + j) * es;
            for (size_t b = 0; b < es; b++) dst[b] = src[b];
        }
    }
}

// A row whose weights are negative, not finite, or spent raises the device's input flag and
// draws -1 (reported at the host's next synchronisation).
__global__ void multinomial_kernel(int dtype, int64_t *out, const void *weights, double *scratch,
                                   int64_t rows, int64_t n, int64_t draws, int replacement, uint64_t key,
                                   uint64_t offset, int *bad) {
    GRID_STRIDE(r, rows) {
        double *w = scratch + r * n, total = 0.0;
        bool ok = true;
        for (int64_t j = 0; j < n; j++) {
            double v = load_f64(dtype, weights, r * n + j);
            if (!(v >= 0 && v <= 1.7e308)) ok = false;
            total += (w[j] = v);
        }
        for (int64_t d = 0; d < draws; d++) {
            if (!ok || !(total > 0)) {
                *bad = 1;
                out[r * draws + d] = -1;
                continue;
            }
            uint64_t c = offset + (uint64_t)(r * draws + d);
            double u = uniform_open0(random_bits(key, c));
            double target = u * total, acc = 0.0;
            int64_t pick = n - 1;
            for (int64_t j = 0; j < n; j++) {
                acc += w[j];
                if (w[j] > 0 && acc >= target) {
                    pick = j;
                    break;
                }
            }
            while (w[pick] <= 0 && pick > 0) pick--;
            out[r * draws + d] = pick;
            if (!replacement) {
                total -= w[pick];
                w[pick] = 0.0;
            }
        }
    }
}
}  // namespace

extern "C" {

it_status it_cuda_topk(it_device device, it_dtype dtype, void *values, int64_t *indices, const void *inp,
                       int64_t rows, int64_t n, int64_t k, int32_t largest) {
    if (rows * k == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    double *best;
    CU_TRY(cudaMallocAsync((void **)&best, (size_t)(rows * k) * sizeof(double), s));
    topk_kernel<<<it_blocks(rows, 64), 64, 0, s>>>((int)dtype, dtype_bytes(dtype), values, indices, inp, best,
                                                   rows, n, k, largest);
    cudaError_t launched = cudaPeekAtLastError();
    CU_TRY(cudaFreeAsync(best, s));
    CU_TRY(launched);
    return IT_OK;
}

it_status it_cuda_multinomial(it_device device, it_dtype dtype, int64_t *out, const void *weights, int64_t rows,
                              int64_t n, int64_t num_samples, int32_t replacement, uint64_t seed,
                              uint64_t offset) {
    if (rows == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int *bad;
    IT_CU_TRY(it_cuda_index_flag(device, &bad));
    double *scratch;
    CU_TRY(cudaMallocAsync((void **)&scratch, (size_t)(rows * n) * sizeof(double), s));
    uint64_t key = mix64(seed ^ 0x2545f4914f6cdd1dull);  // the CPU's key for multinomial draws
    multinomial_kernel<<<it_blocks(rows, 64), 64, 0, s>>>((int)dtype, out, weights, scratch, rows, n, num_samples,
                                                          replacement, key, offset, bad);
    cudaError_t launched = cudaPeekAtLastError();
    CU_TRY(cudaFreeAsync(scratch, s));
    CU_TRY(launched);
    return IT_OK;
}

}  // extern "C"
