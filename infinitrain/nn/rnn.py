"""Recurrent layers (torch.nn.RNN, LSTM, GRU and their one-step cells), composed from the
differentiable ops: each layer projects every timestep's input with one matrix product, then
runs the recurrence step by step. Parameter names, shapes, gate order and initialisation are
PyTorch's, so a state_dict moves between the two unchanged."""
from __future__ import annotations

import math

from .. import creation
from ..ops.shape import cat, stack
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module
from .parameter import Parameter

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _rnn_step(mode):
    """The step function of a mode: (projected input, state, weight_hh, bias_hh) -> new state,
    the state being h, or (h, c) for an LSTM."""
    def rnn(xp, h, w_hh, b_hh, act):
        return act(xp + F.linear(h, w_hh, b_hh))

    def lstm(xp, state, w_hh, b_hh):
        h, c = state
        i, f, g, o = (xp + F.linear(h, w_hh, b_hh)).chunk(4, -1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c.tanh(), c

    def gru(xp, h, w_hh, b_hh):
        xr, xz, xn = xp.chunk(3, -1)
        hr, hz, hn = F.linear(h, w_hh, b_hh).chunk(3, -1)
        r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
        n = (xn + r * hn).tanh()
        return n + z * (h - n)  # (1 - z) * n + z * h

    if mode == "LSTM":
        return lstm
    if mode == "GRU":
        return gru
    act = F.tanh if mode == "RNN_TANH" else F.relu
    return lambda xp, h, w_hh, b_hh: rnn(xp, h, w_hh, b_hh, act)


def _check_sizes(name, input_size, hidden_size):
    for what, v in (("input_size", input_size), ("hidden_size", hidden_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name}: {what} must be a positive integer, got {v!r}")


class RNNBase(Module):
    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None):
        super().__init__()
        name = type(self).__name__
        _check_sizes(name, input_size, hidden_size)
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers <= 0:
            raise ValueError(f"{name}: num_layers must be a positive integer, got {num_layers!r}")
        if not (isinstance(dropout, (int, float)) and 0 <= dropout <= 1) or isinstance(dropout, bool):
            raise ValueError(f"{name}: dropout must be a number in [0, 1], got {dropout!r}")
        if proj_size:
            raise NotImplementedError(f"{name}: proj_size (an LSTM with projections) is not implemented; "
                                      "leave proj_size=0")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bidirectional, proj_size
        gates = _GATES[mode] * hidden_size
        directions = 2 if bidirectional else 1
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else hidden_size * directions
            for suffix in ("", "_reverse")[:directions]:
                shapes = {"weight_ih": (gates, layer_in), "weight_hh": (gates, hidden_size)}
                if bias:
                    shapes.update(bias_ih=(gates,), bias_hh=(gates,))
                for kind, shape in shapes.items():
                    setattr(self, f"{kind}_l{layer}{suffix}",
                            Parameter(creation.empty(*shape, dtype=dtype, device=device)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def flatten_parameters(self) -> None:
        """PyTorch's packs the weights into one cuDNN buffer; these stay separate tensors, so
        there is nothing to do."""

    def _weights(self, layer: int, reverse: bool):
        suffix = f"_l{layer}" + ("_reverse" if reverse else "")
        get = self._parameters.get
        return (get("weight_ih" + suffix), get("weight_hh" + suffix), get("bias_ih" + suffix),
                get("bias_hh" + suffix))

    def forward(self, input, hx=None):
        name = type(self).__name__
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: input must be a tensor (PackedSequence is not implemented), "
                            f"got {type(input).__name__}")
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            raise ValueError(f"{name}: expected input of shape (L, N, {self.input_size}) "
                             f"{'(batch_first: (N, L, ...)) ' if self.batch_first else ''}or "
                             f"(L, {self.input_size}), got {tuple(input.shape)}")
        unbatched = input.ndim == 2
        x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
        batch = x.shape[1]
        directions = 2 if self.bidirectional else 1
        states = self._initial_states(hx, batch, unbatched, x)
        step = _rnn_step(self.mode)
        finals = []
        for layer in range(self.num_layers):
            if layer and self.dropout and self.training:
                x = F.dropout(x, self.dropout, True)
            outs = []
            for d in range(directions):
                w_ih, w_hh, b_ih, b_hh = self._weights(layer, d == 1)
                projected = F.linear(x, w_ih, b_ih)  # every timestep at once
                state = states[layer * directions + d]
                hs = [None] * x.shape[0]
                for t in (reversed(range(x.shape[0])) if d else range(x.shape[0])):
                    state = step(projected[t], state, w_hh, b_hh)
                    hs[t] = state[0] if self.mode == "LSTM" else state
                outs.append(stack(hs, 0))
                finals.append(state)
            x = outs[0] if directions == 1 else cat(outs, -1)
        output = x.squeeze(1) if unbatched else (x.transpose(0, 1) if self.batch_first else x)
        if self.mode == "LSTM":
            h_n, c_n = stack([s[0] for s in finals], 0), stack([s[1] for s in finals], 0)
            return output, ((h_n.squeeze(1), c_n.squeeze(1)) if unbatched else (h_n, c_n))
        h_n = stack(finals, 0)
        return output, (h_n.squeeze(1) if unbatched else h_n)

    def _initial_states(self, hx, batch: int, unbatched: bool, x):
        """Per layer and direction, the state [N, H] (or (h, c)) the recurrence starts from."""
        count = self.num_layers * (2 if self.bidirectional else 1)
        shape = (count, self.hidden_size) if unbatched else (count, batch, self.hidden_size)
        lstm = self.mode == "LSTM"
        if hx is None:
            zero = creation.zeros(*shape, dtype=x.dtype, device=x.device)
            parts = (zero, zero) if lstm else (zero,)
        else:
            parts = tuple(hx) if lstm else (hx,)
            if lstm and len(parts) != 2:
                raise ValueError("LSTM: hx must be a tuple (h_0, c_0)")
            for p in parts:
                if not isinstance(p, Tensor) or tuple(p.shape) != shape:
                    got = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
                    raise ValueError(f"{type(self).__name__}: expected an initial state of shape {shape}, "
                                     f"got {got}")
        if unbatched:
            parts = tuple(p.unsqueeze(1) for p in parts)
        per_layer = [tuple(p[k] for p in parts) for k in range(count)]
        return per_layer if lstm else [s[0] for s in per_layer]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        for key, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False)):
            if getattr(self, key) != default:
                s += f", {key}={getattr(self, key)}"
        return s


