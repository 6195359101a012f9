"""PyTorch's checkpoint files (torch.save's zip format, PyTorch 1.6 and later) read without
PyTorch and without running pickled code.

Such a file is a zip archive: `<name>/data.pkl` pickles the object, each storage is the raw
bytes of `<name>/data/<key>`, named in data.pkl by a persistent id ('storage', storage type,
key, location, number of elements), and `<name>/byteorder` says the bytes' order. data.pkl is
read by a restricted unpickler that names only what torch.load(weights_only=True) accepts:
containers, tensor and Parameter rebuilding, storage types, dtypes, devices. Any other global
(a class of the program, os.system, ...) is refused before anything is called, and the one
opcode that sets attributes (BUILD) is only accepted on an OrderedDict (a state_dict's
_metadata), so nothing in the file can reach into an object's memory.
"""
from __future__ import annotations

import codecs
import io
import math
import pickle
import zipfile
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np

from . import dtypes as _dt
from .creation import from_numpy
from .device import device as Device
from .io import DataFormatError
from .nn.parameter import Parameter
from .size import Size
from .tensor import Tensor

# the element type of each of torch's storage classes, by torch's dtype name
_STORAGE_DTYPES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
                   "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
                   "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
                   "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128",
                   "UntypedStorage": "uint8"}
