"""LoRA (Hu et al.): the base weights frozen, and on chosen linear layers a trainable low-rank
update, y = x Wᵀ + b + (alpha / r) · (x Aᵀ) Bᵀ, with A [r, in] drawn and B [out, r] zero, so
training starts from the base model.

The adapters sit on the linear layers themselves (`lora_A`, `lora_B` beside `weight`), so the
base parameters keep their names and checkpoints and llm.c files load as before. Under tensor
parallelism they are split to match their layer:
- column-parallel (output features split): A whole on every rank, B split by rows as W is;
  A's gradient is a partial sum on each rank and is summed over TP after backward;
- row-parallel (input features split): A split by columns as W is, B whole on every rank; the
  adapter's partial product is added to the layer's before the reduction (one collective, the
  sum one process computes), and B's gradient is summed over TP.
A is drawn full-size from a generator keyed by the seed and the layer's one-process name, so
every layout (TP, PP, DP) starts from the same adapters.
"""
from __future__ import annotations

import math
import zlib

from ..autograd import no_grad
from ..creation import empty
from ..random import Generator
from . import init
from .modules import Linear
from .parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from .parameter import Parameter

# InfiniTrain's default targets: GPT-2's and LLaMA-3's projections (a name matches when it is
# the layer's name or ends with "." + it)
DEFAULT_TARGETS = ("c_attn", "attn.c_proj", "c_fc", "c_fc2", "mlp.c_proj")


def _matches(name: str, targets) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def apply_lora(model, rank: int, alpha: float | None = None, targets=DEFAULT_TARGETS,
               seed: int = 0, ranks: dict | None = None) -> list:
    """Adds adapters to every linear layer of `model` whose name matches a target, freezes
    every other parameter, and returns the adapted layers' names. alpha defaults to rank
    (scale 1). `ranks` gives layers (by name) a rank of their own; every layer scales by
    alpha / rank all the same (PEFT's rank_pattern, and LLaMA's q, k, v adapters with three
    A's fused into one, need it)."""
    ranks = dict(ranks or {})
    for r in [rank, *ranks.values()]:
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {r!r}")
    alpha = float(rank if alpha is None else alpha)
    kinds = (Linear, ColumnParallelLinear, RowParallelLinear)
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, kinds) and _matches(n, targets)]
    if not layers:
        linear = [n for n, m in model.named_modules() if isinstance(m, kinds)]
        raise ValueError(f"no linear layer matches the LoRA targets {list(targets)}; this model's "
                         f"linear layers: {', '.join(linear[:12]) or 'none'}")
    _refuse_routed(model, [n for n, _ in layers])
    for p in model.parameters():
        p.requires_grad = False
    for name, layer in layers:
        _add_adapter(layer, name, ranks.get(name, rank), alpha / rank, seed)
    model.lora_config = {"r": rank, "lora_alpha": alpha, "target_modules": list(targets), "seed": seed}
    if ranks:
        model.lora_config["ranks"] = ranks
    return [n for n, _ in layers]


def _refuse_routed(model, names) -> None:
    """The routed experts' products are grouped over all experts at once (ops.moe), never
    through their Linear modules, and the router's runs in float32 apart: an adapter on them
    would be silently left out, so it is refused. LoRA on an MoE model adapts the attention
    (and the shared experts, dense SwiGLU MLPs), the experts and router frozen."""
    from .moe import MoE
    routed = {f"{prefix}.{part}" if prefix else part for prefix, m in model.named_modules() if isinstance(m, MoE)
              for part in ("gate", "experts")}
    bad = [n for n in names if any(n == r or n.startswith(r + ".") for r in routed)]
    if bad:
        raise ValueError("LoRA cannot adapt a mixture-of-experts layer's router or routed experts "
                         f"({', '.join(bad[:4])}"
                         f"{', ...' if len(bad) > 4 else ''}): target the attention (c_attn, attn.c_proj) or the "
                         "shared experts (shared_experts.gate_proj, ...) instead; the experts stay frozen")


def _add_adapter(layer, name: str, rank: int, scale: float, seed: int) -> None:
    if "lora_A" in layer._parameters:
        raise ValueError(f"{name} has a LoRA adapter already")
    w, dtype = layer.weight, layer.weight.dtype
    if isinstance(layer, RowParallelLinear):
        A = Parameter(empty(rank, w.shape[1], dtype=dtype, device=w.device))
        A.tp_shard = w.tp_shard                    # split by columns, as W
        B = Parameter(empty(w.shape[0], rank, dtype=dtype, device=w.device))
        B.partial_grad_group = layer.tp.group  # its gradient: a partial sum per TP rank
    else:
        A = Parameter(empty(rank, w.shape[1], dtype=dtype, device=w.device))
        B = Parameter(empty(w.shape[0], rank, dtype=dtype, device=w.device))
        if isinstance(layer, ColumnParallelLinear):
            B.tp_shard = w.tp_shard                # split by rows (whole heads of q, k, v), as W
            A.partial_grad_group = layer.tp.group
    fan_in = layer.in_features
    bound = 1.0 / math.sqrt(fan_in)
    init.uniform_(A, -bound, bound, generator=Generator(seed * 1_000_003 + zlib.crc32(name.encode())))
    init.zeros_(B)
    layer.lora_A, layer.lora_B = A, B
    layer.lora_scale, layer.lora_on = scale, True


def lora_layers(model) -> list:
    return [(n, m) for n, m in model.named_modules() if "lora_A" in m._parameters]


def lora_state(model) -> dict:
    """name -> adapter parameter (this rank's part), under one-process names."""
    return {n: p for n, p in model.named_parameters() if n.endswith((".lora_A", ".lora_B"))}


@no_grad()
def merge_lora(model) -> None:
    """W += scale · B A in every adapted layer (its forward then skips the adapter): the
    model runs as a plain one, at the base model's cost."""
    for _, m in lora_layers(model):
        if m.lora_on:
            m.weight.add_((m.lora_B.float() @ m.lora_A.float() * m.lora_scale).to(m.weight.dtype))
            m.lora_on = False


@no_grad()
def unmerge_lora(model) -> None:
    """Undoes merge_lora (W -= scale · B A; the adapters are applied separately again)."""
    for _, m in lora_layers(model):
        if not m.lora_on:
            m.weight.sub_((m.lora_B.float() @ m.lora_A.float() * m.lora_scale).to(m.weight.dtype))
            m.lora_on = True
