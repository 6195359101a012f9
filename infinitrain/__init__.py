"""infinitrain: a training engine with a C/CUDA core and a PyTorch-shaped Python API.

The package is layered bottom to top, each layer importing only those below it: the cffi
binding (`_native`), dtypes and devices, `runtime` (threads, memory counters), `tensor`
(data and raw views), `kernels` (checked native calls), `autograd`, `ops` (differentiable
functions), `tensor_methods` (attaches the user-facing Tensor methods), `amp`, then `nn`,
`optim`, `data`, `checkpoint`, `models`. This file only gathers the public names.
"""
from __future__ import annotations

from ._native import InvalidArgumentError, NativeError, NoCudaError, NotSupportedError
from .device import device
from .dtypes import (bfloat16, bool, double, dtype, float, float16, float32, float64, half, int,
                    int32, int64, long, promote_types, uint8)
from .runtime import (build_info, empty_cache, get_num_threads, max_memory_allocated,
                      memory_allocated, memory_stats, reset_peak_memory_stats, set_num_threads)
from .tensor import Tensor
from . import tensor_methods  # noqa: F401  (attaches Tensor's methods)
from .dlpack import as_tensor, from_dlpack
from .creation import (arange, empty, empty_like, from_numpy, full, full_like, ones, ones_like,
                       rand, randn, tensor, zeros, zeros_like)
from .random import Generator, default_generator, initial_seed, manual_seed
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .functions import (abs, add, allclose, amax, amin, argmax, argmin, argsort, bmm, cat, chunk, clamp,
                        cumsum, div, einsum, exp, flatten, gather, index_select, log, log_softmax, logsumexp,
                        masked_fill, matmul, max, maximum, mean, min, minimum, mm, mul, multinomial,
                        permute, reshape, sigmoid, softmax, sort, split, sqrt, squeeze, stack, sub, sum,
                        tanh, topk, transpose, tril, triu, unsqueeze, where)
from . import amp, cuda, nn, optim  # noqa: F401  (it.cuda, it.nn, it.optim: public submodules)
from .amp import autocast
from .ops.scatter import index_add, scatter, scatter_add

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
]
__all__ += ["scatter", "scatter_add", "index_add"]
