"""DLPack, both ways, without a copy: `Tensor.__dlpack__` / `__dlpack_device__` hand a tensor's
memory to numpy, PyTorch, CuPy, JAX (their `from_dlpack`), and `infinitrain.from_dlpack(obj)`
takes theirs (anything with `__dlpack__`, or a "dltensor" capsule). Both sides then share the
memory: writes show through, and the memory lives while either side holds it.

The capsule is DLPack's unversioned one (a `DLManagedTensor` named "dltensor"), which every
consumer reads. Stream semantics: the consumer passes the stream it will use; a CUDA tensor's
pending work on this package's stream is finished before the capsule is handed over (a device
synchronisation: correct for any consumer stream).
"""
from __future__ import annotations

import ctypes

from . import dtypes as _dt
from .device import as_device

KDL_CPU, KDL_CUDA = 1, 2
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
_CODES = {_dt.float32: (_FLOAT, 32), _dt.float64: (_FLOAT, 64), _dt.float16: (_FLOAT, 16),
          _dt.bfloat16: (_BFLOAT, 16), _dt.int32: (_INT, 32), _dt.int64: (_INT, 64), _dt.uint8: (_UINT, 8),
          _dt.bool: (_BOOL, 8)}
_DTYPES = {v: k for k, v in _CODES.items()}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _Versioned(ctypes.Structure):  # DLPack 1.0: a version and flags (bit 0: read-only) first
    pass


_VERSIONED_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Versioned))
_Versioned._fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", _VERSIONED_DELETER),
                       ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]

_api = ctypes.pythonapi
_api.PyCapsule_New.restype, _api.PyCapsule_New.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                                              ctypes.c_void_p]
_api.PyCapsule_GetPointer.restype, _api.PyCapsule_GetPointer.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                                          ctypes.c_char_p]
_api.PyCapsule_SetName.restype, _api.PyCapsule_SetName.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype, _api.PyCapsule_IsValid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
# the destructor gets the capsule as a raw PyObject*: these two take it so
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))

_EXPORTED = {}  # address of a DLManagedTensor -> what it points into, alive until its deleter runs


def _released(address: int) -> None:
    """The consumer of the export at address is done with it: one alias fewer of its storage."""
    entry = _EXPORTED.pop(address, None)
    if entry is not None:
        entry[3]._storage.unexported()


@_DELETER
def _delete(managed):
    _released(ctypes.addressof(managed.contents))


@_VERSIONED_DELETER
def _delete_versioned(managed):
    _released(ctypes.addressof(managed.contents))


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_gone(capsule):
    """A capsule no consumer took: its tensor is released here (a consumer renames it and calls
    the deleter itself when done)."""
    if _is_valid(capsule, b"dltensor"):
        _delete(ctypes.cast(_get_pointer(capsule, b"dltensor"), ctypes.POINTER(_Managed)))
    elif _is_valid(capsule, b"dltensor_versioned"):
        _delete_versioned(ctypes.cast(_get_pointer(capsule, b"dltensor_versioned"), ctypes.POINTER(_Versioned)))


def to_dlpack(t, stream=None, max_version=None):
    """A capsule sharing t's memory (Tensor.__dlpack__): DLPack 1.0's "dltensor_versioned" to a
    consumer that asks for max_version >= (1, 0) (writable: numpy reads the unversioned one as
    read-only), else the unversioned "dltensor"."""
    if t.device.type == "cuda":
        from . import cuda
        cuda.synchronize(t.device)  # the consumer's stream then sees finished data
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    managed = _Versioned() if versioned else _Managed()
    shape = (ctypes.c_int64 * max(t.ndim, 1))(*t.shape)
    strides = (ctypes.c_int64 * max(t.ndim, 1))(*t.stride())
    code, bits = _CODES[t.dtype]
    managed.dl_tensor = _DLTensor(ctypes.c_void_p(t.data_ptr()),
                                  _Device(KDL_CUDA if t.device.type == "cuda" else KDL_CPU, t.device.index or 0),
                                  t.ndim, _DataType(code, bits, 1), shape, strides, 0)
    if versioned:
        managed.version, managed.flags, managed.deleter = _Version(1, 0), 0, _delete_versioned
    else:
        managed.deleter = _delete
    address = ctypes.addressof(managed)
    _EXPORTED[address] = (managed, shape, strides, t)
    t._storage.exported()  # writable (flags 0; numpy alone reads the unversioned capsule as read-only)
    name = b"dltensor_versioned" if versioned else b"dltensor"
    return _api.PyCapsule_New(address, name, ctypes.cast(_capsule_gone, ctypes.c_void_p))


def dlpack_device(t) -> tuple:
    return (KDL_CUDA, t.device.index or 0) if t.device.type == "cuda" else (KDL_CPU, 0)


class _Imported:
    """Keeps a consumed DLPack tensor alive; its producer's deleter runs when this goes."""

    def __init__(self, managed, capsule):
        self.managed, self.capsule = managed, capsule

    def __del__(self):
        deleter = self.managed.contents.deleter
        if deleter:
            deleter(self.managed)


