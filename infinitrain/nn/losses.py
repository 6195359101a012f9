"""The loss functions of torch.nn.functional (re-exported there): cross_entropy (class indices or
probabilities, logits [C], [N, C] or [N, C, d1, ...]), nll_loss, binary_cross_entropy (with
logits), l1_loss, mse_loss, with PyTorch's signatures, class weights and reductions."""
from __future__ import annotations

from .. import dtypes as _dt
from ..ops import index as _idx
from ..ops import layers as _nn
from ..tensor import Tensor

_REDUCTIONS = ("mean", "sum", "none")


def reduction_of(what: str, size_average, reduce, reduction: str) -> str:
    """The reduction, with PyTorch's reading of the deprecated size_average and reduce."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        reduction = "mean" if size_average and reduce else ("sum" if reduce else "none")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{what}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return reduction


def _reduce(losses: Tensor, reduction: str) -> Tensor:
    return losses if reduction == "none" else (losses.sum() if reduction == "sum" else losses.mean())


def _classes_last(what: str, input: Tensor, target: Tensor):
    """input [C], [N, C] or [N, C, d1, ...] with class-index target [], [N] or [N, d1, ...], as
    logits [M, C] and targets [M] (the class dimension moved last)."""
    if input.ndim == 0:
        raise ValueError(f"{what}: input must have a class dimension, got a 0-dimensional tensor")
    if input.ndim == 1:
        expected = ()
    else:
        expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        hint = (" (logits [..., C] with targets [...]: reshape them to [M, C] and [M])"
                if tuple(target.shape) == tuple(input.shape[:-1]) else "")
        raise ValueError(f"{what}: expected target of shape {expected} for input {tuple(input.shape)} "
                         f"(PyTorch's [N, C, d1, ...] with [N, d1, ...]), got {tuple(target.shape)}{hint}")
    classes = input.shape[-1] if input.ndim <= 2 else input.shape[1]
    if input.ndim > 2:
        input = input.permute(0, *range(2, input.ndim), 1)
    return input.reshape(-1, classes), target.reshape(-1), expected


def _check_class_target(what: str, target: Tensor) -> None:
    if not isinstance(target, Tensor) or target.dtype not in (_dt.int32, _dt.int64):
        got = target.dtype.name if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"{what}: target must hold class indices (int32 or int64) or, for cross_entropy, "
                        f"probabilities of the input's shape; got {got}")


def _check_weight(what: str, weight, classes: int) -> None:
    if weight is not None and (not isinstance(weight, Tensor) or tuple(weight.shape) != (classes,)):
        got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"{what}: weight must be a tensor of shape ({classes},), one per class, got {got}")


def _weighted_picks(logp: Tensor, targets: Tensor, weight, ignore_index: int):
    """-logp at each target times its class weight (0 where ignored), and those weights."""
    keep = targets != ignore_index
    safe = _idx.where(keep, targets, 0).long()
    picked = _idx.gather(logp, -1, safe.unsqueeze(-1)).squeeze(-1)
    w = keep.to(dtype=logp.dtype)
    if weight is not None:
        w = _idx.index_select(weight.to(dtype=logp.dtype), 0, safe) * w
    return _idx.where(keep, -picked * w, 0.0), w


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
             ignore_index: int = -100, reduce=None, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities input [C], [N, C] or [N, C, d1, ...] at
    the class targets; 'mean' divides by the targets' summed weights."""
    reduction = reduction_of("nll_loss", size_average, reduce, reduction)
    _check_class_target("nll_loss", target)
    flat, targets, shape = _classes_last("nll_loss", input, target)
    _check_weight("nll_loss", weight, flat.shape[-1])
    losses, w = _weighted_picks(flat, targets, weight, ignore_index)
    if reduction == "none":
        return losses.reshape(shape)
    return losses.sum() if reduction == "sum" else losses.sum() / w.sum()


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
                  ignore_index: int = -100, reduce=None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """PyTorch's: logits input [C], [N, C] or [N, C, d1, ...]; target class indices [], [N] or
    [N, d1, ...] (ignore_index counting for nothing), or class probabilities of input's shape.
    With label_smoothing e, the target is (1 - e) * itself + e / C spread over the classes."""
    reduction = reduction_of("cross_entropy", size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if isinstance(target, Tensor) and target.dtype.is_floating_point:
        return _cross_entropy_probabilities(input, target, weight, reduction, label_smoothing)
    _check_class_target("cross_entropy", target)
    flat, targets, shape = _classes_last("cross_entropy", input, target)
    classes = flat.shape[-1]
    _check_weight("cross_entropy", weight, classes)
    if weight is None and not label_smoothing:  # the fused kernel, reduction and all
        out = _nn.cross_entropy(flat, targets, classes, ignore_index, reduction)
        return out.reshape(shape) if reduction == "none" else out
    if weight is None:  # the fused kernel's negative log-likelihood, and the smoothing's term
        nll = _nn.cross_entropy(flat, targets, classes, ignore_index, "none")
        w = (targets != ignore_index).to(dtype=nll.dtype)
        logp = _idx.log_softmax(flat, -1)
        spread = -logp.sum(-1) * w
    else:
        logp = _idx.log_softmax(flat, -1)
        nll, w = _weighted_picks(logp, targets, weight, ignore_index)
        spread = -(logp * weight.to(dtype=logp.dtype)).sum(-1) * (targets != ignore_index).to(dtype=logp.dtype)
    losses = nll if not label_smoothing else (1 - label_smoothing) * nll + (label_smoothing / classes) * spread
    if reduction == "none":
        return losses.reshape(shape)
    return losses.sum() if reduction == "sum" else losses.sum() / w.sum()


def _cross_entropy_probabilities(input, target, weight, reduction, label_smoothing):
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"cross_entropy: probability targets must have the input's shape "
                         f"{tuple(input.shape)}, got {tuple(target.shape)}")
    dim = 0 if input.ndim == 1 else 1
    classes = input.shape[dim]
    _check_weight("cross_entropy", weight, classes)
    logp = _idx.log_softmax(input, dim)
    if label_smoothing:
        target = target * (1 - label_smoothing) + label_smoothing / classes
    terms = logp * target
    if weight is not None:
        terms = terms * weight.to(dtype=logp.dtype).reshape(classes, *([1] * (input.ndim - dim - 1)))
    return _reduce(-terms.sum(dim), reduction)


