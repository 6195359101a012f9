"""DataLoader, as torch.utils.data's: batches of a dataset, read through a (batch) sampler
lazily, collated into infinitrain tensors, optionally by worker processes running ahead."""
from __future__ import annotations

import itertools
import multiprocessing
import queue
import time

from ._collate import default_collate, default_convert
from ._random import seed as fresh_seed
from ._worker import Fetcher, Resume, WorkerDone, WorkerError, unship, worker_loop
from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

_FIXED = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")


class _EndlessNone(Sampler):
    """An iterable dataset's 'indices': the dataset itself decides what comes next."""

    def __iter__(self):
        return itertools.repeat(None)


class DataLoader:
    """Batches of `dataset`. Map-style datasets are read in the order of `sampler` (default:
    sequential, or random with shuffle=True, drawn from `generator` or infinitrain's default
    generator, so manual_seed fixes it), batch_size indices at a time (or `batch_sampler`'s
    lists); iterable datasets are read in their own order. num_workers > 0 reads in that many
    processes, prefetch_factor batches each ahead, batches still in order. pin_memory is
    accepted and does nothing: batches are in ordinary host memory."""

    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool | None = None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn=None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *, prefetch_factor: int | None = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        iterable = isinstance(dataset, IterableDataset)
        if iterable:
            for name, value in (("shuffle", shuffle), ("sampler", sampler), ("batch_sampler", batch_sampler)):
                if value not in (None, False):
                    raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} option, "
                                     f"but got {name}={value}")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                                 "and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with "
                             "drop_last")
        if sampler is None:
            if iterable:
                sampler = _EndlessNone()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        if isinstance(multiprocessing_context, str):
            multiprocessing_context = multiprocessing.get_context(multiprocessing_context)
        if multiprocessing_context is not None and num_workers == 0:
            raise ValueError("multiprocessing_context can only be used with multi-process loading "
                             f"(num_workers > 0), but got num_workers={num_workers}")
        for name, value in (("dataset", dataset), ("batch_size", batch_size), ("drop_last", drop_last),
                            ("sampler", sampler), ("batch_sampler", batch_sampler),
                            ("persistent_workers", persistent_workers)):
            object.__setattr__(self, name, value)
        self.num_workers, self.prefetch_factor, self.pin_memory = num_workers, prefetch_factor, pin_memory
        self.pin_memory_device, self.timeout, self.worker_init_fn = pin_memory_device, timeout, worker_init_fn
        self.multiprocessing_context, self.generator, self.in_order = multiprocessing_context, generator, in_order
        self.collate_fn = collate_fn if collate_fn is not None else \
            default_collate if batch_sampler is not None else default_convert
        self._iterable = iterable
        self._workers = None  # the persistent workers' iterator, kept across epochs

    def __setattr__(self, name, value):
        if name in _FIXED and name in self.__dict__:
            raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
        object.__setattr__(self, name, value)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        return len(self._index_sampler)

    def __iter__(self):
        if self.num_workers == 0:
            return _InProcess(self)
        if not self.persistent_workers:
            return _InWorkers(self)
        if self._workers is None or not self._workers.running:
            self._workers = _InWorkers(self)
        else:
            self._workers.reset()
        return self._workers


class _InProcess:
    def __init__(self, loader: DataLoader):
        self.loader = loader
        fresh_seed(loader.generator)  # the draw a worker seed takes: orders match with and without workers
        self.indices = iter(loader._index_sampler)
        self.fetcher = Fetcher(loader.dataset, loader._iterable, loader._auto_collation, loader.collate_fn,
                               loader.drop_last)

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def __next__(self):
        return self.fetcher.fetch(next(self.indices))  # StopIteration from either ends the epoch


class _InWorkers:
    """Sends batches of indices to the workers in turn, keeps prefetch_factor tasks per worker
    in flight, and hands back the results in task order."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        n = loader.num_workers
        context = loader.multiprocessing_context or multiprocessing.get_context(
            "fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        base_seed = fresh_seed(loader.generator)
        self.results = context.Queue()
        self.queues, self.workers = [], []
        for w in range(n):
            q = context.Queue()
            p = context.Process(target=worker_loop, daemon=True,
                                args=(loader.dataset, loader._iterable, loader._auto_collation, loader.collate_fn,
                                      loader.drop_last, base_seed, loader.worker_init_fn, w, n, q, self.results))
            p.start()
            self.queues.append(q)
            self.workers.append(p)
        self.running = True
        self._start_epoch()

    def _start_epoch(self) -> None:
        self.indices = iter(self.loader._index_sampler)
        self.sent = self.received = 0
        self.tasks = {}  # task number -> [worker] while pending, [worker, batch] once arrived early
        self.active = [True] * len(self.workers)
        self.turn = itertools.cycle(range(len(self.workers)))
        for _ in range(max(1, self.loader.prefetch_factor * len(self.workers))):  # at least one in flight
            self._send()

    def reset(self) -> None:
        """A new epoch on the same (persistent) workers."""
        for q in self.queues:
            q.put(Resume())
        waiting = len(self.queues)
        while waiting:  # results of an epoch left unfinished come first and are dropped
            number, _ = self._get()
            waiting -= isinstance(number, Resume)
        self._start_epoch()

    def _send(self) -> None:
        try:
            index = next(self.indices)
        except StopIteration:
            return
        for _ in range(len(self.workers)):
            w = next(self.turn)
            if self.active[w]:
                break
        else:
            return
        self.queues[w].put((self.sent, index))
        self.tasks[self.sent] = [w]
        self.sent += 1

    def _get(self):
        start = time.monotonic()
        while True:
            try:
                return self.results.get(timeout=1.0)
            except queue.Empty:
                dead = [p.pid for p in self.workers if not p.is_alive()]
                if dead:
                    self.shutdown()
                    raise RuntimeError(f"DataLoader worker (pid(s) {', '.join(map(str, dead))}) exited "
                                       "unexpectedly") from None
                if self.loader.timeout and time.monotonic() - start > self.loader.timeout:
                    raise RuntimeError(f"DataLoader timed out after {self.loader.timeout} seconds") from None

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def __next__(self):
        while True:
            while self.received < self.sent:  # skip tasks of workers whose stream has ended
                task = self.tasks[self.received]
                if len(task) == 2 or self.active[task[0]]:
                    break
                del self.tasks[self.received]
                self.received += 1
            else:
                if not self.loader.persistent_workers:
                    self.shutdown()
                raise StopIteration
            task = self.tasks[self.received]
            if len(task) == 2:
                return self._deliver(task[1])
            number, data = self._get()
            if isinstance(number, Resume):
                continue
            if isinstance(data, WorkerDone):
                self.active[data.worker_id] = False
                self._send()
                continue
            if number != self.received:
                self.tasks[number].append(data)  # early: kept until its turn
                continue
            return self._deliver(data)

    def _deliver(self, data):
        del self.tasks[self.received]
        self.received += 1
        self._send()
        if isinstance(data, WorkerError):
            self.shutdown()
            data.reraise()
        return unship(data)

    def shutdown(self) -> None:
        if not getattr(self, "running", False):
            return
        self.running = False
        for q in self.queues:
            q.put(None)
        for p in self.workers:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
        for q in [*self.queues, self.results]:
            q.cancel_join_thread()
            q.close()

    def __del__(self):
        self.shutdown()
