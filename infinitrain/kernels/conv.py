"""Convolution, pooling and batch normalisation of NCHW images: checked calls of the native
kernels (float32). Shapes are checked here so that a mistake names the tensors involved; the
library checks the sizes again (ranges, overflow) whatever calls it."""
from __future__ import annotations

from .. import _trace
from .. import dtypes as _dt
from .._native import check, ffi, lib
from ..tensor import Tensor, _empty
from . import _checks

_NULL = ffi.NULL


def _ptr_or_null(t):
    return _NULL if t is None else t._ptr()


def _f32_ptr(t):
    return _NULL if t is None else ffi.cast("float *", t.data_ptr())


def _float32(op: str, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.dtype is not _dt.float32:
            raise NotImplementedError(f"{op}: {name} is {t.dtype.name}; the native kernels take float32 only "
                                      f"(convert with .float())")


def _image(op: str, x: Tensor) -> Tensor:
    if x.ndim != 4:
        raise ValueError(f"{op}: expected a 4-D input [batch, channels, height, width], got shape {tuple(x.shape)}")
    _float32(op, input=x)
    return x._contiguous_raw()


def conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


# ---- convolution -------------------------------------------------------------------------------
def _conv_params(x, weight: Tensor, stride, padding, dilation, groups):
    """x: the input tensor, or its shape where there is no input (a transposed convolution's)."""
    shape = x.shape if isinstance(x, Tensor) else tuple(x)
    return ffi.new("it_conv2d_params *", dict(
        batch=shape[0], in_channels=shape[1], height=shape[2], width=shape[3], out_channels=weight.shape[0],
        kernel_h=weight.shape[2], kernel_w=weight.shape[3], stride_h=stride[0], stride_w=stride[1],
        pad_h=padding[0], pad_w=padding[1], dilation_h=dilation[0], dilation_w=dilation[1], groups=groups))


def _check_conv(x: Tensor, weight: Tensor, bias, groups: int) -> None:
    _checks.same_device("conv2d", input=x, weight=weight, bias=bias)
    _float32("conv2d", input=x, weight=weight, bias=bias)
    if weight.ndim != 4:
        raise ValueError(f"conv2d: weight must be 4-D [out_channels, in_channels/groups, kh, kw], "
                         f"got shape {tuple(weight.shape)}")
    if groups < 1 or x.shape[1] != weight.shape[1] * groups or weight.shape[0] % groups:
        raise ValueError(f"conv2d: input of {x.shape[1]} channels and weight {tuple(weight.shape)} do not match "
                         f"groups={groups} (expected weight.shape[1] * groups == in_channels, out_channels "
                         f"divisible by groups)")
    if bias is not None:
        _checks.shape_is("conv2d", "bias", bias, (weight.shape[0],))


@_trace.traced("kernel")
def conv2d(x: Tensor, weight: Tensor, bias, stride, padding, dilation, groups: int) -> Tensor:
    x = _image("conv2d", x)
    _check_conv(x, weight, bias, groups)
    weight = weight._contiguous_raw()
    oh, ow = (conv_output_size(x.shape[2 + i], weight.shape[2 + i], stride[i], padding[i], dilation[i])
              for i in range(2))
    if oh < 1 or ow < 1:
        raise ValueError(f"conv2d: the input {tuple(x.shape[2:])} padded by {tuple(padding)} is smaller than the "
                         f"dilated kernel; the output would be {oh} x {ow}")
    out = _empty((x.shape[0], weight.shape[0], oh, ow), x.dtype, x.device)
    check(lib.it_conv2d_forward(x.device.native, x.dtype.native, out._ptr(), x._ptr(), weight._ptr(),
                                _ptr_or_null(bias), _conv_params(x, weight, stride, padding, dilation, groups)))
    return out


@_trace.traced("kernel")
def conv2d_backward(dout: Tensor, x: Tensor, weight: Tensor, stride, padding, dilation, groups: int,
                    want=(True, True, True)):
    """Returns (dinput, dweight, dbias), None where `want` says not wanted."""
    x, weight, dout = x._contiguous_raw(), weight._contiguous_raw(), dout._contiguous_raw()
    dx = _empty(x.shape, x.dtype, x.device) if want[0] else None
    dw = _empty(weight.shape, x.dtype, x.device) if want[1] else None
    db = _empty((weight.shape[0],), x.dtype, x.device) if want[2] else None
    check(lib.it_conv2d_backward(x.device.native, x.dtype.native, _ptr_or_null(dx), _ptr_or_null(dw),
                                 _ptr_or_null(db), dout._ptr(), x._ptr(), weight._ptr(),
                                 _conv_params(x, weight, stride, padding, dilation, groups)))
    return dx, dw, db


@_trace.traced("kernel")
def conv2d_input_grad(dout: Tensor, weight: Tensor, input_shape, stride, padding, dilation, groups: int) -> Tensor:
    """The gradient of conv2d's input of input_shape for dout, alone (no input needed): the
    transposed convolution of dout by weight."""
    dout = _image("conv_transpose2d", dout)
    _checks.same_device("conv_transpose2d", input=dout, weight=weight)
    _float32("conv_transpose2d", weight=weight)
    if weight.ndim != 4 or groups < 1 or dout.shape[1] != weight.shape[0] or weight.shape[0] % groups:
        raise ValueError(f"conv_transpose2d: input of {dout.shape[1]} channels and weight {tuple(weight.shape)} "
                         f"do not match groups={groups} (expected a 4-D weight [in_channels, out_channels/groups, "
                         f"kh, kw] with in_channels divisible by groups)")
    weight = weight._contiguous_raw()
    for i in range(2):
        if conv_output_size(input_shape[2 + i], weight.shape[2 + i], stride[i], padding[i], dilation[i]) != \
                dout.shape[2 + i]:
            raise ValueError(f"conv_transpose2d: an output of {tuple(input_shape[2:])} does not convolve back to the "
                             f"input's {tuple(dout.shape[2:])} (output_padding must be smaller than the stride)")
    dx = _empty(tuple(input_shape), dout.dtype, dout.device)
    check(lib.it_conv2d_backward(dout.device.native, dout.dtype.native, dx._ptr(), _NULL, _NULL, dout._ptr(), _NULL,
                                 weight._ptr(), _conv_params(input_shape, weight, stride, padding, dilation, groups)))
    return dx


# ---- pooling ------------------------------------------------------------------------------------
def pool_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:  # the last window would start in the padding
        out -= 1
    return out


def _pool_params(x: Tensor, kernel, stride, padding, dilation, ceil_mode: bool):
    return ffi.new("it_pool2d_params *", dict(
        planes=x.shape[0] * x.shape[1], height=x.shape[2], width=x.shape[3], kernel_h=kernel[0], kernel_w=kernel[1],
        stride_h=stride[0], stride_w=stride[1], pad_h=padding[0], pad_w=padding[1], dilation_h=dilation[0],
        dilation_w=dilation[1], ceil_mode=int(bool(ceil_mode))))


def _pooled_shape(op: str, x: Tensor, kernel, stride, padding, dilation, ceil_mode) -> tuple:
    for i in range(2):
        if kernel[i] < 1 or stride[i] < 1 or dilation[i] < 1:
            raise ValueError(f"{op}: kernel_size {tuple(kernel)}, stride {tuple(stride)} and dilation "
                             f"{tuple(dilation)} must be positive")
        if padding[i] < 0 or 2 * padding[i] > kernel[i]:
            raise ValueError(f"{op}: pad should be at most half of effective kernel size, got padding "
                             f"{tuple(padding)} for kernel_size {tuple(kernel)}")
    oh, ow = (pool_output_size(x.shape[2 + i], kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
              for i in range(2))
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: the input {tuple(x.shape[2:])} is too small for kernel_size {tuple(kernel)}: "
                         f"the output would be {oh} x {ow}")
    return x.shape[0], x.shape[1], oh, ow


@_trace.traced("kernel")
def max_pool2d(x: Tensor, kernel, stride, padding, dilation, ceil_mode: bool):
    """Returns (out, indices) with int64 indices into each plane (y * width + x), as PyTorch."""
    x = _image("max_pool2d", x)
    shape = _pooled_shape("max_pool2d", x, kernel, stride, padding, dilation, ceil_mode)
    out, idx = _empty(shape, x.dtype, x.device), _empty(shape, _dt.int64, x.device)
    check(lib.it_max_pool2d_forward(x.device.native, x.dtype.native, out._ptr(),
                                    ffi.cast("int64_t *", idx.data_ptr()), x._ptr(),
                                    _pool_params(x, kernel, stride, padding, dilation, ceil_mode)))
    return out, idx


@_trace.traced("kernel")
def max_pool2d_backward(dout: Tensor, indices: Tensor, input_shape, kernel, stride, padding, dilation, ceil_mode):
    x = _empty(input_shape, dout.dtype, dout.device)
    dout, indices = dout._contiguous_raw(), indices._contiguous_raw()
    check(lib.it_max_pool2d_backward(x.device.native, x.dtype.native, x._ptr(), dout._ptr(),
                                     ffi.cast("const int64_t *", indices.data_ptr()),
                                     _pool_params(x, kernel, stride, padding, dilation, ceil_mode)))
    return x


@_trace.traced("kernel")
def avg_pool2d(x: Tensor, kernel, stride, padding, ceil_mode: bool, count_include_pad: bool) -> Tensor:
    x = _image("avg_pool2d", x)
    shape = _pooled_shape("avg_pool2d", x, kernel, stride, padding, (1, 1), ceil_mode)
    out = _empty(shape, x.dtype, x.device)
    check(lib.it_avg_pool2d_forward(x.device.native, x.dtype.native, out._ptr(), x._ptr(),
                                    _pool_params(x, kernel, stride, padding, (1, 1), ceil_mode),
                                    int(bool(count_include_pad))))
    return out


@_trace.traced("kernel")
def avg_pool2d_backward(dout: Tensor, input_shape, kernel, stride, padding, ceil_mode, count_include_pad) -> Tensor:
    dx = _empty(input_shape, dout.dtype, dout.device)
    dout = dout._contiguous_raw()
    check(lib.it_avg_pool2d_backward(dx.device.native, dx.dtype.native, dx._ptr(), dout._ptr(),
                                     _pool_params(dx, kernel, stride, padding, (1, 1), ceil_mode),
                                     int(bool(count_include_pad))))
    return dx


@_trace.traced("kernel")
def adaptive_avg_pool2d(x: Tensor, output_size) -> Tensor:
    x = _image("adaptive_avg_pool2d", x)
    oh, ow = output_size
    out = _empty((x.shape[0], x.shape[1], oh, ow), x.dtype, x.device)
    check(lib.it_adaptive_avg_pool2d_forward(x.device.native, x.dtype.native, out._ptr(), x._ptr(),
                                             x.shape[0] * x.shape[1], x.shape[2], x.shape[3], oh, ow))
    return out


@_trace.traced("kernel")
def adaptive_avg_pool2d_backward(dout: Tensor, input_shape) -> Tensor:
    dx = _empty(input_shape, dout.dtype, dout.device)
    dout = dout._contiguous_raw()
    n, c, h, w = input_shape
    check(lib.it_adaptive_avg_pool2d_backward(dx.device.native, dx.dtype.native, dx._ptr(), dout._ptr(), n * c,
                                              h, w, dout.shape[2], dout.shape[3]))
    return dx


# ---- batch normalisation ------------------------------------------------------------------------
def _nc_s(x: Tensor) -> tuple:
    spatial = 1
    for s in x.shape[2:]:
        spatial *= s
    return x.shape[0], x.shape[1], spatial


@_trace.traced("kernel")
def batch_norm(x: Tensor, running_mean, running_var, weight, bias, training: bool, momentum: float, eps: float):
    """x [N, C, *]. Returns (out, save_mean, save_rstd); the running statistics (float32 [C])
    are updated in place when training."""
    if x.ndim < 2:
        raise ValueError(f"batch_norm: expected an input of at least 2 dimensions [N, C, ...], got {tuple(x.shape)}")
    _float32("batch_norm", input=x, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    _checks.same_device("batch_norm", input=x, weight=weight, bias=bias, running_mean=running_mean,
                        running_var=running_var)
    c = x.shape[1]
    for name, t in (("weight", weight), ("bias", bias), ("running_mean", running_mean), ("running_var", running_var)):
        if t is not None:
            _checks.shape_is("batch_norm", name, t, (c,))
            if name.startswith("running") and not t.is_contiguous():
                raise ValueError(f"batch_norm: {name} must be contiguous (it is updated in place)")
    x = x._contiguous_raw()
    n, c, s = _nc_s(x)
    if training and n * s <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {tuple(x.shape)}")
    out = _empty(x.shape, x.dtype, x.device)
    mean, rstd = _empty((c,), _dt.float32, x.device), _empty((c,), _dt.float32, x.device)
    check(lib.it_batchnorm_forward(x.device.native, x.dtype.native, out._ptr(), _f32_ptr(mean), _f32_ptr(rstd),
                                   _f32_ptr(running_mean), _f32_ptr(running_var), x._ptr(), _ptr_or_null(weight),
                                   _ptr_or_null(bias), n, c, s, int(bool(training)), momentum, eps))
    return out, mean, rstd


@_trace.traced("kernel")
def batch_norm_backward(dout: Tensor, x: Tensor, weight, mean: Tensor, rstd: Tensor, training: bool,
                        want=(True, True, True)):
    """Returns (dinput, dweight, dbias), None where not wanted or without a weight."""
    dout, x = dout._contiguous_raw(), x._contiguous_raw()
    n, c, s = _nc_s(x)
    dx = _empty(x.shape, x.dtype, x.device) if want[0] else None
    dw = _empty((c,), x.dtype, x.device) if want[1] and weight is not None else None
    db = _empty((c,), x.dtype, x.device) if want[2] and weight is not None else None
    check(lib.it_batchnorm_backward(x.device.native, x.dtype.native, _ptr_or_null(dx), _ptr_or_null(dw),
                                    _ptr_or_null(db), dout._ptr(), x._ptr(), _ptr_or_null(weight), _f32_ptr(mean),
                                    _f32_ptr(rstd), n, c, s, int(bool(training))))
    return dx, dw, db