def _same_shape(what: str, input: Tensor, target: Tensor) -> None:
    if not isinstance(input, Tensor) or not isinstance(target, Tensor):
        raise TypeError(f"{what}: input and target must be tensors")
    if tuple(input.shape) != tuple(target.shape):
        raise ValueError(f"{what}: input {tuple(input.shape)} and target {tuple(target.shape)} differ in shape")


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
                         reduce=None, reduction: str = "mean") -> Tensor:
    """-weight (y log x + (1 - y) log(1 - x)) of probabilities x, each log held at -100 or
    above as PyTorch does (so x = 0 or 1 gives a finite loss)."""
    reduction = reduction_of("binary_cross_entropy", size_average, reduce, reduction)
    _same_shape("binary_cross_entropy", input, target)
    if input.numel() and (input.detach().min().item() < 0 or input.detach().max().item() > 1):
        raise ValueError("binary_cross_entropy: every element of input must be a probability in [0, 1] "
                         "(for logits use binary_cross_entropy_with_logits)")
    x, y = input.detach(), target.detach()
    log_x, log_1mx = x.log().clamp(min=-100), (1 - x).log().clamp(min=-100)
    losses = -(y * log_x + (1 - y) * log_1mx)
    # PyTorch's gradients, finite at x = 0 or 1 (where log's is infinite and the clamp's zero
    # would make NaN): d/dx = (x - y) / max(x (1 - x), 1e-12), d/dy = log(1 - x) - log(x), both
    # clamped logs (PyTorch's d/dy is +-inf there); attached as value + grad * (t - t.detach()),
    # which adds 0 and has that gradient
    if input.requires_grad:
        losses = losses + ((x - y) / (x * (1 - x)).clamp(min=1e-12)) * (input - x)
    if target.requires_grad:
        losses = losses + (log_1mx - log_x) * (target - y)
    return _reduce(losses if weight is None else losses * weight, reduction)


def _softplus_of_negative(x: Tensor) -> Tensor:
    """log(1 + exp(-x)) without overflow, its gradient -sigmoid(-x) everywhere (x = 0 included:
    both branches below are taken on the same side, so their derivatives add up right)."""
    negative = x < 0
    return _idx.where(negative, -x, 0.0) + (1 + _idx.where(negative, x, -x).exp()).log()


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average=None, reduce=None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """binary_cross_entropy of sigmoid(input), computed from the logits (no overflow);
    pos_weight (broadcast over the last dimension, one per class) weighs the positive term."""
    reduction = reduction_of("binary_cross_entropy_with_logits", size_average, reduce, reduction)
    _same_shape("binary_cross_entropy_with_logits", input, target)
    softplus = _softplus_of_negative(input)  # -log sigmoid(x)
    if pos_weight is None:
        losses = (1 - target) * input + softplus
    else:
        losses = (1 - target) * input + ((pos_weight - 1) * target + 1) * softplus
    return _reduce(losses if weight is None else losses * weight, reduction)


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    reduction = reduction_of("l1_loss", size_average, reduce, reduction)
    _same_shape("l1_loss", input, target)
    return _reduce((input - target).abs(), reduction)


def mse_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    reduction = reduction_of("mse_loss", size_average, reduce, reduction)
    _same_shape("mse_loss", input, target)
    diff = input - target
    return _reduce(diff * diff, reduction)
