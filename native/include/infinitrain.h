/*
 * infinitrain.h — the whole public C ABI of libinfinitrain.
 *
 * One header for embedding hosts and for Python (cffi reads the declarations between the
 * IT_CDEF_BEGIN / IT_CDEF_END markers, so that block holds plain C declarations only: no
 * preprocessor lines, no macros).
 *
 * Rules:
 *  - every function returns an it_status; on failure it_last_error() (thread-local) says why.
 *    The library never aborts, exits or prints.
 *  - kernels take raw pointers to contiguous memory, a dtype and explicit sizes, and name
 *    the device their pointers live on; the library dispatches to the CPU or CUDA code.
 *  - "N rows of C" means a row-major [N, C] array. Reductions inside a kernel accumulate in
 *    float32 whatever the storage dtype, and give the same result for any thread count.
 *  - bfloat16/float16 are stored as uint16 bit patterns; conversion to them rounds to nearest
 *    even.
 */
#ifndef INFINITRAIN_H
#define INFINITRAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* IT_CDEF_BEGIN */

/* ---- status, errors, runtime ---------------------------------------------------------- */
typedef enum it_status {
    IT_OK = 0,
    IT_ERR_INVALID_ARGUMENT = 1,  /* a size, pointer, dtype or option that cannot work */
    IT_ERR_OUT_OF_MEMORY = 2,
    IT_ERR_NOT_SUPPORTED = 3,     /* valid, but this dtype/op/device is not implemented */
    IT_ERR_NO_CUDA = 4,           /* a CUDA call in a build or on a machine without CUDA */
    IT_ERR_INDEX_OUT_OF_RANGE = 5,/* an index (token id, target) outside its range */
    IT_ERR_INTERNAL = 6,
    IT_ERR_CUDA = 7,
    IT_ERR_NCCL = 8
} it_status;

const char *it_last_error(void);          /* message of the last failure on this thread */
const char *it_status_name(it_status status);
const char *it_version(void);
const char *it_build_info(void);          /* BLAS, SIMD level picked at run time, OpenMP, CUDA */
it_status it_set_num_threads(int32_t n);  /* OpenMP and BLAS threads used by CPU kernels */
int32_t it_get_num_threads(void);

/* ---- dtypes and devices --------------------------------------------------------------- */
typedef enum it_dtype {
    IT_FLOAT32 = 0,
    IT_BFLOAT16 = 1,
    IT_FLOAT16 = 2,
    IT_INT32 = 3,
    IT_INT64 = 4,
    IT_UINT8 = 5,
    IT_FLOAT64 = 6,  /* elementwise, reductions, matmul, indexing; not the fused NN kernels */
    IT_BOOL = 7      /* one byte, 0 or 1: comparison results and masks */
} it_dtype;

typedef enum it_device_type {
    IT_CPU = 0,
    IT_CUDA = 1
} it_device_type;

typedef struct it_device {
    int32_t type;   /* an it_device_type */
    int32_t index;  /* 0 for the CPU */
} it_device;

size_t it_dtype_size(it_dtype dtype);   /* 0 for an unknown dtype */
/* CUDA: 0 when this build has no CUDA library, or there is no driver or GPU (not an error). */
it_status it_device_count(it_device_type type, int32_t *count);
it_status it_device_synchronize(it_device device);  /* waits for all of the device's work */

/* ---- streams and events --------------------------------------------------------------- */
/* A stream is an ordered queue of work on one device. Kernels called for a device run on the
 * calling thread's current stream for it (it_set_stream; NULL means the device's own stream)
 * and return without waiting; an event marks a point in a stream that another stream, or the
 * host, can wait for. On the CPU a kernel's work is done when it returns: its streams and
 * events exist so that code is written once for both. */
typedef struct it_stream it_stream;
typedef struct it_event it_event;

it_status it_stream_create(it_device device, it_stream **out);
it_status it_stream_destroy(it_stream *stream);
it_status it_stream_synchronize(it_stream *stream);
it_status it_set_stream(it_device device, it_stream *stream);
it_status it_event_create(it_device device, it_event **out);
it_status it_event_destroy(it_event *event);
it_status it_event_record(it_event *event, it_stream *stream);        /* NULL: the current stream */
it_status it_stream_wait_event(it_stream *stream, it_event *event);   /* NULL: the current stream */
it_status it_event_synchronize(it_event *event);
it_status it_event_query(it_event *event, int32_t *done);
/* An event whose recordings carry the device's clock (a profiler's pairs around each op):
 * it_event_elapsed_time gives the milliseconds from `start`'s last recording to `end`'s, both
 * done (it waits for `end`). Timing makes recording a little dearer, so the events that only
 * order work are made without it. CPU events carry no time (IT_ERR_NOT_SUPPORTED). */
