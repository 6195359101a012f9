"""Where OffloadOptimizer keeps its state: blocks of the state laid out end to end (layout),
in host memory (HostStore) or in an unlinked scratch file streamed through two host buffers by
one background thread, with direct I/O where the filesystem takes it (FileStore). See
offload.py for why and how the optimizer uses them."""
from __future__ import annotations

import errno
import mmap
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_ALIGN = 4096  # direct I/O: file offsets, sizes and buffer addresses in multiples of this
# A parameter split over two blocks is split at a multiple of this many elements from its start,
# so that the elementwise kernels see the same vector/scalar boundaries as on the whole tensor
# (the same bits as the optimizer without offload).
PIECE = 1024
BUFFERS = 2  # staging buffers: the one the update works on, the one being read or written


class OffloadError(RuntimeError):
    """The offloaded state could not be kept: the folder is unusable, the disk too small, a read
    or a write failed."""


class Block:
    """A run of parameter pieces whose state is stored together: chunks are (parameter index,
    first element, end element, where the piece starts in the block); entry k of the state of
    every piece lies at k * numel + where."""
    __slots__ = ("chunks", "numel", "offset", "nbytes")

    def __init__(self, chunks: list, numel: int, offset: int, entries: int):
        self.chunks, self.numel, self.offset = chunks, numel, offset
        self.nbytes = -(-entries * numel * 4 // _ALIGN) * _ALIGN


def layout(numels: list, per_block: int, entries: int) -> list:
    blocks, chunks, filled, offset = [], [], 0, 0

    def close():
        nonlocal chunks, filled, offset
        if chunks:
            blocks.append(Block(chunks, filled, offset, entries))
            offset += blocks[-1].nbytes
        chunks, filled = [], 0

    for i, n in enumerate(numels):
        start = 0
        while start < n:
            take = min(n - start, per_block - filled)
            if take < n - start:  # the parameter goes on in the next block
                take = take // PIECE * PIECE
                if take == 0:
                    close()
                    continue
            chunks.append((i, start, start + take, filled))
            filled += take
            start += take
            if filled >= per_block:
                close()
    close()
    return blocks


class HostStore:
    """device="cpu": every block's state in one host array; streaming is only slicing."""
    direct, description = False, "host memory"

    def __init__(self, blocks: list, entries: int):
        self.array = np.zeros(sum(b.nbytes for b in blocks) // 4, dtype=np.float32)
        self.entries = entries
        self.bytes_read = self.bytes_written = 0
        self.io_seconds = self.waited = 0.0

    def stream(self, blocks: list, write: bool = True):
        for b in blocks:
            yield b, self.array[b.offset // 4:b.offset // 4 + self.entries * b.numel]

    def read_range(self, offset: int, out: np.ndarray, k: int = 0) -> None:
        out[:] = self.array[offset // 4:offset // 4 + out.size]

    def submit(self, fn):
        """fn() now (host memory has nothing to overlap), as a finished future."""
        from concurrent.futures import Future
        done = Future()
        try:
            done.set_result(fn())
        except Exception as e:  # noqa: BLE001 - raised where the future is read, as the thread's
            done.set_exception(e)
        return done

    def close(self) -> None:
        self.array = None


class FileStore:
    """device="nvme": the blocks in an unlinked scratch file under folder, streamed through two
    host buffers by one background thread (its queue keeps a buffer's write before the read
    that reuses it)."""

    def __init__(self, blocks: list, entries: int, folder, direct: bool | None):
        folder = os.fspath(folder)
        if not os.path.isdir(folder):
            raise OffloadError(f"offload path {folder} is not a folder: make it (mkdir -p) or name another "
                               "with --offload_path")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OffloadError(f"offload path {folder} is not writable by this user: name another with "
                               "--offload_path")
        self.entries, self.folder = entries, folder
        size = sum(b.nbytes for b in blocks)
        fd, name = tempfile.mkstemp(dir=folder, prefix="infinitrain-offload-", suffix=".state")
        self.direct = False
        try:
            if direct is not False and hasattr(os, "O_DIRECT"):
                try:
                    self.fd = os.open(name, os.O_RDWR | os.O_DIRECT)
                    self.direct = True
                    os.close(fd)
                except OSError:
                    if direct:
                        raise OffloadError(f"offload path {folder}: its filesystem does not take direct I/O "
                                           "(O_DIRECT); leave direct I/O to be chosen") from None
                    self.fd = fd
            else:
                self.fd = fd
        finally:
            os.unlink(name)  # scratch: the space is freed when the file is closed, however the process ends
        try:
            os.posix_fallocate(self.fd, 0, max(size, 1))
        except OSError as e:
            os.close(self.fd)
            free = os.statvfs(folder)
            raise OffloadError(f"offload path {folder}: cannot reserve {size / 2**30:.2f} GB for the optimizer "
                               f"state ({e.strerror}; {free.f_bavail * free.f_frsize / 2**30:.2f} GB free): free "
                               "space there or name a bigger disk with --offload_path") from None
        self.description = f"a scratch file in {folder} ({'direct' if self.direct else 'buffered'} I/O)"
        # anonymous maps are page-aligned, as direct I/O needs
        largest = max((b.nbytes for b in blocks), default=_ALIGN)
        self.maps = [mmap.mmap(-1, largest) for _ in range(BUFFERS)]
        self.buffers = [np.frombuffer(m, dtype=np.float32) for m in self.maps]
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offload-io")
        self.bytes_read = self.bytes_written = 0
        self.io_seconds = self.waited = 0.0

    def _size(self, b: Block) -> int:
        return b.nbytes if self.direct else self.entries * b.numel * 4

    def _pread(self, k: int, size: int, offset: int, what: str) -> None:
        """size bytes of the file from offset into buffer k (the one way this store reads)."""
        t0, view, got = time.perf_counter(), memoryview(self.maps[k]), 0
        try:
            while got < size:
                n = os.preadv(self.fd, [view[got:size]], offset + got)
                if n == 0:
                    raise OSError(errno.EIO, "the scratch file ends early")
                got += n
        except OSError as e:
            raise OffloadError(f"offload: reading {what} from {self.folder} failed: {e.strerror}") from None
        finally:
            view.release()
        self.bytes_read += size
        self.io_seconds += time.perf_counter() - t0

    def _read(self, b: Block, k: int) -> None:
        self._pread(k, self._size(b), b.offset, "optimizer state")

    def _write(self, b: Block, k: int) -> None:
        t0, view, size, done = time.perf_counter(), memoryview(self.maps[k]), self._size(b), 0
        try:
            while done < size:
                done += os.pwritev(self.fd, [view[done:size]], b.offset + done)
            if not self.direct:  # written out, then out of the page cache
                os.fdatasync(self.fd)
                os.posix_fadvise(self.fd, b.offset, size, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            raise OffloadError(f"offload: writing optimizer state to {self.folder} failed: {e.strerror}; the "
                               "last checkpoint is intact: free space there and resume from it") from None
        finally:
            view.release()
        self.bytes_written += size
        self.io_seconds += time.perf_counter() - t0

    def submit(self, fn):
        """fn() on the I/O thread, after what is queued there (its buffers are that thread's)."""
        return self.pool.submit(fn)

    def read_range(self, offset: int, out: np.ndarray, k: int = 0) -> None:
        """out.nbytes bytes of the file from offset into out (float32), through buffer k: an
        aligned superset of the range is read (direct I/O reads whole 4 KB pages)."""
        lo = offset // _ALIGN * _ALIGN
        hi = -(-(offset + out.nbytes) // _ALIGN) * _ALIGN
        at = 0
        while lo + at < hi:  # a range longer than a buffer (a parameter over many blocks) in parts
            size = min(hi - lo - at, len(self.maps[k]))
            self._pread(k, size, lo + at, "parameters")
            # the bytes of this window that belong to the range
            first, last = max(offset, lo + at), min(offset + out.nbytes, lo + at + size)
            raw = out.view(np.uint8)
            raw[first - offset:last - offset] = self.buffers[k].view(np.uint8)[first - lo - at:last - lo - at]
            at += size

    def stream(self, blocks: list, write: bool = True):
        """Yields (block, its state as a float32 array) in order; what the caller leaves in the
        array is written back (write=True) while the next block is worked on."""
        pending = []
        try:
            if blocks:
                pending.append(self.pool.submit(self._read, blocks[0], 0))
            for i, b in enumerate(blocks):
                reading = pending[-1]
                if i + 1 < len(blocks):  # read-ahead: queued behind the write of the buffer it reuses
                    pending.append(self.pool.submit(self._read, blocks[i + 1], (i + 1) % BUFFERS))
                t0 = time.perf_counter()
                reading.result()
                self.waited += time.perf_counter() - t0
                yield b, self.buffers[i % BUFFERS][:self.entries * b.numel]
                if write:  # write-behind
                    pending.append(self.pool.submit(self._write, b, i % BUFFERS))
            for f in pending:
                f.result()
        finally:  # also when the caller stopped early: no I/O may outlive the loop's buffers
            for f in pending:
                f.cancel()
            for f in pending:
                if not f.cancelled():
                    f.exception()

    def close(self) -> None:
        if self.fd is not None:
            self.pool.shutdown(wait=True)
            os.close(self.fd)
            self.fd = None
