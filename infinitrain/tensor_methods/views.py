"""Tensor methods of shape, views and indexing: view, reshape, flatten, permute, transpose, t, T,
mT, unsqueeze, squeeze, expand, expand_as, narrow, split, chunk, unbind, select, iteration,
x[key] and x[key] = v (PyTorch's advanced indexing with one index tensor, list or bool mask
included), index_select, gather, and those built by index_select and reshape: flip, roll,
repeat, repeat_interleave, nonzero. view() and reshape() give a view wherever the strides allow one
(PyTorch's rule, _view_strides), so a piece of split() can be viewed."""
from __future__ import annotations

import builtins
import math
from .. import dtypes as _dt
from ..kernels import memory
from ..ops import index as _idx
from ..ops import shape as _shape
from ..tensor import Tensor, _contiguous_strides, _wrap_dim


def _values_per_row(value, n: int, row_shape: tuple) -> str:
    """How x[index] = value spreads value over the n selected rows of shape row_shape, as PyTorch
    broadcasts it to the indexing result [n, *row_shape]: "each" (value[j] to row j), "first"
    (value[0] to every row) or "all" (value itself, broadcast to every row); a value that does not
    broadcast is refused with PyTorch's message (it filled every row with the first value)."""
    if not isinstance(value, Tensor) or value.ndim <= len(row_shape):
        shape = tuple(value.shape) if isinstance(value, Tensor) else ()
        if all(a in (1, b) for a, b in zip(reversed(shape), reversed(row_shape))):
            return "all"
    elif value.ndim == len(row_shape) + 1 and value.shape[0] in (1, n) and \
            all(a in (1, b) for a, b in zip(reversed(tuple(value.shape[1:])), reversed(row_shape))):
        return "each" if value.shape[0] == n and n > 1 else "first"
    raise RuntimeError(f"shape mismatch: value tensor of shape {list(value.shape)} cannot be broadcast to "
                       f"indexing result of shape {[n, *row_shape]}")


def _advanced_index(x, key):
    """(the tensor x[key] with the one index tensor, list or bool mask of key replaced by full
    slices, the dimension where that index applies, the index as a tensor), or None when key
    has none. Two index tensors at once (x[i, j]) are refused."""
    import numpy as np
    from ..creation import tensor
    parts = key if isinstance(key, tuple) else (key,)
    advanced = [i for i, k in enumerate(parts) if isinstance(k, (Tensor, list, np.ndarray))]
    if not advanced:
        return None
    if len(advanced) > 1:
        raise NotImplementedError("indexing with more than one index tensor at once (x[i, j]) is not supported; "
                                  "index one dimension at a time")
    at = advanced[0]
    index = parts[at]
    if not isinstance(index, Tensor):
        arr = np.asarray(index)
        index = tensor(arr, dtype=_dt.bool if arr.dtype == np.bool_ else _dt.int64, device=x.device)
    if index.dtype is not _dt.bool and index.dtype.is_floating_point:
        raise IndexError(f"tensors used as indices must be integer or bool, not {index.dtype}")
    width = index.ndim if index.dtype is _dt.bool else 1
    basic = parts[:at] + (slice(None),) * width + parts[at + 1:]
    y = x[basic] if len(basic) > 1 or width > 1 else x[basic[0]]
    # the output dimension where the index's dimensions sit: those before it that survive
    used = builtins.sum(1 for k in basic if k is not None and k is not Ellipsis)
    dim = 0
    for k in parts[:at]:
        if k is Ellipsis:
            dim += x.ndim - used
        elif k is None or isinstance(k, slice):
            dim += 1
    return y, dim, index


def _positions(values, device) -> Tensor:
    """A 1-D int64 index tensor of these positions on device."""
    from ..creation import tensor
    return tensor(list(values), dtype=_dt.int64, device=device)


