"""Layout: how the world's ranks split into data-, tensor- and pipeline-parallel groups.

TP varies fastest, then DP, then PP: rank = tp + dp*TP + pp*TP*DP (as InfiniTrain and
Megatron), so a TP group is a block of neighbouring ranks (one node) and PP stages are far
apart. Context parallelism will add a CP axis between TP and DP.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Coords:
    dp: int
    tp: int
    pp: int


class Layout:
    def __init__(self, world_size: int, tp: int = 1, pp: int = 1, dp: int | None = None):
        for name, v in (("world size", world_size), ("tensor parallel size", tp),
                        ("pipeline parallel size", pp)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if world_size % (tp * pp):
            raise ValueError(f"the world of {world_size} ranks cannot be split into tensor parallel "
                             f"{tp} x pipeline parallel {pp} (= {tp * pp}); use a world size that "
                             f"is a multiple of {tp * pp}")
        inferred = world_size // (tp * pp)
        if dp is not None and dp != inferred:
            raise ValueError(f"data parallel {dp} x tensor parallel {tp} x pipeline parallel {pp} "
                             f"= {dp * tp * pp} ranks, but the world has {world_size}")
        self.world_size, self.tp, self.pp, self.dp = world_size, tp, pp, inferred

    def rank_of(self, dp: int = 0, tp: int = 0, pp: int = 0) -> int:
        if not (0 <= dp < self.dp and 0 <= tp < self.tp and 0 <= pp < self.pp):
            raise ValueError(f"coordinates (dp={dp}, tp={tp}, pp={pp}) are outside {self}")
        return tp + dp * self.tp + pp * self.tp * self.dp

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        return Coords(dp=(rank // self.tp) % self.dp, tp=rank % self.tp,
                      pp=rank // (self.tp * self.dp))

    def dp_group(self, rank: int) -> list:
        """The ranks holding the same model shard (same tp, pp): they all-reduce gradients."""
        c = self.coords(rank)
        return [self.rank_of(d, c.tp, c.pp) for d in range(self.dp)]

    def tp_group(self, rank: int) -> list:
        c = self.coords(rank)
        return [self.rank_of(c.dp, t, c.pp) for t in range(self.tp)]

    def pp_group(self, rank: int) -> list:
        c = self.coords(rank)
        return [self.rank_of(c.dp, c.tp, p) for p in range(self.pp)]

    def all_groups(self, kind: str) -> list:
        """Every group of one kind ("dp", "tp" or "pp"), each a sorted list of ranks."""
        fn = {"dp": self.dp_group, "tp": self.tp_group, "pp": self.pp_group}[kind]
        return sorted({tuple(fn(r)) for r in range(self.world_size)})

    def describe(self, sequence_parallel: bool = False) -> str:
        return f"DP={self.dp}, TP={self.tp}, SP={self.tp if sequence_parallel and self.tp > 1 else 0}, PP={self.pp}"

    def __repr__(self) -> str:
        return f"Layout(world={self.world_size}, dp={self.dp}, tp={self.tp}, pp={self.pp})"
