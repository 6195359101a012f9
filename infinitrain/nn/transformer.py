"""The original Transformer's modules with PyTorch's names, arguments, parameter names and
defaults: MultiheadAttention, TransformerEncoderLayer / TransformerDecoderLayer,
TransformerEncoder / TransformerDecoder and Transformer. A state_dict moves between these and
torch.nn's unchanged.

Attention runs through the fused kernel (F.scaled_dot_product_attention) unless the caller asks
for the weights (need_weights=True, MultiheadAttention's default), which PyTorch too computes
as an explicit softmax."""
from __future__ import annotations

import copy
import math

from .. import creation
from .. import dtypes as _dt
from ..autograd import is_grad_enabled
from ..autograd.recompute import checkpoint
from ..ops.shape import cat as _cat
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module
from .modules import Dropout, LayerNorm, Linear, ModuleList
from .parameter import Parameter


def _padding_bias(key_padding_mask, batch: int, keys: int):
    """A [N, S] key-padding mask (bool True = padding, or float added) as a [N, 1, 1, S] bias."""
    if key_padding_mask.shape != (batch, keys):
        raise ValueError(f"key_padding_mask must be [batch, source length] = [{batch}, {keys}], "
                         f"got {list(key_padding_mask.shape)}")
    return F.attention_bias(key_padding_mask, allowed=False).reshape(batch, 1, 1, keys)


