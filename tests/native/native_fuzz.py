"""Hostile calls into the C ABI, drawn from a seeded generator: every call has at least one
argument that cannot be right (a negative size, sizes whose product passes 2^58 elements, a
NULL array where work is asked for, a device or dtype that does not exist). Each must return a
non-zero status with a message; the process must survive all of them. Run in a subprocess by
tests/test_native_fuzz.py (a crash is then a failed test, not a dead test session)."""
import random
import sys

from infinitrain._native import ffi, lib

CPU = ffi.new("it_device *", [lib.IT_CPU, 0])[0]
BAD_DEVICES = [ffi.new("it_device *", d)[0] for d in ([lib.IT_CPU, 7], [lib.IT_CPU, -1], [9, 0], [lib.IT_CUDA, 0])]
BUF = ffi.new("float[4096]")
I64 = ffi.new("int64_t[64]", [1] * 64)
HOSTILE = [-1, -2**63, 2**59, 2**62, 2**63 - 1]
FINE = [1, 2, 3]
NAN = float("nan")


def _cuda_devices() -> int:
    count = ffi.new("int32_t *")
    lib.it_device_count(lib.IT_CUDA, count)
    return count[0]


def draw(rng, n_sizes):
    """n sizes, one of them hostile, or the first two (sizes every call multiplies) huge
    enough that their product overflows."""
    sizes = [rng.choice(FINE) for _ in range(n_sizes)]
    if n_sizes >= 2 and rng.random() < 0.3:
        sizes[0] = sizes[1] = 2**31 + rng.randrange(2**20)
    else:
        sizes[rng.randrange(n_sizes)] = rng.choice(HOSTILE)
    return sizes


def _options(**fields):
    return ffi.new("it_attention_options *", dict(bias=BUF + 256, **fields))


def _conv(**fields):
    base = dict(batch=1, in_channels=6, height=8, width=8, out_channels=6, kernel_h=3, kernel_w=3, stride_h=1,
                stride_w=1, pad_h=0, pad_w=0, dilation_h=1, dilation_w=1, groups=1)
    return ffi.new("it_conv2d_params *", dict(base, **fields))


def _pool(**fields):
    base = dict(planes=1, height=8, width=8, kernel_h=2, kernel_w=2, stride_h=2, stride_w=2, pad_h=0, pad_w=0,
                dilation_h=1, dilation_w=1, ceil_mode=0)
    return ffi.new("it_pool2d_params *", dict(base, **fields))