def _view_strides(shape: tuple, strides: tuple, new_shape: tuple):
    """Strides that read a tensor of (shape, strides) in the new shape without a copy, or None
    when there are none (PyTorch's rule): the old dims are cut into runs in which each dim steps
    over exactly the next one (a run is one block of memory, read in order), and the new dims must
    tile each run in turn; size-1 dims fit anywhere."""
    if math.prod(shape) == 0 or not shape:
        return _contiguous_strides(new_shape)
    out = [0] * len(new_shape)
    j = len(new_shape) - 1
    base, run, tiled = strides[-1], 1, 1  # the run's innermost stride, its size, what the new dims cover
    for i in range(len(shape) - 1, -1, -1):
        run *= shape[i]
        if i > 0 and (shape[i - 1] == 1 or strides[i - 1] == run * base):
            continue  # the run goes on through dim i - 1
        while j >= 0 and (tiled < run or new_shape[j] == 1):
            out[j] = tiled * base
            tiled *= new_shape[j]
            j -= 1
        if tiled != run:
            return None
        if i > 0:
            base, run, tiled = strides[i - 1], 1, 1
    return tuple(out) if j == -1 else None


def _as_view(t: Tensor, shape: tuple, strides: tuple) -> Tensor:
    return _shape.View.apply(t, shape, strides) if t._tracks() else t._view(shape, strides)