it_status it_event_create_timing(it_device device, it_event **out);
it_status it_event_elapsed_time(it_event *start, it_event *end, float *ms);

/* ---- storage and the caching allocator ------------------------------------------------ */
/* A storage is a block of device memory. Blocks come from a caching allocator: a freed
 * block goes back to a per-device cache and is reused by the next request of its size
 * class, so a training step does not give memory back to the OS and fault it in again. */
typedef struct it_storage it_storage;

typedef struct it_memory_stats {
    uint64_t allocated_bytes;      /* in live storages (rounded to size classes) */
    uint64_t peak_allocated_bytes; /* highest allocated_bytes since the last reset */
    uint64_t reserved_bytes;       /* allocated + cached */
    uint64_t peak_reserved_bytes;
    uint64_t num_allocs;           /* requests served */
    uint64_t num_cache_hits;       /* requests served from the cache */
} it_memory_stats;

it_status it_storage_new(it_device device, size_t nbytes, it_storage **out);
/* Wrap memory the caller owns (a numpy array, a host buffer); it is never freed here. */
it_status it_storage_wrap(it_device device, void *data, size_t nbytes, it_storage **out);
it_status it_storage_free(it_storage *storage);
void *it_storage_data(const it_storage *storage);
size_t it_storage_nbytes(const it_storage *storage);
it_device it_storage_device(const it_storage *storage);

it_status it_memory_stats_get(it_device device, it_memory_stats *out);
it_status it_memory_reset_peak(it_device device);
it_status it_memory_empty_cache(it_device device);  /* return cached blocks to the system */

it_status it_memcpy(it_device dst_device, void *dst, it_device src_device, const void *src,
                    size_t nbytes);
/* Pinned (page-locked) host memory: a CPU storage the GPUs' copy engines read and write
 * directly, so that it_memcpy_async to or from it runs beside kernels. Needs a CUDA device
 * (IT_ERR_NO_CUDA otherwise). It is not cached: each one is the system's until freed. */
it_status it_storage_new_pinned(size_t nbytes, it_storage **out);
int32_t it_storage_is_pinned(const it_storage *storage);
/* A copy queued on `stream` (NULL: the calling thread's current stream of the GPU side) that
 * returns at once, between host memory and a GPU or within one GPU. The host memory must not be
 * read (to the host) or changed (from the host) until an event recorded on the stream after it
 * has completed; with host memory that is not pinned CUDA stages it, and the copy does not run
 * beside kernels. Between two CPU buffers it is it_memcpy (done when it returns). */
it_status it_memcpy_async(it_device dst_device, void *dst, it_device src_device, const void *src,
                          size_t nbytes, it_stream *stream);

/* ---- creation, copies and casts ------------------------------------------------------- */
it_status it_fill(it_device device, it_dtype dtype, void *out, double value, int64_t n);
it_status it_arange(it_device device, it_dtype dtype, void *out, double start, double step,
                    int64_t n);
it_status it_cast(it_device device, void *out, it_dtype out_dtype, const void *inp,
                  it_dtype inp_dtype, int64_t n);
/* out[i...] = inp[i...] over an ndim-dimensional shape; strides in elements (may be 0). */
it_status it_copy_strided(it_device device, it_dtype dtype, void *out, const int64_t *out_strides,
                          const void *inp, const int64_t *inp_strides, const int64_t *shape,
                          int32_t ndim);
/* Inputs/outputs viewed as [outer, sizes[i], inner]; concatenated along the middle. */
it_status it_concat(it_device device, it_dtype dtype, void *out, const void *const *inputs,
                    const int64_t *sizes, int32_t num_inputs, int64_t outer, int64_t inner);
it_status it_split(it_device device, it_dtype dtype, void *const *outputs, const void *inp,
                   const int64_t *sizes, int32_t num_outputs, int64_t outer, int64_t inner);
/* batch matrices [rows, cols]: keep the lower (upper=0) or upper (upper=1) triangle relative
 * to `diagonal` (as torch.tril/triu) and set the rest to fill_value. */
it_status it_triangle(it_device device, it_dtype dtype, void *out, const void *inp, int64_t batch,
                      int64_t rows, int64_t cols, int64_t diagonal, int32_t upper,
                      double fill_value);

/* ---- random numbers ------------------------------------------------------------------- */
/* Counter-based: element i of a call depends only on (seed, offset + i), so the numbers are
 * the same for any thread count and a generator advances its offset by n per call. */
