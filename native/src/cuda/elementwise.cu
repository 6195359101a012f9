// Elementwise kernels, the twins of cpu/elementwise.c: unary ops and their gradients, strided
// binary ops, scalar ops, SwiGLU. Math is in float for
// float32/bfloat16/float16 (double for float64), with the CPU kernels' definitions (NaN
// propagation of maximum/minimum included); 16-bit results are rounded once.
#include "common.cuh"

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)

template <typename C> __device__ C unary_op(int op, C x) {
    switch (op) {
    case IT_NEG: return -x;
    case IT_EXP: return exp(x);
    case IT_LOG: return log(x);
    case IT_SQRT: return sqrt(x);
    case IT_RSQRT: return C(1) / sqrt(x);
    case IT_ABS: return fabs(x);
    case IT_TANH: return tanh(x);
    case IT_SIGMOID: return C(1) / (C(1) + exp(-x));
    case IT_RELU: return x > C(0) || x != x ? x : C(0);
    case IT_SILU: return x / (C(1) + exp(-x));
    case IT_GELU_TANH: return C(0.5) * x * (C(1) + tanh(C(kGeluK) * (x + C(0.044715) * x * x * x)));
    case IT_SIN: return sin(x);
    case IT_COS: return cos(x);
    case IT_SQUARE: return x * x;
    case IT_GELU: return C(0.5) * x * (C(1) + erf(x * C(0.7071067811865476)));
    default: return C(1) / x;  // IT_RECIPROCAL
    }
}

// dx = dy * f'(x); s is x, or the op's output for EXP, SQRT, TANH and SIGMOID
template <typename C> __device__ C unary_grad(int op, C dy, C s) {
    switch (op) {
    case IT_NEG: return -dy;
    case IT_EXP: return dy * s;
    case IT_LOG: return dy / s;
    case IT_SQRT: return dy * C(0.5) / s;
    case IT_RSQRT: return C(-0.5) * dy / (s * sqrt(s));
    case IT_ABS: return s > C(0) ? dy : (s < C(0) ? -dy : C(0));
    case IT_TANH: return dy * (C(1) - s * s);
    case IT_SIGMOID: return dy * s * (C(1) - s);
    case IT_RELU: return s > C(0) ? dy : C(0);
    case IT_SILU: {
        C sg = C(1) / (C(1) + exp(-s));
        return dy * sg * (C(1) + s * (C(1) - sg));
    }
    case IT_GELU_TANH: {
        C t = tanh(C(kGeluK) * (s + C(0.044715) * s * s * s));
        C dt = C(kGeluK) * (C(1) + C(3 * 0.044715) * s * s);
        return dy * (C(0.5) * (C(1) + t) + C(0.5) * s * (C(1) - t * t) * dt);
    }
    case IT_SIN: return dy * cos(s);
    case IT_COS: return -dy * sin(s);
    case IT_SQUARE: return C(2) * s * dy;
    case IT_GELU:
        return dy * (C(0.5) * (C(1) + erf(s * C(0.7071067811865476))) + s * C(0.3989422804014327) * exp(C(-0.5) * s * s));
    default: return -dy / (s * s);  // IT_RECIPROCAL
    }
}

template <typename C> __device__ C binary_op(int op, C a, C b) {
    switch (op) {
    case IT_ADD: return a + b;
    case IT_SUB: return a - b;
    case IT_MUL: return a * b;
    case IT_DIV: return a / b;
    case IT_MAXIMUM: return (a != a || b != b) ? a + b : (a > b ? a : b);
    case IT_MINIMUM: return (a != a || b != b) ? a + b : (a < b ? a : b);
    default: return pow(a, b);  // IT_POW
    }
}

template <typename I> __device__ I binary_int(int op, I a, I b) {
    switch (op) {
    case IT_ADD: return a + b;
    case IT_SUB: return a - b;
    case IT_MUL: return a * b;
    case IT_DIV: return b ? a / b : 0;
    case IT_MAXIMUM: return a > b ? a : b;
    default: return a < b ? a : b;
    }
}

