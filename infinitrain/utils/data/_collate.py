"""default_collate and default_convert, as torch.utils.data's: a list of samples becomes one
batch of infinitrain tensors, with the samples' structure (dicts, tuples, lists, named
tuples) kept and each leaf stacked along a new first dimension."""
from __future__ import annotations

import collections.abc

import numpy as np

from ...creation import from_numpy, tensor
from ...dtypes import float64
from ...functions import stack
from ...tensor import Tensor

_NOT_COLLATABLE = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"


def _from_array(a: np.ndarray) -> Tensor:
    if a.dtype.kind in "SaUO":
        raise TypeError(_NOT_COLLATABLE.format(a.dtype))
    return from_numpy(np.ascontiguousarray(a))


def default_collate(batch):
    """Tensors are stacked; numpy arrays and numpy scalars stacked into a tensor of their
    dtype; Python floats into a float64 tensor, ints into int64 (bools into bool); strings
    are left a list; a mapping becomes a mapping of collated fields, a tuple a list of
    collated positions (as PyTorch's), another sequence of the same type."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return stack(list(batch), 0)
    if isinstance(elem, (np.ndarray, np.bool_, np.number)):
        if isinstance(elem, np.ndarray) and elem.dtype.kind in "SaUO":
            raise TypeError(_NOT_COLLATABLE.format(elem.dtype))
        return _from_array(np.stack([np.asarray(b) for b in batch]))
    if isinstance(elem, float):
        return tensor(list(batch), dtype=float64)
    if isinstance(elem, int):
        return tensor(list(batch))
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        fields = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(fields)
        except TypeError:  # a mapping type that cannot be built from a dict
            return fields
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # a named tuple
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        if len({len(e) for e in batch}) != 1:
            raise RuntimeError("each element in list of batch should be of equal size")
        columns = [default_collate(list(s)) for s in zip(*batch)]
        if isinstance(elem, tuple):
            return columns
        try:
            return type(elem)(columns)
        except TypeError:
            return columns
    raise TypeError(_NOT_COLLATABLE.format(type(elem)))


def default_convert(data):
    """One sample as tensors, not batched (the loader's collate when batch_size=None):
    numpy arrays and scalars become tensors; containers are walked; the rest is kept."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, (np.ndarray, np.bool_, np.number)):
        return data if isinstance(data, np.ndarray) and data.dtype.kind in "SaUO" else _from_array(np.asarray(data))
    if isinstance(data, collections.abc.Mapping):
        fields = {key: default_convert(data[key]) for key in data}
        try:
            return type(data)(fields)
        except TypeError:
            return fields
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        try:
            return type(data)([default_convert(d) for d in data])
        except TypeError:
            return [default_convert(d) for d in data]
    return data