class ViewMethods:
    def view(self, *shape) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], _dt.dtype):
            raise NotImplementedError("view(dtype) (reinterpreting the bytes) is not supported; use .to(dtype)")
        shape = self._infer_shape(shape)
        strides = _view_strides(self._shape, self._strides, shape)
        if strides is None:
            raise RuntimeError("view size is not compatible with input tensor's size and stride (at least one "
                               "dimension spans across two contiguous subspaces). Use .reshape(...) instead.")
        return _as_view(self, shape, strides)

    def view_as(self, other: Tensor) -> Tensor:
        return self.view(other.shape)

    def reshape(self, *shape) -> Tensor:
        """A view where the strides allow one (as view()), else a copy."""
        shape = self._infer_shape(shape)
        strides = _view_strides(self._shape, self._strides, shape)
        if strides is not None:
            return _as_view(self, shape, strides)
        t = self.contiguous()
        return _shape.Reshape.apply(t, shape) if t._tracks() else t._reshape_raw(shape)

    def reshape_as(self, other: Tensor) -> Tensor:
        return self.reshape(other.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = _wrap_dim(start_dim, self.ndim), _wrap_dim(end_dim, self.ndim)
        return self.reshape(self._shape[:s] + (math.prod(self._shape[s:e + 1]),) + self._shape[e + 1:])

    def permute(self, *dims) -> Tensor:
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        dims = tuple(_wrap_dim(d, self.ndim) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise ValueError(f"permute(): {dims} is not a permutation of the {self.ndim} "
                             f"dimensions of a tensor of shape {self._shape}")
        return _shape.Permute.apply(self, dims) if self._tracks() else self._permute_raw(dims)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        d0, d1 = _wrap_dim(dim0, self.ndim), _wrap_dim(dim1, self.ndim)
        dims = list(range(self.ndim))
        dims[d0], dims[d1] = dims[d1], dims[d0]
        return self.permute(dims)

    swapaxes = swapdims = transpose

    def movedim(self, source, destination) -> Tensor:
        source = (source,) if isinstance(source, int) else tuple(source)
        destination = (destination,) if isinstance(destination, int) else tuple(destination)
        if len(source) != len(destination):
            raise ValueError(f"movedim: {len(source)} source dims for {len(destination)} destinations")
        src = [_wrap_dim(d, self.ndim) for d in source]
        dst = [_wrap_dim(d, self.ndim) for d in destination]
        rest = iter(d for d in range(self.ndim) if d not in src)
        order = [None] * self.ndim
        for s_, d_ in zip(src, dst):
            order[d_] = s_
        return self.permute([next(rest) if o is None else o for o in order])

    moveaxis = movedim

    def ravel(self) -> Tensor:
        return self.reshape(-1)

    def unflatten(self, dim: int, sizes) -> Tensor:
        d = _wrap_dim(dim, self.ndim)
        return self.reshape(self._shape[:d] + tuple(sizes) + self._shape[d + 1:])

    def broadcast_to(self, size) -> Tensor:
        return self.expand(size)

    def t(self) -> Tensor:
        if self.ndim > 2:
            raise ValueError(f"t() expects a tensor with <= 2 dimensions, got {self.ndim}")
        return self if self.ndim < 2 else self.transpose(0, 1)

    @property
    def T(self) -> Tensor:
        return self.permute(*reversed(range(self.ndim)))

    @property
    def mT(self) -> Tensor:
        return self.transpose(-2, -1)

    def unsqueeze(self, dim: int) -> Tensor:
        d = _wrap_dim(dim, self.ndim + 1)
        return self[(slice(None),) * d + (None,)]

    def squeeze(self, dim: int | None = None) -> Tensor:
        if dim is None:
            key = tuple(0 if n == 1 else slice(None) for n in self._shape)
        else:
            d = _wrap_dim(dim, self.ndim)
            key = (slice(None),) * d + ((0,) if self._shape[d] == 1 else ())
        return self[key]

    def expand(self, *shape) -> Tensor:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if len(shape) < self.ndim:
            raise ValueError(f"expand(): cannot expand shape {self._shape} to {shape}")
        if tuple(shape) == self._shape:
            return self
        return _shape.Expand.apply(self, shape) if self._tracks() else self._expand_raw(shape)

    def expand_as(self, other: Tensor) -> Tensor:
        return self.expand(other.shape)

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        d = _wrap_dim(dim, self.ndim)
        if start < 0:
            start += self._shape[d]
        if not (0 <= start and length >= 0 and start + length <= self._shape[d]):
            raise IndexError(f"narrow(): [{start}, {start + length}) is out of range for "
                             f"dimension {d} of size {self._shape[d]}")
        return self[(slice(None),) * d + (slice(start, start + length),)]

    def split(self, split_size, dim: int = 0) -> list:
        d = _wrap_dim(dim, self.ndim)
        n = self._shape[d]
        if isinstance(split_size, int):
            if split_size <= 0:
                raise ValueError(f"split(): split_size must be > 0, got {split_size}")
            sizes = [builtins.min(split_size, n - i) for i in range(0, n, split_size)] or [0]
        else:
            sizes = list(split_size)
            if builtins.sum(sizes) != n:
                raise ValueError(f"split(): sizes {sizes} do not add up to {n} (dimension {d})")
        out, at = [], 0
        for s in sizes:
            out.append(self.narrow(d, at, s))
            at += s
        return out

    def chunk(self, chunks: int, dim: int = 0) -> list:
        n = self._shape[_wrap_dim(dim, self.ndim)]
        return self.split(builtins.max(1, -(-n // chunks)), dim)

    def unbind(self, dim: int = 0) -> tuple:
        d = _wrap_dim(dim, self.ndim)
        return tuple(self.select(d, i) for i in range(self._shape[d]))

    def select(self, dim: int, index: int) -> Tensor:
        d = _wrap_dim(dim, self.ndim)
        return self[(slice(None),) * d + (index,)]

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __getitem__(self, key) -> Tensor:
        found = _advanced_index(self, key)
        if found is not None:  # an index tensor, list or bool mask: PyTorch's advanced indexing
            y, dim, index = found
            if index.dtype is _dt.bool:  # the mask's dims become one, of the selected positions
                m = index.ndim
                if tuple(index.shape) != tuple(y.shape[dim:dim + m]):
                    raise IndexError(f"a mask of shape {tuple(index.shape)} does not match the indexed "
                                     f"dimensions {tuple(y.shape[dim:dim + m])}")
                y = y.reshape(y.shape[:dim] + (-1,) + y.shape[dim + m:])
                return y.index_select(dim, index.reshape(-1).nonzero().reshape(-1))
            out = y.index_select(dim, index.reshape(-1))
            return out.reshape(y.shape[:dim] + tuple(index.shape) + y.shape[dim + 1:])
        return _shape.Index.apply(self, key) if self._tracks() else self._getitem_raw(key)

    def __setitem__(self, key, value) -> None:
        if self._records("item assignment", value):  # autograd follows it (inplace.py)
            self._setitem_recorded(key, value)
            return
        self._storage.version += 1
        found = _advanced_index(self, key)
        if found is None:
            memory.copy_into(self._getitem_raw(key), value)
            return
        y, dim, index = found  # y: a view of self, so writes into it land in self
        if not isinstance(value, Tensor) and not isinstance(value, (int, float, bool)):
            from ..creation import tensor  # a list or array of values: a tensor of this one's dtype
            value = tensor(value, dtype=self.dtype, device=self.device)
        if index.dtype is _dt.bool and (not isinstance(value, Tensor) or value.ndim == 0):
            # x[mask] = number: one masked fill, the mask aligned with the dims it indexes
            y.masked_fill_(index.reshape(tuple(index.shape) + (1,) * (y.ndim - dim - index.ndim)), value)
            return
        if index.dtype is _dt.bool:
            positions = [tuple(p) for p in index.nonzero().tolist()]
            rows = [y[(slice(None),) * dim + p] for p in positions]
        else:
            rows = [y.select(dim, int(i)) for i in index.reshape(-1).tolist()]
        per_row = _values_per_row(value, len(rows), tuple(rows[0].shape) if rows else ())
        for j, row in enumerate(rows):  # one copy per selected position (x[idx] = v, x[mask] = v)
            memory.copy_into(row, value[j] if per_row == "each" else value[0] if per_row == "first" else value)

    def index_select(self, dim: int, index: Tensor) -> Tensor:
        return _idx.index_select(self, dim, index)

    def gather(self, dim: int, index: Tensor) -> Tensor:
        return _idx.gather(self, dim, index)

    def flip(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        out = self
        for d in dims:
            n = self.shape[_wrap_dim(d, self.ndim)]
            out = out.index_select(d, _positions(list(range(n - 1, -1, -1)), self.device))
        return out

    def roll(self, shifts, dims=None):
        if dims is None:
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(shifts) != len(dims):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
        out = self
        for shift, d in zip(shifts, dims):
            n = self.shape[_wrap_dim(d, self.ndim)]
            if n:
                out = out.index_select(d, _positions([(i - shift) % n for i in range(n)], self.device))
        return out

    def fliplr(self):
        return self.flip(1)

    def flipud(self):
        return self.flip(0)

    def tile(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        return self.repeat((1,) * (self.ndim - len(dims)) + tuple(dims))

    def repeat(self, *sizes):
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if len(sizes) < self.ndim:
            raise ValueError(f"repeat: {len(sizes)} sizes for a tensor of {self.ndim} dimensions")
        x = self.reshape((1,) * (len(sizes) - self.ndim) + tuple(self.shape))
        inter = []  # [r0, n0, r1, n1, ...] expanded, then merged pairwise
        for r, n in zip(sizes, x.shape):
            inter += [r, n]
        expanded = x.reshape(tuple(v for n in x.shape for v in (1, n))).expand(*inter)
        return expanded.reshape(tuple(r * n for r, n in zip(sizes, x.shape)))

    def repeat_interleave(self, repeats, dim=None, *, output_size=None):
        """Each element (each slice along dim) repeated `repeats` times in place, an int or one
        count per element; dim None repeats the flattened tensor. Differentiable (index_select)."""
        import numpy as np
        from ..creation import tensor
        x = self.reshape(-1) if dim is None else self
        d = 0 if dim is None else _wrap_dim(dim, x.ndim)
        n = x.shape[d] if x.ndim else 1
        if isinstance(repeats, Tensor):
            if repeats.dtype.is_floating_point or repeats.ndim > 1:
                raise TypeError("repeat_interleave: repeats must be an int or a 0-d or 1-D integer tensor, "
                                f"got a {repeats.dtype.name} tensor of shape {tuple(repeats.shape)}")
            counts = np.asarray(repeats.tolist(), dtype=np.int64).reshape(-1)
            if counts.size not in (1, n):
                raise ValueError(f"repeat_interleave: {counts.size} repeats for a dimension of size {n}")
        else:
            counts = np.asarray([int(repeats)], dtype=np.int64)
        if (counts < 0).any():
            raise ValueError("repeat_interleave: repeats must be non-negative")
        index = np.repeat(np.arange(n), counts if counts.size == n else counts[0])
        if output_size is not None and output_size != index.size:
            raise ValueError(f"repeat_interleave: output_size={output_size} but the repeats give {index.size}")
        if x.ndim == 0:
            x = x.reshape(1)
        return x.index_select(d, tensor(index, dtype=_dt.int64, device=self.device))

    def nonzero(self, *, as_tuple: builtins.bool = False):
        """The indices of the non-zero elements, [n, ndim] int64 (read on the host)."""
        import numpy as np
        from ..creation import tensor
        idx = np.argwhere(self.detach()._host().numpy() != 0)
        if as_tuple:
            return tuple(tensor(idx[:, d], dtype=_dt.int64, device=self.device) for d in range(self.ndim))
        return tensor(idx.reshape(-1, self.ndim), dtype=_dt.int64, device=self.device)