def calls(rng):
    f32 = lib.IT_FLOAT32
    b = BUF
    # (batch, heads, q_len, head_dim, kv_heads, kv_len)
    yield "attention", lambda s: lib.it_attention_forward(CPU, f32, b, b, b, b, b, s[0], s[1], s[4],
                                                          s[2], s[5], s[3], 1.0, 1, ffi.NULL), 6
    # a mask's row stride (the batch and head strides of a one-head batch of one reach nothing)
    yield "attention_bias", lambda s: lib.it_attention_forward(CPU, f32, b, b, b, b, b, 1, 1, 1, 2, 2, 1, 1.0, 0,
                                                               _options(bias_stride_query=s[0])), 1
    # (groups, rows, block_rows, head_dim, row_offset): a hostile offset near 2^63 wrapped the range check
    yield "attention_merge", lambda s: lib.it_attention_merge(CPU, f32, b, b, b, b, s[0], s[1], s[2], s[4],
                                                              s[3]), 5
    yield "layernorm", lambda s: lib.it_layernorm_forward(CPU, f32, b, b, b, b, b, b, *s, 1e-5), 2
    yield "rmsnorm", lambda s: lib.it_rmsnorm_forward(CPU, f32, b, b, b, b, *s, 1e-5), 2
    yield "softmax", lambda s: lib.it_softmax_forward(CPU, f32, b, b, *s), 2
    yield "cross_entropy", lambda s: lib.it_cross_entropy_forward(CPU, f32, b, b, b, I64, lib.IT_INT64,
                                                                  s[0], s[1], s[1], -100), 2
    yield "rope", lambda s: lib.it_rope_forward(CPU, f32, b, b, b, b, s[0], s[1], s[2],
                                                      2 * s[3] if s[3] in FINE else s[3]), 4
    # (n, cols, num_embeddings)
    yield "embedding", lambda s: lib.it_embedding_forward(CPU, f32, b, I64, lib.IT_INT64, b, s[0], s[2], s[1]), 3
    yield "reduce", lambda s: lib.it_reduce(CPU, lib.IT_SUM, f32, b, b, *s), 3
    yield "argmax", lambda s: lib.it_argmax(CPU, f32, I64, b, *s), 3
    yield "matmul", lambda s: lib.it_matmul(CPU, f32, b, b, b, *s, 0, 0, 1.0, 0.0, 0, 0, 0), 4
    yield "unary", lambda s: lib.it_unary(CPU, lib.IT_EXP, f32, b, b, *s), 1
    yield "scalar", lambda s: lib.it_scalar(CPU, lib.IT_ADD, f32, b, b, 1.0, *s), 1
    yield "random", lambda s: lib.it_random_normal(CPU, f32, b, s[0], 0.0, 1.0, 1, 0), 1
    # the entry points that once took a huge size and wrote past their buffers
    yield "fill", lambda s: lib.it_fill(CPU, f32, b, 1.0, s[0]), 1
    yield "arange", lambda s: lib.it_arange(CPU, f32, b, 0.0, 1.0, s[0]), 1
    yield "cast", lambda s: lib.it_cast(CPU, b, lib.IT_BFLOAT16, b, f32, s[0]), 1
    yield "swiglu", lambda s: lib.it_swiglu_forward(CPU, f32, b, b, b, s[0]), 1
    yield "swiglu_backward", lambda s: lib.it_swiglu_backward(CPU, f32, b, b, b, b, b, s[0]), 1
    yield "unary_backward", lambda s: lib.it_unary_backward(CPU, lib.IT_EXP, f32, b, b, b, s[0]), 1
    yield "topk", lambda s: lib.it_topk(CPU, f32, b, I64, b, s[0], s[1], 1, 1), 2
    yield "cumsum", lambda s: lib.it_cumsum(CPU, f32, b, b, *s), 3
    # bytes, 8 per element: a negative size as size_t sees it, a huge one saturated
    yield "memcpy", lambda s: lib.it_memcpy(CPU, b, CPU, b + 8, s[0] % 2**64 if s[0] < 0
                                            else min(s[0] * 8, 2**64 - 1)), 1
    yield "memcpy_async", lambda s: lib.it_memcpy_async(CPU, b, CPU, b + 8, s[0] % 2**64 if s[0] < 0
                                                        else min(s[0] * 8, 2**64 - 1), ffi.NULL), 1

    # (batch, in_channels, height, width) of a 1x1 convolution; (kernel_h, stride_h, dilation_h, groups) of a
    # 3x3 one over [1, 6, 8, 8]
    yield "conv2d", lambda s: lib.it_conv2d_forward(CPU, f32, b, b + 2048, b, ffi.NULL, _conv(
        batch=s[0], in_channels=s[1], height=s[2], width=s[3], out_channels=1, kernel_h=1, kernel_w=1)), 4
    yield "conv2d_geometry", lambda s: lib.it_conv2d_backward(CPU, f32, b, b, b, b, b, b, _conv(
        kernel_h=s[0], stride_h=s[1], dilation_h=s[2], groups=s[3])), 4
    # (planes, height, width); (kernel_h, stride_h, pad_h) over [1, 8, 8]
    yield "max_pool2d", lambda s: lib.it_max_pool2d_forward(CPU, f32, b, I64, b, _pool(
        planes=s[0], height=s[1], width=s[2])), 3
    yield "avg_pool2d_geometry", lambda s: lib.it_avg_pool2d_backward(CPU, f32, b, b + 2048, _pool(
        kernel_h=s[0], stride_h=s[1], pad_h=s[2]), 1), 3
    yield "adaptive_avg_pool2d", lambda s: lib.it_adaptive_avg_pool2d_forward(CPU, f32, b, b, *s), 5
    yield "batchnorm", lambda s: lib.it_batchnorm_forward(CPU, f32, b, b, b, b, b, b, b, b, *s, 1, 0.1, 1e-5), 3
    yield "batchnorm_backward", lambda s: lib.it_batchnorm_backward(CPU, f32, b, b, b, b + 1024, b + 2048, b, b,
                                                                    b, *s, 1), 3

    # mixture of experts: (tokens, top_k, num_experts); (assignments, cols, tokens); (rows, in, out, groups)
    yield "moe_sort", lambda s: lib.it_moe_sort(CPU, I64, I64 + 16, I64 + 32, I64 + 48, ffi.NULL, *s), 3
    yield "moe_permute", lambda s: lib.it_moe_permute(CPU, f32, b, b + 2048, I64, s[0], s[2], s[1]), 3
    yield "moe_unpermute", lambda s: lib.it_moe_unpermute(CPU, f32, b, b + 2048, ffi.NULL, I64, s[0], s[2], s[1]), 3
    experts = ffi.new("void *[]", [b + 1024, b + 2048, b + 3072])
    yield "moe_grouped_linear", lambda s: lib.it_moe_grouped_linear_forward(CPU, f32, b, b + 512, experts, I64, s[3],
                                                                            s[0], s[1], s[2]), 4

    def strided(s):
        shape = ffi.new("int64_t[]", s)
        return lib.it_copy_strided(CPU, f32, b, I64, b, I64, shape, len(s))
    yield "copy_strided", strided, 3

    def concat(s):
        parts = ffi.new("void *[]", [b, b])
        sizes = ffi.new("int64_t[]", [s[0], s[2]])
        return lib.it_concat(CPU, f32, b, parts, sizes, 2, s[1], 1)
    yield "concat", concat, 3


