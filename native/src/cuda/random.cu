// Random numbers and multinomial draws, the twins of cpu/random.c. Random numbers use the
// CPU's counter-based streams: element i of a call hashes (seed, offset + i), so a seed draws
// the same numbers on the CPU and on any GPU. A multinomial draw is one thread per row with the
// CPU kernel's cumulative walk over the weights, so the drawn categories are the same on both.
#include "common.cuh"

namespace {

template <typename T>
__global__ void uniform_kernel(T *out, int64_t n, double a, double b, uint64_t key, uint64_t offset) {
    GRID_STRIDE(i, n) {
        double u = uniform_open0(random_bits(key, offset + (uint64_t)i));
        out[i] = from_f<T>((float)(a + (b - a) * (1.0 - u)));
    }
}

// Box-Muller on the counter pair (2j, 2j + 1): the even element takes the cosine, the odd one
// the sine, so element i depends only on (seed, offset + i), as on the CPU.
template <typename T>
__global__ void normal_kernel(T *out, int64_t n, double mean, double std, uint64_t key, uint64_t offset) {
    GRID_STRIDE(i, n) {
        uint64_t ctr = offset + (uint64_t)i, pair = ctr >> 1;
        double u1 = uniform_open0(random_bits(key, 2 * pair));
        double u2 = uniform_open0(random_bits(key, 2 * pair + 1));
        double r = sqrt(-2.0 * log(u1)), s, c;
        sincos(6.283185307179586 * u2, &s, &c);
        out[i] = from_f<T>((float)(mean + std * r * ((ctr & 1) ? s : c)));
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

it_status it_cuda_random_uniform(it_device device, it_dtype dtype, void *out, int64_t n, double low,
                                 double high, uint64_t seed, uint64_t offset) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    uint64_t key = mix64(seed ^ 0x5851f42d4c957f2dull);  // the CPU's key for uniform draws
    IT_FLOAT_SWITCH(dtype, "it_random_uniform",
                    uniform_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>((T *)out, n, low, high, key, offset));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_random_normal(it_device device, it_dtype dtype, void *out, int64_t n, double mean,
                                double std, uint64_t seed, uint64_t offset) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    uint64_t key = mix64(seed ^ 0xd1b54a32d192ed03ull);  // the CPU's key for normal draws
    IT_FLOAT_SWITCH(dtype, "it_random_normal",
                    normal_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>((T *)out, n, mean, std, key, offset));
    CU_LAUNCHED();
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

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(random_uniform);
IT_CUDA_MIRRORS(random_normal);
IT_CUDA_MIRRORS(multinomial);