def _attn_mask_bias(attn_mask, batch: int, heads: int, queries: int, keys: int):
    """A [L, S] or [N * H, L, S] mask (bool True = not allowed, or float added) as a bias that
    broadcasts over [N, H, L, S]."""
    if attn_mask.shape == (queries, keys):
        return F.attention_bias(attn_mask, allowed=False)
    if attn_mask.shape == (batch * heads, queries, keys):
        return F.attention_bias(attn_mask, allowed=False).reshape(batch, heads, queries, keys)
    raise ValueError(f"attn_mask must be [target length, source length] = [{queries}, {keys}] or "
                     f"[batch * heads, L, S] = [{batch * heads}, {queries}, {keys}], got "
                     f"{list(attn_mask.shape)}")


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: in_proj_weight [3E, E] (q, k, v stacked), or with kdim/vdim
    other than E q_proj_weight [E, E], k_proj_weight [E, kdim], v_proj_weight [E, vdim];
    in_proj_bias [3E], out_proj; add_bias_kv: learned bias_k, bias_v [1, 1, E] appended to the
    keys and values, add_zero_attn: a zero key and value appended (each a key every query may
    attend to). Inputs [L, N, E] (batch_first=False, PyTorch's default), [N, L, E] or unbatched
    [L, E]; key_padding_mask [N, S] and attn_mask [L, S] or [N * H, L, S], bool True = masked
    out (the opposite of F.scaled_dot_product_attention's bool) or float added. Returns
    (output, weights averaged over heads or per head, or None when need_weights=False)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be a positive "
                             f"multiple of num_heads ({num_heads})")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout}")
        kdim, vdim = kdim or embed_dim, vdim or embed_dim
        if kdim <= 0 or vdim <= 0:
            raise ValueError(f"MultiheadAttention: kdim ({kdim}) and vdim ({vdim}) must be positive")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.dropout, self.batch_first, self.add_zero_attn = dropout, batch_first, add_zero_attn
        self.kdim, self.vdim = kdim, vdim
        self._qkv_same_embed_dim = kdim == embed_dim and vdim == embed_dim
        E = embed_dim

        def weight(*shape):
            return Parameter(creation.empty(*shape, dtype=dtype, device=device))
        if self._qkv_same_embed_dim:
            self.in_proj_weight = weight(3 * E, E)
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        else:
            self.in_proj_weight = None
            self.q_proj_weight, self.k_proj_weight, self.v_proj_weight = weight(E, E), weight(E, kdim), weight(E, vdim)
        self.in_proj_bias = Parameter(creation.zeros(3 * E, dtype=dtype, device=device)) if bias else None
        self.out_proj = Linear(E, E, bias=bias, device=device, dtype=dtype)
        self.bias_k, self.bias_v = (weight(1, 1, E), weight(1, 1, E)) if add_bias_kv else (None, None)
        # PyTorch's _reset_parameters
        for w in ((self.in_proj_weight,) if self._qkv_same_embed_dim else
                  (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)):
            init.xavier_uniform_(w)
        if bias:
            init.zeros_(self.out_proj.bias)
        if add_bias_kv:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    # What tensor parallelism (nn.parallel.tensor_parallel.ParallelMultiheadAttention) changes:
    # the heads this module computes (a TP rank: its block of them), the stream of attention's
    # dropout, how the inputs enter, and how per-head masks and weights are cut and joined.
    local_heads = property(lambda self: self.num_heads)
    generator = None

    def _enter(self, x: Tensor) -> Tensor:
        return x

    def _in_linear(self, x: Tensor, weight: Tensor, bias) -> Tensor:
        """An input's projection, the input entering as _enter has it (one input, one product)."""
        return F.linear(self._enter(x), weight, bias)

    def _local_mask(self, bias: Tensor) -> Tensor:
        return bias

    def _joined_weights(self, weights: Tensor, average: bool) -> Tensor:
        return weights.mean(dim=1) if average else weights

    def _projection(self, i: int) -> tuple:
        """(weight, bias) of q (i = 0), k (1) or v (2)."""
        if self._qkv_same_embed_dim:
            n = self.in_proj_weight.shape[0] // 3  # E, or this rank's E / TP
            w = self.in_proj_weight[i * n:(i + 1) * n]
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]
            n = w.shape[0]
        return w, None if self.in_proj_bias is None else self.in_proj_bias[i * n:(i + 1) * n]

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask=None,
                need_weights: bool = True, attn_mask=None, average_attn_weights: bool = True,
                is_causal: bool = False):
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"MultiheadAttention: query, key and value must all be batched (3-D) or "
                             f"all unbatched (2-D), got {tuple(query.shape)}, {tuple(key.shape)}, "
                             f"{tuple(value.shape)}")
        if query.shape[-1] != self.embed_dim or key.shape[-1] != self.kdim or value.shape[-1] != self.vdim:
            raise ValueError(f"MultiheadAttention: the last dimension of query, key and value must be "
                             f"embed_dim {self.embed_dim}, kdim {self.kdim} and vdim {self.vdim}, got "
                             f"{query.shape[-1]}, {key.shape[-1]} and {value.shape[-1]}")
        if is_causal and attn_mask is None:
            raise ValueError("MultiheadAttention: is_causal=True is a hint that attn_mask is the causal "
                             "mask; pass that mask too (as PyTorch)")
        self_attention = query is key and key is value  # before the transposes make new objects
        unbatched = query.ndim == 2
        if unbatched:  # [L, E] -> [1, L, E]
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # [L, N, E] -> [N, L, E]
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        N, L, _ = query.shape
        S, H, Dh = key.shape[1], self.local_heads, self.head_dim
        if key.shape[:2] != value.shape[:2] or key.shape[0] != N:
            raise ValueError(f"MultiheadAttention: key {tuple(key.shape)} and value {tuple(value.shape)} "
                             f"must have the same batch and length, and the query's batch {N}")
        if self_attention and self._qkv_same_embed_dim:  # one product for q, k and v
            q, k, v = self._in_linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        elif value is key:  # one input, two products: it enters once, its gradient summed once
            q = self._in_linear(query, *self._projection(0))
            key = self._enter(key)
            k, v = F.linear(key, *self._projection(1)), F.linear(key, *self._projection(2))
        else:
            q, k, v = (self._in_linear(x, *self._projection(i)) for i, x in enumerate((query, key, value)))
        extra = []  # the keys (and values) appended, which every query may attend to
        if self.bias_k is not None:
            extra.append((self.bias_k.expand(N, 1, H * Dh), self.bias_v.expand(N, 1, H * Dh)))
        if self.add_zero_attn:
            zero = creation.zeros(N, 1, H * Dh, dtype=k.dtype, device=k.device)
            extra.append((zero, zero))
        if extra:
            k = _cat([k] + [ek for ek, _ in extra], dim=1)
            v = _cat([v] + [ev for _, ev in extra], dim=1)
        q, k, v = (t.reshape(N, -1, H, Dh).transpose(1, 2) for t in (q, k, v))  # [N, H, T, Dh]
        bias = None
        if key_padding_mask is not None:
            bias = _padding_bias(key_padding_mask, N, S)
        if attn_mask is not None:
            m = self._local_mask(_attn_mask_bias(attn_mask, N, self.num_heads, L, S))
            bias = m if bias is None else bias + m
        if bias is not None and extra:  # the appended keys are allowed
            bias = F.pad(bias, (0, len(extra)))
        p = self.dropout if self.training else 0.0
        if need_weights:  # the explicit softmax, as PyTorch's own path for weights
            scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(Dh))
            weights = (scores if bias is None else scores + bias).softmax(-1)
            weights = F.dropout(weights, p, self.training, generator=self.generator)
            out = weights @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, generator=self.generator)
            weights = None
        out = self.out_proj(out.transpose(1, 2).reshape(N, L, H * Dh))
        if weights is not None:
            weights = self._joined_weights(weights, average_attn_weights)
        if unbatched:
            return out.squeeze(0), None if weights is None else weights.squeeze(0)
        return (out if self.batch_first else out.transpose(0, 1)), weights

    def extra_repr(self):
        dims = "" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}"
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, " \
               f"batch_first={self.batch_first}{dims}"


