"""Layout: how the world's ranks split into data-, context-, tensor- and pipeline-parallel
groups.

TP varies fastest, then CP, then DP, then PP (Megatron's order):
    rank = tp + cp*TP + dp*TP*CP + pp*TP*CP*DP
so a TP group is a block of neighbouring ranks (one node), the CP ranks that pass K/V around
their ring come next, and PP stages are far apart. DP and CP together form the group that
reduces gradients (Megatron's `dp_cp` group): each CP rank holds part of a sample's gradient,
each DP rank another batch.

Expert parallelism (EP) is carved out of DP x CP, as Megatron-Core does: it adds no ranks. The
DP x CP group, in its order (cp fastest, then dp: index = cp + dp*CP), is cut into blocks of EP
neighbours; each block is an EP group (`ep_group`: the ranks that exchange tokens with an
all-to-all, each holding E/EP of the experts), the neighbours so that the all-to-all, the
heaviest traffic of an MoE layer, stays between close ranks (one node) as TP's does. The ranks
at the same place of every block hold the same experts and form the expert data-parallel group
(`expert_dp_group`, DP x CP / EP ranks), which reduces the experts' gradients; dense weights are
replicated over all of DP x CP and reduced over it as before.
"""
from __future__ import annotations

from dataclasses import dataclass

AXES = ("tp", "cp", "dp", "pp")  # fastest-varying first


@dataclass(frozen=True)
class Coords:
    dp: int
    tp: int
    pp: int
    cp: int = 0


class Layout:
    def __init__(self, world_size: int, tp: int = 1, pp: int = 1, dp: int | None = None, cp: int = 1,
                 ep: int = 1):
        for name, v in (("world size", world_size), ("tensor parallel size", tp),
                        ("pipeline parallel size", pp), ("context parallel size", cp),
                        ("expert parallel size", ep)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if world_size % (tp * pp * cp):
            raise ValueError(f"the world of {world_size} ranks cannot be split into tensor parallel "
                             f"{tp} x context parallel {cp} x pipeline parallel {pp} (= {tp * cp * pp}); "
                             f"use a world size that is a multiple of {tp * cp * pp}")
        inferred = world_size // (tp * pp * cp)
        if dp is not None and dp != inferred:
            raise ValueError(f"data parallel {dp} x tensor parallel {tp} x context parallel {cp} x "
                             f"pipeline parallel {pp} = {dp * tp * cp * pp} ranks, but the world has {world_size}")
        self.world_size, self.tp, self.pp, self.cp, self.dp = world_size, tp, pp, cp, inferred
        if (inferred * cp) % ep:
            raise ValueError(f"--expert_parallel {ep} must divide data parallel {inferred} x context parallel {cp} "
                             f"(= {inferred * cp}): expert parallelism is carved out of those ranks")
        self.ep = ep

    def _sizes(self) -> dict:
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}

    def rank_of(self, dp: int = 0, tp: int = 0, pp: int = 0, cp: int = 0) -> int:
        at = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        rank, stride = 0, 1
        for axis in AXES:
            size = self._sizes()[axis]
            if not 0 <= at[axis] < size:
                raise ValueError(f"coordinates (dp={dp}, tp={tp}, pp={pp}, cp={cp}) are outside {self}")
            rank += at[axis] * stride
            stride *= size
        return rank

    def coords(self, rank: int) -> Coords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        at, rest = {}, rank
        for axis in AXES:
            size = self._sizes()[axis]
            at[axis], rest = rest % size, rest // size
        return Coords(**at)

    def group(self, rank: int, axes: tuple) -> list:
        """The ranks that share this rank's coordinates except along `axes` (which vary, the
        first fastest), in rank order for a single axis."""
        c = self.coords(rank)
        members = [dict(dp=c.dp, tp=c.tp, pp=c.pp, cp=c.cp)]
        for axis in axes:
            members = [dict(m, **{axis: i}) for i in range(self._sizes()[axis]) for m in members]
        return sorted(self.rank_of(**m) for m in members)

    def dp_group(self, rank: int) -> list:
        """The ranks holding the same model shard and the same part of the sequence (same tp,
        cp, pp): different batches."""
        return self.group(rank, ("dp",))

    def tp_group(self, rank: int) -> list:
        return self.group(rank, ("tp",))

    def pp_group(self, rank: int) -> list:
        return self.group(rank, ("pp",))

    def cp_group(self, rank: int) -> list:
        """The ranks that split one batch's sequences (same tp, dp, pp): their ring."""
        return self.group(rank, ("cp",))

    def dp_cp_group(self, rank: int) -> list:
        """The ranks holding the same model shard (same tp, pp): they reduce gradients."""
        return self.group(rank, ("cp", "dp"))

    def ep_group(self, rank: int) -> list:
        """The EP ranks that exchange tokens (each holding E/EP experts): this rank's block of EP
        neighbours in the DP x CP group's order."""
        members = self.dp_cp_group(rank)
        block = members.index(rank) // self.ep
        return members[block * self.ep:(block + 1) * self.ep]

    def expert_dp_group(self, rank: int) -> list:
        """The ranks holding the same experts (the same place in each EP block of DP x CP, DP x
        CP / EP of them): they reduce the experts' gradients."""
        members = self.dp_cp_group(rank)
        return members[members.index(rank) % self.ep::self.ep]

    def all_groups(self, kind: str) -> list:
        """Every group of one kind ("dp", "tp", "pp", "cp", "dp_cp", "ep" or "expert_dp"), each a
        sorted list of ranks."""
        fn = getattr(self, f"{kind}_group")
        return sorted({tuple(fn(r)) for r in range(self.world_size)})

    def describe(self, sp: int = 0) -> str:
        """The sizes as the log line shows them; sp: the sequence-parallel size (0: off)."""
        return f"DP={self.dp}, TP={self.tp}, SP={sp}, PP={self.pp}, CP={self.cp}" + \
            (f", EP={self.ep}" if self.ep > 1 else "")

    def __repr__(self) -> str:
        return f"Layout(world={self.world_size}, dp={self.dp}, tp={self.tp}, pp={self.pp}, cp={self.cp}" + \
            (f", ep={self.ep})" if self.ep > 1 else ")")