it_status it_random_uniform(it_device device, it_dtype dtype, void *out, int64_t n, double low,
                            double high, uint64_t seed, uint64_t offset);
it_status it_random_normal(it_device device, it_dtype dtype, void *out, int64_t n, double mean,
                           double std, uint64_t seed, uint64_t offset);

/* ---- elementwise ---------------------------------------------------------------------- */
typedef enum it_unary_op {
    IT_NEG = 0, IT_EXP, IT_LOG, IT_SQRT, IT_RSQRT, IT_ABS, IT_TANH, IT_SIGMOID, IT_RELU,
    IT_SILU, IT_GELU_TANH, IT_SIN, IT_COS, IT_SQUARE, IT_RECIPROCAL,
    IT_GELU /* exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), PyTorch's default */
} it_unary_op;

typedef enum it_binary_op {
    IT_ADD = 0, IT_SUB, IT_MUL, IT_DIV, IT_MAXIMUM, IT_MINIMUM, IT_POW
} it_binary_op;

typedef enum it_scalar_op {
    IT_SCALAR_ADD = 0,   /* x + s */
    IT_SCALAR_MUL,       /* x * s */
    IT_SCALAR_RSUB,      /* s - x */
    IT_SCALAR_RDIV,      /* s / x */
    IT_SCALAR_POW,       /* x ** s */
    IT_SCALAR_MAX,       /* max(x, s) */
    IT_SCALAR_MIN,       /* min(x, s) */
    IT_SCALAR_DIV        /* x / s */
} it_scalar_op;

it_status it_unary(it_device device, it_unary_op op, it_dtype dtype, void *out, const void *inp,
                   int64_t n);
/* Gradient of a unary op: dinp = dout * f'(x). `saved` is the op's input x, except for
 * IT_SIGMOID and IT_TANH where it is the op's output. Defined for IT_NEG, IT_EXP (saved = out),
 * IT_LOG, IT_SQRT (saved = out), IT_TANH, IT_SIGMOID, IT_RELU, IT_SILU, IT_GELU_TANH,
 * IT_GELU, IT_SQUARE. */
it_status it_unary_backward(it_device device, it_unary_op op, it_dtype dtype, void *dinp,
                            const void *dout, const void *saved, int64_t n);
/* out (contiguous, `shape`) = a op b, where a and b are read through their own strides
 * (0 along a broadcast dimension). */
it_status it_binary(it_device device, it_binary_op op, it_dtype dtype, void *out, const void *a,
                    const int64_t *a_strides, const void *b, const int64_t *b_strides,
                    const int64_t *shape, int32_t ndim);
it_status it_scalar(it_device device, it_scalar_op op, it_dtype dtype, void *out, const void *inp,
                    double scalar, int64_t n);
/* out = silu(a) * b (LLaMA's gated MLP); backward gives da and db. */
it_status it_swiglu_forward(it_device device, it_dtype dtype, void *out, const void *a,
                            const void *b, int64_t n);
it_status it_swiglu_backward(it_device device, it_dtype dtype, void *da, void *db,
                             const void *dout, const void *a, const void *b, int64_t n);

/* ---- comparisons and selection -------------------------------------------------------- */
typedef enum it_compare_op { IT_EQ = 0, IT_NE, IT_LT, IT_LE, IT_GT, IT_GE } it_compare_op;

/* out (IT_BOOL, contiguous `shape`) = a op b, a and b of `dtype` read through their strides
 * as in it_binary. NaN compares unequal to everything (IEEE). */
it_status it_compare(it_device device, it_compare_op op, it_dtype dtype, uint8_t *out,
                     const void *a, const int64_t *a_strides, const void *b,
                     const int64_t *b_strides, const int64_t *shape, int32_t ndim);
/* out (contiguous `shape`) = cond ? a : b; cond is IT_BOOL, all three read through strides. */
it_status it_where(it_device device, it_dtype dtype, void *out, const uint8_t *cond,
                   const int64_t *cond_strides, const void *a, const int64_t *a_strides,
                   const void *b, const int64_t *b_strides, const int64_t *shape, int32_t ndim);

/* ---- indexing along one axis ---------------------------------------------------------- */
/* Arrays viewed as [outer, n, inner] (inp) and [outer, k, inner] (out, index).
 * gather: out[o, j, i] = inp[o, index[o, j, i], i]; scatter_add: out[o, index[o,j,i], i] +=
 * src[o, j, i] (out [outer, n, inner] is accumulated into). index_select/index_add take a
 * 1-D index [k] shared by every (o, i). Indices may be negative (counted from the end);
 * anything outside [-n, n) is IT_ERR_INDEX_OUT_OF_RANGE and nothing is written. */
