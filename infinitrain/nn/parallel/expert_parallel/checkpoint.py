"""Checkpoints under expert parallelism keep one process's names: each EP rank holds the
experts [r*E/EP, (r+1)*E/EP) under their global names (experts.5...), so the writer gathers
every EP rank's experts over the EP group and writes them all; a reader takes the names of the
experts it holds (whatever EP wrote the file)."""
from __future__ import annotations

import re

from ....tensor import _empty

# a routed expert's tensor: "<layer>.experts.<global index>.<rest>" (a shared expert's name,
# "shared_experts.gate_proj...", has no index and no dot before "experts")
_EXPERT = re.compile(r"^(.*\.experts\.)(\d+)(\..*)$")


def is_expert_name(name: str) -> bool:
    return _EXPERT.match(name) is not None


def expert_parallel_of(model):
    """The ExpertParallel the model's MoE layers were built with (EP > 1), or None."""
    from . import ExpertParallel
    for m in model.modules():
        ep = getattr(m, "ep", None)
        if isinstance(ep, ExpertParallel) and ep.size > 1:
            return ep
    return None


def every_rank_names(names, ep) -> dict:
    """{the name of an expert tensor on any EP rank: the name of this rank's at the same place}
    for this rank's expert names (the places: layer, local position, rest of the name; every
    rank holds the same layers with E/EP experts each)."""
    held = {}  # layer prefix -> this rank's global expert indices there
    for name in names:
        m = _EXPERT.match(name)
        if m:
            held.setdefault(m.group(1), set()).add(int(m.group(2)))
    local = {prefix: sorted(ids) for prefix, ids in held.items()}
    out = {}
    for name in names:
        m = _EXPERT.match(name)
        if m:
            prefix, n = m.group(1), len(local[m.group(1)])
            i = local[prefix].index(int(m.group(2)))
            for r in range(ep.size):
                out[f"{prefix}{r * n + i}{m.group(3)}"] = name
    return out


def gather_expert_tensors(tensors: dict, ep) -> dict:
    """tensors: name -> this rank's tensor, its experts' under their global names. Returns them
    with every EP rank's expert tensors added under their global names. Collective over the EP
    group: the tensors are gathered in the order of their names on rank 0 of the group, which
    name the same places on every rank."""
    names = every_rank_names(tensors, ep)
    first = {}  # own name -> its name on the group's rank 0 (the same on every rank)
    for name, own in names.items():
        first[own] = min(first.get(own, name), name, key=_place)
    out = dict(tensors)
    for own in sorted(first, key=lambda k: _place(first[k])):
        t = tensors[own].contiguous()
        every = _empty((ep.size * t.numel(),), t.dtype, t.device)
        ep.group.all_gather(every, t.reshape(-1))
        for r, name in enumerate(sorted((n for n, o in names.items() if o == own), key=_place)):
            out[name] = every[r * t.numel():(r + 1) * t.numel()].reshape(*t.shape)
    return out


def _place(name: str) -> tuple:
    m = _EXPERT.match(name)
    return m.group(1), int(m.group(2)), m.group(3)
