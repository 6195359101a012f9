"""What GPT-2 and LLaMA-3 share as causal language models: the embed -> blocks -> head
structure that a pipeline stage runs a part of, initialisation that any layout reproduces,
llm.c checkpoints and sampling."""
from __future__ import annotations

import numpy as np

from .. import creation
from ..autograd import no_grad
from ..autograd.recompute import checkpoint
from ..nn import functional as F
from ..nn import init
from ..nn.module import Module
from ..nn.parallel import tensor_parallel as tpl
from ..ops import layers as ops_layers


def get_submodule(module, dotted: str):
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def causal_attention(q, k, v, cp=None):
    """The blocks' attention: causal over [B, H, T, D] (k, v: fewer heads under GQA); under
    context parallelism (cp) this rank's queries over the whole sequence's keys."""
    if cp is not None and cp.size > 1:
        return cp.attention(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def _full_shape(p) -> tuple:
    shard = getattr(p, "tp_shard", None)
    return shard.full_shape(p.shape) if shard is not None else tuple(p.shape)


class Blocks(Module):
    """The transformer blocks this rank holds, keyed by their index in the whole model, so
    that a pipeline stage's parameters keep their one-process names (transformer.h.5.ln_1.weight)
    and checkpoints need no renaming. Iterates in layer order; blocks[i] is layer i."""

    def __init__(self, blocks: dict):
        super().__init__()
        for i in sorted(blocks):
            self.add_module(str(i), blocks[i])

    def __getitem__(self, i: int) -> Module:
        return self._modules[str(i)]

    def __contains__(self, i: int) -> bool:
        return str(i) in self._modules

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)

    def indices(self) -> list:
        return [int(k) for k in self._modules]


