"""What GPT-2 and LLaMA-3 share as causal language models: sampling."""
from __future__ import annotations

import numpy as np

from .. import creation
from ..autograd import no_grad
from ..nn.module import Module
from ..nn.parallel import tensor_parallel as tpl
from ..ops import layers as ops_layers


def get_submodule(module, dotted: str):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _full_shape(p) -> tuple:
    shard = getattr(p, "tp_shard", None)
    return shard.full_shape(p.shape) if shard is not None else tuple(p.shape)


def _full(p):
    shard = getattr(p, "tp_shard", None)
    return shard.gather(p) if shard is not None else p.detach()


class CausalLM(Module):
    """A model whose forward(idx, targets=None) returns (logits [B, T, V], loss)."""

    config_class = None  # the dataclass of the model's configuration

    def _loss_and_logits(self, logits, targets, return_logits: bool):
        """From the head's logits [B, T, V'] (V'/TP columns under TP, padding last): the mean
        loss over the real vocabulary, and the logits without padding (gathered under TP)."""
        V, tp = self.config.vocab_size, getattr(self, "tp", None)
        loss = None
        if targets is not None:
            flat, t = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
            loss = tpl.vocab_parallel_cross_entropy(flat, t, V, tp) if tp \
                else ops_layers.cross_entropy(flat, t, V)
        if not return_logits:
            return None, loss
        if tp:
            logits = tpl.gather_from_tp(logits, tp.group)
        return logits[..., :V], loss

    # ---- llm.c checkpoints: a header, then every tensor in the model's llm.c order ----------
    def _llmc_tensors(self) -> list:
        """(name, [parameters]) in the file's order; per-layer tensors listed layer by layer."""
        raise NotImplementedError

    def _llmc_payload(self, store_dtype) -> bytes:
        """The file's payload: full tensors (a tensor-parallel shard is gathered first, so every
        rank of the group must call this)."""
        store = np.dtype(store_dtype)
        return b"".join(np.ascontiguousarray(_full(p).float().numpy()).astype(store).tobytes()
                        for _, params in self._llmc_tensors() for p in params)

    def _llmc_numel(self) -> int:
        return sum(int(np.prod(_full_shape(p))) for _, params in self._llmc_tensors() for p in params)

    @no_grad()
    def _llmc_load_payload(self, data: np.ndarray) -> None:
        """Copies the flat payload (any float dtype) into the parameters, in file order; a
        tensor-parallel shard takes its slice of the full tensor."""
        at = 0
        for _, params in self._llmc_tensors():
            for p in params:
                shape = _full_shape(p)
                n = int(np.prod(shape))
                full = creation.from_numpy(np.asarray(data[at:at + n]).astype(np.float32).reshape(shape))
                p.copy_(p.tp_shard.take(full) if p.tp_shard is not None else full)
                at += n

    def save_pretrained(self, folder) -> None:
        """Weights as safetensors plus config.json."""
        from ..checkpoint import save_pretrained
        save_pretrained(self, folder)

    @classmethod
    def from_pretrained(cls, folder):
        from ..checkpoint import from_pretrained
        return from_pretrained(cls, folder)

    @no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 seed: int = 0):
        """Samples continuations of idx [B, T] (no KV cache: each token reruns the prefix)."""
        rng = np.random.default_rng(seed)
        tokens = idx.numpy().astype(np.int64)
        tp = getattr(self, "tp", None)
        multiple = tp.size if tp is not None and tp.sequence_parallel else 1
        for _ in range(max_new_tokens):
            ctx = tokens[:, -self.config.block_size:]
            n = ctx.shape[1]
            # sequence parallelism splits the sequence evenly: pad the end (causal attention
            # keeps the padding out of the real positions' logits)
            ctx = np.pad(ctx, ((0, 0), (0, (-n) % multiple)))
            logits, _ = self(creation.from_numpy(np.ascontiguousarray(ctx)))
            last = logits[:, n - 1, :].float().numpy().astype(np.float64) / max(temperature, 1e-6)
            if top_k:
                kth = np.sort(last, axis=-1)[:, -top_k][:, None]
                last = np.where(last < kth, -np.inf, last)
            p = np.exp(last - last.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            nxt = np.array([[rng.choice(p.shape[-1], p=row)] for row in p])
            tokens = np.concatenate([tokens, nxt], axis=1)
        return creation.from_numpy(tokens)