_TORCH_DTYPES = {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                 "complex64", "complex128", "float", "double", "half", "long", "int", "short", "cfloat", "cdouble",
                 "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "complex32", "chalf"}
_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32"}
_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")


def checked_view(base: Tensor, offset, shape, stride, name: str) -> Tensor:
    """The view of base (a 1-D tensor over a whole stored storage) that a file describes, after
    checking it lies inside base: a damaged or crafted file is refused, never read out of
    bounds."""
    ints = lambda v: isinstance(v, (list, tuple)) and all(type(n) is int and n >= 0 for n in v)  # noqa: E731
    if type(offset) is not int or offset < 0 or not ints(shape) or not ints(stride) or len(shape) != len(stride):
        raise DataFormatError(f"{name}: a tensor has shape {shape!r}, strides {stride!r} and offset {offset!r}, "
                              "which are not lists of non-negative integers of one length (damaged file?)")
    numel = math.prod(shape)
    end = offset + sum((n - 1) * s for n, s in zip(shape, stride)) + 1 if numel else 0
    if end > base.numel():
        raise DataFormatError(f"{name}: a tensor of shape {tuple(shape)} (strides {tuple(stride)}, offset "
                              f"{offset}) reaches past its storage of {base.numel()} elements (damaged file?)")
    return base._view(tuple(shape), tuple(stride), base._offset + offset)


class _StorageType:
    """What torch.FloatStorage & co. stand for in data.pkl: an element type."""

    def __init__(self, torch_dtype: str):
        self.torch_dtype = torch_dtype


class _TypeName:
    """torch.Tensor or torch.nn.Parameter as data.pkl names them: only _rebuild_from_type_v2 reads
    them, so that no opcode can call or instantiate a tensor class itself."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


_TENSOR, _PARAMETER = _TypeName("torch.Tensor"), _TypeName("torch.nn.Parameter")


class _Stored:
    """One storage of the file: its bytes, read once, and its tensors on their device."""

    def __init__(self, raw: bytes, location: str, big_endian: bool):
        self.raw, self.location, self.big_endian, self.bases = raw, location, big_endian, {}


class _StorageRef:
    """A storage as data.pkl hands it to a tensor's rebuilding: the stored bytes and their dtype."""

    def __init__(self, stored: _Stored, dtype: _dt.dtype):
        self.stored, self.dtype = stored, dtype


def _supported(torch_dtype: str, name: str) -> _dt.dtype:
    found = _dt._BY_NAME.get(_ALIASES.get(torch_dtype, torch_dtype))
    if found is None:
        have = ", ".join(d.name for d in _dt.ALL)
        raise NotImplementedError(f"{name} holds a tensor of dtype torch.{torch_dtype}, which infinitrain does not "
                                  f"have (it has {have}); convert it in PyTorch before saving (e.g. t.float())")
    return found


class _Unpickler(pickle._Unpickler):
    """Python's unpickler (not the C one: its opcodes can be restricted) with find_class limited to
    what rebuilds tensors and plain containers."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, name: str, where, big_endian: bool,
                 mapped: Path | None):
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self.archive, self.prefix, self.name, self.where, self.big_endian = archive, prefix, name, where, big_endian
        self.mapped = mapped
        self.stored = {}

    def _load_build(self):
        state = self.stack.pop()
        inst = self.stack[-1]
        if type(inst) is OrderedDict and type(state) is dict and all(type(k) is str for k in state):
            inst.__dict__.update(state)  # a state_dict's _metadata (versions of its modules' layouts)
            return
        raise pickle.UnpicklingError(f"{self.name}: data.pkl sets the state of a {type(inst).__name__}, which "
                                     "no PyTorch checkpoint does; refusing it (a crafted or damaged file?)")

    dispatch[pickle.BUILD[0]] = _load_build

    def find_class(self, module: str, name: str):
        module = "builtins" if module == "__builtin__" else module
        found = self._allowed(module, name)
        if found is None:
            raise pickle.UnpicklingError(
                f"{self.name} needs {module}.{name} to load, which infinitrain.load refuses: it reads tensors, "
                "Parameters, containers and plain Python values only (what torch.load(weights_only=True) reads), "
                "since loading any other object can run any code on this machine (and it never runs such code, "
                "whatever weights_only says). If you trust the file, load it with PyTorch and save what you need "
                "as tensors and plain values (e.g. the model's state_dict()).")
        return found

    def _allowed(self, module: str, name: str):
        plain = {("collections", "OrderedDict"): OrderedDict, ("collections", "Counter"): Counter,
                 ("builtins", "set"): set, ("builtins", "frozenset"): frozenset, ("builtins", "bytearray"): bytearray,
                 ("builtins", "complex"): complex, ("_codecs", "encode"): _encode, ("torch", "Size"): Size,
                 ("torch", "device"): _torch_device, ("torch", "Tensor"): _TENSOR,
                 ("torch.nn.parameter", "Parameter"): _PARAMETER,
                 ("torch._utils", "_rebuild_tensor"): self._rebuild_tensor,
                 ("torch._utils", "_rebuild_tensor_v2"): self._rebuild_tensor_v2,
                 ("torch._utils", "_rebuild_tensor_v3"): self._rebuild_tensor_v3,
                 ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
                 ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter_with_state,
                 ("torch._tensor", "_rebuild_from_type_v2"): self._rebuild_from_type_v2}
        if (module, name) in plain:
            return plain[(module, name)]
        if module in ("torch", "torch.storage") and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        if module == "torch" and name in _TORCH_DTYPES:
            return _supported(name, self.name)
        if module in ("torch._utils", "torch.serialization", "torch._tensor") and name.startswith(("_rebuild",
                                                                                                   "_get_layout")):
            raise NotImplementedError(f"{self.name} holds a tensor rebuilt by {module}.{name} (a quantized, sparse, "
                                      "nested, meta or subclass tensor); infinitrain reads dense tensors only")
        return None

    def persistent_load(self, pid):
        if not (type(pid) is tuple and len(pid) == 5 and pid[0] in ("storage", b"storage")
                and isinstance(pid[1], _StorageType) and type(pid[2]) is str and type(pid[3]) is str
                and type(pid[4]) is int and pid[4] >= 0):
            raise pickle.UnpicklingError(f"{self.name}: data.pkl refers to {str(pid)[:100]}, which is not one of "
                                         "its storages (a damaged file, or not one torch.save wrote)")
        _, kind, key, location, numel = pid
        if key not in self.stored:
            entry = f"{self.prefix}data/{key}"
            try:
                raw = self.archive.read(entry) if self.mapped is None else self._map(entry)
            except KeyError:
                raise DataFormatError(f"{self.name}: storage {key} ({entry}) is missing from the archive "
                                      "(a damaged file)") from None
            self.stored[key] = _Stored(raw, location, self.big_endian)
        stored = self.stored[key]
        dtype = _supported(kind.torch_dtype, self.name)
        if len(stored.raw) < numel * dtype.itemsize:
            raise DataFormatError(f"{self.name}: storage {key} holds {len(stored.raw)} bytes, data.pkl says "
                                  f"{numel} elements of {dtype.name} (a damaged file)")
        return _StorageRef(stored, dtype)

    def _map(self, entry: str):
        """The bytes of an uncompressed entry of the file, memory-mapped copy-on-write (torch.load's
        mmap=True: writes to the tensors stay in this process, the file is not changed)."""
        info = self.archive.getinfo(entry)
        if info.compress_type != zipfile.ZIP_STORED or not info.file_size:
            return self.archive.read(entry)
        with open(self.mapped, "rb") as fh:
            fh.seek(info.header_offset)
            local = fh.read(30)
        if local[:4] != b"PK\x03\x04":
            raise DataFormatError(f"{self.name}: the zip entry {entry} has no local header (a damaged file)")
        name_and_extra = int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
        start = info.header_offset + 30 + name_and_extra
        if start + info.file_size > self.mapped.stat().st_size:
            raise DataFormatError(f"{self.name}: {entry} reaches past the end of the file (truncated)")
        return np.memmap(self.mapped, dtype=np.uint8, mode="c", offset=start, shape=(info.file_size,))

    # ---- tensors ---------------------------------------------------------------------------
    def _base(self, storage, dtype: _dt.dtype) -> Tensor:
        """The whole storage as a 1-D tensor of dtype, where map_location puts it (made once per
        storage and dtype, so tensors that share a storage in the file share it here)."""
        stored = storage.stored
        base = stored.bases.get(dtype)
        if base is None:
            raw_type = np.dtype(np.uint16) if dtype is _dt.bfloat16 else dtype.numpy
            count = len(stored.raw) // dtype.itemsize
            if isinstance(stored.raw, np.memmap) and not stored.big_endian:
                a = stored.raw[:count * dtype.itemsize].view(raw_type)  # the mapping itself
                a = a if a.flags.aligned else a.copy()
            else:
                a = np.frombuffer(stored.raw, dtype=raw_type.newbyteorder(">" if stored.big_endian else "<"),
                                  count=count).astype(raw_type)  # astype copies: the tensor owns writable memory
            a = a.view(dtype.numpy) if dtype is _dt.bfloat16 else a
            base = stored.bases[dtype] = self.where(from_numpy(a), stored.location)
        return base

    def _storage_of(self, storage):
        if type(storage) is not _StorageRef:
            raise pickle.UnpicklingError(f"{self.name}: a tensor is rebuilt from {type(storage).__name__}, not "
                                         "from one of the file's storages (a damaged or crafted file)")
        return storage

    def _rebuild_tensor(self, storage, storage_offset, size, stride):
        storage = self._storage_of(storage)
        return checked_view(self._base(storage, storage.dtype), storage_offset, size, stride, self.name)

    def _rebuild_tensor_v2(self, storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                           metadata=None):
        t = self._rebuild_tensor(storage, storage_offset, size, stride)
        return t.requires_grad_(True) if requires_grad is True else t

    def _rebuild_tensor_v3(self, storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype,
                           metadata=None):
        storage = self._storage_of(storage)
        if not isinstance(dtype, _dt.dtype):
            raise pickle.UnpicklingError(f"{self.name}: a tensor's dtype is {dtype!r} (a damaged file)")
        t = checked_view(self._base(storage, dtype), storage_offset, size, stride, self.name)
        return t.requires_grad_(True) if requires_grad is True else t

    def _rebuild_from_type_v2(self, func, new_type, args, state):
        if func not in (self._rebuild_tensor, self._rebuild_tensor_v2, self._rebuild_tensor_v3) \
                or type(args) is not tuple:
            raise pickle.UnpicklingError(f"{self.name}: a tensor subclass is rebuilt by {func!r} (not supported)")
        t = func(*args)
        if state:
            raise NotImplementedError(f"{self.name} holds a tensor with Python attributes "
                                      f"{sorted(map(str, state))[:5]}; infinitrain's tensors carry none")
        if new_type is _PARAMETER:
            return Parameter(t, t.requires_grad)
        if new_type is not _TENSOR:
            raise NotImplementedError(f"{self.name} holds a tensor of a subclass; infinitrain reads dense tensors")
        return t


def _encode(text, encoding="utf-8"):
    """_codecs.encode as pickle protocol 2 uses it for bytes: (str, 'latin1') only."""
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode is only accepted to rebuild bytes (a str and 'latin1')")
    return codecs.encode(text, "latin1")


def _torch_device(kind, index=None):
    if type(kind) is not str or (index is not None and type(index) is not int):
        raise pickle.UnpicklingError(f"torch.device({kind!r}, {index!r}) in a checkpoint (a damaged file)")
    return Device(kind, index)


def _rebuild_parameter(data, requires_grad, backward_hooks):
    if not isinstance(data, Tensor):
        raise pickle.UnpicklingError(f"a Parameter is rebuilt from {type(data).__name__}, not a tensor")
    return Parameter(data, requires_grad is True)


def _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state):
    if state:
        raise NotImplementedError(f"the file holds a Parameter with Python attributes {sorted(map(str, state))[:5]}; "
                                  "infinitrain's Parameters carry none")
    return _rebuild_parameter(data, requires_grad, backward_hooks)


def load_torch_zip(source, name: str, where, mmap: bool = False):
    """The object torch.save wrote to a zip file (a path, or the file's bytes), tensors placed by
    where; mmap: the storages are mapped from the file (a path), not read."""
    try:
        archive = zipfile.ZipFile(source if isinstance(source, Path) else io.BytesIO(source))
        names = archive.namelist()
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise DataFormatError(f"{name} starts as a zip archive (PyTorch's checkpoint format) but cannot be read as "
                              f"one ({e}): it is truncated or damaged, e.g. a copy or a save that did not finish; "
                              "save or copy it again") from None
    pickles = [n for n in names if n.count("/") == 1 and n.endswith("/data.pkl")]
    if len(pickles) != 1:
        if any(n.endswith(("/constants.pkl", "/code/")) or "/code/" in n for n in names):
            raise DataFormatError(f"{name} is a TorchScript archive (torch.jit.save), which infinitrain cannot run; "
                                  "save the model's state_dict() with torch.save instead")
        raise DataFormatError(f"{name} is a zip archive but not a checkpoint torch.save wrote (it has "
                              f"{len(pickles)} '<name>/data.pkl' entries, not one)")
    prefix = pickles[0][: -len("data.pkl")]
    try:
        order = archive.read(prefix + "byteorder").decode() if prefix + "byteorder" in names else "little"
        if order not in ("little", "big"):
            raise DataFormatError(f"{name}: its byteorder record says {order[:20]!r}, not 'little' or 'big'")
        unpickler = _Unpickler(archive.read(pickles[0]), archive, prefix, name, where, order == "big",
                               source if mmap else None)
        out = unpickler.load()
        _refuse_bare_storages(out, name)
        return out
    except (zipfile.BadZipFile, EOFError, pickle.UnpicklingError, ValueError, KeyError, IndexError, TypeError,
            AttributeError, OverflowError) as e:
        if isinstance(e, (DataFormatError, pickle.UnpicklingError)) and str(e).startswith(name):
            raise
        raise DataFormatError(f"{name}: PyTorch checkpoint is damaged or not one torch.save wrote "
                              f"({type(e).__name__}: {str(e)[:300]})") from None


def _refuse_bare_storages(obj, name: str, seen=None) -> None:
    """A storage saved by itself (torch.save(t.untyped_storage())) has no counterpart here."""
    if type(obj) is _StorageRef:
        raise NotImplementedError(f"{name} holds a bare storage (torch.save of a tensor's storage()); infinitrain "
                                  "has no storage objects: save the tensor instead")
    if isinstance(obj, (dict, list, tuple, set, frozenset)):
        seen = set() if seen is None else seen
        if id(obj) in seen:
            return
        seen.add(id(obj))
        for item in (list(obj.keys()) + list(obj.values())) if isinstance(obj, dict) else obj:
            _refuse_bare_storages(item, name, seen)


def refuse_unknown(data: bytes, name: str):
    """The error for a file that is neither infinitrain.save's nor torch.save's zip format."""
    if not data:
        raise DataFormatError(f"{name} is empty (a save that did not finish?)")
    if len(data) >= 14 and data[0] == 0x80 and data[2:4] == b"\x8a\x0a" and data[4:14] == _LEGACY_MAGIC:
        raise DataFormatError(f"{name} is in PyTorch's legacy format (before 1.6, or torch.save(..., "
                              "_use_new_zipfile_serialization=False)), which infinitrain does not read; re-save it "
                              "with a current PyTorch: torch.save(torch.load(f), 'new.pt')")
    if len(data) > 262 and data[257:262] == b"ustar":
        raise DataFormatError(f"{name} is a tar archive (PyTorch's oldest format, or not a checkpoint); re-save it "
                              "with a current PyTorch: torch.save(torch.load(f), 'new.pt')")
    if data[0] == 0x80:
        raise DataFormatError(f"{name} is a bare pickle, not a file torch.save or infinitrain.save wrote; "
                              "infinitrain never unpickles arbitrary files (they can run code)")
    raise DataFormatError(f"{name} is not a checkpoint: infinitrain.load reads files written by infinitrain.save "
                          f"or torch.save (a zip archive); this one starts with {data[:8]!r}")