def from_dlpack(obj):
    """A tensor sharing the memory of obj (anything with __dlpack__: a numpy array, a PyTorch
    or CuPy tensor; or a "dltensor" capsule), without a copy; memory the producer marks
    read-only (a read-only numpy array, a memory map) is copied, with a warning."""
    from .storage import Storage
    from .tensor import Tensor
    if isinstance(obj, Tensor):
        return obj
    if hasattr(obj, "__dlpack__"):
        kind, _ = obj.__dlpack_device__()
        stream = {"stream": 1} if kind == KDL_CUDA else {}
        try:
            capsule = obj.__dlpack__(max_version=(1, 0), **stream)
        except TypeError:  # a producer that predates DLPack 1.0
            capsule = obj.__dlpack__(**stream)
    else:
        capsule = obj
    if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        managed = ctypes.cast(_api.PyCapsule_GetPointer(capsule, b"dltensor_versioned"), ctypes.POINTER(_Versioned))
        if managed.contents.version.major > 1:
            raise TypeError(f"from_dlpack: DLPack {managed.contents.version.major}.x is newer than this reader's 1.0")
        _api.PyCapsule_SetName(capsule, b"used_dltensor_versioned")
        read_only = bool(managed.contents.flags & 1)
    elif _api.PyCapsule_IsValid(capsule, b"dltensor"):
        managed = ctypes.cast(_api.PyCapsule_GetPointer(capsule, b"dltensor"), ctypes.POINTER(_Managed))
        _api.PyCapsule_SetName(capsule, b"used_dltensor")  # ours now: its deleter is ours to call
        read_only = False  # (DLPack before 1.0 cannot say; numpy refuses to export read-only arrays so)
    else:
        raise TypeError(f"from_dlpack: expected an object with __dlpack__ or an unused DLPack capsule, got "
                        f"{type(obj).__name__} (a capsule is read once)")
    owner = _Imported(managed, capsule)
    t = managed.contents.dl_tensor
    key = (t.dtype.code, t.dtype.bits)
    if key not in _DTYPES or t.dtype.lanes != 1:
        raise TypeError(f"from_dlpack: DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, {t.dtype.lanes} lanes) "
                        f"has no infinitrain dtype")
    dtype = _DTYPES[key]
    if t.device.device_type == KDL_CPU:
        device = as_device("cpu")
    elif t.device.device_type == KDL_CUDA:
        device = as_device(f"cuda:{t.device.device_id}")
    else:
        raise TypeError(f"from_dlpack: DLPack device type {t.device.device_type} is neither the CPU (1) nor CUDA (2)")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:  # NULL: compact row-major
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
        strides = tuple(strides)
    if any(s < 0 for s in strides):
        raise ValueError(f"from_dlpack: negative strides {strides} are not supported; pass a copy")
    item = dtype.itemsize
    if t.byte_offset % item:
        raise ValueError(f"from_dlpack: byte_offset {t.byte_offset} is not a multiple of the item size {item}")
    numel = 1
    for n in shape:
        numel *= n
    span = 0 if numel == 0 else (sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * item
    address = (t.data or 0) + t.byte_offset
    storage = Storage.wrap(address, span, device, keepalive=owner)
    shared = Tensor._make(storage, shape, strides, 0, dtype)
    if read_only:  # (writing through a view of read-only memory, a memory map, would crash the process)
        import warnings
        warnings.warn("from_dlpack: the producer's memory is read-only (DLPack's read-only flag): the tensor is "
                      "a copy of it, and writes to it do not reach the producer", UserWarning, stacklevel=2)
        return shared.clone()
    return shared


def from_cuda_array_interface(obj, device=None):
    """A CUDA tensor sharing the memory of obj's __cuda_array_interface__ (CuPy, pycuda's
    GPUArray, Numba), kept alive with it. The interface names no device: `device` (default:
    cuda:0) must be the one the pointer belongs to. A producer's stream (version 3) is
    synchronised with before the memory is read here."""
    import numpy as np
    from .storage import Storage
    from .tensor import Tensor
    from . import cuda
    face = obj.__cuda_array_interface__
    shape = tuple(int(n) for n in face["shape"])
    try:
        dtype = _dt.from_numpy_dtype(np.dtype(face["typestr"]))
    except (TypeError, ValueError, KeyError):
        raise TypeError(f"as_tensor: __cuda_array_interface__ typestr {face.get('typestr')!r} has no infinitrain "
                        "dtype") from None
    item = dtype.itemsize
    if face.get("strides") is None:
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
    else:
        if any(s % item or s < 0 for s in face["strides"]):
            raise ValueError(f"as_tensor: strides {face['strides']} are negative or not a multiple of {item} bytes")
        strides = [s // item for s in face["strides"]]
    device = as_device(device or "cuda")
    if face.get("stream") not in (None, 0):
        cuda.synchronize(device)  # the producer's work on its stream, finished before ours reads it
    numel = 1
    for n in shape:
        numel *= n
    span = 0 if numel == 0 else (sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * item
    address = face["data"][0] or 0
    storage = Storage.wrap(address, span, device, keepalive=obj)
    return Tensor._make(storage, shape, tuple(strides), 0, dtype)


def as_tensor(data, dtype=None, device=None):
    """torch.as_tensor: data itself when it already is a tensor of that dtype and device, else
    its memory shared when it can be (another library's CUDA array through
    __cuda_array_interface__, a DLPack producer, a numpy array), else a copy (tensor())."""
    import numpy as np
    from .tensor import Tensor
    from .creation import from_numpy, tensor
    if isinstance(data, Tensor):
        out = data
    elif hasattr(data, "__cuda_array_interface__"):
        out = from_cuda_array_interface(data, device)
    elif hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray):
        out = from_dlpack(data)
    elif isinstance(data, np.ndarray) and data.flags.writeable:
        try:
            out = from_numpy(data)
        except (TypeError, ValueError):  # a layout or dtype that cannot be shared: a copy
            return tensor(data, dtype=dtype, device=device)
    else:
        return tensor(data, dtype=dtype, device=device)
    if dtype is not None and _dt.as_dtype(dtype) is not out.dtype:
        out = out.to(dtype=dtype)
    if device is not None and as_device(device) != out.device:
        out = out.to(as_device(device))
    return out