def main(cases: int) -> None:
    rng = random.Random(1234)
    table = list(calls(rng))
    done = 0
    for i in range(cases):
        name, fn, n = table[i % len(table)]
        sizes = draw(rng, n)
        status = fn(sizes)
        message = ffi.string(lib.it_last_error()).decode()
        assert status != lib.IT_OK and message, f"{name}{tuple(sizes)} returned {status} ({message!r})"
        done += 1
    # NULL arrays where work is asked for, and devices, dtypes and thread counts that do not exist
    nulls = [
        lambda: lib.it_copy_strided(CPU, lib.IT_FLOAT32, BUF, ffi.NULL, BUF, ffi.NULL, ffi.NULL, 2),
        lambda: lib.it_binary(CPU, lib.IT_ADD, lib.IT_FLOAT32, BUF, BUF, ffi.NULL, BUF, ffi.NULL, ffi.NULL, 3),
        lambda: lib.it_concat(CPU, lib.IT_FLOAT32, BUF, ffi.NULL, ffi.NULL, 2, 1, 1),
        lambda: lib.it_split(CPU, lib.IT_FLOAT32, ffi.NULL, BUF, ffi.NULL, 2, 1, 1),
        lambda: lib.it_set_num_threads(2**31 - 1),
        lambda: lib.it_set_num_threads(0),
        lambda: lib.it_unary(CPU, lib.IT_EXP, 99, BUF, BUF, 4),
        lambda: lib.it_reduce(CPU, 77, lib.IT_FLOAT32, BUF, BUF, 1, 4, 1),
        # aliasing the header forbids, flags that are not 0/1, scalars that are not finite
        lambda: lib.it_matmul(CPU, lib.IT_FLOAT32, BUF, BUF, BUF + 64, 1, 4, 4, 4, 0, 0, 1.0, 0.0, 0, 0, 0),
        lambda: lib.it_matmul(CPU, lib.IT_FLOAT32, BUF, BUF + 64, BUF + 128, 1, 4, 4, 4, 7, 0, 1.0, 0.0, 0, 0, 0),
        lambda: lib.it_matmul(CPU, lib.IT_FLOAT32, BUF, BUF + 64, BUF + 128, 1, 4, 4, 4, 0, 0, NAN, 0.0, 0, 0, 0),
        lambda: lib.it_layernorm_backward(CPU, lib.IT_FLOAT32, BUF, ffi.NULL, ffi.NULL, BUF, BUF + 64, ffi.NULL,
                                          BUF + 128, BUF + 132, 2, 4),
        # convolution, pooling and batch norm: no geometry, options that are not 0/1 or finite, an index
        # outside its plane, a dtype the kernels do not take, a dilated average pool
        lambda: lib.it_conv2d_forward(CPU, lib.IT_FLOAT32, BUF, BUF + 1024, BUF + 2048, ffi.NULL, ffi.NULL),
        lambda: lib.it_conv2d_forward(CPU, lib.IT_BFLOAT16, BUF, BUF + 1024, BUF + 2048, ffi.NULL, _conv()),
        lambda: lib.it_conv2d_forward(CPU, lib.IT_FLOAT32, BUF, BUF + 1024, BUF + 2048, ffi.NULL,
                                      _conv(in_channels=4, groups=3)),
        lambda: lib.it_max_pool2d_forward(CPU, lib.IT_FLOAT32, BUF, I64, BUF + 1024, _pool(ceil_mode=2)),
        lambda: lib.it_max_pool2d_backward(CPU, lib.IT_FLOAT32, BUF, BUF + 1024, ffi.new("int64_t[16]", [99] * 16),
                                           _pool()),
        lambda: lib.it_avg_pool2d_forward(CPU, lib.IT_FLOAT32, BUF, BUF + 1024, _pool(dilation_h=2), 0),
        lambda: lib.it_avg_pool2d_forward(CPU, lib.IT_FLOAT32, BUF, BUF + 1024, _pool(), 5),
        lambda: lib.it_batchnorm_forward(CPU, lib.IT_FLOAT32, BUF, BUF, BUF, BUF, BUF, BUF + 64, BUF, BUF, 2, 2, 2,
                                         1, NAN, 1e-5),
        lambda: lib.it_batchnorm_forward(CPU, lib.IT_FLOAT32, BUF, BUF, BUF, BUF, BUF, BUF + 64, BUF, BUF, 2, 2, 2,
                                         3, 0.1, 1e-5),
        lambda: lib.it_batchnorm_forward(CPU, lib.IT_FLOAT32, BUF, BUF, BUF, BUF, BUF, BUF + 64, BUF, BUF, 1, 2, 1,
                                         1, 0.1, 1e-5),
        lambda: lib.it_batchnorm_forward(CPU, lib.IT_FLOAT32, BUF, BUF, BUF, ffi.NULL, ffi.NULL, BUF + 64, BUF, BUF,
                                         2, 2, 2, 0, 0.1, 1e-5),
        lambda: lib.it_arange(CPU, lib.IT_FLOAT32, BUF, 0.0, NAN, 4),
        lambda: lib.it_attention_forward(CPU, lib.IT_FLOAT32, BUF, BUF + 64, BUF + 128, BUF + 192, BUF + 256, 1, 1,
                                         1, 2, 2, 4, 1.0, 0, _options(dropout_p=NAN)),
        lambda: lib.it_attention_backward(CPU, lib.IT_FLOAT32, BUF, BUF + 64, BUF + 128, BUF + 192, BUF + 256,
                                          BUF + 320, BUF + 384, BUF + 448, BUF + 512, 1, 1, 1, 2, 2, 4, 1.0, 0,
                                          _options(dropout_p=1.5)),
        lambda: lib.it_arange(CPU, lib.IT_FLOAT32, BUF, float("inf"), 1.0, 4),
        lambda: lib.it_attention_forward(CPU, lib.IT_FLOAT32, BUF, BUF + 64, BUF + 128, BUF + 192, BUF + 256, 1, 1,
                                         1, 2, 2, 4, 1.0, 0, _options(bias_stride_batch=2**63 - 1)),
        lambda: lib.it_adamw_step(CPU, lib.IT_FLOAT32, BUF, BUF + 64, BUF + 128, BUF + 192, 4, 1e-3, 0.9, 0.99,
                                  NAN, 0.0, 1),
        lambda: lib.it_sgd_step(CPU, lib.IT_FLOAT32, BUF, BUF + 64, ffi.NULL, 4, NAN, 0.0, 0.0, 0.0, 0, 1),
        lambda: lib.it_sgd_step(CPU, lib.IT_FLOAT32, BUF, BUF + 64, BUF + 128, 4, 0.1, 0.9, 0.0, 0.0, 3, 1),
        lambda: lib.it_memcpy(CPU, BUF, CPU, BUF + 64, (-16) % 2**64),  # a negative size, as size_t
        lambda: lib.it_storage_wrap(CPU, BUF, 2**64 - 1, ffi.new("it_storage **")),
        lambda: lib.it_memcpy_async(CPU, BUF, CPU, BUF + 64, (-16) % 2**64, ffi.NULL),
        lambda: lib.it_memcpy_async(ffi.new("it_device *", [lib.IT_CUDA, 0])[0], ffi.NULL, CPU, BUF, 8, ffi.NULL),
        lambda: lib.it_storage_new_pinned(2**60, ffi.new("it_storage **")),
        lambda: lib.it_storage_new_pinned(64, ffi.NULL),
        lambda: lib.it_moe_sort(CPU, I64, I64 + 16, ffi.NULL, I64 + 48, ffi.NULL, 2, 2, 4),
        lambda: lib.it_moe_grouped_linear_forward(CPU, lib.IT_FLOAT32, BUF, BUF + 64, ffi.NULL, I64, 2, 2, 2, 2),
        lambda: lib.it_moe_grouped_linear_backward_weight(CPU, lib.IT_FLOAT32, ffi.new("void *[2]"), BUF, BUF + 64,
                                                          I64, 2, 2, 2, 2),
    ] + [(lambda d=d: lib.it_unary(d, lib.IT_EXP, lib.IT_FLOAT32, BUF, BUF, 4)) for d in BAD_DEVICES] \
      + [(lambda d=d: lib.it_storage_new(d, 64, ffi.new("it_storage **"))) for d in BAD_DEVICES] \
      + [(lambda d=d: lib.it_memcpy_async(d, BUF, CPU, BUF + 64, 8, ffi.NULL)) for d in BAD_DEVICES] \
      + [(lambda d=d: lib.it_storage_wrap(d, BUF, 64, ffi.new("it_storage **")))  # cuda:7 where there is none
         for d in BAD_DEVICES + [ffi.new("it_device *", [lib.IT_CUDA, 7])[0]]
         if not (d.type == lib.IT_CUDA and d.index < _cuda_devices())]
    for i, fn in enumerate(nulls):
        status = fn()
        assert status != lib.IT_OK and ffi.string(lib.it_last_error()), f"case {i} returned {status}"
        done += 1
    print(f"OK {done} hostile calls refused", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000)