class RNN(RNNBase):
    """Elman RNN: h_t = nonlinearity(W_ih x_t + b_ih + W_hh h_(t-1) + b_hh)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size,
                         num_layers, bias, batch_first, dropout, bidirectional, 0, device, dtype)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """Gates i, f, g, o (in that order in the weights): c_t = f c_(t-1) + i g, h_t = o tanh(c_t)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, proj_size, device, dtype)


class GRU(RNNBase):
    """Gates r, z, n: n = tanh(W_in x + b_in + r (W_hn h + b_hn)), h_t = (1 - z) n + z h_(t-1)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, device, dtype)


class RNNCellBase(Module):
    def __init__(self, mode: str, input_size: int, hidden_size: int, bias: bool, device, dtype):
        super().__init__()
        _check_sizes(type(self).__name__, input_size, hidden_size)
        self.mode, self.input_size, self.hidden_size, self.bias = mode, input_size, hidden_size, bias
        gates = _GATES[mode] * hidden_size
        self.weight_ih = Parameter(creation.empty(gates, input_size, dtype=dtype, device=device))
        self.weight_hh = Parameter(creation.empty(gates, hidden_size, dtype=dtype, device=device))
        self.bias_ih = Parameter(creation.empty(gates, dtype=dtype, device=device)) if bias else None
        self.bias_hh = Parameter(creation.empty(gates, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    reset_parameters = RNNBase.reset_parameters

    def forward(self, input, hx=None):
        name = type(self).__name__
        if not isinstance(input, Tensor) or input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
            raise ValueError(f"{name}: expected input (N, {self.input_size}) or ({self.input_size},), got {got}")
        unbatched = input.ndim == 1
        x = input.unsqueeze(0) if unbatched else input
        shape = (x.shape[0], self.hidden_size)
        lstm = self.mode == "LSTM"
        if hx is None:
            zero = creation.zeros(*shape, dtype=x.dtype, device=x.device)
            state = (zero, zero) if lstm else zero
        else:
            parts = tuple(hx) if lstm else (hx,)
            if lstm and len(parts) != 2:
                raise ValueError("LSTMCell: hx must be a tuple (h_0, c_0)")
            want = shape[1:] if unbatched else shape
            for p in parts:
                if not isinstance(p, Tensor) or tuple(p.shape) != want:
                    got = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
                    raise ValueError(f"{name}: expected a state of shape {want}, got {got}")
            parts = tuple(p.unsqueeze(0) for p in parts) if unbatched else parts
            state = parts if lstm else parts[0]
        out = _rnn_step(self.mode)(F.linear(x, self.weight_ih, self.bias_ih), state, self.weight_hh,
                                   self.bias_hh)
        if unbatched:
            return tuple(o.squeeze(0) for o in out) if lstm else out.squeeze(0)
        return out

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}" + ("" if self.bias else ", bias=False")


class RNNCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, bias,
                         device, dtype)
        self.nonlinearity = nonlinearity


class LSTMCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, bias, device, dtype)


class GRUCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, bias, device, dtype)
