"""The mixture-of-experts kernels: the routing order, the permutation and the weighted scatter
back (with its backward), and the experts' grouped products (native/src/*/moe.*)."""
from __future__ import annotations

from .. import dtypes as _dt
from .._native import check, ffi, int64_array, lib
from ..tensor import Tensor, _empty
from .. import _trace
from . import _checks
from .memory import convert


def _rows_ptr(rows: Tensor):
    return ffi.cast("int64_t *", rows.data_ptr())


def _check_rows(op: str, rows: Tensor, **tensors) -> Tensor:
    if rows.dtype is not _dt.int64 or rows.ndim != 1:
        raise TypeError(f"{op}: rows must be a 1-D int64 tensor, got {rows.dtype.name} of shape {tuple(rows.shape)}")
    _checks.same_device(op, rows=rows, **tensors)
    return rows._contiguous_raw()


@_trace.traced("kernel")
def sort(expert_ids: Tensor, num_experts: int, keep: Tensor | None = None):
    """expert_ids [tokens, k] -> (rows [A], slots [A], counts [num_experts] on the host as a
    tuple of ints): the kept assignments ordered by expert, then token, then choice."""
    if expert_ids.ndim != 2:
        raise ValueError(f"sort_by_expert: expert ids must be [tokens, k], got shape {tuple(expert_ids.shape)}")
    if expert_ids.dtype.is_floating_point:
        raise TypeError(f"sort_by_expert: expert ids must be integers, got {expert_ids.dtype.name}")
    if keep is not None:
        if tuple(keep.shape) != tuple(expert_ids.shape):
            raise ValueError(f"sort_by_expert: keep must be a mask of the ids' shape {tuple(expert_ids.shape)}, "
                             f"got shape {tuple(keep.shape)}")
        _checks.same_device("sort_by_expert", expert_ids=expert_ids, keep=keep)
        keep = keep._contiguous_raw() if keep.dtype is _dt.bool else convert(keep._contiguous_raw(), _dt.bool)
    ids = expert_ids._contiguous_raw()
    if ids.dtype is not _dt.int64:
        ids = convert(ids, _dt.int64)
    tokens, k = ids.shape
    device = ids.device
    rows = _empty((tokens * k,), _dt.int64, device)
    slots = _empty((tokens * k,), _dt.int64, device)
    counts = _empty((num_experts,), _dt.int64, device)
    check(lib.it_moe_sort(device.native, _rows_ptr(rows), _rows_ptr(slots), _rows_ptr(counts),
                          ffi.cast("int64_t *", ids.data_ptr()),
                          ffi.cast("uint8_t *", keep.data_ptr()) if keep is not None else ffi.NULL,
                          tokens, k, num_experts))
    # the host needs the counts (they size the products and the all-to-all); on a GPU this
    # copy is the synchronisation that reports an expert id out of range
    host = tuple(int(c) for c in counts._host()._array())
    kept = sum(host)
    return rows._getitem_raw(slice(0, kept)), slots._getitem_raw(slice(0, kept)), host


@_trace.traced("kernel")
def permute(x: Tensor, rows: Tensor) -> Tensor:
    """out [A, C] = x [N, C] at rows."""
    rows = _check_rows("permute", rows, input=x)
    if x.ndim != 2:
        raise ValueError(f"permute: the input must be [tokens, C], got shape {tuple(x.shape)}")
    x = x._contiguous_raw()
    out = _empty((rows.shape[0], x.shape[1]), x.dtype, x.device)
    check(lib.it_moe_permute(x.device.native, x.dtype.native, out._ptr(), x._ptr(), _rows_ptr(rows),
                             rows.shape[0], x.shape[0], x.shape[1]))
    return out


@_trace.traced("kernel")
def unpermute(y: Tensor, rows: Tensor, weights: Tensor | None, num_tokens: int) -> Tensor:
    """out [num_tokens, C]: each token's rows of y [A, C] summed, weighted by weights [A]
    (None: unweighted, the permutation's backward)."""
    rows = _check_rows("unpermute", rows, input=y, weights=weights)
    _checks.same_dtype("unpermute", input=y, weights=weights)
    _checks.floating("unpermute", "input", y)
    if y.ndim != 2 or y.shape[0] != rows.shape[0]:
        raise ValueError(f"unpermute: the input must be [{rows.shape[0]}, C] (one row per assignment), "
                         f"got shape {tuple(y.shape)}")
    if weights is not None:
        _checks.shape_is("unpermute", "weights", weights, (rows.shape[0],))
        weights = weights._contiguous_raw()
    y = y._contiguous_raw()
    out = _empty((num_tokens, y.shape[1]), y.dtype, y.device)
    check(lib.it_moe_unpermute(y.device.native, y.dtype.native, out._ptr(), y._ptr(),
                               weights._ptr() if weights is not None else ffi.NULL, _rows_ptr(rows),
                               rows.shape[0], num_tokens, y.shape[1]))
    return out


