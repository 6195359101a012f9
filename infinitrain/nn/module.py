"""Module: the base of every layer and model (parameters, buffers, submodules, state_dict)."""
from __future__ import annotations

from collections import OrderedDict

from ..autograd import no_grad
from ..tensor import Tensor
from .parameter import Parameter


class Module:
    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        pre, post = self.__dict__.get("_forward_pre_hooks"), self.__dict__.get("_forward_hooks")
        if not pre and not post:
            return self.forward(*args, **kwargs)
        for hook in list(pre.values()) if pre else ():
            out = hook(self, args)
            if out is not None:
                args = out if isinstance(out, tuple) else (out,)
        result = self.forward(*args, **kwargs)
        for hook in list(post.values()) if post else ():
            out = hook(self, args, result)
            if out is not None:
                result = out
        return result

    # ---- hooks -------------------------------------------------------------------------
    def register_forward_pre_hook(self, hook) -> "RemovableHandle":
        """hook(module, args) runs before forward; it may return new args."""
        return self._add_hook("_forward_pre_hooks", hook)

    def register_forward_hook(self, hook) -> "RemovableHandle":
        """hook(module, args, output) runs after forward; it may return a new output."""
        return self._add_hook("_forward_hooks", hook)

    def _add_hook(self, store: str, hook) -> "RemovableHandle":
        hooks = self.__dict__.get(store)
        if hooks is None:
            hooks = OrderedDict()
            object.__setattr__(self, store, hooks)
        handle = RemovableHandle(hooks)
        hooks[handle.id] = hook
        return handle

    # ---- registration ------------------------------------------------------------------
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                                 "before assigning attributes")
        for store in (self._parameters, self._buffers, self._modules):
            store.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Tensor) and name in self.__dict__.get("_buffer_names", ()):
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        self.__dict__.setdefault("_buffer_names", set()).add(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self._parameters[name] = param

    def add_module(self, name: str, module: "Module") -> None:
        self._modules[name] = module

    # ---- traversal ---------------------------------------------------------------------
    def named_modules(self, prefix: str = "", memo=None):
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_children(self):
        return ((n, m) for n, m in self._modules.items() if m is not None)

    def children(self):
        return (m for _, m in self.named_children())

    def _named(self, store: str, prefix: str, recurse: bool, remove_duplicate: bool = True):
        seen = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mprefix, m in mods:
            for name, t in getattr(m, store).items():
                if t is None or (remove_duplicate and id(t) in seen):
                    continue
                seen.add(id(t))
                yield (f"{mprefix}.{name}" if mprefix else name), t

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """(name, parameter) pairs; a parameter shared by two modules (tied weights) once."""
        return self._named("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True):
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        return self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True):
        return (b for _, b in self.named_buffers(recurse=recurse))

    # ---- state ---------------------------------------------------------------------------
    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> OrderedDict:
        out = OrderedDict()
        for mprefix, m in self.named_modules(prefix.rstrip(".")):
            base = f"{mprefix}." if mprefix else ""
            for name, p in m._parameters.items():
                if p is not None:
                    out[base + name] = p if keep_vars else p.detach()
            for name, b in m._buffers.items():
                if b is not None and name not in m._non_persistent:
                    out[base + name] = b if keep_vars else b.detach()
        return out

    def load_state_dict(self, state_dict, strict: bool = True):
        """Copies tensors into this module's parameters and buffers (converting dtypes). With
        strict=True, missing or unexpected keys are an error; a shape mismatch always is."""
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        mismatched = [f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(own[k].shape)}"
                      for k in own if k in state_dict and tuple(state_dict[k].shape) != tuple(own[k].shape)]
        problems = []
        if strict and missing:
            problems.append("missing keys: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        if mismatched:
            problems.append("shape mismatch: " + "; ".join(mismatched))
        if problems:
            raise RuntimeError(f"error loading state_dict into {type(self).__name__}:\n  " +
                               "\n  ".join(problems))
        with no_grad():
            for k, t in own.items():
                if k in state_dict:
                    src = state_dict[k]
                    t.copy_(src if isinstance(src, Tensor) else _as_tensor(src))
        return missing, unexpected

    # ---- modes, conversion, gradients ---------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def to(self, *args, **kwargs) -> "Module":
        """Moves parameters and buffers to a device and converts the floating-point ones to a
        dtype (to(dtype), to(device), to(device, dtype)): integer buffers keep their dtype but
        follow the device, as in PyTorch."""
        from ..tensor_methods import to_arguments
        dtype, device = to_arguments(args, **kwargs)
        with no_grad():
            for m in self.modules():
                for name, p in m._parameters.items():
                    if p is not None:
                        p._assign(_moved(p, dtype, device))
                        if p.grad is not None:
                            p.grad = _moved(p.grad, dtype, device)
                for name, b in m._buffers.items():
                    if b is not None:
                        m._buffers[name] = _moved(b, dtype, device)
        return self

    def float(self) -> "Module":
        from ..dtypes import float32
        return self.to(float32)

    def bfloat16(self) -> "Module":
        from ..dtypes import bfloat16
        return self.to(bfloat16)

    def zero_grad(self, set_to_none: bool = True) -> None:
        from .utils import zero_grads
        zero_grads(self.parameters(), set_to_none)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def apply(self, fn) -> "Module":
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- printing ----------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({n}): " + repr(m).replace("\n", "\n  ") for n, m in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ("\n  " + "\n  ".join(lines) + "\n)" if lines else ")")


class RemovableHandle:
    """What register_*_hook returns: remove() takes the hook away again."""
    _next_id = 0

    def __init__(self, hooks: dict):
        self.hooks, self.id = hooks, RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self) -> None:
        self.hooks.pop(self.id, None)


def _moved(t, dtype, device):
    """t on device, converted to dtype if it is floating point (integer tensors keep theirs)."""
    return t.to(dtype=dtype if dtype is not None and t.dtype.is_floating_point else None, device=device)


def _as_tensor(x):
    from ..creation import from_numpy
    import numpy as np
    return from_numpy(np.ascontiguousarray(x))
