"""CUDA devices with PyTorch's torch.cuda names: is_available(), device_count(), synchronize(),
memory_stats(), manual_seed(), get_device_name(), Stream and Event, `with infinitrain.cuda.stream(s):`.

Importing infinitrain needs no GPU, driver or CUDA library: without them is_available() is
False and a CUDA tensor raises NoCudaError saying what is missing (build_info() too)."""
from __future__ import annotations

import threading
from contextlib import contextmanager

from .. import runtime
from .._native import NoCudaError, check, ffi, lib
from ..device import as_device
from ..random import default_generator


def device_count() -> int:
    n = ffi.new("int32_t *")
    check(lib.it_device_count(lib.IT_CUDA, n))
    return int(n[0])


def is_available() -> bool:
    return device_count() > 0


def _cuda(device):
    d = as_device("cuda" if device is None else device)
    if d.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {d}")
    return d


def current_device() -> int:
    return 0


def is_bf16_supported() -> bool:
    """Whether bfloat16 CUDA tensors can be used: on every CUDA device infinitrain runs on."""
    return is_available()


def manual_seed(seed: int) -> None:
    """Seeds the generator that CUDA tensors draw from. That is the default generator, which
    serves every device here (its numbers do not depend on the device), so this is
    infinitrain.manual_seed: a program seeding both with one seed gets PyTorch's behaviour."""
    default_generator.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed_all() -> None:
    import random
    manual_seed(random.getrandbits(63))


def get_device_name(device=None) -> str:
    """The GPU's name as the CUDA driver gives it ("NVIDIA H100 80GB HBM3")."""
    import ctypes
    index = _cuda(device).index
    if index >= device_count():
        raise NoCudaError(f"get_device_name: no CUDA device {index} ({device_count()} available)")
    driver = ctypes.CDLL("libcuda.so.1")
    handle, name = ctypes.c_int(), ctypes.create_string_buffer(256)
    if driver.cuInit(0) or driver.cuDeviceGet(ctypes.byref(handle), index) or \
            driver.cuDeviceGetName(name, len(name), handle):
        raise NoCudaError(f"get_device_name: the CUDA driver could not name device {index}")
    return name.value.decode()


def synchronize(device=None) -> None:
    """Waits for all work queued on the device (default cuda:0); reports an index error that
    a kernel met since the last synchronisation."""
    check(lib.it_device_synchronize(_cuda(device).native))


def memory_stats(device=None) -> dict:
    return runtime.memory_stats(_cuda(device))


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["peak_allocated_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    runtime.reset_peak_memory_stats(_cuda(device))


def empty_cache(device=None) -> None:
    runtime.empty_cache(_cuda(device))


class Stream:
    """An ordered queue of work on a device; kernels go to this thread's current stream."""

    def __init__(self, device=None):
        self.device = _cuda(device)
        out = ffi.new("it_stream **")
        check(lib.it_stream_create(self.device.native, out))
        self._handle = ffi.gc(out[0], lib.it_stream_destroy)

    def synchronize(self) -> None:
        check(lib.it_stream_synchronize(self._handle))

    def wait_event(self, event: "Event") -> None:
        check(lib.it_stream_wait_event(self._handle, event._handle))

    def wait_stream(self, other: "Stream") -> None:
        event = Event(self.device)
        event.record(other)
        self.wait_event(event)

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event(self.device)
        event.record(self)
        return event


class Event:
    """A point in a stream that another stream, or the host, can wait for; with
    enable_timing=True (PyTorch's) it also carries the GPU's clock: start.elapsed_time(end)."""

    def __init__(self, device=None, enable_timing: bool = False):
        self.device = _cuda(device)
        out = ffi.new("it_event **")
        create = lib.it_event_create_timing if enable_timing else lib.it_event_create
        check(create(self.device.native, out))
        self._handle = ffi.gc(out[0], lib.it_event_destroy)

    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds of GPU time from this event's recording to end's (waits for end)."""
        ms = ffi.new("float *")
        check(lib.it_event_elapsed_time(self._handle, end._handle, ms))
        return float(ms[0])

    def record(self, stream: Stream | None = None) -> None:
        check(lib.it_event_record(self._handle, stream._handle if stream else ffi.NULL))

    def wait(self, stream: Stream | None = None) -> None:
        check(lib.it_stream_wait_event(stream._handle if stream else ffi.NULL, self._handle))

    def synchronize(self) -> None:
        check(lib.it_event_synchronize(self._handle))

    def query(self) -> bool:
        done = ffi.new("int32_t *")
        check(lib.it_event_query(self._handle, done))
        return bool(done[0])


_current = threading.local()  # per thread: device index -> the Stream a `stream` block set


@contextmanager
def stream(s: Stream):
    """Kernels on s's device from this thread go to s inside the block; after it, to the
    stream they went to before (blocks nest, as PyTorch's)."""
    streams = _current.__dict__.setdefault("streams", {})
    previous = streams.get(s.device.index)
    check(lib.it_set_stream(s.device.native, s._handle))
    streams[s.device.index] = s
    try:
        yield s
    finally:
        streams[s.device.index] = previous
        check(lib.it_set_stream(s.device.native, previous._handle if previous is not None else ffi.NULL))