it_status it_gather(it_device device, it_dtype dtype, void *out, const void *inp,
                    const void *index, it_dtype index_dtype, int64_t outer, int64_t n,
                    int64_t k, int64_t inner);
it_status it_scatter_add(it_device device, it_dtype dtype, void *out, const void *src,
                         const void *index, it_dtype index_dtype, int64_t outer, int64_t n,
                         int64_t k, int64_t inner);
it_status it_index_select(it_device device, it_dtype dtype, void *out, const void *inp,
                          const void *index, it_dtype index_dtype, int64_t outer, int64_t n,
                          int64_t k, int64_t inner);
it_status it_index_add(it_device device, it_dtype dtype, void *out, const void *src,
                       const void *index, it_dtype index_dtype, int64_t outer, int64_t n,
                       int64_t k, int64_t inner);
/* Running sum over the middle axis of [outer, n, inner] (float32 accumulation for 16-bit). */
it_status it_cumsum(it_device device, it_dtype dtype, void *out, const void *inp, int64_t outer,
                    int64_t n, int64_t inner);
/* The k largest (or smallest) of each row of [rows, n], sorted, with their int64 indices;
 * ties keep the lower index first, NaN counts as the largest value. */
it_status it_topk(it_device device, it_dtype dtype, void *values, int64_t *indices,
                  const void *inp, int64_t rows, int64_t n, int64_t k, int32_t largest);
/* num_samples draws per row of non-negative weights [rows, n] (not necessarily normalised),
 * with or without replacement; counter-based like the other random calls. */
it_status it_multinomial(it_device device, it_dtype dtype, int64_t *out, const void *weights,
                         int64_t rows, int64_t n, int64_t num_samples, int32_t replacement,
                         uint64_t seed, uint64_t offset);

/* ---- reductions ----------------------------------------------------------------------- */
typedef enum it_reduce_op { IT_SUM = 0, IT_MEAN, IT_MAX, IT_MIN } it_reduce_op;

/* inp viewed as [outer, n, inner], reduced over n into out [outer, inner]. */
it_status it_reduce(it_device device, it_reduce_op op, it_dtype dtype, void *out, const void *inp,
                    int64_t outer, int64_t n, int64_t inner);
/* out: int64 [outer, inner], index of the first maximum (NaN counts as the maximum). */
it_status it_argmax(it_device device, it_dtype dtype, int64_t *out, const void *inp,
                    int64_t outer, int64_t n, int64_t inner);
/* out: int64 [outer, inner], index of the first minimum (NaN counts as the minimum). */
it_status it_argmin(it_device device, it_dtype dtype, int64_t *out, const void *inp,
                    int64_t outer, int64_t n, int64_t inner);

/* ---- matrix products ------------------------------------------------------------------ */
/* For each of `batch` problems: C = alpha * op(A) @ op(B) + beta * C, with op(A) [M, K],
 * op(B) [K, N], C [M, N], all row-major; trans_a means A is stored [K, M] (likewise B as
 * [N, K]). stride_* are the element distances between problems (0 broadcasts one matrix). */
it_status it_matmul(it_device device, it_dtype dtype, void *c, const void *a, const void *b,
                    int64_t batch, int64_t m, int64_t n, int64_t k, int32_t trans_a,
                    int32_t trans_b, float alpha, float beta, int64_t stride_a,
                    int64_t stride_b, int64_t stride_c);

/* ---- normalisation, softmax, loss ----------------------------------------------------- */
/* N rows of C. mean and rstd are float32 [N], saved for the backward pass. */
it_status it_layernorm_forward(it_device device, it_dtype dtype, void *out, float *mean,
                               float *rstd, const void *inp, const void *weight,
                               const void *bias, int64_t rows, int64_t cols, float eps);
/* dweight/dbias are overwritten; weight/bias/dweight/dbias may be NULL (no affine); dinp
 * may be NULL (parameter gradients only) but must not alias dout or inp. */
it_status it_layernorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                                void *dbias, const void *dout, const void *inp,
                                const void *weight, const float *mean, const float *rstd,
                                int64_t rows, int64_t cols);
it_status it_rmsnorm_forward(it_device device, it_dtype dtype, void *out, float *rstd,
                             const void *inp, const void *weight, int64_t rows, int64_t cols,
                             float eps);
it_status it_rmsnorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                              const void *dout, const void *inp, const void *weight,
                              const float *rstd, int64_t rows, int64_t cols);
