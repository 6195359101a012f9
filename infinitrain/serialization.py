"""infinitrain.save and infinitrain.load, PyTorch's torch.save and torch.load without pickled code
on disk.

`save` writes one safetensors file: each storage its tensors view (the part of it they span) is
an array, and the structure of the object (dicts, lists, tuples, numbers, strings, ...) is JSON
in the file's metadata, with each tensor's dtype, shape, strides, offset, device and
requires_grad. Nothing in it can run code when loaded. What torch.load(weights_only=True)
accepts is what it stores; anything else (an object of a class, a function, a Module) is refused
with the place inside the object where it was found.

`load` reads those files, and PyTorch's own (the zip format torch.save writes since 1.6) through
torch_files, without PyTorch and without running any pickled code.
"""
from __future__ import annotations

import base64
import io
import json
import math
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np

from . import dtypes as _dt
from .device import device as Device
from .io import DataFormatError
from .nn.parameter import Parameter
from .size import Size
from .tensor import Tensor
from .torch_files import checked_view, load_torch_zip, refuse_unknown

FORMAT = "infinitrain.save"
VERSION = 1
_HEADER_LIMIT = 100 << 20  # bytes of safetensors header (JSON) this reads at most


# ---- where loaded tensors go -----------------------------------------------------------------

def placement(map_location, name: str):
    """A function (CPU tensor, location saved with it) -> the tensor where it is to go, from
    torch.load's map_location: None (where it was saved), a device or its name, a dict from
    saved location to location, or a callable(storage, location) returning the storage (here
    the storage is given as a 1-D CPU tensor, and must be returned as a tensor of its dtype and
    length)."""
    if map_location is None or isinstance(map_location, (str, Device)):
        fixed = None if map_location is None else _device(str(map_location), name, "map_location")
        return lambda t, location: _moved(t, fixed or _device(location, name, "saved location"), location, name)
    if isinstance(map_location, dict):
        table = {str(k): v for k, v in map_location.items()}
        return lambda t, location: _moved(t, _device(str(table.get(location, location)), name, "map_location"),
                                          location, name)
    if callable(map_location):
        def call(t, location):
            out = map_location(t, location)
            if out is None:  # torch's convention for "leave it where the default puts it"
                return _moved(t, _device(location, name, "saved location"), location, name)
            if not isinstance(out, Tensor) or out.dtype is not t.dtype or out.shape != t.shape:
                raise TypeError(f"map_location returned {type(out).__name__} for a storage of {t.numel()} "
                                f"{t.dtype.name} elements; it must return the storage it is given (a 1-D "
                                f"infinitrain tensor), moved where it should go (e.g. storage.cuda())")
            return out
        return call
    raise TypeError(f"map_location must be None, a device, a device name ('cpu', 'cuda:0'), a dict from saved "
                    f"location to location, or a callable(storage, location); got {type(map_location).__name__}")


def _device(spec: str, name: str, what: str) -> Device:
    try:
        return Device(spec)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {what} {spec!r} is not a device infinitrain has ('cpu', 'cuda', 'cuda:N'); "
                         f"pass map_location='cpu' (or a dict mapping {spec!r} to one)") from None


def _moved(t: Tensor, dev: Device, location: str, name: str) -> Tensor:
    if dev.type == "cuda":
        from . import cuda
        if not cuda.is_available():
            raise RuntimeError(f"{name}: its tensors were saved on {location} and are to be loaded on {dev}, but "
                               f"this machine has no CUDA device; pass map_location='cpu' to load them on the CPU")
    return t if dev == t.device else t.to(dev)


# ---- save ------------------------------------------------------------------------------------

_ALLOWED = ("tensors, Parameters, Size, dict, OrderedDict, list, tuple, set, int, float, complex, bool, str, bytes, "
            "bytearray, None, dtypes and devices")


