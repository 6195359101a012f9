/* Counter-based random numbers: element i of a call is a hash of (seed, offset + i), so the
 * result does not depend on the thread count, and a generator only has to remember
 * (seed, offset) to reproduce or resume a stream. */
#define _GNU_SOURCE /* sincos */
#include "common.h"
#include "random_bits.h"

typedef enum { UNIFORM, NORMAL } distribution;

static it_status check_generate(const char *fn, it_device device, it_dtype dtype, void *out,
                                int64_t n) {
    IT_CHECK_DEVICE(device, fn);
    IT_CHECK_FLOAT(dtype, fn);
    IT_CHECK_PRODUCT(fn, 8, n);
    IT_CHECK_ARG(n == 0 || out, "%s: out is NULL", fn);
    return IT_OK;
}

static it_status generate(distribution dist, it_dtype dtype, void *out, int64_t n, double a,
                          double b, uint64_t seed, uint64_t offset) {
    if (n == 0) return IT_OK;
    /* Uniform and normal draws use different keys so that their streams never coincide. */
    uint64_t key = mix64(seed ^ (dist == UNIFORM ? 0x5851f42d4c957f2dull : 0xd1b54a32d192ed03ull));
    int64_t nchunks = (n + IT_CHUNK - 1) / IT_CHUNK;
#pragma omp parallel
    {
        float buf[IT_CHUNK];
#pragma omp for schedule(static)
        for (int64_t c = 0; c < nchunks; c++) {
            int64_t off = c * IT_CHUNK, len = n - off < IT_CHUNK ? n - off : IT_CHUNK;
            float *y = it_row_dest(dtype, out, off, buf);
            for (int64_t i = 0; i < len;) {
                uint64_t ctr = offset + (uint64_t)(off + i);
                if (dist == UNIFORM) {
                    double u = uniform_open0(random_bits(key, ctr)); /* (0, 1] */
                    y[i++] = (float)(a + (b - a) * (1.0 - u));       /* [a, b) */
                    continue;
                }
                /* Box-Muller: the counter pair (2j, 2j+1) gives the normals of elements 2j
                 * (cosine) and 2j+1 (sine), so both are used and element i still depends
                 * only on (seed, offset + i). */
                uint64_t pair = ctr >> 1;
                double u1 = uniform_open0(random_bits(key, 2 * pair));
                double u2 = uniform_open0(random_bits(key, 2 * pair + 1));
                double r = sqrt(-2.0 * log(u1)), s, c;
                sincos(6.283185307179586 * u2, &s, &c);
                if ((ctr & 1) == 0) {
                    y[i++] = (float)(a + b * r * c);
                    if (i < len) y[i++] = (float)(a + b * r * s);
                } else {
                    y[i++] = (float)(a + b * r * s);
                }
            }
            it_row_store(dtype, out, off, y, len);
        }
    }
    return IT_OK;
}

it_status it_random_uniform(it_device device, it_dtype dtype, void *out, int64_t n, double low,
                            double high, uint64_t seed, uint64_t offset) {
    IT_CHECK_ARG(low <= high, "it_random_uniform: low (%g) must be <= high (%g)", low, high);
    IT_TRY(check_generate("it_random_uniform", device, dtype, out, n));
    IT_DISPATCH(random_uniform, device, dtype, out, n, low, high, seed, offset);
    return generate(UNIFORM, dtype, out, n, low, high, seed, offset);
}

it_status it_random_normal(it_device device, it_dtype dtype, void *out, int64_t n, double mean,
                           double std, uint64_t seed, uint64_t offset) {
    IT_CHECK_ARG(std >= 0, "it_random_normal: std must be >= 0, got %g", std);
    IT_TRY(check_generate("it_random_normal", device, dtype, out, n));
    IT_DISPATCH(random_normal, device, dtype, out, n, mean, std, seed, offset);
    return generate(NORMAL, dtype, out, n, mean, std, seed, offset);
}

/* Draw d of row r uses counter offset + r * num_samples + d, so rows are independent of the
 * thread count. Without replacement a drawn category's weight is set to zero in a private
 * copy of the row (sequential draws, as torch.multinomial). */
it_status it_multinomial(it_device device, it_dtype dtype, int64_t *out, const void *weights,
                         int64_t rows, int64_t n, int64_t num_samples, int32_t replacement,
                         uint64_t seed, uint64_t offset) {
    IT_CHECK_DEVICE(device, "it_multinomial");
    IT_REQUIRE(it_is_float(dtype) || dtype == IT_FLOAT64, IT_ERR_NOT_SUPPORTED,
               "it_multinomial: weights must be a floating-point dtype, got %s",
               it_dtype_name(dtype));
    IT_CHECK_SIZE(rows, "it_multinomial");
    IT_CHECK_ARG(n > 0, "it_multinomial: a row needs at least one category");
    IT_CHECK_ARG(num_samples > 0, "it_multinomial: num_samples must be > 0, got %lld",
                 (long long)num_samples);
    IT_CHECK_ARG(replacement || num_samples <= n,
                 "it_multinomial: cannot draw %lld samples without replacement from %lld "
                 "categories", (long long)num_samples, (long long)n);
    IT_CHECK_ARG(rows == 0 || (n <= INT64_MAX / rows && num_samples <= INT64_MAX / rows),
                 "it_multinomial: sizes overflow int64");
    if (rows == 0) return IT_OK;
    IT_CHECK_PTR(out, "it_multinomial");
    IT_CHECK_PTR(weights, "it_multinomial");
    IT_DISPATCH(multinomial, device, dtype, out, weights, rows, n, num_samples, replacement,
                seed, offset);
    for (int64_t i = 0; i < rows * n; i++) {
        double w = it_load_f64(dtype, weights, i);
        IT_CHECK_ARG(w >= 0 && w <= 1.7e308, "it_multinomial: weight %lld is %g; weights must "
                     "be finite and >= 0", (long long)i, w);
    }
    double *scratch = (double *)it_scratch_alloc((size_t)rows * (size_t)n * sizeof(double));
    IT_REQUIRE(scratch, IT_ERR_OUT_OF_MEMORY, "it_multinomial: out of memory");
    uint64_t key = mix64(seed ^ 0x2545f4914f6cdd1dull);
    int64_t bad_row = -1;
#pragma omp parallel for schedule(static) if (rows * n > 32768)
    for (int64_t r = 0; r < rows; r++) {
        double *w = scratch + r * n, total = 0.0;
        for (int64_t j = 0; j < n; j++) total += (w[j] = it_load_f64(dtype, weights, r * n + j));
        for (int64_t d = 0; d < num_samples; d++) {
            if (!(total > 0)) {
#pragma omp critical
                bad_row = r;
                break;
            }
            double u = uniform_open0(random_bits(key, offset + (uint64_t)(r * num_samples + d)));
            double target = u * total, acc = 0.0;
            int64_t pick = n - 1;
            for (int64_t j = 0; j < n; j++) {
                acc += w[j];
                if (w[j] > 0 && acc >= target) { pick = j; break; }
            }
            while (w[pick] <= 0 && pick > 0) pick--; /* round-off past the last positive weight */
            out[r * num_samples + d] = pick;
            if (!replacement) { total -= w[pick]; w[pick] = 0.0; }
        }
    }
    it_scratch_free(scratch);
    IT_CHECK_ARG(bad_row < 0, "it_multinomial: row %lld has no positive weight left to draw "
                 "from", (long long)bad_row);
    return IT_OK;
}
