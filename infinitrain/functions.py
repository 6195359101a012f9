"""The torch.* functional forms (infinitrain.where, infinitrain.cat, ...): thin entry points
over the Tensor methods and ops, so that `it.where(c, a, b)` reads as it does in PyTorch."""
from __future__ import annotations

import builtins

from .kernels import index as _kidx
from .ops import index as _idx
from .ops import math as _ops
from .ops import reductions as _reductions
from .ops.shape import cat, stack  # noqa: F401  (re-exported)
from .random import default_generator
from .tensor import Tensor


def matmul(a: Tensor, b: Tensor) -> Tensor:
    return _ops.matmul(a, b)


def mm(a: Tensor, b: Tensor) -> Tensor:
    return a.mm(b)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    return a.bmm(b)


def einsum(equation: str, *operands) -> Tensor:
    from .ops.einsum import einsum as _einsum
    return _einsum(equation, *operands)


def where(condition: Tensor, input, other) -> Tensor:
    return _idx.where(condition, input, other)


def masked_fill(input: Tensor, mask: Tensor, value) -> Tensor:
    return _idx.masked_fill(input, mask, value)


def gather(input: Tensor, dim: int, index: Tensor) -> Tensor:
    return _idx.gather(input, dim, index)


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    return _idx.index_select(input, dim, index)


def cumsum(input: Tensor, dim: int) -> Tensor:
    return _idx.cumsum(input, dim)


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    return input.topk(k, dim, largest, sorted)


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,
                generator=None) -> Tensor:
    """Indices drawn from the rows of non-negative weights (torch.multinomial); for sampling
    from a language model: multinomial(softmax(logits), 1)."""
    return _kidx.multinomial(input.detach(), num_samples, replacement,
                             generator or default_generator)


def maximum(input: Tensor, other: Tensor) -> Tensor:
    return _ops.maximum(input, other, True)


def minimum(input: Tensor, other: Tensor) -> Tensor:
    return _ops.maximum(input, other, False)


def clamp(input: Tensor, min=None, max=None) -> Tensor:  # noqa: A002
    return _ops.clamp(input, min, max)