@_trace.traced("kernel")
def unpermute_backward(grad: Tensor, y: Tensor, rows: Tensor, weights: Tensor, need_y: bool, need_weights: bool):
    """(dy [A, C] or None, dweights [A] or None) of unpermute, given grad [num_tokens, C]."""
    rows = _check_rows("unpermute", rows, grad=grad, input=y, weights=weights)
    grad, y, weights = grad._contiguous_raw(), y._contiguous_raw(), weights._contiguous_raw()
    dy = _empty(y.shape, y.dtype, y.device) if need_y else None
    dw = _empty(weights.shape, weights.dtype, y.device) if need_weights else None
    check(lib.it_moe_unpermute_backward(y.device.native, y.dtype.native, dy._ptr() if dy is not None else ffi.NULL,
                                        dw._ptr() if dw is not None else ffi.NULL, grad._ptr(), y._ptr(),
                                        weights._ptr(), _rows_ptr(rows), rows.shape[0], grad.shape[0],
                                        y.shape[1]))
    return dy, dw


def _pointers(tensors):
    return ffi.new("void *[]", [t._ptr() for t in tensors]) if tensors else ffi.NULL


def _check_group(op: str, x: Tensor, weights, counts):
    _checks.same_device(op, input=x, **{f"weight {e}": w for e, w in enumerate(weights)})
    _checks.same_dtype(op, input=x, **{f"weight {e}": w for e, w in enumerate(weights)})
    _checks.floating(op, "input", x)


@_trace.traced("kernel")
def grouped_linear(x: Tensor, weights, counts) -> Tensor:
    """x [A, in] with counts[e] consecutive rows for expert e, weights[e] [out, in]: out [A, out]."""
    _check_group("grouped_linear", x, weights, counts)
    x = x._contiguous_raw()
    weights = [w._contiguous_raw() for w in weights]
    out_features = weights[0].shape[0] if weights else 0
    out = _empty((x.shape[0], out_features), x.dtype, x.device)
    check(lib.it_moe_grouped_linear_forward(x.device.native, x.dtype.native, out._ptr(), x._ptr(), _pointers(weights),
                                            int64_array(counts), len(counts), x.shape[0], x.shape[1], out_features))
    return out


@_trace.traced("kernel")
def grouped_linear_backward_input(grad: Tensor, weights, counts) -> Tensor:
    """dx [A, in] = grad_e [n_e, out] @ weights[e] per expert."""
    _check_group("grouped_linear", grad, weights, counts)
    grad = grad._contiguous_raw()
    weights = [w._contiguous_raw() for w in weights]
    in_features = weights[0].shape[1] if weights else 0
    dx = _empty((grad.shape[0], in_features), grad.dtype, grad.device)
    check(lib.it_moe_grouped_linear_backward_input(grad.device.native, grad.dtype.native, dx._ptr(), grad._ptr(),
                                                   _pointers(weights), int64_array(counts), len(counts),
                                                   grad.shape[0], in_features, grad.shape[1]))
    return dx


@_trace.traced("kernel")
def grouped_linear_backward_weight(grad: Tensor, x: Tensor, counts) -> list:
    """dweights[e] [out, in] = grad_e^T @ x_e per expert (zeros for an expert without rows)."""
    _checks.same_device("grouped_linear", grad=grad, input=x)
    _checks.same_dtype("grouped_linear", grad=grad, input=x)
    grad, x = grad._contiguous_raw(), x._contiguous_raw()
    dws = [_empty((grad.shape[1], x.shape[1]), x.dtype, x.device) for _ in counts]
    check(lib.it_moe_grouped_linear_backward_weight(x.device.native, x.dtype.native, _pointers(dws), grad._ptr(),
                                                    x._ptr(), int64_array(counts), len(counts), x.shape[0],
                                                    x.shape[1], grad.shape[1]))
    return dws
