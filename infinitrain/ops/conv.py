"""Differentiable convolution, pooling and batch normalisation over the native kernels."""
from __future__ import annotations

from ..autograd import Function
from ..kernels import conv as kconv


class Conv2d(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(x, weight)
        ctx.geometry = (stride, padding, dilation, groups)
        ctx.has_bias = bias is not None
        return kconv.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        dx, dw, db = kconv.conv2d_backward(g, x, weight, *ctx.geometry, want=want)
        return dx, dw, db, None, None, None, None


class ConvTranspose2d(Function):
    """conv2d run backwards: the forward pass is conv2d's input gradient, the backward pass a
    conv2d of the gradient (for the input) and conv2d's weight gradient with the roles of input
    and output gradient exchanged (for the weight). The bias is added outside, by the caller."""
    @staticmethod
    def forward(ctx, x, weight, out_hw, stride, padding, dilation, groups):
        ctx.save_for_backward(x, weight)
        ctx.geometry = (stride, padding, dilation, groups)
        shape = (x.shape[0], weight.shape[1] * groups, *out_hw)
        return kconv.conv2d_input_grad(x, weight, shape, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        dx = kconv.conv2d(g, weight, None, *ctx.geometry) if ctx.needs_input_grad[0] else None
        dw = kconv.conv2d_backward(x, g, weight, *ctx.geometry, want=(False, True, False))[1] \
            if ctx.needs_input_grad[1] else None
        return dx, dw, None, None, None, None, None


class MaxPool2d(Function):
    """Returns (values, int64 indices); only the values take a gradient."""

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, dilation, ceil_mode):
        out, indices = kconv.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)
        ctx.save_for_backward(indices)
        ctx.args = (x.shape, kernel, stride, padding, dilation, ceil_mode)
        return out, indices

    @staticmethod
    def backward(ctx, g, _):
        (indices,) = ctx.saved_tensors
        return (kconv.max_pool2d_backward(g, indices, *ctx.args),) + (None,) * 5


class AvgPool2d(Function):
    @staticmethod
    def forward(ctx, x, kernel, stride, padding, ceil_mode, count_include_pad):
        ctx.args = (x.shape, kernel, stride, padding, ceil_mode, count_include_pad)
        return kconv.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad)

    @staticmethod
    def backward(ctx, g):
        return (kconv.avg_pool2d_backward(g, *ctx.args),) + (None,) * 5


class AdaptiveAvgPool2d(Function):
    @staticmethod
    def forward(ctx, x, output_size):
        ctx.input_shape = x.shape
        return kconv.adaptive_avg_pool2d(x, output_size)

    @staticmethod
    def backward(ctx, g):
        return kconv.adaptive_avg_pool2d_backward(g, ctx.input_shape), None


class BatchNorm(Function):
    """Batch statistics when `training` (the running ones, if given, updated in place), else
    the running statistics."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
        out, mean, rstd = kconv.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.training, ctx.has_bias = training, bias is not None
        return out

    @staticmethod
    def backward(ctx, g):
        x, weight, mean, rstd = ctx.saved_tensors
        want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        dx, dw, db = kconv.batch_norm_backward(g, x, weight, mean, rstd, ctx.training, want)
        return dx, dw, db, None, None, None, None, None


def conv2d(x, weight, bias, stride, padding, dilation, groups):
    return Conv2d.apply(x, weight, bias, stride, padding, dilation, groups)


def conv_transpose2d(x, weight, out_hw, stride, padding, dilation, groups):
    return ConvTranspose2d.apply(x, weight, out_hw, stride, padding, dilation, groups)


def max_pool2d(x, kernel, stride, padding, dilation, ceil_mode, return_indices=False):
    out, indices = MaxPool2d.apply(x, kernel, stride, padding, dilation, ceil_mode)
    return (out, indices) if return_indices else out


def avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad):
    return AvgPool2d.apply(x, kernel, stride, padding, ceil_mode, count_include_pad)


def adaptive_avg_pool2d(x, output_size):
    return AdaptiveAvgPool2d.apply(x, output_size)


def batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return BatchNorm.apply(x, weight, bias, running_mean, running_var, training, momentum, eps)
