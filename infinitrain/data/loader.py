"""Loaders beyond torch.utils.data's (whose DataLoader, datasets and samplers live in
infinitrain.utils.data): length-grouped batches, and llm.c-style next-token batches from
token shards."""
from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

from ..creation import from_numpy
from ..device import as_device
from ..random import Generator
from ..utils.data import BatchSampler
from ..utils.data._random import randperm
from .llmc import read_shard


def shard_files(pattern) -> list:
    """The token shards a path or glob (train_*.bin) names, sorted; FileNotFoundError when a
    glob matches none (a plain path is returned as it is: reading it says what is wrong with it,
    a folder, a FIFO, a missing file)."""
    if not any(c in str(pattern) for c in "*?["):
        return [str(pattern)]
    files = sorted(f for f in glob.glob(str(pattern)) if Path(f).is_file())
    if not files:
        raise FileNotFoundError(f"no token shard matches {pattern}")
    return files


class LengthGroupedBatchSampler(BatchSampler):
    """Batches of items of similar length, as Hugging Face's LengthGroupedSampler groups them,
    for DataLoader(batch_sampler=...): the order of `sampler` (default: a random order drawn
    from seed + epoch with shuffle, else 0, 1, ...) is cut into mega-batches of 50 batches,
    each sorted by length (longest first) and cut into batches; with shuffle the batches then
    come in a random order. Padding is little and every epoch (set_epoch) still differs; the
    same seed and epoch give the same batches."""

    def __init__(self, lengths, batch_size: int, drop_last: bool = False, sampler=None, shuffle: bool = True,
                 seed: int = 0):
        super().__init__(sampler if sampler is not None else range(len(lengths)), batch_size, drop_last)
        self.lengths, self.custom_order = np.asarray(lengths), sampler is not None
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = Generator(self.seed + self.epoch)
        if self.custom_order:
            idx = np.fromiter(iter(self.sampler), dtype=np.int64)
        else:
            idx = randperm(len(self.lengths), g) if self.shuffle else np.arange(len(self.lengths))
        if len(idx) and int(idx.max()) >= len(self.lengths):
            raise ValueError(f"LengthGroupedBatchSampler: index {int(idx.max())} has no length "
                             f"({len(self.lengths)} lengths)")
        mega = self.batch_size * 50
        idx = np.concatenate([chunk[np.argsort(-self.lengths[chunk], kind="stable")]
                              for chunk in np.split(idx, range(mega, len(idx), mega))]) if len(idx) else idx
        batches = [idx[i:i + self.batch_size].tolist() for i in range(0, len(idx), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        order = randperm(len(batches), g) if self.shuffle else range(len(batches))
        return iter([batches[i] for i in order])


class TokenLoader:
    """Next-token batches from llm.c token shards, in llm.c's order: a batch is the window of
    B*T+1 tokens at the current position (x = all but the last, y = all but the first); the
    position advances by B*T*num_processes; when the next window would not fit, the loader
    moves to the next shard (wrapping around to the first). Process r starts r windows in, so
    processes together read what one process with their combined batch would. Batches come
    on `device` (copied from the host)."""

    def __init__(self, pattern, batch_size: int, seq_len: int, process_rank: int = 0,
                 num_processes: int = 1, vocab_size: int | None = None, device="cpu"):
        self.files = files = shard_files(pattern)
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
