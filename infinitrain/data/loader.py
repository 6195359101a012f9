"""Datasets and loaders: map-style Dataset/DataLoader, and llm.c-style next-token batches
from token shards."""
from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

from ..creation import from_numpy
from ..device import as_device
from .llmc import read_shard


class Dataset:
    def __getitem__(self, index):
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class TensorDataset(Dataset):
    """Rows of numpy arrays (or tensors) of equal length."""

    def __init__(self, *arrays):
        arrays = [np.asarray(a) for a in arrays]
        if len({len(a) for a in arrays}) != 1:
            raise ValueError(f"TensorDataset: arrays of different lengths {[len(a) for a in arrays]}")
        self.arrays = arrays

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])


class DistributedSampler:
    """The indices of one data-parallel rank: every num_replicas-th index of the (seeded,
    per-epoch) permutation, padded by wrapping so that every rank gets the same count."""

    def __init__(self, dataset, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        if not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: rank {rank} is outside [0, {num_replicas})")
        self.n, self.replicas, self.rank = len(dataset), num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = np.random.default_rng((self.seed, self.epoch)).permutation(self.n) if self.shuffle \
            else np.arange(self.n)
        per = self.n // self.replicas if self.drop_last else -(-self.n // self.replicas)
        total = per * self.replicas
        order = order[:total] if self.drop_last else np.resize(order, total)
        return iter(order[self.rank:total:self.replicas].tolist())

    def __len__(self) -> int:
        return self.n // self.replicas if self.drop_last else -(-self.n // self.replicas)


class DataLoader:
    """Batches of a map-style dataset as tensors: seeded shuffling (a new order each epoch,
    the same orders for the same seed), drop_last, an optional sampler of indices, and as in
    PyTorch a collate_fn (a list of items -> numpy arrays; default: stack each field) run ahead
    in num_workers processes. group_by_length (one length per item) batches items of similar
    length together, as Hugging Face's LengthGroupedSampler: the order is cut into mega-batches
    of 50 batches, each sorted by length, and the batches are shuffled, so padding is little
    and every epoch still differs."""

    def __init__(self, dataset: Dataset, batch_size: int = 1, shuffle: bool = False,
                 drop_last: bool = False, seed: int = 0, sampler=None, collate_fn=None,
                 num_workers: int = 0, group_by_length=None):
        if batch_size <= 0:
            raise ValueError(f"DataLoader: batch_size must be > 0, got {batch_size}")
        if shuffle and sampler is not None:
            raise ValueError("DataLoader: shuffle and sampler are mutually exclusive")
        if num_workers < 0:
            raise ValueError(f"DataLoader: num_workers must be >= 0, got {num_workers}")
        if group_by_length is not None and len(group_by_length) != len(dataset):
            raise ValueError(f"DataLoader: group_by_length has {len(group_by_length)} lengths for "
                             f"{len(dataset)} items")
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.drop_last, self.seed, self.sampler = shuffle, drop_last, seed, sampler
        self.collate_fn, self.num_workers = collate_fn, num_workers
        self.lengths = None if group_by_length is None else np.asarray(group_by_length)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> np.ndarray:
        if self.sampler is not None:
            return np.asarray(list(self.sampler))
        n = len(self.dataset)
        if self.shuffle:
            return np.random.default_rng((self.seed, self.epoch)).permutation(n)
        return np.arange(n)

    def _batches(self, idx: np.ndarray) -> list:
        B = self.batch_size
        if self.lengths is not None:
            mega = B * 50
            idx = np.concatenate([chunk[np.argsort(-self.lengths[chunk], kind="stable")]
                                  for chunk in np.split(idx, range(mega, len(idx), mega))]) if len(idx) else idx
        batches = [idx[i:i + B] for i in range(0, len(idx), B)]
        if self.drop_last and batches and len(batches[-1]) < B:
            batches.pop()
        if self.lengths is not None:
            order = np.random.default_rng((self.seed, self.epoch, 1)).permutation(len(batches))
            batches = [batches[i] for i in order]
        return batches

    def __len__(self) -> int:
        n = len(self._indices())
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        batches = self._batches(self._indices())
        self.epoch += 1
        if self.num_workers == 0:
            for batch in batches:
                yield _as_tensors(self._collate(batch))
            return
        global _WORKER_LOADER
        import multiprocessing
        _WORKER_LOADER = self  # forked workers inherit it: no pickling of the dataset or collate_fn
        with multiprocessing.get_context("fork").Pool(self.num_workers) as pool:
            for arrays in pool.imap(_collate_in_worker, batches):  # runs ahead of the consumer
                yield _as_tensors(arrays)

    def _collate(self, batch) -> tuple:
        if self.collate_fn is not None:
            return tuple(self.collate_fn([self.dataset[int(i)] for i in batch]))
        if hasattr(self.dataset, "arrays"):  # vectorised gather for array datasets
            return tuple(a[batch] for a in self.dataset.arrays)
        rows = [self.dataset[int(i)] for i in batch]
        return tuple(np.stack([np.asarray(r[j]) for r in rows]) for j in range(len(rows[0])))


_WORKER_LOADER = None


def _collate_in_worker(batch):
    return _WORKER_LOADER._collate(batch)


def _as_tensors(arrays) -> tuple:
    return tuple(from_numpy(np.ascontiguousarray(_tensor_dtype(np.asarray(a)))) for a in arrays)


def _tensor_dtype(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.float64:
        return a.astype(np.float32)
    if a.dtype.kind in "iu" and a.dtype != np.uint8:
        return a.astype(np.int64)
    return a


class TokenLoader:
    """Next-token batches from llm.c token shards, in llm.c's order: a batch is the window of
    B*T+1 tokens at the current position (x = all but the last, y = all but the first); the
    position advances by B*T*num_processes; when the next window would not fit, the loader
    moves to the next shard (wrapping around to the first). Process r starts r windows in, so
    processes together read what one process with their combined batch would. Batches come
    on `device` (copied from the host)."""

    def __init__(self, pattern, batch_size: int, seq_len: int, process_rank: int = 0,
                 num_processes: int = 1, vocab_size: int | None = None, device="cpu"):
        files = sorted(glob.glob(str(pattern))) if any(c in str(pattern) for c in "*?[") \
            else [str(pattern)]
        if not files or not all(Path(f).is_file() for f in files):
            raise FileNotFoundError(f"no token shard matches {pattern}")
        self.files = files
        self.B, self.T = batch_size, seq_len
        self.rank, self.world = process_rank, num_processes
        self.vocab_size = vocab_size
        self.device = as_device(device)
        need = batch_size * seq_len * num_processes + 1
        self.shards = []
        for f in files:
            toks = read_shard(f, vocab_size)
            if len(toks) < need:
                raise ValueError(f"{f}: {len(toks)} tokens are fewer than one step needs "
                                 f"({need} = batch {batch_size} x sequence {seq_len} x "
                                 f"{num_processes} processes + 1); use a smaller batch")
            self.shards.append(toks)
        self.reset()

    def reset(self) -> None:
        self.shard = 0
        self.position = self.B * self.T * self.rank

    def state(self) -> dict:
        """Where the loader is, for checkpoints: the same on every process (each adds its own
        offset back when loading)."""
        return {"shard": self.shard, "position": self.position - self.B * self.T * self.rank}

    def load_state(self, state: dict) -> None:
        shard, position = int(state["shard"]), int(state["position"]) + self.B * self.T * self.rank
        if not 0 <= shard < len(self.shards):
            raise ValueError(f"the saved loader was at shard {shard}, but there are {len(self.shards)}")
        if not 0 <= position <= len(self.shards[shard]) - (self.B * self.T + 1):
            raise ValueError(f"the saved loader was at token {position} of shard {shard}, which has "
                             f"{len(self.shards[shard])} tokens: these are not the shards it read")
        self.shard, self.position = shard, position

    def next_batch(self):
        B, T = self.B, self.T
        toks = self.shards[self.shard]
        window = np.asarray(toks[self.position:self.position + B * T + 1], dtype=np.int64)
        x = from_numpy(window[:-1].reshape(B, T).copy()).to(self.device)
        y = from_numpy(window[1:].reshape(B, T).copy()).to(self.device)
        self.position += B * T * self.world
        if self.position + B * T + 1 > len(toks):
            self.shard = (self.shard + 1) % len(self.shards)
            self.position = B * T * self.rank
        return x, y

    def __iter__(self):
        while True:
            yield self.next_batch()
