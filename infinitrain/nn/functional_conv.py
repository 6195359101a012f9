"""torch.nn.functional's convolution, pooling, batch and group normalisation (gathered into
infinitrain.nn.functional). 1-D convolution is the 2-D one over images of height 1."""
from __future__ import annotations

from .. import amp
from .. import dtypes as _dt
from ..ops import conv as _conv
from ..ops import layers as _nn
from ..tensor import Tensor


def _tuple(value, n: int, name: str) -> tuple:
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) == 1:
        value *= n
    if len(value) != n or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{name} must be an int or a tuple of {n} ints, got {value!r}")
    return value


def _widened(*tensors):
    """16-bit tensors in float32 for the kernels (float32 only; PyTorch's 16-bit CPU kernels
    accumulate in float32 too), and the dtype to round the result back to."""
    wide = tuple(t.float() if t is not None and t.dtype in (_dt.bfloat16, _dt.float16) else t for t in tensors)
    return wide, tensors[0].dtype


def _narrowed(out, dtype):
    return out if out.dtype is dtype else out.to(dtype)


def _batched(op: str, x: Tensor, dims: int):
    """An unbatched input (one image) as a batch of one, and whether it was."""
    if x.ndim == dims + 1:
        return x.unsqueeze(0), True
    if x.ndim != dims + 2:
        raise ValueError(f"{op}: expected a {dims + 1}-D (unbatched) or {dims + 2}-D (batched) input, "
                         f"got shape {tuple(x.shape)}")
    return x, False


