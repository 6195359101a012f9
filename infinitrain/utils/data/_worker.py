"""What runs inside a DataLoader worker process, and what both sides share: the fetcher
(indices -> a collated batch), get_worker_info, and how batches and errors cross the queue."""
from __future__ import annotations

import itertools
import os
import queue
import random
import sys
import traceback

import numpy as np

from ...creation import from_numpy
from ...functions import index_select
from ...random import manual_seed
from ...runtime import set_num_threads
from ...tensor import Tensor
from ._collate import _from_array, default_collate
from .dataset import TensorDataset


class Fetcher:
    """Turns what the batch sampler yields (a list of indices; one index without batching;
    for an iterable dataset, how many items to take) into a collated batch. For an iterable
    dataset it holds the dataset's iterator and raises StopIteration when that ends."""

    def __init__(self, dataset, iterable: bool, auto_collation: bool, collate_fn, drop_last: bool):
        self.dataset, self.iterable, self.auto = dataset, iterable, auto_collation
        self.collate_fn, self.drop_last = collate_fn, drop_last
        self.stream = iter(dataset) if iterable else None

    def fetch(self, index):
        if self.iterable:
            if not self.auto:
                return self.collate_fn(next(self.stream))
            items = list(itertools.islice(self.stream, len(index)))
            if not items or (self.drop_last and len(items) < len(index)):
                raise StopIteration
            return self.collate_fn(items)
        if not self.auto:
            return self.collate_fn(self.dataset[index])
        if type(self.dataset) is TensorDataset and self.collate_fn is default_collate:
            return _gather_rows(self.dataset, index)
        many = getattr(self.dataset, "__getitems__", None)
        return self.collate_fn(many(index) if callable(many) else [self.dataset[i] for i in index])


def _gather_rows(dataset: TensorDataset, index) -> list:
    """default_collate of a TensorDataset's rows, gathered in one step per tensor (the same
    batch; per-row indexing and stacking cost a Python call per item)."""
    rows = np.asarray(index, dtype=np.int64)
    out = []
    for t in dataset.tensors:
        if isinstance(t, Tensor):
            out.append(index_select(t, 0, from_numpy(rows).to(t.device)))
        else:
            out.append(_from_array(t[rows]))
    return out


class WorkerInfo:
    """What get_worker_info() returns inside a worker: id, num_workers, seed, dataset."""

    def __init__(self, **fields):
        for k, v in fields.items():
            object.__setattr__(self, k, v)

    def __setattr__(self, key, value):
        raise RuntimeError(f"Cannot assign attributes to {type(self).__name__} objects")

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed})"


_worker_info = None


def get_worker_info():
    """In a DataLoader worker: its WorkerInfo (an IterableDataset splits its stream by id and
    num_workers); in the main process: None."""
    return _worker_info


class Resume:
    """Sent to a persistent worker at a new epoch: start the dataset's stream afresh."""


class WorkerDone:
    """An iterable dataset's stream ended in this worker."""

    def __init__(self, worker_id: int):
        self.worker_id = worker_id


class WorkerError:
    """An exception raised in a worker, carried back with its traceback as text and raised
    again in the main process with the same type."""

    def __init__(self, where: str):
        kind, _, _ = sys.exc_info()
        self.kind, self.where, self.text = kind, where, "".join(traceback.format_exc())

    def reraise(self):
        message = f"Caught {self.kind.__name__} {self.where}.\nOriginal {self.text}"
        try:
            error = self.kind(message)
        except Exception:  # an exception type that takes other arguments
            raise RuntimeError(message) from None
        raise error


class _Shipped:
    """A tensor crossing the queue, as a numpy array of its dtype."""

    def __init__(self, t: Tensor):
        self.array = t.detach().cpu().numpy()


def ship(data):
    """`data` with its tensors made picklable, its containers kept."""
    return _walk(data, lambda t: _Shipped(t) if isinstance(t, Tensor) else t)


def unship(data):
    return _walk(data, lambda s: from_numpy(s.array) if isinstance(s, _Shipped) else s)


def _walk(data, leaf):
    if isinstance(data, dict):
        fields = {k: _walk(v, leaf) for k, v in data.items()}
        try:
            return type(data)(fields)
        except TypeError:
            return fields
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_walk(v, leaf) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_walk(v, leaf) for v in data)
    return leaf(data)


def worker_loop(dataset, iterable, auto_collation, collate_fn, drop_last, base_seed, init_fn, worker_id,
                num_workers, index_queue, results):
    """A worker's life: seed, run worker_init_fn, then fetch the batches the main process asks
    for (index_queue: (task, indices), Resume, or None to stop) and put (task, batch) on results."""
    global _worker_info
    set_num_threads(1)  # many workers share the cores; each collates on one thread
    seed = base_seed + worker_id
    random.seed(seed)
    manual_seed(seed)
    _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
    parent = os.getppid()
    failed = None
    try:
        if init_fn is not None:
            init_fn(worker_id)
        fetcher = Fetcher(dataset, iterable, auto_collation, collate_fn, drop_last)
    except Exception:
        failed = WorkerError(f"in DataLoader worker process {worker_id}")
    ended = False
    while True:
        try:
            task = index_queue.get(timeout=5.0)
        except queue.Empty:
            if os.getppid() != parent:  # the main process is gone
                return
            continue
        if task is None:  # the main process wants nothing more: what is still queued may be dropped
            results.cancel_join_thread()
            return
        if isinstance(task, Resume):
            if failed is None:
                fetcher, ended = Fetcher(dataset, iterable, auto_collation, collate_fn, drop_last), False
            results.put((task, None))
            continue
        if ended:  # tasks sent before the main process heard the stream ended
            continue
        number, index = task
        if failed is not None:
            data, failed = failed, None
        else:
            try:
                data = ship(fetcher.fetch(index))
            except StopIteration:
                if not iterable:
                    data = WorkerError(f"in DataLoader worker process {worker_id}")
                else:
                    data, ended = WorkerDone(worker_id), True
            except Exception:
                data = WorkerError(f"in DataLoader worker process {worker_id}")
        results.put((number, data))