class _Encoder:
    """The JSON form of an object, and the storages its tensors view."""

    def __init__(self):
        self.groups = {}  # (id(storage), dtype name) -> [storage, dtype, first element, end, key]
        self.tensor_nodes = []  # (node, group, its first element)

    def encode(self, v, path: str, active: set):
        t = type(v)
        if v is None or t in (bool, int, str):
            return v
        if t is float:
            return v if math.isfinite(v) else {"float": repr(v)}
        if t is complex:
            return {"complex": [self.encode(v.real, path, active), self.encode(v.imag, path, active)]}
        if t in (bytes, bytearray):
            return {t.__name__: base64.b64encode(v).decode("ascii")}
        if t is _dt.dtype:
            return {"dtype": v.name}
        if t is Device:
            return {"device": str(v)}
        if t in (Tensor, Parameter):
            return self._tensor(v, path)
        if t is Size:  # a shape (torch.Size in a PyTorch program)
            return {"size": [int(n) for n in v]}
        if t in (dict, OrderedDict, list, tuple, set):
            if id(v) in active:
                raise ValueError(f"infinitrain.save: {path} contains itself; a file cannot hold a cycle")
            active.add(id(v))
            try:
                if t in (dict, OrderedDict):
                    items = [[self.encode(k, f"{path} (a key)", active), self.encode(x, f"{path}[{k!r}]", active)]
                             for k, x in v.items()]
                    return {"dict" if t is dict else "odict": items}
                items = sorted(v, key=repr) if t is set else v  # a set's order is arbitrary; a file's is not
                return {t.__name__: [self.encode(x, f"{path}[{i}]", active) for i, x in enumerate(items)]}
            finally:
                active.discard(id(v))
        name = f"{t.__module__}.{t.__qualname__}"
        hint = "save its state_dict() instead, and load it with load_state_dict()" \
            if hasattr(v, "state_dict") else "store its contents as plain values instead"
        raise TypeError(f"infinitrain.save cannot store {path} (of type {name}): it stores {_ALLOWED} (files that "
                        f"cannot run code when loaded, as torch.load(weights_only=True) reads); {hint}")

    def _tensor(self, t: Tensor, path: str) -> dict:
        if t._storage.is_released:
            raise RuntimeError(f"infinitrain.save: {path}'s memory was released: {t._storage.ptr.why}")
        node = {"tensor": None, "dtype": t.dtype.name, "shape": list(t.shape), "stride": list(t.stride()),
                "offset": 0, "device": str(t.device), "requires_grad": bool(t.requires_grad),
                "parameter": isinstance(t, Parameter)}
        if t.numel():
            first = t._offset
            end = first + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
            group = self.groups.setdefault((id(t._storage), t.dtype.name),
                                           [t._storage, t.dtype, first, end, f"s{len(self.groups)}"])
            group[2], group[3] = min(group[2], first), max(group[3], end)
            self.tensor_nodes.append((node, group, first))
        return node

    def arrays(self) -> dict:
        """{key: array} of the stored part of each storage; fixes each tensor's offset to it."""
        from .checkpoint.format import _to_numpy
        out = {}
        for storage, dtype, first, end, key in self.groups.values():
            span = Tensor._make(storage, (end - first,), (1,), first, dtype)
            out[key] = _to_numpy(span)[0]
        for node, group, first in self.tensor_nodes:
            node["tensor"], node["offset"] = group[4], first - group[2]
        return out


def save(obj, f, pickle_module=None, pickle_protocol: int = 2) -> None:
    """Writes obj to f (a path or a binary file object) as torch.save does, in a file that cannot
    run code when loaded (see the module's docstring); infinitrain.load reads it back."""
    if pickle_module not in (None, pickle):
        raise TypeError("infinitrain.save: pickle_module is not supported; it writes no pickle")
    encoder = _Encoder()
    tree = encoder.encode(obj, "obj", set())
    arrays = encoder.arrays()
    metadata = {"format": FORMAT, "version": str(VERSION), "structure": json.dumps(tree)}
    if isinstance(f, (str, os.PathLike)):
        from safetensors.numpy import save_file
        from .checkpoint.format import _write_safetensors
        path = Path(f)
        if path.is_dir():
            raise IsADirectoryError(f"infinitrain.save: {path} is a directory; give a file's path")
        if not path.parent.is_dir():
            raise FileNotFoundError(f"infinitrain.save: the folder {path.parent} does not exist")
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        try:
            _write_safetensors(save_file, arrays, tmp, metadata)
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        return
    if not hasattr(f, "write"):
        raise TypeError(f"infinitrain.save: f must be a path or a binary file object, got {type(f).__name__}")
    from safetensors.numpy import save as to_bytes
    f.write(to_bytes(arrays, metadata=metadata))


