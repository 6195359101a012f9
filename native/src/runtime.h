/* Threads (OpenMP), the BLAS binding and streaming stores (runtime.c). Not part of the ABI. */
#ifndef IT_RUNTIME_H
#define IT_RUNTIME_H

#include <stdint.h>

/* The most threads a kernel may use: OpenMP runtimes exit the process when asked for far more
 * threads than they can create (OMP_NUM_THREADS=70000), so requests are bounded here. */
#define IT_MAX_THREADS 1024

/* ---- streaming stores ------------------------------------------------------------------ */
/* Outputs larger than the caches are written with non-temporal stores: a normal store first
 * reads the destination line into the cache (read-for-ownership), so an output costs two DRAM
 * transfers instead of one. Used for rows that are computed in a cache-resident scratch row.
 * Call it_stream_fence() before the data is read by another thread (end of the kernel). */
#define IT_STREAM_MIN_BYTES ((int64_t)16 << 20)
void it_store_scaled_stream(float *dst, const float *src, float scale, int64_t n);
void it_stream_fence(void);

/* ---- BLAS ----------------------------------------------------------------------------- */
/* Sets the number of BLAS threads and returns the previous value (a no-op for BLAS libraries
 * without the call); used around OpenMP regions whose threads each call sgemm. */
int it_blas_set_threads_local(int n);
void it_blas_set_threads(int n);
void it_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
              int64_t ldc);
void it_dgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
              const double *a, int64_t lda, const double *b, int64_t ldb, double beta, double *c,
              int64_t ldc);

#endif
