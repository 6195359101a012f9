"""Fused optimizer updates, in place on parameter and state tensors."""
from __future__ import annotations

from .. import dtypes as _dt
from .._native import check, ffi, lib
from ..tensor import Tensor
from .. import _trace
from . import _checks


def _state(op: str, name: str, s: Tensor, param: Tensor) -> None:
    if s.dtype is not _dt.float32 or s.shape != param.shape or not s.is_contiguous():
        raise ValueError(f"{op}: {name} must be a contiguous float32 tensor of shape "
                         f"{tuple(param.shape)}, got {s.dtype.name} {tuple(s.shape)}")


def _param_and_grad(op: str, param: Tensor, grad: Tensor) -> Tensor:
    _checks.floating(op, "param", param)
    _checks.same_device(op, param=param, grad=grad)
    _checks.same_dtype(op, param=param, grad=grad)
    _checks.shape_is(op, "grad", grad, param.shape)
    if not param.is_contiguous():
        raise ValueError(f"{op}: param must be contiguous")
    return grad._contiguous_raw()


@_trace.traced("kernel")
def adamw_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, lr: float,
               beta1: float, beta2: float, eps: float, weight_decay: float, step: int) -> None:
    grad = _param_and_grad("adamw", param, grad)
    _state("adamw", "exp_avg", exp_avg, param)
    _state("adamw", "exp_avg_sq", exp_avg_sq, param)
    check(lib.it_adamw_step(param.device.native, param.dtype.native, param._ptr(), grad._ptr(),
                            ffi.cast("float *", exp_avg.data_ptr()),
                            ffi.cast("float *", exp_avg_sq.data_ptr()), param.numel(), lr, beta1,
                            beta2, eps, weight_decay, step))


@_trace.traced("kernel")
def adamw_step_multi(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, *, lr: float, beta1: float,
                     beta2: float, eps: float, weight_decay: float, step: int) -> None:
    """adamw_step on every (param, grad, exp_avg, exp_avg_sq), all on one device in one dtype:
    one launch on a GPU."""
    if not params:
        return
    first = params[0]
    grads = [_param_and_grad("adamw", p, g) for p, g in zip(params, grads)]
    for p, m, v in zip(params, exp_avgs, exp_avg_sqs):
        _checks.same_device("adamw", param=first, other_param=p)
        _checks.same_dtype("adamw", param=first, other_param=p)
        _state("adamw", "exp_avg", m, p)
        _state("adamw", "exp_avg_sq", v, p)
    n = len(params)
    check(lib.it_adamw_step_multi(first.device.native, first.dtype.native,
                                  ffi.new("void *[]", [p._ptr() for p in params]),
                                  ffi.new("void *[]", [g._ptr() for g in grads]),
                                  ffi.new("float *[]", [ffi.cast("float *", m.data_ptr()) for m in exp_avgs]),
                                  ffi.new("float *[]", [ffi.cast("float *", v.data_ptr()) for v in exp_avg_sqs]),
                                  ffi.new("int64_t[]", [p.numel() for p in params]), n, lr, beta1, beta2, eps,
                                  weight_decay, step))


@_trace.traced("kernel")
def sgd_step(param: Tensor, grad: Tensor, momentum_buf: Tensor | None, *, lr: float,
             momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
             nesterov: bool = False, first_step: bool = False) -> None:
    grad = _param_and_grad("sgd", param, grad)
    buf = ffi.NULL
    if momentum_buf is not None:
        _state("sgd", "momentum_buffer", momentum_buf, param)
        buf = ffi.cast("float *", momentum_buf.data_ptr())
    check(lib.it_sgd_step(param.device.native, param.dtype.native, param._ptr(), grad._ptr(), buf,
                          param.numel(), lr, momentum, dampening, weight_decay, int(nesterov),
                          int(first_step)))