# ---- load ------------------------------------------------------------------------------------

def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, **pickle_load_args):
    """Reads what infinitrain.save or torch.save wrote (see the module's docstring) from a path or
    a binary file object. weights_only: PyTorch's default (True) is the only behaviour: no
    pickled code runs, whatever is passed (a file that needs some is refused, naming what it
    needs). mmap=True (f a path): the tensors on the CPU are the file's bytes mapped copy-on-write,
    not read (writes to them stay in this process)."""
    if pickle_module not in (None, pickle) or pickle_load_args:
        raise TypeError("infinitrain.load: pickle_module and pickle load arguments "
                        f"({', '.join(pickle_load_args) or 'pickle_module'}) are not supported; it unpickles "
                        "only PyTorch's own checkpoint structure")
    if weights_only not in (None, True, False) or mmap not in (None, True, False):
        raise TypeError("infinitrain.load: weights_only and mmap are True, False or None")
    name, source = _source(f)
    if mmap and not isinstance(source, Path):
        raise ValueError("infinitrain.load: mmap=True needs f to be a file's path, not a file object")
    with open(source, "rb") if isinstance(source, Path) else io.BytesIO(source) as fh:
        head = fh.read(300)
        if _maybe_ours(head):  # the whole safetensors header: its length, then its JSON
            head += fh.read(max(0, min(int.from_bytes(head[:8], "little"), _HEADER_LIMIT) + 8 - len(head)))
    where = placement(map_location, name)
    if head[:4] == b"PK\x03\x04" or head[:4] == b"PK\x05\x06":
        return load_torch_zip(source, name, where, bool(mmap))
    if _maybe_ours(head):
        return _load_ours(source, head, name, where, bool(mmap))
    refuse_unknown(head, name)


def _maybe_ours(head: bytes) -> bool:
    return len(head) >= 9 and head[8:9] == b"{"


def _source(f) -> tuple:
    """(name for messages, the path to read from or the bytes that were read from f)."""
    if isinstance(f, (str, os.PathLike)):
        from .io import input_file
        return str(f), input_file(f, "infinitrain.load:")
    if not hasattr(f, "read"):
        raise TypeError(f"infinitrain.load: f must be a path or a binary file object, got {type(f).__name__}")
    data = f.read()
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError("infinitrain.load: the file object must be opened in binary mode ('rb')")
    return str(getattr(f, "name", None) or f"<{type(f).__name__}>"), bytes(data)


def _load_ours(source, head: bytes, name: str, where, mmap: bool):
    n = int.from_bytes(head[:8], "little")
    try:
        if n > min(len(head) - 8, _HEADER_LIMIT):
            raise ValueError(f"its header claims {n} bytes, the file has {len(head) - 8} after the length")
        metadata = json.loads(head[8:8 + n]).get("__metadata__") or {}
    except (ValueError, AttributeError, UnicodeDecodeError) as e:
        raise DataFormatError(f"{name} is neither infinitrain.save's file nor PyTorch's: it looks like a "
                              f"safetensors file but is damaged or truncated ({e})") from None
    if metadata.get("format") != FORMAT:
        raise DataFormatError(f"{name} is a safetensors file not written by infinitrain.save; read its tensors "
                              "with safetensors.numpy.load_file (or a model's from_pretrained)")
    if metadata.get("version") != str(VERSION):
        raise DataFormatError(f"{name} was written by infinitrain.save format version {metadata.get('version')}; "
                              f"this infinitrain reads version {VERSION}")
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load as from_bytes
    try:
        tree = json.loads(metadata["structure"])
        if isinstance(source, Path):  # read storage by storage, not the whole file at once
            with safe_open(str(source), framework="numpy") as opened:  # (which checks the header)
                arrays = _Mapped(source, json.loads(head[8:8 + n]), 8 + n) if mmap else _Arrays(opened)
                return _Decoder(arrays, name, where).decode(tree)
        return _Decoder(from_bytes(source), name, where).decode(tree)
    except (SafetensorError, ValueError, KeyError) as e:
        if isinstance(e, DataFormatError):
            raise
        raise DataFormatError(f"{name} is damaged or truncated ({type(e).__name__}: {str(e)[:200]})") from None


