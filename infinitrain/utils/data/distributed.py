"""DistributedSampler, as torch.utils.data.distributed's: each data-parallel rank's share of
the dataset's indices."""
from __future__ import annotations

import math
import sys

from ...random import Generator
from ._random import randperm
from .sampler import Sampler


def _default_group(what: str) -> int:
    """The default process group's world size or rank. It is looked up, not imported: a group
    exists only once infinitrain.distributed was imported and init_process_group called."""
    distributed = sys.modules.get("infinitrain.distributed")
    if distributed is None or not distributed.is_initialized():
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         f"init_process_group (or pass {what} to DistributedSampler).")
    return distributed.get_world_size() if what == "num_replicas" else distributed.get_rank()


class DistributedSampler(Sampler):
    """Rank `rank`'s indices of `dataset`: every num_replicas-th index of one order, the same
    on every rank (a random one drawn from seed + epoch when shuffle, call set_epoch at each
    epoch; else 0, 1, ...). The order is padded by repeating its start so that every rank gets
    the same count, or with drop_last cut to a multiple of num_replicas. num_replicas and rank
    default to the default process group's (infinitrain.distributed)."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None:
            num_replicas = _default_group("num_replicas")
        if rank is None:
            rank = _default_group("rank")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.epoch, self.drop_last, self.shuffle, self.seed = 0, drop_last, shuffle, seed
        n = len(dataset)
        if drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        n = len(self.dataset)
        order = randperm(n, Generator(self.seed + self.epoch)).tolist() if self.shuffle else list(range(n))
        if self.drop_last:
            order = order[:self.total_size]
        elif order:
            short = self.total_size - len(order)
            order += (order * math.ceil(short / len(order)))[:short]
        if len(order) != self.total_size:
            raise AssertionError(f"DistributedSampler: {len(order)} indices, expected {self.total_size}")
        return iter(order[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order to draw: with shuffle, each epoch's differs, the same on every rank."""
        self.epoch = epoch
