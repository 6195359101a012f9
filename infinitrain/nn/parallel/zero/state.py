"""ZeRO's state dicts (a mixin of ZeroOptimizer), in one process's form so that checkpoints
are layout-free: state_dict gathers every rank's shard of the optimizer state into full
tensors per original parameter (collective over the DP group); load_state_dict takes such a
state (from any DP size or none) and keeps this rank's shard of every tensor.

It works on what ZeroOptimizer's constructor made: param_groups, segments, buckets, group,
optimizer (None on a rank with no element) and optimizer_class.
"""
from __future__ import annotations

import numpy as np

from ....autograd import no_grad
from ....creation import empty, from_numpy, zeros
from ..process_group import ReduceOp


class ZeroState:
    """The state dicts of ZeroOptimizer."""

    def _original_params(self) -> list:
        return [p for g in self.param_groups for p in g["params"]]

    @no_grad()
    def state_dict(self) -> dict:
        """The state one process's optimizer would have (per original parameter, full tensors),
        gathered from every rank's shard: collective over the DP group."""
        index = {id(p): i for i, p in enumerate(self._original_params())}
        inner = self.optimizer.state_dict()["state"] if self.optimizer is not None else {}
        mine_of = {id(shard): inner.get(k, {}) for k, shard in enumerate(self._inner_params())}
        keys, step = set(), 0
        for st in inner.values():
            keys |= {k for k, v in st.items() if hasattr(v, "numel") and v.ndim == 1}
            step = max(step, int(st.get("step", 0)))
        t = from_numpy(np.array([step], dtype=np.int64)).to(self.buckets[0].device)
        self.group.all_reduce(t, ReduceOp.MAX)
        step = int(t.item())
        keys = sorted(keys) if keys else ["exp_avg", "exp_avg_sq"]
        state = {}
        for bi, b in enumerate(self.buckets):
            for key in keys:
                mine = zeros(b.piece, dtype=b.dtype, device=b.device)
                for shard, sbi, at, p, _ in self.segments:
                    if sbi == bi and key in mine_of[id(shard)]:
                        mine[at:at + shard.numel()].copy_(mine_of[id(shard)][key])
                full = empty(b.padded, dtype=b.dtype, device=b.device)
                b.group.all_gather(full, mine)
                for j, p in enumerate(b.params):
                    entry = state.setdefault(index[id(p)], {"step": step})
                    entry[key] = full[b.offsets[j]:b.offsets[j] + p.numel()].view(*p.shape).clone()
        groups, at = [], 0
        for g in self.param_groups:
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": list(range(at, at + len(g["params"])))})
            at += len(g["params"])
        return {"state": state if step > 0 else {}, "param_groups": groups}

    def _inner_params(self) -> list:
        """The shard parameters in the order of the inner optimizer's state_dict."""
        return [p for g in self.optimizer.param_groups for p in g["params"]] if self.optimizer is not None else []

    @no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Takes one process's optimizer state (what state_dict gives, from any DP size or
        none): each rank keeps its shard of every tensor."""
        params = self._original_params()
        groups = state_dict["param_groups"]
        for saved in groups:
            self.optimizer_class.check_hyperparameters({k: v for k, v in saved.items() if k != "params"})
        for i, st in state_dict["state"].items():
            self.optimizer_class.check_state(i, st)
        if len(groups) != len(self.param_groups):
            raise ValueError(f"optimizer state has {len(groups)} parameter groups, this optimizer "
                             f"has {len(self.param_groups)}")
        for saved, own in zip(groups, self.param_groups):
            own.update({k: v for k, v in saved.items() if k != "params"})
        index = {id(p): i for i, p in enumerate(params)}
        inner = {}  # shard parameter -> its piece of the state
        for shard, _, _, p, off in self.segments:
            st = state_dict["state"].get(index[id(p)], state_dict["state"].get(str(index[id(p)])))
            if not st:
                continue
            entry = {}
            for k, v in st.items():
                if hasattr(v, "numel") and tuple(v.shape) == tuple(p.shape):
                    entry[k] = v.contiguous().view(-1)[off:off + shard.numel()].clone()
                elif hasattr(v, "numel") and v.numel() > 1:
                    raise ValueError(f"optimizer state '{k}' has shape {tuple(v.shape)}, its parameter "
                                     f"{tuple(p.shape)}")
                else:
                    entry[k] = v.item() if hasattr(v, "item") else v
            inner[shard] = entry
        if self.optimizer is not None:
            self.optimizer.load_state_dict({"state": {k: inner[shard] for k, shard in enumerate(self._inner_params())
                                                      if shard in inner},
                                            "param_groups": self.optimizer.numbered_groups()})
