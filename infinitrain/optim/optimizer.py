"""Optimizer: parameter groups, per-parameter state, zero_grad and state_dict, as torch.optim."""
from __future__ import annotations

import numpy as np

from ..autograd import no_grad, zero_grads
from ..creation import zeros
from ..tensor import Tensor


class Optimizer:
    # The state a parameter carries once it has been stepped: name -> "tensor" or "int".
    # load_state_dict holds loaded state to it (a moment missing, a step that is a string).
    state_spec: dict = {}
    optional_state: tuple = ()  # state_spec's entries kept only with some settings (RMSprop's momentum)

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = []
        self.state = {}  # Parameter -> dict (keyed by the parameter object itself)
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, group: dict) -> None:
        group = dict(group)
        group["params"] = list(group["params"])
        for p in group["params"]:
            if not isinstance(p, Tensor) or not p.requires_grad:
                raise ValueError(f"{type(self).__name__}: every parameter must be a tensor with "
                                 "requires_grad=True")
            if not p.dtype.is_floating_point:
                raise TypeError(f"{type(self).__name__}: cannot optimise a {p.dtype.name} tensor")
            if not p.is_leaf:  # the result of an operation: a step would change a temporary
                raise ValueError(f"{type(self).__name__}: can't optimize a non-leaf tensor (the result of an "
                                 "operation); pass the parameters themselves")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("a parameter appears in more than one parameter group")
        if len({id(p) for p in group["params"]}) != len(group["params"]):  # it would be stepped twice
            raise ValueError(f"{type(self).__name__}: a parameter group holds the same parameter more than once; "
                             "pass each parameter once")
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grads((p for g in self.param_groups for p in g["params"]), set_to_none)

    # ---- the step: one update per parameter, through three hooks a subclass defines ---------
    # (OffloadOptimizer drives the same hooks chunk by chunk over state streamed from disk)
    def tensor_keys(self, group: dict) -> tuple:
        """The state entries of a parameter in this group that are float32 tensors of its shape."""
        return tuple(k for k, kind in self.state_spec.items() if kind == "tensor")

    def counters(self) -> dict:
        """The state entries that are counts, as they are before the first step."""
        return {k: 0 for k, kind in self.state_spec.items() if kind == "int"}

    def update(self, param, grad, state: dict, group: dict, first: bool) -> None:
        """One update of param (or a contiguous piece of it) from grad, with its state (the
        counters already advanced for this step; the tensors of param's shape, zeros on the
        first step, which first tells)."""
        raise NotImplementedError

    @no_grad()
    def step(self) -> None:
        for g in self.param_groups:
            updates = []
            for p in g["params"]:
                if p.grad is None:
                    continue
                first = p not in self.state
                if first:
                    self.state[p] = {**self.counters(),
                                     **{k: zeros(*p.shape, device=p.device) for k in self.tensor_keys(g)}}
                state = self.state[p]
                for k in self.counters():
                    state[k] += 1
                updates.append((p, p.grad, state, first))
            self.update_group(updates, g)

    def update_group(self, updates: list, group: dict) -> None:
        """The updates of one group's parameters, (param, grad, state, first) each: one by one,
        unless a subclass does several in one call (AdamW: one launch on a GPU)."""
        for param, grad, state, first in updates:
            self.update(param, grad, state, group, first)

    # ---- state_dict: parameters are numbered in group order, as in PyTorch ----------------
    def state_dict(self) -> dict:
        params = [p for g in self.param_groups for p in g["params"]]
        state = {i: {k: (v.clone() if isinstance(v, Tensor) else v) for k, v in self.state[p].items()}
                 for i, p in enumerate(params) if p in self.state}
        return {"state": state, "param_groups": self.numbered_groups()}

    @classmethod
    def check_hyperparameters(cls, group: dict) -> None:
        """Raises ValueError for a hyperparameter that makes no sense (subclasses check their
        values; loaded state goes through here as the constructor's arguments do)."""

    @classmethod
    def check_state(cls, index, state: dict) -> None:
        """Raises ValueError unless a parameter's loaded state is empty (never stepped) or holds
        exactly state_spec's entries, of their kinds."""
        if not state or not cls.state_spec:
            return
        missing = [k for k in cls.state_spec if k not in state and k not in cls.optional_state]
        unknown = [k for k in state if k not in cls.state_spec]
        if missing or unknown:
            raise ValueError(f"the state of parameter {index} " + "; ".join(
                part for part in (f"lacks {', '.join(missing)}" if missing else "",
                                  f"has unknown entries {', '.join(unknown)}" if unknown else "") if part)
                + f" ({cls.__name__} keeps {', '.join(cls.state_spec)})")
        for k, kind in cls.state_spec.items():
            if k not in state:
                continue
            v = state[k]
            ok = (isinstance(v, (Tensor, np.ndarray)) if kind == "tensor" else
                  isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0)
            if not ok:
                raise ValueError(f"the state of parameter {index}: {k} is {type(v).__name__} {str(v)[:40]!r}, "
                                 f"not {'a tensor' if kind == 'tensor' else 'a count >= 0'}")

    def load_state_dict(self, state_dict: dict) -> None:
        self.state = self.checked_state(state_dict)
        self.load_hyperparameters(state_dict)

    def checked_state(self, state_dict: dict) -> dict:
        """state_dict's per-parameter state, checked against this optimizer's groups and state_spec,
        as {parameter: state} with tensors where their parameter lives (ValueError otherwise)."""
        groups = state_dict["param_groups"]
        for saved in groups:
            self.check_hyperparameters({k: v for k, v in saved.items() if k != "params"})
        if len(groups) != len(self.param_groups):
            raise ValueError(f"optimizer state has {len(groups)} parameter groups, this optimizer "
                             f"has {len(self.param_groups)}")
        params = []
        for saved, own in zip(groups, self.param_groups):
            if len(saved["params"]) != len(own["params"]):
                raise ValueError(f"a parameter group has {len(own['params'])} parameters but the "
                                 f"saved one has {len(saved['params'])}")
            params += own["params"]
        state = {}
        for i, st in state_dict["state"].items():
            p = params[int(i)]
            st = {k: _count(v) if self.state_spec.get(k) == "int" else v for k, v in st.items()}
            self.check_state(i, st)
            new = {}
            for k, v in st.items():
                if isinstance(v, (Tensor, np.ndarray)):
                    t = v if isinstance(v, Tensor) else _from_array(v)
                    if tuple(t.shape) != tuple(p.shape) and t.numel() > 1:
                        raise ValueError(f"optimizer state '{k}' of parameter {i} has shape "
                                         f"{tuple(t.shape)}, the parameter {tuple(p.shape)}")
                    v = t.to(device=p.device, copy=True)  # the state lives where its parameter does
                new[k] = v
            state[p] = new
        return state

    def load_hyperparameters(self, state_dict: dict) -> None:
        """The saved groups' settings (lr, betas, ...) onto this optimizer's groups."""
        for saved, own in zip(state_dict["param_groups"], self.param_groups):
            own.update({k: v for k, v in saved.items() if k != "params"})

    def numbered_groups(self) -> list:
        """param_groups as state_dict writes them: settings, and parameters numbered in order."""
        groups, at = [], 0
        for g in self.param_groups:
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": list(range(at, at + len(g["params"])))})
            at += len(g["params"])
        return groups


def _count(v):
    """A step counter as PyTorch saves it (a one-element float tensor) as the int it counts; any
    other value is left for check_state to judge."""
    if isinstance(v, Tensor) and v.numel() == 1 and not isinstance(v.item(), bool) and float(v.item()).is_integer():
        return int(v.item())
    return v


def _from_array(a):
    from ..creation import from_numpy
    return from_numpy(np.ascontiguousarray(a))