def _same_padding(op: str, kernel: tuple, stride: tuple, dilation: tuple):
    """padding='same': (before, after) per dimension; the odd one out goes after, as PyTorch."""
    if any(s != 1 for s in stride):
        raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
    total = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return [(t // 2, t - t // 2) for t in total]


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    x, unbatched = _batched("conv2d", input, 2)
    (x, weight, bias), dtype = _widened(*amp.lower(x, weight, bias))
    stride, dilation = _tuple(stride, 2, "stride"), _tuple(dilation, 2, "dilation")
    crop = (0, 0)
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"conv2d: padding must be 'same', 'valid', an int or a tuple, got {padding!r}")
        pads = [(0, 0), (0, 0)] if padding == "valid" else \
            _same_padding("conv2d", tuple(weight.shape[2:]), stride, dilation)
        # an even kernel pads one more after than before: both sides by the larger amount, and
        # the output's first row/column (one padded position too early) dropped
        padding, crop = tuple(b for _, b in pads), tuple(b - a for a, b in pads)
    padding = _tuple(padding, 2, "padding")
    out = _conv.conv2d(x, weight, bias, stride, padding, dilation, groups)
    for dim, extra in ((2, crop[0]), (3, crop[1])):
        if extra:
            out = out.narrow(dim, extra, x.shape[dim])
    out = _narrowed(out, dtype)
    return out.squeeze(0) if unbatched else out


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """PyTorch's (its argument order: groups before dilation); weight [in_channels,
    out_channels/groups, kh, kw]. output_padding must be smaller than the stride."""
    x, unbatched = _batched("conv_transpose2d", input, 2)
    (x, weight, bias), dtype = _widened(*amp.lower(x, weight, bias))
    stride, padding = _tuple(stride, 2, "stride"), _tuple(padding, 2, "padding")
    output_padding, dilation = _tuple(output_padding, 2, "output_padding"), _tuple(dilation, 2, "dilation")
    if weight.ndim != 4:
        raise ValueError(f"conv_transpose2d: weight must be 4-D [in_channels, out_channels/groups, kh, kw], "
                         f"got shape {tuple(weight.shape)}")
    if any(not 0 <= p < s for p, s in zip(output_padding, stride)):
        raise ValueError(f"conv_transpose2d: output_padding {output_padding} must be at least 0 and smaller than "
                         f"the stride {stride}")
    out_hw = tuple((x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (weight.shape[2 + i] - 1)
                   + output_padding[i] + 1 for i in range(2))
    if min(out_hw) < 1:
        raise ValueError(f"conv_transpose2d: the output would be {out_hw[0]} x {out_hw[1]}")
    out = _conv.conv_transpose2d(x, weight, out_hw, stride, padding, dilation, groups)
    if bias is not None:
        out = out + bias.view(1, -1, 1, 1)
    out = _narrowed(out, dtype)
    return out.squeeze(0) if unbatched else out


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    x, unbatched = _batched("conv1d", input, 1)
    if weight.ndim != 3:
        raise ValueError(f"conv1d: weight must be 3-D [out_channels, in_channels/groups, kernel], "
                         f"got shape {tuple(weight.shape)}")
    if not isinstance(padding, str):
        padding = (0,) + _tuple(padding, 1, "padding")
    out = conv2d(x.unsqueeze(2), weight.unsqueeze(2), bias, (1,) + _tuple(stride, 1, "stride"), padding,
                 (1,) + _tuple(dilation, 1, "dilation"), groups).squeeze(2)
    return out.squeeze(0) if unbatched else out


def _pool_args(kernel_size, stride, padding):
    kernel = _tuple(kernel_size, 2, "kernel_size")
    stride = kernel if stride is None or (not isinstance(stride, int) and len(stride) == 0) \
        else _tuple(stride, 2, "stride")
    return kernel, stride, _tuple(padding, 2, "padding")


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
               return_indices: bool = False):
    x, unbatched = _batched("max_pool2d", input, 2)
    kernel, stride, padding = _pool_args(kernel_size, stride, padding)
    (x,), dtype = _widened(x)
    out = _conv.max_pool2d(x, kernel, stride, padding, _tuple(dilation, 2, "dilation"), ceil_mode, return_indices)
    out = (_narrowed(out[0], dtype), out[1]) if return_indices else _narrowed(out, dtype)
    if unbatched:
        return tuple(t.squeeze(0) for t in out) if return_indices else out.squeeze(0)
    return out


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override=None) -> Tensor:
    if divisor_override is not None:
        raise NotImplementedError("avg_pool2d: divisor_override is not supported; divide the sum yourself "
                                  "(avg_pool2d(x, k, count_include_pad=True) * k*k / divisor)")
    x, unbatched = _batched("avg_pool2d", input, 2)
    kernel, stride, padding = _pool_args(kernel_size, stride, padding)
    (x,), dtype = _widened(x)
    out = _narrowed(_conv.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad), dtype)
    return out.squeeze(0) if unbatched else out


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    x, unbatched = _batched("adaptive_avg_pool2d", input, 2)
    size = (output_size, output_size) if isinstance(output_size, int) or output_size is None else tuple(output_size)
    if len(size) != 2:
        raise ValueError(f"adaptive_avg_pool2d: output_size must be an int or a pair, got {output_size!r}")
    size = tuple(x.shape[2 + i] if s is None else s for i, s in enumerate(size))
    if any(not isinstance(s, int) or s < 1 for s in size):
        raise ValueError(f"adaptive_avg_pool2d: output_size must be positive, got {output_size!r}")
    (x,), dtype = _widened(x)
    out = _narrowed(_conv.adaptive_avg_pool2d(x, size), dtype)
    return out.squeeze(0) if unbatched else out


def batch_norm(input: Tensor, running_mean, running_var, weight=None, bias=None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    if not training and (running_mean is None or running_var is None):
        raise ValueError("batch_norm: running_mean and running_var are needed when training=False")
    if weight is None and bias is not None:  # the kernel takes a bias only with a weight
        from ..creation import ones
        weight = ones(input.shape[1], dtype=bias.dtype, device=bias.device)
    (x, weight, bias), dtype = _widened(*amp.full(input, weight, bias))
    return _narrowed(_conv.batch_norm(x, weight, bias, running_mean, running_var, training,
                                      0.0 if momentum is None else momentum, eps), dtype)


def group_norm(input: Tensor, num_groups: int, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """Layer norm of each group's channels together (the layer-norm kernels, exactly), then
    the per-channel affine map."""
    if input.ndim < 2 or input.shape[1] % num_groups:
        raise ValueError(f"group_norm: the input's channels (shape {tuple(input.shape)}) must be divisible "
                         f"by num_groups={num_groups}")
    n, c = input.shape[0], input.shape[1]
    out = _nn.layer_norm(input.reshape(n, num_groups, -1), None, None, eps).reshape(input.shape)
    affine = (1, c) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(affine)
    if bias is not None:
        out = out + bias.reshape(affine)
    return out