class _Arrays:
    """The arrays of an open safetensors file, read when asked for."""

    def __init__(self, opened):
        self.opened, self.keys = opened, set(opened.keys())

    def __contains__(self, key) -> bool:
        return key in self.keys

    def __getitem__(self, key):
        return self.opened.get_tensor(key)


class _Mapped:
    """The arrays of a safetensors file whose header safe_open has checked, memory-mapped
    copy-on-write when asked for."""

    DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "U8": np.uint8, "U16": np.uint16, "BOOL": np.bool_}

    def __init__(self, path: Path, header: dict, data_start: int):
        self.path, self.header, self.start = path, header, data_start

    def __contains__(self, key) -> bool:
        return key != "__metadata__" and key in self.header

    def __getitem__(self, key):
        entry = self.header[key]
        dtype, shape = self.DTYPES[entry["dtype"]], tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if end == begin:
            return np.zeros(shape, dtype)
        return np.memmap(self.path, dtype=dtype, mode="c", offset=self.start + begin, shape=shape)


class _Decoder:
    def __init__(self, arrays: dict, name: str, where):
        self.arrays, self.name, self.where, self.bases = arrays, name, where, {}

    def bad(self, what: str):
        return DataFormatError(f"{self.name}: {what} (damaged file?)")

    def decode(self, node):
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is not dict:
            raise self.bad(f"unexpected {str(node)[:80]} in its structure")
        if "tensor" in node:
            return self._tensor(node)
        if len(node) != 1:
            raise self.bad(f"unexpected {str(node)[:80]} in its structure")
        (kind, body), = node.items()
        if kind == "size" and type(body) is list and all(type(n) is int and n >= 0 for n in body):
            return Size(body)
        if kind in ("list", "tuple", "set") and type(body) is list:
            items = [self.decode(x) for x in body]
            return items if kind == "list" else tuple(items) if kind == "tuple" else set(items)
        if kind in ("dict", "odict") and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
            return (dict if kind == "dict" else OrderedDict)((self.decode(k), self.decode(v)) for k, v in body)
        if kind == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if kind == "complex" and type(body) is list and len(body) == 2:
            return complex(self.decode(body[0]), self.decode(body[1]))
        if kind in ("bytes", "bytearray") and type(body) is str:
            return (bytes if kind == "bytes" else bytearray)(base64.b64decode(body))
        if kind == "dtype" and body in _dt._BY_NAME:
            return _dt._BY_NAME[body]
        if kind == "device" and type(body) is str:
            return _device(body, self.name, "device")
        raise self.bad(f"unexpected {str(node)[:80]} in its structure")

    def _tensor(self, node: dict):
        dtype = _dt._BY_NAME.get(node.get("dtype"))
        key, device = node.get("tensor"), node.get("device")
        if dtype is None or type(device) is not str or (key is not None and key not in self.arrays):
            raise self.bad(f"a tensor entry {str(node)[:120]} names no dtype, device or stored array")
        if key is None:  # no elements
            from .creation import empty
            base = self.where(empty(0, dtype=dtype), device)
        else:
            base = self.bases.get((key, device))
            if base is None:
                from .checkpoint.format import _from_numpy
                a = self.arrays[key]
                base = self.where(_from_numpy(a if a.flags.writeable else np.array(a), dtype.name).reshape(-1),
                                  device)
                self.bases[(key, device)] = base
            if base.dtype is not dtype:
                raise self.bad(f"array {key} holds {base.dtype.name}, its tensor says {dtype.name}")
        t = checked_view(base, node.get("offset"), node.get("shape"), node.get("stride"), self.name)
        requires_grad = node.get("requires_grad") is True
        if node.get("parameter") is True:
            return Parameter(t, requires_grad)
        return t.requires_grad_(requires_grad) if requires_grad else t
