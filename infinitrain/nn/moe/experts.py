"""The experts of a mixture-of-experts layer: SwiGLU feed-forward networks (LLaMA's MLP,
Hugging Face's names gate_proj, up_proj, down_proj, bias-free), the routed ones run together
by grouped products over their rows, the shared ones (DeepSeek, Qwen2-MoE) on every token."""
from __future__ import annotations

from ...autograd.recompute import checkpoint
from ...ops.moe import grouped_linear
from .. import functional as F
from ..module import Module
from ..modules import Linear, ModuleDict
from ..parallel import tensor_parallel as tpl


class Expert(Module):
    """One routed expert's weights (its products run in Experts, grouped with the others')."""

    def __init__(self, hidden: int, ffn_hidden: int):
        super().__init__()
        self.gate_proj = Linear(hidden, ffn_hidden, bias=False)
        self.up_proj = Linear(hidden, ffn_hidden, bias=False)
        self.down_proj = Linear(ffn_hidden, hidden, bias=False)

    def forward(self, x):  # one expert alone, as a reference and for a caller with one expert's rows
        return self.down_proj(F.swiglu(self.gate_proj(x), self.up_proj(x)))


class Experts(ModuleDict):
    """The routed experts this rank holds, keyed by their GLOBAL index (so checkpoint names are
    one process's: experts.5.gate_proj.weight whatever the expert parallelism)."""

    recompute = False  # selective recomputation: the activation and down products rerun in backward

    def __init__(self, hidden: int, ffn_hidden: int, indices):
        super().__init__({str(e): Expert(hidden, ffn_hidden) for e in indices})

    def forward(self, xs, counts):
        """xs [A, C]: rows grouped by expert in this ModuleDict's order, counts[i] of the i-th."""
        experts = list(self.values())
        gate = grouped_linear(xs, [e.gate_proj.weight for e in experts], counts)
        up = grouped_linear(xs, [e.up_proj.weight for e in experts], counts)
        if self.recompute:
            return checkpoint(self.down, gate, up, tuple(counts))
        return self.down(gate, up, counts)

    def down(self, gate, up, counts):
        return grouped_linear(F.swiglu(gate, up), [e.down_proj.weight for e in self.values()], counts)


class SharedExperts(Module):
    """A SwiGLU MLP of width (shared experts) x moe_ffn_hidden that every token goes through;
    split over TP as the dense MLP is (column-parallel gate and up, row-parallel down)."""

    recompute = False

    def __init__(self, hidden: int, ffn_hidden: int, tp=None):
        super().__init__()
        if tp:
            tp.check_divisible("the shared experts' width (moe_shared_experts * moe_ffn_hidden)", ffn_hidden)
        self.gate_proj = tpl.column_linear(hidden, ffn_hidden, tp, bias=False)
        self.up_proj = tpl.column_linear(hidden, ffn_hidden, tp, bias=False)
        self.down_proj = tpl.row_linear(ffn_hidden, hidden, tp, bias=False)

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        return checkpoint(self.down, gate, up) if self.recompute else self.down(gate, up)

    def down(self, gate, up):
        return self.down_proj(F.swiglu(gate, up))