template <typename C> __device__ C scalar_op(int op, C x, C s) {
    switch (op) {
    case IT_SCALAR_ADD: return x + s;
    case IT_SCALAR_MUL: return x * s;
    case IT_SCALAR_RSUB: return s - x;
    case IT_SCALAR_RDIV: return s / x;
    case IT_SCALAR_POW: return s == C(2) ? x * x : pow(x, s);
    case IT_SCALAR_MAX: return x != x ? x : (x > s ? x : s);
    case IT_SCALAR_MIN: return x != x ? x : (x < s ? x : s);
    default: return x / s;  // IT_SCALAR_DIV
    }
}


template <typename T, int V> __global__ void unary_kernel(int op, T *out, const T *inp, int64_t n) {
    GRID_STRIDE(p, n / V) {
        Vec<T, V> x = ((const Vec<T, V> *)inp)[p];
#pragma unroll
        for (int e = 0; e < V; e++) store_acc(x.x, e, unary_op(op, load_acc(x.x, e)));
        ((Vec<T, V> *)out)[p] = x;
    }
    GRID_STRIDE(i, n % V) store_acc(out, n / V * V + i, unary_op(op, load_acc(inp, n / V * V + i)));
}

template <typename T, int V>
__global__ void unary_grad_kernel(int op, T *dinp, const T *dout, const T *saved, int64_t n) {
    GRID_STRIDE(p, n / V) {
        Vec<T, V> dy = ((const Vec<T, V> *)dout)[p], x = ((const Vec<T, V> *)saved)[p];
#pragma unroll
        for (int e = 0; e < V; e++) store_acc(dy.x, e, unary_grad(op, load_acc(dy.x, e), load_acc(x.x, e)));
        ((Vec<T, V> *)dinp)[p] = dy;
    }
    GRID_STRIDE(i, n % V) {
        int64_t j = n / V * V + i;
        store_acc(dinp, j, unary_grad(op, load_acc(dout, j), load_acc(saved, j)));
    }
}

// both operands contiguous and of the output's shape (the residual adds, gradients summed): no
// index arithmetic, V elements at a time (common.cuh)
template <typename T, int V>
__global__ void binary_flat_kernel(int op, T *out, const T *a, const T *b, int64_t n) {
    GRID_STRIDE(p, n / V) {
        Vec<T, V> x = ((const Vec<T, V> *)a)[p], y = ((const Vec<T, V> *)b)[p];
#pragma unroll
        for (int e = 0; e < V; e++) store_acc(x.x, e, binary_op(op, load_acc(x.x, e), load_acc(y.x, e)));
        ((Vec<T, V> *)out)[p] = x;
    }
    GRID_STRIDE(i, n % V) {
        int64_t j = n / V * V + i;
        store_acc(out, j, binary_op(op, load_acc(a, j), load_acc(b, j)));
    }
}

// whether every operand of s is laid out contiguously in its shape (dimensions of one aside)
static bool all_contiguous(const Strided &s, int operands) {
    for (int k = 0; k < operands; k++) {
        int64_t expect = 1;
        for (int d = s.ndim - 1; d >= 0; d--) {
            if (s.shape[d] != 1 && s.stride[k][d] != expect) return false;
            expect *= s.shape[d];
        }
    }
    return true;
}

template <typename T>
__global__ void binary_kernel(int op, T *out, const T *a, const T *b, Strided s, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t off[2];
        offsets(s, i, 2, off);
        store_acc(out, i, binary_op(op, load_acc(a, off[0]), load_acc(b, off[1])));
    }
}

template <typename I>
__global__ void binary_int_kernel(int op, I *out, const I *a, const I *b, Strided s, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t off[2];
        offsets(s, i, 2, off);
        out[i] = binary_int(op, a[off[0]], b[off[1]]);
    }
}