def _activation(activation):
    if callable(activation):
        return activation
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise ValueError(f"activation must be 'relu', 'gelu' or a callable, got {activation!r}")


class _TransformerLayer(Module):
    """What the encoder and decoder layers share, under PyTorch's attribute names: self-attention,
    the feed-forward network (linear1, activation, dropout, linear2), norm_first, and n norms
    with a dropout after each block (norm1.., dropout1..)."""

    def __init__(self, blocks: int, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                 batch_first, norm_first, bias, device, dtype):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias=bias, batch_first=batch_first, **kw)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        for i in range(1, blocks + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw))
            setattr(self, f"dropout{i}", Dropout(dropout))
        self.activation = _activation(activation)

    def _sa_block(self, x, attn_mask, key_padding_mask):
        return self.dropout1(self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                            need_weights=False)[0])

    def _feed_forward(self, x, out_dropout):
        return out_dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoderLayer(_TransformerLayer):
    """torch.nn.TransformerEncoderLayer: self-attention and a position-wise feed-forward
    network, each with dropout and a residual, LayerNorm after (norm_first=False, the paper)
    or before each block."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__(2, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, device, dtype)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask)
            return x + self._feed_forward(self.norm2(x), self.dropout2)
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask))
        return self.norm2(x + self._feed_forward(x, self.dropout2))


class TransformerDecoderLayer(_TransformerLayer):
    """torch.nn.TransformerDecoderLayer: masked self-attention, cross-attention over the
    encoder's memory, and the feed-forward network, each with dropout, a residual and a
    LayerNorm (after, or before with norm_first=True)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__(3, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, device, dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout, bias=bias, batch_first=batch_first,
                                                 device=device, dtype=dtype)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False, memory_is_causal: bool = False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask)
            return x + self._feed_forward(self.norm3(x), self.dropout3)
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask))
        return self.norm3(x + self._feed_forward(x, self.dropout3))

    def _mha_block(self, x, mem, attn_mask, key_padding_mask):
        return self.dropout2(self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                                 key_padding_mask=key_padding_mask, need_weights=False)[0])


def _clones(layer: Module, n: int) -> ModuleList:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"num_layers must be a positive int, got {n!r}")
    return ModuleList([copy.deepcopy(layer) for _ in range(n)])


def _run(layer, *args):
    """layer(*args), its activations recomputed in backward when layer.recompute is set."""
    if getattr(layer, "recompute", False) and layer.training and is_grad_enabled():
        return checkpoint(layer, *args)
    return layer(*args)


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: num_layers copies of encoder_layer (deep copies, so they
    start equal, as PyTorch's), then norm if given. A layer with .recompute = True keeps only
    its input for backward (activation recomputation)."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm=None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()
        self.layers, self.num_layers, self.norm = _clones(encoder_layer, num_layers), num_layers, norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = _run(layer, x, mask, src_key_padding_mask)
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(Module):
    """torch.nn.TransformerDecoder: num_layers copies of decoder_layer, then norm if given (and
    recomputation as TransformerEncoder's)."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm=None):
        super().__init__()
        self.layers, self.num_layers, self.norm = _clones(decoder_layer, num_layers), num_layers, norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal: bool = False):
        x = tgt
        for layer in self.layers:
            x = _run(layer, x, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask)
        return x if self.norm is None else self.norm(x)


class Transformer(Module):
    """torch.nn.Transformer: an encoder and a decoder stack with final LayerNorms, every
    matrix re-drawn xavier_uniform_ (as PyTorch). No embeddings or output layer: the model
    around it brings them."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", custom_encoder=None, custom_decoder=None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        layer = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                     activation=activation, layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                     norm_first=norm_first, bias=bias, **kw)
        self.encoder = custom_encoder or TransformerEncoder(
            TransformerEncoderLayer(**layer), num_encoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw))
        self.decoder = custom_decoder or TransformerDecoder(
            TransformerDecoderLayer(**layer), num_decoder_layers,
            LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw))
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
                src_is_causal=None, tgt_is_causal=None, memory_is_causal: bool = False):
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ValueError(f"Transformer: the feature size of src and tgt must be d_model {self.d_model}, "
                             f"got {src.shape[-1]} and {tgt.shape[-1]}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """The causal mask as PyTorch makes it: float, -inf above the diagonal, 0 elsewhere."""
        mask = creation.full((sz, sz), float("-inf"), dtype=dtype or _dt.float32, device=device)
        return mask.triu(diagonal=1)
