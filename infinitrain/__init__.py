"""infinitrain: a training engine with a C/CUDA core and a PyTorch-shaped Python API.

The package is layered bottom to top, each layer importing only those below it: the cffi
binding (`_native`), dtypes and devices, `runtime` (threads, memory counters), `tensor`
(data and raw views), `kernels` (checked native calls), `autograd`, `ops` (differentiable
functions), `tensor_methods` (attaches the user-facing Tensor methods), `amp`, then `nn`,
`optim`, `data`, `checkpoint`, `serialization` (save/load, and
`torch_files`: PyTorch's checkpoints), `models`. This file only gathers the public names.
"""
from __future__ import annotations

from ._native import InvalidArgumentError, NativeError, NoCudaError, NotSupportedError
from .device import device
from .dtypes import (bfloat16, bool, double, dtype, float, float16, float32, float64, half, int,
                    int32, int64, long, promote_types, uint8)
from .dtypes import finfo, get_default_dtype, iinfo, set_default_dtype
from .size import Size
from .runtime import (build_info, empty_cache, get_num_threads, max_memory_allocated,
                      memory_allocated, memory_stats, reset_peak_memory_stats, set_num_threads)
from .tensor import Tensor
from . import tensor_methods  # noqa: F401  (attaches Tensor's methods)
from .dlpack import as_tensor, from_dlpack
from .creation import (arange, empty, empty_like, from_numpy, full, full_like, ones, ones_like,
                       rand, randn, tensor, zeros, zeros_like)
from .creation import eye, linspace, logspace, rand_like, randint, randint_like, randn_like, randperm
from .random import Generator, default_generator, initial_seed, manual_seed
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .functions import (abs, add, allclose, amax, amin, argmax, argmin, argsort, bmm, cat, chunk, clamp,
                        cumsum, div, einsum, exp, flatten, gather, index_select, log, log_softmax, logsumexp,
                        masked_fill, matmul, max, maximum, mean, min, minimum, mm, mul, multinomial,
                        permute, reshape, sigmoid, softmax, sort, split, sqrt, squeeze, stack, sub, sum,
                        tanh, topk, transpose, tril, triu, unsqueeze, where)
from .functions import (all, any, ceil, clip, clone, cos, detach, eq, equal, erf, expm1, fix, flip,  # noqa: F401
                        floor, floor_divide, frac, ge, ger, gt, is_floating_point, is_tensor, isclose, isfinite,
                        isinf, isnan, kthvalue, le, log10, log1p, log2, logical_not, lt, median, narrow, ne, neg,
                        nonzero, norm, numel, outer, pow, reciprocal, relu, repeat_interleave, roll, round, rsqrt,
                        select, sign, sin, square, std, t, trunc, unbind, var)
from .functions import (addmm, bernoulli, count_nonzero, diag, dot, lerp, logical_and, logical_or,  # noqa: F401
                        logical_xor, masked_select, meshgrid, normal, prod, tan)
from .execution import (are_deterministic_algorithms_enabled, compile, inference_mode,  # noqa: F401
                        is_inference_mode_enabled, use_deterministic_algorithms)
from .backends import get_float32_matmul_precision, set_float32_matmul_precision
from . import accelerator, backends, linalg, return_types  # noqa: F401  (it.backends, it.linalg: submodules)
from . import amp, cuda, nn, optim  # noqa: F401  (it.cuda, it.nn, it.optim: public submodules)
from .amp import autocast
from .ops.scatter import index_add, scatter, scatter_add
from .optim import GradScaler  # torch.GradScaler, and torch.amp.GradScaler below
from . import functions as _functions
from .cuda import amp as _cuda_amp  # noqa: F401  (torch.cuda.amp: torch.amp's older spelling, above optim)
# amp sits below tensors, GradScaler works on gradients: it lives with optim and is named here
amp.GradScaler = GradScaler

# torch.<name> for every Tensor method PyTorch also has as a function (those written by other modules too)
_FORMS = [_n for _n in _functions.METHOD_FORMS if _n not in globals()]
globals().update({_n: getattr(_functions, _n) for _n in _FORMS})

__version__ = "0.1.0"

__all__ = [
    "Tensor", "dtype", "device", "Generator", "NativeError", "InvalidArgumentError",
    "NotSupportedError", "NoCudaError", "float32", "float", "float64", "double", "bfloat16",
    "float16", "half", "int32", "int", "int64", "long", "uint8", "bool", "promote_types",
    "empty", "zeros", "ones", "full", "arange", "rand", "randn", "tensor", "from_numpy", "from_dlpack", "as_tensor",
    "empty_like", "zeros_like", "ones_like", "full_like", "manual_seed", "initial_seed",
    "default_generator", "matmul", "mm", "bmm", "einsum", "cat", "stack", "tril", "triu", "where",
    "masked_fill", "gather", "index_select", "cumsum", "topk", "multinomial", "maximum",
    "add", "sub", "mul", "div", "max", "min", "sort", "argsort", "split", "chunk", "flatten", "squeeze",
    "unsqueeze", "transpose", "permute", "reshape", "abs", "tanh", "sigmoid",
    "minimum", "clamp", "sum", "mean", "amax", "amin", "argmax", "argmin", "softmax",
    "log_softmax", "logsumexp", "exp", "log", "sqrt", "allclose",
    "set_num_threads", "get_num_threads", "build_info", "memory_stats", "memory_allocated",
    "max_memory_allocated", "reset_peak_memory_stats", "empty_cache", "no_grad", "enable_grad",
    "is_grad_enabled", "set_grad_enabled", "nn", "optim", "amp", "autocast",
    "save", "load",
    "utils", "multiprocessing",
    "Size", "finfo", "iinfo", "get_default_dtype", "set_default_dtype",
    "eye", "linspace", "logspace", "rand_like", "randint", "randint_like", "randn_like", "randperm",
    "all", "any", "ceil", "clip", "clone", "cos", "detach", "eq", "equal", "erf", "expm1", "fix", "flip",
    "floor", "floor_divide", "frac", "ge", "ger", "gt", "is_floating_point", "is_tensor", "isclose", "isfinite",
    "isinf", "isnan", "kthvalue", "le", "log10", "log1p", "log2", "logical_not", "lt", "median", "narrow", "ne",
    "neg", "nonzero", "norm", "numel", "outer", "pow", "reciprocal", "relu", "repeat_interleave", "roll", "round",
    "rsqrt", "select", "sign", "sin", "square", "std", "t", "trunc", "unbind", "var",
    "are_deterministic_algorithms_enabled", "compile", "inference_mode", "is_inference_mode_enabled",
    "use_deterministic_algorithms", "get_float32_matmul_precision", "set_float32_matmul_precision",
    "addmm", "bernoulli", "count_nonzero", "diag", "dot", "lerp", "logical_and", "logical_or", "logical_xor",
    "masked_select", "meshgrid", "normal", "prod", "tan",
    "accelerator", "backends", "linalg", "return_types", *_FORMS,
]
__all__ += ["scatter", "scatter_add", "index_add"]
__all__ += ["GradScaler"]


# loaded on first use: every process of a multi-rank job imports this package, and most never
# touch these (a tenth of the import time)
_LAZY_MODULES = ("distributed", "utils", "multiprocessing")
_LAZY_NAMES = {"save": "serialization", "load": "serialization"}


def __getattr__(name: str):
    """it.distributed, it.utils, it.multiprocessing (as torch's submodules) and it.save /
    it.load, imported on first use."""
    import importlib
    if name in _LAZY_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
