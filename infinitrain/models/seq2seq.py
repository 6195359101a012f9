"""The original encoder-decoder Transformer ("Attention Is All You Need") for translation: one
token embedding shared by source and target (one joint BPE vocabulary) scaled by sqrt(d_model),
sinusoidal positions as a buffer, dropout, nn.Transformer (post-LayerNorm as the paper, or
norm_first), and an output projection tied to the embedding (tie_embeddings=True, the paper's)
or its own. Greedy and beam-search decoding.

Tensor parallelism (tp=): the model is built whole, as one process builds it, and each rank
keeps its part: the embedding's vocabulary rows (and the tied output layer's), the attention
heads and feed-forward units of every layer (nn.parallel.tensor_parallel.parallelize_transformer).
The loss is the vocabulary-parallel cross-entropy, label smoothing included; decoding gathers
the logits."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import creation
from .. import dtypes as _dt
from ..autograd import no_grad
from ..nn import Dropout, Embedding, Linear, Module, Transformer
from ..nn import functional as F
from ..nn import init
from ..nn.parallel import tensor_parallel as tpl
from ..runtime import check_fits_in_memory
from ..data.translation import BOS, EOS, PAD


@dataclass
class Seq2SeqConfig:
    vocab_size: int
    d_model: int = 256
    nhead: int = 4
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    dim_feedforward: int = 1024
    dropout: float = 0.1
    max_len: int = 256
    norm_first: bool = False
    tie_embeddings: bool = True
    label_smoothing: float = 0.1  # the paper's


SEQ2SEQ_PRESETS = {  # the paper's base model, and sizes a CPU trains in minutes
    "base": dict(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048),
    "small": dict(d_model=256, nhead=4, num_encoder_layers=3, num_decoder_layers=3, dim_feedforward=1024),
    "tiny": dict(d_model=64, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=128),
}


def sinusoidal_positions(max_len: int, d_model: int) -> np.ndarray:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...), float32 [max_len, d]."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    freq = np.exp(-math.log(10000.0) * np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    pe = np.zeros((max_len, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos * freq), np.cos(pos * freq[: d_model // 2])
    return pe.astype(np.float32)


class Seq2SeqTransformer(Module):
    def __init__(self, config: Seq2SeqConfig, tp: tpl.TensorParallel | None = None):
        super().__init__()
        c = self.config = config
        self.embedding = Embedding(c.vocab_size, c.d_model, padding_idx=PAD)
        with no_grad():  # N(0, d^-1/2) as fairseq's (scaled by sqrt(d) going in, unit logits going out)
            init.normal_(self.embedding.weight, 0.0, c.d_model ** -0.5)
            self.embedding.weight[PAD] = 0.0
        self.register_buffer("positions", creation.from_numpy(sinusoidal_positions(c.max_len, c.d_model)),
                             persistent=False)
        self.dropout = Dropout(c.dropout)
        self.transformer = Transformer(c.d_model, c.nhead, c.num_encoder_layers, c.num_decoder_layers,
                                       c.dim_feedforward, c.dropout, batch_first=True, norm_first=c.norm_first)
        self.generator = Linear(c.d_model, c.vocab_size, bias=not c.tie_embeddings)
        if c.tie_embeddings:  # one matrix, registered in both (as GPT-2's lm_head): ZeRO-3 gathers it for each
            self.generator.weight = self.embedding.weight
        self.tp = tp
        if tp is not None:  # this rank's part of what one process built (see the module's docstring)
            tpl.parallelize_transformer(self.transformer, tp)
            self.embedding = tpl.VocabParallelEmbedding.from_embedding(self.embedding, tp)
            self.generator = tpl.ColumnParallelLinear.from_linear(self.generator, tp, pad=True)
            if c.tie_embeddings:  # the same rows of the vocabulary on each rank
                self.generator.weight = self.embedding.weight

    def _embed(self, ids):
        if ids.shape[1] > self.config.max_len:
            raise ValueError(f"a sequence of {ids.shape[1]} tokens is longer than max_len {self.config.max_len}")
        x = self.embedding(ids) * math.sqrt(self.config.d_model) + self.positions[:ids.shape[1]]
        return self.dropout(x)

    def encode(self, src):
        """Memory [B, S, d] of source ids [B, S] (PAD-padded)."""
        return self.transformer.encoder(self._embed(src), src_key_padding_mask=src == PAD)

    def decode(self, tgt_in, memory, src, gather: bool = True):
        """Logits [B, T, V] of the next token after each prefix of tgt_in, attending to memory
        (under TP with gather=False: this rank's block of the padded vocabulary)."""
        T = tgt_in.shape[1]
        causal = creation.ones(T, T, dtype=_dt.bool, device=tgt_in.device).triu(1)  # True: not allowed
        h = self.transformer.decoder(self._embed(tgt_in), memory, tgt_mask=causal,
                                     tgt_key_padding_mask=tgt_in == PAD, memory_key_padding_mask=src == PAD)
        logits = self.generator(h)
        return self._whole_vocabulary(logits) if gather else logits

    def _whole_vocabulary(self, logits):
        """Logits over the whole vocabulary from this rank's block of it (under TP)."""
        if self.tp is None:
            return logits
        full = tpl.gather_from_tp(logits, self.tp.group)
        return full[..., :self.config.vocab_size] if full.shape[-1] != self.config.vocab_size else full

    def forward(self, inputs, targets=None, return_logits: bool = True):
        """inputs = (src [B, S], tgt_in [B, T]) or (src, tgt_in, weight); targets tgt_out [B, T]
        (PAD ignored). Returns (logits or None, the label-smoothed mean cross-entropy times
        weight, or None), as the language models do, so the trainer's TrainStep (DDP, ZeRO) takes
        it as it takes them. weight: this batch's share of the tokens of a batch split over
        data-parallel ranks, times their number (the ranks' mean is then the whole batch's)."""
        src, tgt_in, *weight = inputs
        logits = self.decode(tgt_in, self.encode(src), src, gather=False)
        loss = None
        if targets is not None:
            flat, smoothing = logits.reshape(-1, logits.shape[-1]), self.config.label_smoothing
            if self.tp is None:
                loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=PAD, label_smoothing=smoothing)
            else:
                loss = tpl.vocab_parallel_cross_entropy(flat, targets.reshape(-1), self.config.vocab_size, self.tp,
                                                        ignore_index=PAD, label_smoothing=smoothing)
            if weight and weight[0] != 1.0:
                loss = loss * weight[0]
        return (self._whole_vocabulary(logits) if return_logits else None), loss

    @no_grad()
    def greedy(self, src, max_len: int = 64) -> list:
        """Each source's translation as ids (without BOS/EOS), the most likely token each step."""
        memory, B = self.encode(src), src.shape[0]
        out = np.full((B, 1), BOS, np.int64)
        done = np.zeros(B, bool)
        for _ in range(max_len):
            logits = self.decode(creation.from_numpy(out), memory, src)[:, -1]
            nxt = logits.argmax(-1).numpy()
            nxt[done] = PAD
            out = np.concatenate([out, nxt[:, None]], 1)
            done |= nxt == EOS
            if done.all():
                break
        return [_until_eos(row[1:]) for row in out]

    @staticmethod
    def check_beam(config: Seq2SeqConfig, beam: int, max_len: int) -> None:
        """Refuse a beam whose decoding cannot fit in memory, before it starts: each step decodes
        all `beam` prefixes, up to max_len long, into float32 logits over the vocabulary (plus
        the decoder's activations of each layer)."""
        per_position = config.vocab_size + 16 * config.d_model * config.num_decoder_layers
        check_fits_in_memory(2 * 4 * beam * max_len * per_position, f"beam search with a beam of {beam}",
                             "Use a smaller beam (4 to 10 is usual).")

    @no_grad()
    def beam_search(self, src, beam: int = 4, max_len: int = 64, length_penalty: float = 0.6) -> list:
        """Each source's best of `beam` hypotheses by log-probability / ((5 + len) / 6)^alpha
        (GNMT's length penalty), as ids without BOS/EOS."""
        self.check_beam(self.config, beam, max_len)
        results = []
        for b in range(src.shape[0]):
            s = src[b:b + 1]
            memory = self.encode(s)
            live = [([BOS], 0.0)]
            finished = []
            for _ in range(max_len):
                prefixes = creation.from_numpy(np.array([p for p, _ in live], np.int64))
                k = len(live)
                logp = self.decode(prefixes, memory.expand(k, *memory.shape[1:]),
                                   s.expand(k, s.shape[1]))[:, -1].log_softmax(-1).numpy()
                scores = np.array([sc for _, sc in live])[:, None] + logp
                flat = np.argsort(-scores, axis=None)[:2 * beam]
                candidates = []
                for f in flat:
                    i, tok = divmod(int(f), logp.shape[1])
                    seq, sc = live[i][0] + [tok], float(scores[i, tok])
                    if tok == EOS:
                        finished.append((seq, sc / ((5 + len(seq) - 1) / 6) ** length_penalty))
                    else:
                        candidates.append((seq, sc))
                    if len(candidates) == beam:
                        break
                live = candidates
                best_live = max(sc for _, sc in live) / ((5 + max_len) / 6) ** length_penalty if live else -np.inf
                if len(finished) >= beam and max(f[1] for f in finished) >= best_live:
                    break
            pool = finished or [(seq, sc / ((5 + len(seq) - 1) / 6) ** length_penalty) for seq, sc in live]
            results.append(_until_eos(max(pool, key=lambda x: x[1])[0][1:]))
        return results


def _until_eos(ids) -> list:
    ids = [int(t) for t in ids]
    return ids[:ids.index(EOS)] if EOS in ids else [t for t in ids if t != PAD]