/* Softmax over the last dimension of N rows of C. */
it_status it_softmax_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                             int64_t rows, int64_t cols);
it_status it_softmax_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                              const void *out, int64_t rows, int64_t cols);
/* Fused softmax + cross-entropy over N rows of logits, each `padded_vocab` wide of which the
 * first `vocab` columns are real (llm.c pads the vocabulary; padded columns never enter the
 * softmax and get zero gradient). targets: int32 or int64 [N]; a row whose target equals
 * ignore_index gets loss 0 and zero gradient. losses and lse (log-sum-exp, saved for
 * backward) are float32 [N]. */
it_status it_cross_entropy_forward(it_device device, it_dtype dtype, float *losses, float *lse,
                                   const void *logits, const void *targets,
                                   it_dtype target_dtype, int64_t rows, int64_t vocab,
                                   int64_t padded_vocab, int64_t ignore_index);
/* dlogits = (softmax(logits) - onehot(target)) * dlosses[row]; may alias logits. */
it_status it_cross_entropy_backward(it_device device, it_dtype dtype, void *dlogits,
                                    const void *logits, const float *lse, const void *targets,
                                    it_dtype target_dtype, const float *dlosses, int64_t rows,
                                    int64_t vocab, int64_t padded_vocab, int64_t ignore_index);

/* ---- convolution, pooling, batch normalisation -------------------------------------- */
/* Images are NCHW and contiguous; float32 only (other dtypes: IT_ERR_NOT_SUPPORTED). Every
 * sum over the batch is taken in a fixed order, so results do not depend on the thread count.
 * A 2-D convolution: input [batch, in_channels, height, width], weight [out_channels,
 * in_channels / groups, kernel_h, kernel_w], bias [out_channels] (may be NULL), out [batch,
 * out_channels, out_h, out_w] with out_h = (height + 2 pad_h - dilation_h (kernel_h - 1) - 1)
 * / stride_h + 1 (floor; likewise out_w), which must be >= 1. Zero padding on both sides. */
typedef struct it_conv2d_params {
    int64_t batch, in_channels, height, width;
    int64_t out_channels, kernel_h, kernel_w;
    int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;
} it_conv2d_params;
it_status it_conv2d_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                            const void *weight, const void *bias, const it_conv2d_params *params);
/* dinp, dweight, dbias (each may be NULL: not wanted) are overwritten. */
it_status it_conv2d_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                             void *dbias, const void *dout, const void *inp, const void *weight,
                             const it_conv2d_params *params);
/* Pooling over `planes` images [height, width] (batch * channels of an NCHW tensor), windows
 * kernel_h x kernel_w, padding of at most half the kernel (a padded position never wins a max;
 * an average counts it in its divisor only with count_include_pad). out_h = (height + 2 pad_h -
 * dilation_h (kernel_h - 1) - 1) / stride_h + 1, rounded up with ceil_mode, less one when the
 * last window would start in the bottom padding (likewise out_w). Average pooling takes no
 * dilation (1). */
typedef struct it_pool2d_params {
    int64_t planes, height, width;
    int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
    int32_t ceil_mode;
} it_pool2d_params;
/* out [planes, out_h, out_w]; indices (int64, same shape) hold the flat position y * width + x
 * of each maximum within its plane (NaN counts as the maximum). */
it_status it_max_pool2d_forward(it_device device, it_dtype dtype, void *out, int64_t *indices,
                                const void *inp, const it_pool2d_params *params);
/* dinp (overwritten) gets each dout at its index; an index outside the plane is
 * IT_ERR_INDEX_OUT_OF_RANGE. */
it_status it_max_pool2d_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                                 const int64_t *indices, const it_pool2d_params *params);
it_status it_avg_pool2d_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                                const it_pool2d_params *params, int32_t count_include_pad);
it_status it_avg_pool2d_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                                 const it_pool2d_params *params, int32_t count_include_pad);
/* Output cell (i, j) averages rows [floor(i H / out_h), ceil((i + 1) H / out_h)) and the
 * columns likewise. */
it_status it_adaptive_avg_pool2d_forward(it_device device, it_dtype dtype, void *out,
                                         const void *inp, int64_t planes, int64_t height,
                                         int64_t width, int64_t out_h, int64_t out_w);
it_status it_adaptive_avg_pool2d_backward(it_device device, it_dtype dtype, void *dinp,
                                          const void *dout, int64_t planes, int64_t height,
                                          int64_t width, int64_t out_h, int64_t out_w);
