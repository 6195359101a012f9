/* A C program that embeds libinfinitrain without Python: a LayerNorm followed by a linear
 * layer on random inputs, with the library's error handling. Build and run:
 *
 *   cc examples/c_host/main.c $(python -m infinitrain.config --cflags --libs) -o c_host
 *   ./c_host
 */
#include <stdio.h>

#include "infinitrain.h"

#define TRY(call)                                                                            \
    do {                                                                                     \
        it_status st_ = (call);                                                              \
        if (st_ != IT_OK) {                                                                  \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, it_last_error(),                  \
                    it_status_name(st_));                                                    \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(void) {
    const it_device cpu = {IT_CPU, 0};
    const int64_t rows = 4, in = 8, out = 3;
    it_storage *x, *y, *w, *h, *mean, *rstd;
    TRY(it_storage_new(cpu, rows * in * sizeof(float), &x));
    TRY(it_storage_new(cpu, rows * in * sizeof(float), &y));
    TRY(it_storage_new(cpu, out * in * sizeof(float), &w));
    TRY(it_storage_new(cpu, rows * out * sizeof(float), &h));
    TRY(it_storage_new(cpu, rows * sizeof(float), &mean));
    TRY(it_storage_new(cpu, rows * sizeof(float), &rstd));

    TRY(it_random_normal(cpu, IT_FLOAT32, it_storage_data(x), rows * in, 0.0, 1.0, 1234, 0));
    TRY(it_random_normal(cpu, IT_FLOAT32, it_storage_data(w), out * in, 0.0, 0.02, 1234,
                         (uint64_t)(rows * in)));
    /* y = LayerNorm(x) without affine parameters; h = y @ w^T (a Linear layer's layout). */
    TRY(it_layernorm_forward(cpu, IT_FLOAT32, it_storage_data(y), it_storage_data(mean),
                             it_storage_data(rstd), it_storage_data(x), NULL, NULL, rows, in,
                             1e-5f));
    TRY(it_matmul(cpu, IT_FLOAT32, it_storage_data(h), it_storage_data(y), it_storage_data(w),
                  1, rows, out, in, 0, 1, 1.0f, 0.0f, 0, 0, 0));

    float *yp = (float *)it_storage_data(y), *hp = (float *)it_storage_data(h);
    double ysum = 0, ysq = 0;
    for (int64_t i = 0; i < rows * in; i++) ysum += yp[i], ysq += yp[i] * yp[i];
    printf("%s\n", it_build_info());
    printf("layernorm: mean %.6f, mean square %.6f\n", ysum / (rows * in), ysq / (rows * in));
    printf("linear out[0] = [%.6f, %.6f, %.6f]\n", hp[0], hp[1], hp[2]);

    /* Bad input gets a status and a message, never a crash. */
    it_status st = it_layernorm_forward(cpu, IT_FLOAT32, it_storage_data(y), NULL, NULL,
                                        it_storage_data(x), NULL, NULL, rows, 0, 1e-5f);
    printf("bad call -> %s: %s\n", it_status_name(st), it_last_error());

    it_memory_stats stats;
    TRY(it_memory_stats_get(cpu, &stats));
    printf("allocated %llu bytes in %llu allocations\n",
           (unsigned long long)stats.allocated_bytes, (unsigned long long)stats.num_allocs);
    it_storage *all[] = {x, y, w, h, mean, rstd};
    for (int i = 0; i < 6; i++) TRY(it_storage_free(all[i]));
    return 0;
}