template <typename T, int V>
__global__ void scalar_kernel(int op, T *out, const T *inp, double scalar, int64_t n) {
    using C = typename Acc<T>::type;
    GRID_STRIDE(p, n / V) {
        Vec<T, V> x = ((const Vec<T, V> *)inp)[p];
#pragma unroll
        for (int e = 0; e < V; e++) store_acc(x.x, e, scalar_op(op, load_acc(x.x, e), (C)scalar));
        ((Vec<T, V> *)out)[p] = x;
    }
    GRID_STRIDE(i, n % V) store_acc(out, n / V * V + i, scalar_op(op, load_acc(inp, n / V * V + i), (C)scalar));
}

// integer tensors: add/mul/rsub/max/min by an integer (the library refuses the rest), in int64
// and stored with the dtype's wraparound, as on the CPU
template <typename I>
__global__ void scalar_int_kernel(int op, I *out, const I *inp, int64_t s, int64_t n) {
    GRID_STRIDE(i, n) {
        int64_t x = (int64_t)inp[i], y;
        switch (op) {
        case IT_SCALAR_ADD: y = x + s; break;
        case IT_SCALAR_MUL: y = x * s; break;
        case IT_SCALAR_RSUB: y = s - x; break;
        case IT_SCALAR_MAX: y = x > s ? x : s; break;
        default: y = x < s ? x : s; break;  // IT_SCALAR_MIN
        }
        out[i] = (I)y;
    }
}

template <typename T> __global__ void swiglu_kernel(T *out, const T *a, const T *b, int64_t n) {
    GRID_STRIDE(i, n) {
        float x = to_f(a[i]);
        out[i] = from_f<T>(x / (1.0f + expf(-x)) * to_f(b[i]));
    }
}

template <typename T>
__global__ void swiglu_grad_kernel(T *da, T *db, const T *dout, const T *a, const T *b, int64_t n) {
    GRID_STRIDE(i, n) {
        float x = to_f(a[i]), dy = to_f(dout[i]), s = 1.0f / (1.0f + expf(-x));
        db[i] = from_f<T>(dy * x * s);
        da[i] = from_f<T>(dy * to_f(b[i]) * s * (1.0f + x * (1.0f - s)));
    }
}




}  // namespace