/* Batch normalisation of inp [batch, channels, spatial] per channel. training = 1: batch
 * statistics (biased variance), written to save_mean / save_rstd (float32 [channels]), and
 * running_mean / running_var (float32 [channels], both NULL or neither) moved towards them by
 * momentum: r = (1 - momentum) r + momentum * s, with the unbiased variance (needs batch *
 * spatial > 1). training = 0: the running statistics normalise (and are saved for the backward
 * pass). weight and bias may be NULL (no affine). */
it_status it_batchnorm_forward(it_device device, it_dtype dtype, void *out, float *save_mean,
                               float *save_rstd, float *running_mean, float *running_var,
                               const void *inp, const void *weight, const void *bias,
                               int64_t batch, int64_t channels, int64_t spatial,
                               int32_t training, float momentum, float eps);
/* dinp, dweight, dbias (each may be NULL) are overwritten; `training` as in the forward pass
 * (0: the statistics were constants). */
it_status it_batchnorm_backward(it_device device, it_dtype dtype, void *dinp, void *dweight,
                                void *dbias, const void *dout, const void *inp,
                                const void *weight, const float *save_mean,
                                const float *save_rstd, int64_t batch, int64_t channels,
                                int64_t spatial, int32_t training);

/* ---- attention and positions ---------------------------------------------------------- */
/* Scaled-dot-product attention with grouped-query heads.
 * q, out: [B, H, Tq, D]; k, v: [B, H_kv, Tk, D] with H % H_kv == 0 (head h reads kv head
 * h / (H / H_kv)). lse: float32 [B, H, Tq], saved for backward. scale is usually 1/sqrt(D).
 * causal != 0 masks aligned to the bottom right: query i sees key j when j <= i + Tk - Tq
 * (needs Tk >= Tq; with Tq == Tk the usual causal mask). The backward pass takes the lse and
 * out of the whole row; when the row spans more keys than k holds (a block of a longer
 * sequence, as context parallelism computes it), it gives this block's part of dq and the
 * block's dk, dv. options (NULL: none) adds a mask and dropout; the backward pass takes the
 * same options as the forward pass. */
typedef struct it_attention_options {
    /* A float32 bias added to the scaled scores, element (b, h, i, j) at
     * bias[b * stride_batch + h * stride_head + i * stride_query + j] (a stride of 0
     * broadcasts; keys are contiguous); -inf masks a key out. NULL: none. A query row whose
     * every key is masked out gives zeros and passes no gradient (PyTorch's fused kernels). */
    const float *bias;
    int64_t bias_stride_batch, bias_stride_head, bias_stride_query;
    /* Zeroes each attention probability with probability dropout_p (in [0, 1]) and scales the
     * kept ones by 1 / (1 - dropout_p). Which ones is a hash of (seed, row, key), the same on
     * every device and thread count, so the backward pass recomputes the forward's mask. */
    float dropout_p;
    uint64_t seed;
} it_attention_options;
it_status it_attention_forward(it_device device, it_dtype dtype, void *out, float *lse,
                               const void *q, const void *k, const void *v, int64_t batch,
                               int64_t heads, int64_t kv_heads, int64_t q_len, int64_t kv_len,
                               int64_t head_dim, float scale, int causal,
                               const it_attention_options *options);
it_status it_attention_backward(it_device device, it_dtype dtype, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v,
                                const void *out, const float *lse, int64_t batch,
                                int64_t heads, int64_t kv_heads, int64_t q_len, int64_t kv_len,
                                int64_t head_dim, float scale, int causal,
                                const it_attention_options *options);
/* Merges a block's attention (block_out [G, Tb, D] of dtype, block_lse float32 [G, Tb]) into
 * a float32 running result (out [G, T, D], lse [G, T]) at rows [row_offset, row_offset + Tb)
 * of each of the G groups, by the log-sum-exp rule: lse' = log(e^lse + e^block_lse), out' =
 * (out e^lse + block_out e^block_lse) / e^lse'. Start from lse = -inf. */
it_status it_attention_merge(it_device device, it_dtype dtype, float *out, float *lse,
                             const void *block_out, const float *block_lse, int64_t groups,
                             int64_t rows, int64_t block_rows, int64_t row_offset,
                             int64_t head_dim);
/* Rotary embedding on x [B, T, H, D], rotating interleaved pairs (x[2i], x[2i+1]) by the
 * angle whose cos/sin are float32 [T, D/2] (LLaMA's layout). Backward rotates back. */
it_status it_rope_forward(it_device device, it_dtype dtype, void *out, const void *inp,
                          const float *cos, const float *sin, int64_t batch, int64_t seq,
                          int64_t heads, int64_t head_dim);
