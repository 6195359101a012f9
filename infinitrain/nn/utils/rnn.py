"""torch.nn.utils.rnn: pad_sequence (variable-length sequences into one padded batch)."""
from __future__ import annotations

from ...ops.shape import stack
from ...tensor import Tensor
from .. import functional as F


def pad_sequence(sequences, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Tensors [L_i, *] padded with padding_value to the longest L and stacked: [L, B, *], or
    [B, L, *] with batch_first. Differentiable: each sequence's gradient is its own rows'."""
    if padding_side not in ("right", "left"):
        raise ValueError(f"pad_sequence: padding_side must be 'right' or 'left', got {padding_side!r}")
    sequences = list(sequences)
    if not sequences or not all(isinstance(s, Tensor) and s.ndim >= 1 for s in sequences):
        raise ValueError("pad_sequence: expected a non-empty list of tensors of at least one dimension")
    trailing = tuple(sequences[0].shape[1:])
    if any(tuple(s.shape[1:]) != trailing for s in sequences):
        raise ValueError(f"pad_sequence: every sequence must be [L, {', '.join(map(str, trailing))}] "
                         f"(only the length may differ), got {[tuple(s.shape) for s in sequences]}")
    longest = max(s.shape[0] for s in sequences)
    padded = []
    for s in sequences:
        short = longest - s.shape[0]
        pair = (0, short) if padding_side == "right" else (short, 0)
        padded.append(F.pad(s, (0, 0) * len(trailing) + pair, value=padding_value) if short else s)
    return stack(padded, 0 if batch_first else 1)