extern "C" {

it_status it_cuda_unary(it_device device, it_unary_op op, it_dtype dtype, void *out,
                        const void *inp, int64_t n) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    const bool vec = vec_aligned({out, inp});
    FLOAT_OR_DOUBLE(dtype, "it_unary", {
        constexpr int V = 16 / sizeof(T);
        if (vec)
            unary_kernel<T, V><<<it_blocks(n / V), IT_THREADS, 0, s>>>((int)op, (T *)out, (const T *)inp, n);
        else
            unary_kernel<T, 1><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (T *)out, (const T *)inp, n);
    });
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_unary_backward(it_device device, it_unary_op op, it_dtype dtype, void *dinp,
                                 const void *dout, const void *saved, int64_t n) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    const bool vec = vec_aligned({dinp, dout, saved});
    FLOAT_OR_DOUBLE(dtype, "it_unary_backward", {
        constexpr int V = 16 / sizeof(T);
        if (vec)
            unary_grad_kernel<T, V><<<it_blocks(n / V), IT_THREADS, 0, s>>>((int)op, (T *)dinp, (const T *)dout,
                                                                            (const T *)saved, n);
        else
            unary_grad_kernel<T, 1><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (T *)dinp, (const T *)dout,
                                                                        (const T *)saved, n);
    });
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_binary(it_device device, it_binary_op op, it_dtype dtype, void *out,
                         const void *a, const int64_t *a_strides, const void *b,
                         const int64_t *b_strides, const int64_t *shape, int32_t ndim) {
    int64_t n;
    Strided st = strided(shape, ndim, {a_strides, b_strides}, &n);
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    if (dtype == IT_INT32) {
        binary_int_kernel<int32_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (int32_t *)out,
                                                                      (const int32_t *)a, (const int32_t *)b, st, n);
    } else if (dtype == IT_INT64) {
        binary_int_kernel<int64_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (int64_t *)out,
                                                                      (const int64_t *)a, (const int64_t *)b, st, n);
    } else if (dtype == IT_UINT8 || dtype == IT_BOOL) {  // bool: maximum / minimum only (checked)
        binary_int_kernel<uint8_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (uint8_t *)out,
                                                                      (const uint8_t *)a, (const uint8_t *)b, st, n);
    } else {
        const bool flat = all_contiguous(st, 2), vec = flat && vec_aligned({out, a, b});
        FLOAT_OR_DOUBLE(dtype, "it_binary", {
            constexpr int V = 16 / sizeof(T);
            if (vec)
                binary_flat_kernel<T, V><<<it_blocks(n / V), IT_THREADS, 0, s>>>((int)op, (T *)out, (const T *)a,
                                                                                 (const T *)b, n);
            else if (flat)
                binary_flat_kernel<T, 1><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (T *)out, (const T *)a,
                                                                             (const T *)b, n);
            else
                binary_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (T *)out, (const T *)a, (const T *)b,
                                                                     st, n);
        });
    }
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_scalar(it_device device, it_scalar_op op, it_dtype dtype, void *out,
                         const void *inp, double scalar, int64_t n) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    int64_t si = (int64_t)scalar;  // integer dtypes: the library has checked that it is whole
    switch (dtype) {
    case IT_INT32: scalar_int_kernel<int32_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (int32_t *)out, (const int32_t *)inp, si, n); break;
    case IT_INT64: scalar_int_kernel<int64_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (int64_t *)out, (const int64_t *)inp, si, n); break;
    case IT_UINT8: scalar_int_kernel<uint8_t><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (uint8_t *)out, (const uint8_t *)inp, si, n); break;
    default:
        FLOAT_OR_DOUBLE(dtype, "it_scalar", {
            constexpr int V = 16 / sizeof(T);
            if (vec_aligned({out, inp}))
                scalar_kernel<T, V><<<it_blocks(n / V), IT_THREADS, 0, s>>>((int)op, (T *)out, (const T *)inp,
                                                                            scalar, n);
            else
                scalar_kernel<T, 1><<<it_blocks(n), IT_THREADS, 0, s>>>((int)op, (T *)out, (const T *)inp, scalar, n);
        });
    }
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_swiglu_forward(it_device device, it_dtype dtype, void *out, const void *a,
                                 const void *b, int64_t n) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    IT_FLOAT_SWITCH(dtype, "it_swiglu_forward",
                    swiglu_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>((T *)out, (const T *)a, (const T *)b, n));
    CU_LAUNCHED();
    return IT_OK;
}

it_status it_cuda_swiglu_backward(it_device device, it_dtype dtype, void *da, void *db,
                                  const void *dout, const void *a, const void *b, int64_t n) {
    if (n == 0) return IT_OK;
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = it_cuda_stream(device);
    IT_FLOAT_SWITCH(dtype, "it_swiglu_backward",
                    swiglu_grad_kernel<T><<<it_blocks(n), IT_THREADS, 0, s>>>(
                        (T *)da, (T *)db, (const T *)dout, (const T *)a, (const T *)b, n));
    CU_LAUNCHED();
    return IT_OK;
}


}  // extern "C"

// each entry point has its public twin's type (common.cuh)
IT_CUDA_MIRRORS(unary);
IT_CUDA_MIRRORS(unary_backward);
IT_CUDA_MIRRORS(binary);
IT_CUDA_MIRRORS(scalar);
IT_CUDA_MIRRORS(swiglu_forward);
IT_CUDA_MIRRORS(swiglu_backward);