it_status it_rope_backward(it_device device, it_dtype dtype, void *dinp, const void *dout,
                           const float *cos, const float *sin, int64_t batch, int64_t seq,
                           int64_t heads, int64_t head_dim);

/* ---- embedding ------------------------------------------------------------------------ */
/* out [N, C] = weight[indices[n]]; indices int32 or int64, each in [0, num_embeddings). */
it_status it_embedding_forward(it_device device, it_dtype dtype, void *out, const void *indices,
                               it_dtype index_dtype, const void *weight, int64_t n,
                               int64_t num_embeddings, int64_t cols);
/* dweight[indices[n]] += dout[n] (scatter-add into an existing gradient). */
it_status it_embedding_backward(it_device device, it_dtype dtype, void *dweight,
                                const void *dout, const void *indices, it_dtype index_dtype,
                                int64_t n, int64_t num_embeddings, int64_t cols);

/* ---- mixture of experts ---------------------------------------------------------------- */
/* The routing order of tokens * top_k assignments: expert_ids [tokens, top_k] (int64, each in
 * [0, num_experts); anything else is IT_ERR_INDEX_OUT_OF_RANGE, on CUDA at the host's next
 * synchronisation) sorted stably by expert, then token, then choice, leaving out those whose
 * keep [tokens, top_k] (bool, NULL keeps all) is 0. counts [num_experts] receives each expert's
 * number of assignments; rows and slots [tokens * top_k] the token (row) and the flattened
 * index (token * top_k + choice) of each assignment in that order: only the first sum(counts)
 * entries are written. Every array is on `device`. */
it_status it_moe_sort(it_device device, int64_t *rows, int64_t *slots, int64_t *counts,
                      const int64_t *expert_ids, const uint8_t *keep, int64_t tokens,
                      int64_t top_k, int64_t num_experts);
/* out [assignments, cols] = x [tokens, cols] at rows[a] (int64, each in [0, tokens)). */
it_status it_moe_permute(it_device device, it_dtype dtype, void *out, const void *x,
                         const int64_t *rows, int64_t assignments, int64_t tokens, int64_t cols);
/* out [tokens, cols] (overwritten) = the sum over the assignments a with rows[a] == t of
 * weights[a] * y[a] (weights [assignments] of y's dtype; NULL: 1, the permutation's backward).
 * Each token sums its own rows in their order, in float32 (float64 for float64): the same bits
 * whatever the threads, no atomics. A token no row names gets zeros. */
it_status it_moe_unpermute(it_device device, it_dtype dtype, void *out, const void *y,
                           const void *weights, const int64_t *rows, int64_t assignments,
                           int64_t tokens, int64_t cols);
/* Its backward, given dout [tokens, cols]: dy [assignments, cols] = weights[a] * dout[rows[a]]
 * and dweights [assignments] = the dot of y[a] with dout[rows[a]]; either may be NULL. */
it_status it_moe_unpermute_backward(it_device device, it_dtype dtype, void *dy, void *dweights,
                                    const void *dout, const void *y, const void *weights,
                                    const int64_t *rows, int64_t assignments, int64_t tokens,
                                    int64_t cols);
/* The experts' products in one call: x [rows, in_features] holds group_sizes[g] consecutive
 * rows for group (expert) g, group_sizes a host array of `groups` counts summing to rows;
 * weights a host array of `groups` device pointers, each [out_features, in_features] (may be
 * NULL for a group without rows). forward: out [rows, out_features] = x_g @ W_g^T per group;
 * backward_input: dx [rows, in_features] = dout_g @ W_g; backward_weight: dweights[g]
 * [out_features, in_features] (overwritten) = dout_g^T @ x_g, zeros for a group without rows.
 * float32, bfloat16, float16 (float32 accumulation) and float64; cuBLAS's grouped product on
 * CUDA where the toolkit has it (12.5 and later), one product per group otherwise. */
it_status it_moe_grouped_linear_forward(it_device device, it_dtype dtype, void *out, const void *x,
                                        const void *const *weights, const int64_t *group_sizes,
                                        int64_t groups, int64_t rows, int64_t in_features,
                                        int64_t out_features);
it_status it_moe_grouped_linear_backward_input(it_device device, it_dtype dtype, void *dx,
                                               const void *dout, const void *const *weights,
                                               const int64_t *group_sizes, int64_t groups,
                                               int64_t rows, int64_t in_features,
                                               int64_t out_features);