class CausalLM(Module):
    """A model whose forward(idx, targets=None) returns (logits [B, T, V], loss), built as
    embed -> blocks -> head. Under pipeline parallelism (pp=PipelineStage) a rank builds only
    its stage's part: its blocks, the embedding on the first stage, the head on the last; the
    pipeline engine calls embed / run_block / head itself."""

    config_class = None  # the dataclass of the model's configuration

    def _setup_parallel(self, tp, pp, cp=None) -> list:
        """Stores the layout; returns the block indices this rank builds."""
        self.tp = tp if tp is not None and tp.size > 1 else None
        self.pp = pp if pp is not None and pp.size > 1 else None
        self.cp = cp if cp is not None and cp.size > 1 else None
        L = self.config.n_layer
        if self.pp is None:
            self.stage_layers = [list(range(L))]
            return list(range(L))
        self.stage_layers = self.pp.layers(L, self.head_work(self.config))  # one list per local chunk
        return [i for chunk in self.stage_layers for i in chunk]

    # the output head is the token embedding (GPT-2): under a pipeline the last stage holds a copy
    ties_embedding = False

    @classmethod
    def parameter_parts(cls, config, ep: int = 1) -> tuple:
        """(the parameters of the first stage's embeddings, of one block, of the last stage's
        final norm and head), counted from llm.c's tensor list: what a pipeline stage holds is
        its blocks plus the ends it has (plus, with ties_embedding, a copy of the embedding on
        the last stage of a pipeline). ep: the expert-parallel ranks a mixture's experts are
        split over (a model without experts ignores it)."""
        first = block = last = 0
        seen_layers = False
        for name, shape, n in cls._llmc_shapes(config):
            size = int(np.prod(shape))
            if name in cls._PER_LAYER:
                block, seen_layers = block + size, True
            elif seen_layers:
                last += size
            else:
                first += size
        return first, block, last

    @classmethod
    def head_work(cls, config) -> float:
        """The output product's work in blocks' worth: multiply-adds per token of the V x C head
        against those of one block's weight matrices (what a balanced pipeline split counts;
        attention's T x T work and the norms are left out, as in the 6N estimate)."""
        block = sum(int(np.prod(shape)) for name, shape, _ in cls._llmc_shapes(config)
                    if name in cls._PER_LAYER and len(shape) == 2)
        return getattr(config, "padded_vocab_size", config.vocab_size) * config.n_embd / block

    @classmethod
    def active_parameters(cls, config) -> int:
        """The parameters one token's forward multiplies with (the N of the 6N FLOPs per token
        that MFU counts): every one of a dense model's."""
        return cls._llmc_numel(config)

    @property
    def has_embedding(self) -> bool:
        return self.pp is None or self.pp.is_first

    @property
    def has_head(self) -> bool:
        return self.pp is None or self.pp.is_last

    def check_batch(self, idx, targets=None) -> int:
        """Checks a batch against the model; returns T."""
        if idx.ndim != 2:
            raise ValueError(f"idx must be [batch, sequence], got shape {tuple(idx.shape)}")
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds the model's block size "
                             f"{self.config.block_size}")
        if targets is not None and tuple(targets.shape) != (B, T):
            raise ValueError(f"targets have shape {tuple(targets.shape)}, expected {(B, T)}")
        sp = tpl.sequence_split(self.tp)
        if self.cp is not None:
            self.cp.check_sequence(T, sp)
        elif T % sp:
            raise ValueError(f"sequence parallelism splits the sequence over tensor parallel "
                             f"{sp}, which does not divide the sequence length {T}")
        return T

    # ---- context parallelism: the model takes whole sequences and works on this rank's part
    def local_tokens(self, idx):
        """The token ids this rank embeds: under CP its chunks of every sequence."""
        return self.cp.shard(idx, dim=1) if self.cp is not None else idx

    def token_positions(self, T: int, device):
        """The positions (in the whole sequence) of the tokens this rank's embedding outputs:
        its CP chunks, and under SP its TP part of them."""
        pos = self.cp.positions(T, device) if self.cp is not None else creation.arange(T, device=device)
        sp = tpl.sequence_split(self.tp)
        if sp > 1:
            n = pos.shape[0] // sp
            pos = pos[self.tp.rank * n:(self.tp.rank + 1) * n]
        return pos


    def forward(self, idx, targets=None, return_logits: bool = True):
        """idx, targets: int [B, T]. Returns (logits [B, T, vocab_size], mean loss or None).
        A training loop that only needs the loss passes return_logits=False: the logits, the
        largest activation, can then be overwritten by their gradient."""
        if self.pp is not None:
            raise RuntimeError(f"this model is {self.pp}, not a whole model: run it through "
                               "infinitrain.nn.parallel.pp.PipelineParallel")
        T = self.check_batch(idx, targets)
        x = self.run_blocks(range(len(self.transformer.h)), x=self.embed(idx), T=T)
        return self.head(x, targets, return_logits)

    def embed(self, idx):
        """Token ids [B, T] -> the first block's input [B, T, C] ([B, T/TP, C] under SP)."""
        raise NotImplementedError

    # activation recomputation: "none", "full" (keep each block's input, rerun the block in
    # backward) or "selective" (keep the MLP's up-projection, rerun its activation and down
    # projection: the widest activations for a sixth of the block's forward FLOPs)
    recompute = "none"

    def set_recompute(self, mode: str) -> "CausalLM":
        if mode not in ("none", "full", "selective"):
            raise ValueError(f"recompute must be 'none', 'full' or 'selective', not {mode!r}")
        self.recompute = mode
        for block in self.transformer.h:
            block.mlp.recompute = mode == "selective"
        return self

    def block_inputs(self, T: int) -> tuple:
        """What a block takes besides the hidden state (LLaMA: the rotary tables)."""
        return ()

    def run_block(self, block, x, T: int):
        if self.recompute == "full":
            return checkpoint(block, x, *self.block_inputs(T))
        return block(x, *self.block_inputs(T))

    def run_blocks(self, layers, x, T: int):
        """Blocks `layers` (indices into the model's blocks, in order) on x: the whole model's
        forward runs them all, a pipeline's chunk its own."""
        for i in layers:
            x = self.run_block(self.transformer.h[i], x, T)
        return x

    def head(self, x, targets, return_logits: bool):
        """The last block's output -> (logits or None, loss or None)."""
        logits = self.lm_head(self.transformer.ln_f(x))  # [B, T, V'] (V'/TP columns under TP)
        return self._loss_and_logits(logits, targets, return_logits)

    def hidden_spec(self, batch: int, seq_len: int) -> tuple:
        """(shape, dtype) of the activation between two blocks, which is what pipeline stages
        send each other: [B, T, C], T/TP under SP, in the parameters' dtype (the residual
        stream stays in it under autocast)."""
        T = self.cp.local_len(seq_len) if self.cp is not None else seq_len
        return (batch, T // tpl.sequence_split(self.tp), self.config.n_embd), next(iter(self.parameters())).dtype

    def model_chunks(self) -> list:
        """This rank's model chunks (one per local pipeline chunk; one for a whole model), each
        the modules it runs, in forward order: the embeddings on the chunk that embeds, the
        chunk's blocks, the final norm and the head on the chunk that ends in the loss. What
        parallel code asks instead of matching parameter names: the pipeline reduces each
        chunk's gradients apart, ZeRO-3 gathers each module's parameters together."""
        t = self.transformer
        chunks = [[t.h[i] for i in layers] for layers in self.stage_layers]
        if self.has_embedding:
            chunks[0] = [m for name, m in t.named_children() if name not in ("h", "ln_f")] + chunks[0]
        if self.has_head:
            chunks[-1] += [t.ln_f, self.lm_head]
        return chunks

    def tied_parameters(self) -> list:
        """Parameters that one process ties and a pipeline holds twice (first and last stage):
        their gradients are summed over the embedding group each step."""
        return []

    def _draw(self, gen, weight, numel: int, std: float) -> None:
        """Initialises weight with N(0, std) from gen, or (a parameter another stage holds)
        moves gen past its numel numbers, so that every stage draws what one process would."""
        if weight is None:
            gen.advance(numel)
        else:
            init.normal_(weight, 0.0, std, generator=gen)  # drawn full-size under TP

    def _loss_and_logits(self, logits, targets, return_logits: bool):
        """From the head's logits [B, T, V'] (V'/TP columns under TP, padding last; T/CP
        tokens under CP): the mean loss over the real vocabulary and the whole sequences, and
        the logits without padding (gathered under TP and CP)."""
        V, tp, cp = self.config.vocab_size, getattr(self, "tp", None), getattr(self, "cp", None)
        loss = None
        if targets is not None:
            t = (cp.shard(targets, dim=1) if cp is not None else targets).reshape(-1)
            flat = logits.reshape(-1, logits.shape[-1])
            if cp is None:
                loss = tpl.vocab_parallel_cross_entropy(flat, t, V, tp) if tp \
                    else ops_layers.cross_entropy(flat, t, V)
            else:  # this rank's sum, then the mean over the whole sequences (context_parallel.loss)
                local = tpl.vocab_parallel_cross_entropy(flat, t, V, tp, reduction="sum") if tp \
                    else ops_layers.cross_entropy(flat, t, V, reduction="sum")
                loss = cp.loss(local, t)
        if not return_logits:
            return None, loss
        if tp:
            logits = tpl.gather_from_tp(logits, tp.group)
        if cp is not None:
            logits = cp.gather(logits, dim=1)
        return logits[..., :V], loss

    # ---- llm.c checkpoints: a header, then every tensor in the model's llm.c order ----------
    @classmethod
    def _llmc_shapes(cls, config) -> list:
        """(name, full shape, count) in the file's order, from the configuration alone (so a
        file's size is checked before any model is built); per-layer tensors have count L."""
        raise NotImplementedError

    def _llmc_params(self) -> dict:
        """name -> [parameter or None] (None: held by another pipeline stage), per _llmc_shapes."""
        raise NotImplementedError

    def _layer_params(self, name: str) -> list:
        h = self.transformer.h
        return [get_submodule(h[i], name) if i in h else None for i in range(self.config.n_layer)]

    @classmethod
    def _llmc_numel(cls, config) -> int:
        return sum(int(np.prod(shape)) * n for _, shape, n in cls._llmc_shapes(config))

    def _llmc_payload(self, store_dtype) -> bytes:
        """The file's payload: full tensors (a tensor-parallel shard is gathered first, so every
        rank of the group must call this)."""
        if self.pp is not None:
            raise NotImplementedError("writing an llm.c file from a pipeline stage is not supported: "
                                      "save a checkpoint (save_checkpoint) and convert it in one process")
        store = np.dtype(store_dtype)
        params = self._llmc_params()
        return b"".join(np.ascontiguousarray(tpl.full_tensor(p).float().cpu().numpy()).astype(store).tobytes()
                        for name, _, _ in self._llmc_shapes(self.config) for p in params[name])

    @no_grad()
    def _llmc_load_payload(self, data: np.ndarray) -> None:
        """Copies the flat payload (any float dtype) into the parameters, in file order; a
        tensor-parallel shard takes its slice of the full tensor, a pipeline stage its layers."""
        at, params = 0, self._llmc_params()
        for name, shape, count in self._llmc_shapes(self.config):
            n = int(np.prod(shape))
            for p in params[name]:
                if p is not None:
                    values = np.asarray(data[at:at + n]).astype(np.float32).reshape(shape)
                    bad = values.size - int(np.isfinite(values).sum())
                    if bad:  # loaded as they are (the file may be a diverged run's, kept to study)
                        import warnings
                        warnings.warn(f"{name}: {bad} of its {values.size} values are NaN or infinite; the "
                                      "model will produce NaN", RuntimeWarning, stacklevel=3)
                    tpl.load_full(p, creation.from_numpy(values))
                at += n

    def save_pretrained(self, folder, write: bool = True):
        """config.json and model.safetensors in Hugging Face transformers' format (GPT2LMHeadModel,
        LlamaForCausalLM): checkpoint.save_pretrained."""
        from ..checkpoint import save_pretrained
        return save_pretrained(self, folder, write)

    @classmethod
    def from_pretrained(cls, folder, tp=None, pp=None, cp=None, ep=None):
        """A model from transformers' format (or this package's earlier one), each rank of a
        TP/PP/EP layout reading its slice: checkpoint.from_pretrained."""
        from ..checkpoint import from_pretrained
        return from_pretrained(cls, folder, tp=tp, pp=pp, cp=cp, ep=ep)

    @no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 seed: int = 0, forward=None):
        """Samples continuations of idx [B, T] (no KV cache: each token reruns the prefix);
        temperature 0 takes the most likely token each time (greedy), top_k keeps the k likeliest.
        forward(idx) -> logits replaces the model's own forward (a pipeline passes its
        PipelineParallel.logits, which every stage runs along)."""
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
        rng = np.random.default_rng(seed)
        forward = forward or (lambda x: self(x)[0])
        tokens = idx.cpu().numpy().astype(np.int64)
        device = next(iter(self.parameters())).device
        cp = getattr(self, "cp", None)
        multiple = tpl.sequence_split(getattr(self, "tp", None)) * (cp.n_chunks if cp is not None else 1)
        for _ in range(max_new_tokens):
            ctx = tokens[:, -self.config.block_size:]
            n = ctx.shape[1]
            # sequence and context parallelism split the sequence evenly: pad the end (causal attention
            # keeps the padding out of the real positions' logits)
            ctx = np.pad(ctx, ((0, 0), (0, (-n) % multiple)))
            logits = forward(creation.from_numpy(np.ascontiguousarray(ctx)).to(device))
            last = logits[:, n - 1, :].float().cpu().numpy().astype(np.float64)
            if temperature == 0:  # greedy: the most likely token (the first of equals, as argmax picks)
                tokens = np.concatenate([tokens, last.argmax(-1)[:, None]], axis=1)
                continue
            last = last / temperature
            if top_k and top_k < last.shape[-1]:  # (a k past the vocabulary keeps it all, as PyTorch's top-k filters)
                kth = np.sort(last, axis=-1)[:, -top_k][:, None]
                last = np.where(last < kth, -np.inf, last)
            p = np.exp(last - last.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            nxt = np.array([[rng.choice(p.shape[-1], p=row)] for row in p])
            tokens = np.concatenate([tokens, nxt], axis=1)
        return creation.from_numpy(tokens)