def sum(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    return _reductions.sum(input, dim, keepdim)


def mean(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return _reductions.mean(input, dim, keepdim)


def amax(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return _reductions.amax(input, dim, keepdim, True)


def amin(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return _reductions.amax(input, dim, keepdim, False)


def argmax(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return input.argmax(dim, keepdim)


def argmin(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    return input.argmin(dim, keepdim)


def softmax(input: Tensor, dim: int) -> Tensor:
    return _ops.softmax(input, dim)


def log_softmax(input: Tensor, dim: int) -> Tensor:
    return _idx.log_softmax(input, dim)


def logsumexp(input: Tensor, dim, keepdim: bool = False) -> Tensor:
    return _idx.logsumexp(input, dim, keepdim)


def exp(input: Tensor) -> Tensor:
    return input.exp()


def log(input: Tensor) -> Tensor:
    return input.log()


def sqrt(input: Tensor) -> Tensor:
    return input.sqrt()


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    return _ops.triangle(input, diagonal, False)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    return _ops.triangle(input, diagonal, True)


def allclose(a: Tensor, b: Tensor, rtol: float = 1e-5, atol: float = 1e-8) -> bool:
    import numpy as np
    return bool(np.allclose(a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy(),
                            rtol=rtol, atol=atol))


# ---- arithmetic, order and shape, as torch.add / torch.max / torch.reshape ... --------------

def add(input, other, *, alpha=1) -> Tensor:
    return input + (other if alpha == 1 else other * alpha)


def sub(input, other, *, alpha=1) -> Tensor:
    return input - (other if alpha == 1 else other * alpha)


def mul(input, other) -> Tensor:
    return input * other


def div(input, other, *, rounding_mode=None) -> Tensor:
    if rounding_mode is None:
        return input / other
    if rounding_mode == "floor":
        return input // other
    raise NotImplementedError(f"div: rounding_mode={rounding_mode!r} ('floor' and None are implemented)")


def _max_or_min(which: str, input: Tensor, dim=None, keepdim: bool = False):
    if isinstance(dim, Tensor):  # torch.max(a, b): elementwise
        return maximum(input, dim) if which == "max" else minimum(input, dim)
    return getattr(input, which)() if dim is None else getattr(input, which)(dim, keepdim)


def max(input: Tensor, dim=None, keepdim: bool = False):  # noqa: A001
    """The largest value; with dim, (values, indices) along it; with a tensor, the elementwise maximum."""
    return _max_or_min("max", input, dim, keepdim)


def min(input: Tensor, dim=None, keepdim: bool = False):  # noqa: A001
    return _max_or_min("min", input, dim, keepdim)


def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    return input.sort(dim, descending, stable)


def argsort(input: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
    return input.argsort(dim, descending)


def split(tensor: Tensor, split_size_or_sections, dim: int = 0) -> tuple:
    return tensor.split(split_size_or_sections, dim)


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple:
    return input.chunk(chunks, dim)


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return input.flatten(start_dim, end_dim)


def squeeze(input: Tensor, dim=None) -> Tensor:
    return input.squeeze() if dim is None else input.squeeze(dim)


def unsqueeze(input: Tensor, dim: int) -> Tensor:
    return input.unsqueeze(dim)


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    return input.transpose(dim0, dim1)


def permute(input: Tensor, dims) -> Tensor:
    return input.permute(*dims)


def reshape(input: Tensor, shape) -> Tensor:
    return input.reshape(*shape)


def abs(input: Tensor) -> Tensor:  # noqa: A001
    return input.abs()


def tanh(input: Tensor) -> Tensor:
    return input.tanh()


def sigmoid(input: Tensor) -> Tensor:
    return input.sigmoid()


# ---- the torch.* forms of the other Tensor methods: torch.sin(x) is x.sin() ------------------
# PyTorch's functions that are also Tensor methods (as of 2.x); each gets its form here once Tensor
# has the method and this module has not written one of its own (where, max, split, ... above)
TORCH_METHOD_FORMS = (
    "abs", "abs_", "absolute", "acos", "acos_", "acosh", "acosh_", "add", "addbmm", "addcdiv", "addcmul", "addmm",
    "addmv", "addmv_", "addr", "adjoint", "all", "allclose", "amax", "amin", "aminmax", "angle", "any", "arccos",
    "arccos_", "arccosh", "arccosh_", "arcsin", "arcsin_", "arcsinh", "arcsinh_", "arctan", "arctan2", "arctan_",
    "arctanh", "arctanh_", "argmax", "argmin", "argsort", "argwhere", "as_strided", "as_strided_",
    "as_strided_scatter", "asin", "asin_", "asinh", "asinh_", "atan", "atan2", "atan_", "atanh", "atanh_",
    "baddbmm", "bernoulli", "bincount", "bitwise_and", "bitwise_left_shift", "bitwise_not", "bitwise_or",
    "bitwise_right_shift", "bitwise_xor", "bmm", "broadcast_to", "ceil", "ceil_", "cholesky", "cholesky_inverse",
    "cholesky_solve", "chunk", "clamp", "clamp_", "clamp_max", "clamp_max_", "clamp_min", "clamp_min_", "clip",
    "clip_", "clone", "conj", "conj_physical", "conj_physical_", "copysign", "corrcoef", "cos", "cos_", "cosh",
    "cosh_", "count_nonzero", "cov", "cross", "cummax", "cummin", "cumprod", "cumsum", "deg2rad", "deg2rad_",
    "dequantize", "det", "detach", "detach_", "diag", "diag_embed", "diagflat", "diagonal", "diagonal_scatter",
    "diff", "digamma", "dist", "div", "divide", "dot", "dsplit", "eig", "eq", "equal", "erf", "erf_", "erfc",
    "erfc_", "erfinv", "exp", "exp2", "exp2_", "exp_", "expm1", "expm1_", "fill_", "fix", "fix_", "flatten", "flip",
    "fliplr", "flipud", "float_power", "floor", "floor_", "floor_divide", "fmax", "fmin", "fmod", "frac", "frac_",
    "frexp", "gather", "gcd", "gcd_", "ge", "geqrf", "ger", "get_device", "greater", "greater_equal", "gt",
    "hardshrink", "hash_tensor", "heaviside", "histc", "histogram", "hsplit", "hypot", "i0", "i0_", "igamma",
    "igammac", "imag", "index_add", "index_copy", "index_fill", "index_put", "index_put_", "index_reduce",
    "index_select", "inner", "int_repr", "inverse", "is_complex", "is_conj", "is_distributed", "is_floating_point",
    "is_inference", "is_neg", "is_nonzero", "is_same_size", "is_signed", "isclose", "isfinite", "isinf", "isnan",
    "isneginf", "isposinf", "isreal", "istft", "kron", "kthvalue", "lcm", "lcm_", "ldexp", "ldexp_", "le", "lerp",
    "less", "less_equal", "lgamma", "log", "log10", "log10_", "log1p", "log1p_", "log2", "log2_", "log_",
    "log_softmax", "logaddexp", "logaddexp2", "logcumsumexp", "logdet", "logical_and", "logical_not", "logical_or",
    "logical_xor", "logit", "logit_", "logsumexp", "lstsq", "lt", "lu", "lu_solve", "masked_fill", "masked_scatter",
    "masked_select", "matmul", "matrix_exp", "matrix_power", "max", "maximum", "mean", "median", "min", "minimum",
    "mm", "mode", "moveaxis", "movedim", "msort", "mul", "multinomial", "multiply", "mv", "mvlgamma", "nan_to_num",
    "nan_to_num_", "nanmean", "nanmedian", "nanquantile", "nansum", "narrow", "narrow_copy", "ne", "neg", "neg_",
    "negative", "negative_", "nextafter", "nonzero", "nonzero_static", "norm", "not_equal", "numel", "orgqr",
    "ormqr", "outer", "permute", "pinverse", "polygamma", "positive", "pow", "prelu", "prod", "put",
    "q_per_channel_axis", "q_per_channel_scales", "q_per_channel_zero_points", "q_scale", "q_zero_point", "qr",
    "qscheme", "quantile", "rad2deg", "rad2deg_", "ravel", "real", "reciprocal", "reciprocal_", "relu", "relu_",
    "remainder", "renorm", "repeat_interleave", "reshape", "resize_as_", "resize_as_sparse_", "resolve_conj",
    "resolve_neg", "roll", "rot90", "round", "round_", "rsqrt", "rsqrt_", "scatter", "scatter_add",
    "scatter_reduce", "select", "select_scatter", "sgn", "sigmoid", "sigmoid_", "sign", "signbit", "sin", "sin_",
    "sinc", "sinc_", "sinh", "sinh_", "slice_inverse", "slice_scatter", "slogdet", "smm", "softmax", "solve",
    "sort", "split", "split_with_sizes", "sqrt", "sqrt_", "square", "square_", "squeeze", "sspaddmm", "std", "stft",
    "sub", "subtract", "sum", "svd", "swapaxes", "swapdims", "symeig", "t", "take", "take_along_dim", "tan", "tan_",
    "tanh", "tanh_", "tensor_split", "tile", "topk", "trace", "transpose", "triangular_solve", "tril", "triu",
    "true_divide", "trunc", "trunc_", "unbind", "unflatten", "unique", "unique_consecutive", "unsafe_chunk",
    "unsafe_split", "unsafe_split_with_sizes", "unsqueeze", "var", "vdot", "vsplit", "where", "xlogy", "xlogy_",
    "zero_",
)


def _method_form(name: str):
    def form(input: Tensor, *args, **kwargs):
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}(): argument 'input' must be a Tensor, not {type(input).__name__}")
        return getattr(input, name)(*args, **kwargs)
    form.__name__ = form.__qualname__ = name
    form.__doc__ = f"torch.{name}(input, ...): input.{name}(...)."
    return form


def pow(input, exponent) -> Tensor:  # noqa: A001
    """input ** exponent, where input may be a number and exponent a tensor."""
    if not isinstance(input, Tensor):
        return _ops.rpow(exponent, input)
    return input.pow(exponent)


def repeat_interleave(input: Tensor, repeats=None, dim=None, *, output_size=None) -> Tensor:
    """input.repeat_interleave(repeats, dim); with input alone (the counts), each index repeated so often."""
    if repeats is None:
        from .creation import arange
        return arange(input.numel(), device=input.device).repeat_interleave(input, output_size=output_size)
    return input.repeat_interleave(repeats, dim, output_size=output_size)


def norm(input: Tensor, p="fro", dim=None, keepdim: bool = False, out=None, dtype=None) -> Tensor:
    if out is not None:
        raise NotImplementedError("norm(out=) is not supported")
    return input.norm(p, dim, keepdim, dtype)


def is_tensor(obj) -> bool:
    return isinstance(obj, Tensor)


def isclose(input: Tensor, other: Tensor, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Tensor:
    """|input - other| <= atol + rtol * |other| elementwise (infinities equal when they match)."""
    a, b = input.detach(), other.detach() if isinstance(other, Tensor) else other
    close = ((a - b).abs() <= atol + rtol * (b.abs() if isinstance(b, Tensor) else builtins.abs(b))) | (a == b)
    if equal_nan:
        close = close | (a.isnan() & (b.isnan() if isinstance(b, Tensor) else (a != a)))
    return close


def equal(input: Tensor, other: Tensor) -> bool:
    """True when both have the same shape and the same values."""
    return tuple(input.shape) == tuple(other.shape) and bool((input.detach() == other.detach()).all())


def normal(mean, std=1.0, size=None, *, generator=None, dtype=None, device=None,
           requires_grad: bool = False) -> Tensor:
    """Normal draws of the given mean and std (tensors broadcast together, or numbers with a size);
    differentiable in a tensor mean and std, as PyTorch's."""
    from .creation import randn
    tensors = [t for t in (mean, std) if isinstance(t, Tensor)]
    if not tensors:
        if size is None:
            raise TypeError("normal(mean, std, size): with numbers for mean and std, give size")
        out = randn(size, generator=generator, dtype=dtype, device=device) * std + mean
        return out.requires_grad_(requires_grad) if requires_grad else out
    if size is not None:
        raise TypeError("normal(): size is for numbers mean and std; tensors give the shape")
    from .kernels.elementwise import broadcast_shapes
    like = tensors[0]
    shape = broadcast_shapes(*(t.shape for t in tensors))
    return randn(shape, generator=generator, dtype=like.dtype, device=like.device) * std + mean


def meshgrid(*tensors, indexing: str | None = None) -> tuple:
    """Coordinate grids from 1-D tensors: 'ij' (PyTorch's default) gives them the shape
    (len(t0), len(t1), ...), 'xy' swaps the first two dims, as numpy's."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    indexing = "ij" if indexing is None else indexing
    if indexing not in ("ij", "xy"):
        raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    swap = indexing == "xy" and len(tensors) >= 2
    order = list(tensors)
    if swap:
        order[0], order[1] = order[1], order[0]
    shape = tuple(t.numel() for t in order)
    grids = []
    for i, t in enumerate(order):
        view = (1,) * i + (-1,) + (1,) * (len(order) - i - 1)
        grids.append(t.reshape(view).expand(shape))
    if swap:
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


# last, so that the forms written above (pow, norm, isclose, ...) are not made twice
METHOD_FORMS = tuple(n for n in TORCH_METHOD_FORMS if n not in globals() and hasattr(Tensor, n))
for _name in METHOD_FORMS:
    globals()[_name] = _method_form(_name)