it_status it_moe_grouped_linear_backward_weight(it_device device, it_dtype dtype,
                                                void *const *dweights, const void *dout,
                                                const void *x, const int64_t *group_sizes,
                                                int64_t groups, int64_t rows, int64_t in_features,
                                                int64_t out_features);

/* ---- optimizer updates ---------------------------------------------------------------- */
/* Fused AdamW on n parameters (param/grad in `dtype`, m and v float32). `step` is the
 * 1-based step count for bias correction; weight decay is decoupled (param *= 1 - lr*wd). */
it_status it_adamw_step(it_device device, it_dtype dtype, void *param, const void *grad,
                        float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                        float eps, float weight_decay, int64_t step);
/* it_adamw_step on num_inputs tensors at once (one launch on a GPU, not one per tensor):
 * params[i], grads[i], exp_avgs[i], exp_avg_sqs[i] of sizes[i] elements, all of `dtype`, with
 * the same hyperparameters and step; each tensor gets it_adamw_step's bits. */
it_status it_adamw_step_multi(it_device device, it_dtype dtype, void *const *params, const void *const *grads,
                              float *const *exp_avgs, float *const *exp_avg_sqs, const int64_t *sizes,
                              int32_t num_inputs, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int64_t step);
/* SGD with momentum as torch.optim.SGD: g += wd*p; buf = momentum*buf + (1-dampening)*g
 * (buf = g on the first step); g = nesterov ? g + momentum*buf : buf; p -= lr*g.
 * momentum_buf may be NULL when momentum == 0. */
it_status it_sgd_step(it_device device, it_dtype dtype, void *param, const void *grad,
                      float *momentum_buf, int64_t n, float lr, float momentum, float dampening,
                      float weight_decay, int32_t nesterov, int32_t first_step);

/* ---- collective communication between GPUs (NCCL) ----------------------------------- */
/* A communicator joins `nranks` processes, one GPU each. One rank makes a unique id (at most
 * IT_COMM_ID_BYTES = 128 bytes) and gives it to the others out of band (infinitrain
 * broadcasts it with MPI); each then calls it_comm_init with its rank. Collectives are queued
 * on `stream` (NULL: the calling thread's current stream of the communicator's device) and
 * return without waiting; send and recv pair up between two ranks. Counts are elements.
 * Needs NCCL (libnccl.so.2), opened on first use: without it, IT_ERR_NO_CUDA says so. */
typedef struct it_comm it_comm;
typedef enum it_comm_op { IT_COMM_SUM = 0, IT_COMM_AVG, IT_COMM_MAX, IT_COMM_MIN } it_comm_op;

it_status it_comm_unique_id(it_device device, uint8_t *id, size_t size);
it_status it_comm_init(it_device device, const uint8_t *id, size_t size, int32_t nranks,
                       int32_t rank, it_comm **out);
it_status it_comm_destroy(it_comm *comm);
it_status it_comm_all_reduce(it_comm *comm, it_dtype dtype, const void *send, void *recv,
                             int64_t count, it_comm_op op, it_stream *stream);
/* recv [nranks * count] = every rank's send [count], in rank order */
it_status it_comm_all_gather(it_comm *comm, it_dtype dtype, const void *send, void *recv,
                             int64_t count, it_stream *stream);
/* recv [count] = this rank's block of the reduction of send [nranks * count] */
it_status it_comm_reduce_scatter(it_comm *comm, it_dtype dtype, const void *send, void *recv,
                                 int64_t count, it_comm_op op, it_stream *stream);
it_status it_comm_broadcast(it_comm *comm, it_dtype dtype, const void *send, void *recv,
                            int64_t count, int32_t root, it_stream *stream);
it_status it_comm_send(it_comm *comm, it_dtype dtype, const void *buf, int64_t count,
                       int32_t peer, it_stream *stream);
it_status it_comm_recv(it_comm *comm, it_dtype dtype, void *buf, int64_t count, int32_t peer,
                       it_stream *stream);
/* torch's all_to_all_single: send_counts[k] elements of send, from send_offsets[k], go to rank k;
 * recv_counts[k] elements from rank k land at recv_offsets[k] of recv (each array nranks long,
 * every block inside send's send_total and recv's recv_total elements; blocks may be empty).
 * One NCCL group of sends and receives (the rank's own block copied on the stream). */
it_status it_comm_all_to_all(it_comm *comm, it_dtype dtype, const void *send, int64_t send_total,
                             const int64_t *send_counts, const int64_t *send_offsets, void *recv,
                             int64_t recv_total, const int64_t *recv_counts, const int64_t *recv_offsets,
                             it_stream *stream);

/* IT_CDEF_END */

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* INFINITRAIN_H */
