"""ZeRO-3's parameter side: every rank keeps only its piece of each parameter; a module's
parameters are all-gathered just before its forward and again before its backward, and freed
after use, as DeepSpeed's stage 3 (and PyTorch's FSDP) do.

Units. The model is cut into units, modules whose parameters are gathered together: the
modules of the model's `model_chunks()` if it has them (GPT-2 and LLaMA-3: the embeddings,
each block, the final norm, the head), else every module that holds parameters itself. A unit owns the
parameters it reaches (its subtree, less other units' subtrees) that no earlier unit owns, one
flat bucket per unit; a unit that reaches a parameter owned elsewhere (GPT-2's head, tied to
the token embedding) gathers that bucket too. Parameters no unit reaches belong to the root.

Memory. A bucket's full-size storage is released in place (Storage.release) rather than
dropped, so the views the autograd graph saved in forward see the gathered memory again in
backward, and nothing holds the full weights in between; reading a released parameter raises
a clear error. `gathered()` brings every parameter back for checkpoints and inspection.

Order. The first forward records the order units run in; while it is recorded, every rank
checks before each gather that all ranks gather the same unit (a rank that runs other modules
gets an error naming both units, not a hang or silent garbage), and once the order is known
each gather starts the next unit's gather (backward: the previous unit's) ahead of use.

Offload (offload_param). The pieces themselves can live with the offloaded optimizer state
(OffloadPieces): then a gather first reads its piece, which the unit before started reading, and
the piece is dropped as soon as the all-gather is done.
"""
from __future__ import annotations

import zlib
from contextlib import contextmanager

import numpy as np

from ....autograd import Function, is_grad_enabled
from ....autograd.engine import queue_callback
from ....creation import from_numpy
from ....tensor import Tensor
from ..process_group import ReduceOp

RELEASED = ("this parameter is sharded by ZeRO-3: it exists in full only while its module runs; "
            "read or change it inside `with optimizer.gathered_parameters():`")


def partition(module, params) -> tuple:
    """(unit modules, the parameters each owns, the parameters each uses) for the trainable
    `params` of `module`, units in the model's order."""
    units = [m for chunk in module.model_chunks() for m in chunk] if hasattr(module, "model_chunks") else \
        [m for m in module.modules() if any(p is not None for p in m._parameters.values())]
    unit_ids = {id(u) for u in units}
    managed = {id(p) for p in params}

    def reach(m, top=True):
        if not top and id(m) in unit_ids:
            return
        for p in m._parameters.values():
            if p is not None and id(p) in managed:
                yield p
        for child in m.children():
            yield from reach(child, False)

    if id(module) not in unit_ids and any(True for _ in reach(module)):
        units = [module] + list(units)  # the root gathers what no unit reaches
    owner, owned, uses = {}, [], []
    for u in units:
        used = list({id(p): p for p in reach(u)}.values())
        uses.append(used)
        owned.append([p for p in used if owner.setdefault(id(p), u) is u])
    stray = [p for p in params if id(p) not in owner]
    if stray:
        raise ValueError(f"ZeRO-3: {len(stray)} parameter(s) given to the optimizer are not part of "
                         f"the module (shapes {[tuple(p.shape) for p in stray[:4]]})")
    return units, owned, uses


class _GatherForBackward(Function):
    """Identity in forward; in backward, gathers the unit's parameters before any of the
    unit's own backward runs (they all come after its output's gradient)."""

    @staticmethod
    def forward(ctx, x, gatherer, module):
        ctx.gatherer, ctx.module = gatherer, module
        return x

    @staticmethod
    def backward(ctx, grad):
        ctx.gatherer.before_backward(ctx.module)
        return grad, None, None


class Gatherer:
    """Gathers and frees the optimizer's buckets around the units' forward and backward.
    buckets: the optimizer's flat buckets, one per unit that owns parameters, released (their
    pieces in shard_param); bucket_of: id(parameter) -> bucket index."""

    def __init__(self, group, buckets, units, uses, bucket_of):
        self.group, self.buckets, self.units = group, buckets, units
        for b in buckets:
            b.work, b.users, b.held = None, 0, False
        self.bucket_index = {id(b): i for i, b in enumerate(buckets)}
        self.needs = {id(u): sorted({bucket_of[id(p)] for p in used}) for u, used in zip(units, uses)}
        self.index = {id(u): k for k, u in enumerate(units)}
        self.handles = [h for u in units for h in (u.register_forward_pre_hook(self._pre_forward),
                                                   u.register_forward_hook(self._post_forward))]
        self.order, self.position, self.verified = [], {}, False
        self._callback_queued = False
        self.pieces = None  # ZeroOptimizer's OffloadPieces under offload_param: the pieces are read, not kept

    # ---- one bucket ---------------------------------------------------------------------
    def _gather(self, bi: int, wait: bool) -> None:
        b = self.buckets[bi]
        if self.pieces is not None and self.pieces.whole:  # one rank: the bucket is read, not gathered
            self.pieces.load(bi)
            return
        if b.flat_param._storage.is_released:
            if not self.verified:
                self._check_same_bucket(bi)
            if self.pieces is not None:
                self.pieces.load(bi)
            b.flat_param._storage.allocate(b.padded * b.flat_param.itemsize)
            b.work = b.group.all_gather(b.flat_param, b.shard_param, async_op=True)
        if wait:
            self._wait(b)

    def _wait(self, b) -> None:
        """The bucket's gather done (an offloaded piece is dropped then)."""
        if b.work is not None:
            b.work.wait()
            b.work = None
            if self.pieces is not None:
                self.pieces.unload(self.bucket_index[id(b)])

    def _free(self, b) -> None:
        self._wait(b)  # never free memory a collective is writing
        if self.pieces is not None:  # ... or a read ahead (one rank: it reads into the bucket)
            self.pieces.settle(self.bucket_index[id(b)])
        b.flat_param._storage.release(RELEASED)

    def _maybe_free(self, b) -> None:
        if b.users == 0 and not b.held and not b.flat_param._storage.is_released:
            self._free(b)

    def grads_done(self, bi: int) -> None:
        """The optimizer took the bucket's last gradient: no backward needs it any more."""
        b = self.buckets[bi]
        b.held = False
        self._maybe_free(b)

    # ---- the order units run in -----------------------------------------------------------
    def _check_same_bucket(self, bi: int) -> None:
        t = from_numpy(np.array([bi, -bi], dtype=np.int64)).to(self.buckets[0].device)
        self.group.all_reduce(t, ReduceOp.MAX)
        hi, lo = int(t[0].item()), -int(t[1].item())
        if hi != bi or lo != bi:
            names = [type(u).__name__ for u in self.units]
            raise RuntimeError(f"ZeRO-3: data-parallel rank {self.group.rank} gathers bucket {bi} while "
                               f"another rank gathers bucket {hi if hi != bi else lo}: every rank must run "
                               f"the model's modules in the same order (units: {names[:8]}...)")

    def _finalize_order(self) -> None:
        """The first forward's order is the one prefetching follows; every rank must agree."""
        self.verified = True
        self.position = {id(u): k for k, u in enumerate(self.order)}
        sig = zlib.crc32(np.array([self.index[id(u)] for u in self.order], dtype=np.int64).tobytes())
        t = from_numpy(np.array([sig, -sig], dtype=np.int64)).to(self.buckets[0].device)
        self.group.all_reduce(t, ReduceOp.MAX)
        if int(t[0].item()) != sig or -int(t[1].item()) != sig:
            raise RuntimeError("ZeRO-3: the data-parallel ranks ran the model's modules in different "
                               "orders on the first step; every rank must run the same modules in the "
                               "same order")

    def _prefetch(self, module, step: int) -> None:
        k = self.position.get(id(module))
        if k is not None and 0 <= k + step < len(self.order):
            for bi in self.needs[id(self.order[k + step])]:
                if self.pieces is None:
                    self._gather(bi, wait=False)
                elif self.buckets[bi].flat_param._storage.is_released:  # its piece read while this unit runs
                    self.pieces.read_ahead(bi)

    # ---- hooks ------------------------------------------------------------------------------
    def _pre_forward(self, module, args):
        if not self.verified:
            if any(u is module for u in self.order):  # the second forward begins
                self._finalize_order()
            else:
                self.order.append(module)
        need = self.needs[id(module)]
        for bi in need:
            self._gather(bi, wait=False)
        if self.verified:
            self._prefetch(module, +1)
        for bi in need:
            self._gather(bi, wait=True)
            self.buckets[bi].users += 1

    def _post_forward(self, module, args, output):
        for bi in self.needs[id(module)]:
            b = self.buckets[bi]
            b.users -= 1
            self._maybe_free(b)
        if not is_grad_enabled():
            return None
        wrap = lambda t: _GatherForBackward.apply(t, self, module) \
            if isinstance(t, Tensor) and t.requires_grad else t  # noqa: E731
        return tuple(wrap(t) for t in output) if isinstance(output, tuple) else wrap(output)

    def before_backward(self, module) -> None:
        if not self._callback_queued:
            queue_callback(self._after_backward)
            self._callback_queued = True
        if not self.verified:
            self._finalize_order()
        need = self.needs[id(module)]
        for bi in need:
            self._gather(bi, wait=False)
            self.buckets[bi].held = True  # until the optimizer has its gradients
        self._prefetch(module, -1)
        for bi in need:
            self._gather(bi, wait=True)

    def _after_backward(self) -> None:
        for b in self.buckets:  # what no gradient released (a unit without one, a prefetch)
            b.held = False
            self._maybe_free(b)
        self._callback_queued = False

    @contextmanager
    def gathered(self, write: bool = False):
        """Every parameter whole for the duration; with write=True, what was written into them
        (every rank alike, as loading a checkpoint does) becomes the shards."""
        for bi in range(len(self.buckets)):
            self._gather(bi, wait=False)
        for bi, b in enumerate(self.buckets):
            self._gather(bi, wait=True)
            b.users += 1
        try:
            yield
            if write:
                pieces = {bi: b.flat_param[b.rank * b.piece:(b.rank + 1) * b.piece]
                          for bi, b in enumerate(self.buckets)}
                if self.pieces is not None:
                    self.pieces.write(pieces)
                else:
                    for bi, b in enumerate(self.buckets):
                        b.shard_param.copy_(pieces[bi])
        finally:
            for b in self.buckets:
                b.users -= 1
                self._maybe_free(b)


class OffloadPieces:
    """ZeRO-3 with offload_param: this rank's piece of every bucket lives in the OffloadOptimizer's
    store (host memory or the scratch file), not in memory. The gatherer asks for a piece just
    before its all-gather (`load`: a read-ahead started one unit earlier, or a read now), and
    drops it once the gather is done (`unload`); the step updates the pieces in the store. On one
    rank the piece is the whole bucket: it is read straight into the bucket, nothing gathered."""

    def __init__(self, optimizer, buckets, segments, inner_params, world: int):
        self.optimizer, self.buckets, self.whole = optimizer, buckets, world == 1
        index = {id(p): i for i, p in enumerate(inner_params)}
        self.items = [[] for _ in buckets]  # per bucket: (the store's parameter index, where in the piece)
        for shard, bi, at, _, _ in segments:
            self.items[bi].append((index[id(shard)], at))
        self.pending = {}  # bucket -> (read-ahead future, the array it reads into)
        for b in buckets:
            b.shard_param._storage.release(_OFFLOADED)

    def _tensor(self, b):
        """What a piece is read into: the bucket itself on one rank, else its piece."""
        return b.flat_param if self.whole else b.shard_param

    def _target(self, b):
        """Memory for the piece, and the host array it is read to: that memory on the CPU, a
        host array for a GPU."""
        t = self._tensor(b)
        t._storage.allocate(b.piece * t.itemsize)
        host = t.detach().numpy() if b.device.type == "cpu" else np.empty(b.piece, np.float32)
        host[:] = 0  # the padding past the last parameter
        return host

    def read_ahead(self, bi: int) -> None:
        b = self.buckets[bi]
        if bi not in self.pending and self._tensor(b)._storage.is_released:
            host = self._target(b)
            self.pending[bi] = (self.optimizer.read_params(self.items[bi], host, wait=False), host)

    def load(self, bi: int) -> None:
        """Bucket bi's piece in b.shard_param for its all-gather (one rank: in b.flat_param)."""
        b = self.buckets[bi]
        if bi in self.pending:
            future, host = self.pending.pop(bi)
            future.result()
        elif self._tensor(b)._storage.is_released:
            host = self._target(b)
            self.optimizer.read_params(self.items[bi], host)
        else:
            return
        if b.device.type != "cpu":
            self._tensor(b).copy_(from_numpy(host))

    def unload(self, bi: int) -> None:
        b = self.buckets[bi]
        if not self.whole and bi not in self.pending and not b.shard_param._storage.is_released:
            b.shard_param._storage.release(_OFFLOADED)

    def settle(self, bi: int) -> None:
        """A read ahead into bucket bi finished and dropped (before its memory is freed)."""
        if bi in self.pending:
            future, _ = self.pending.pop(bi)
            future.result()
            self._tensor(self.buckets[bi])._storage.release(_OFFLOADED)

    def discard(self) -> None:
        """Drops every copy read from the store (before the step changes what they hold): the
        reads ahead, and on one rank any bucket still whole."""
        for bi in list(self.pending):
            self.settle(bi)
        if self.whole:
            for b in self.buckets:
                if not b.flat_param._storage.is_released:
                    b.flat_param._storage.release(RELEASED)

    def write(self, pieces: dict) -> None:
        """New values for the pieces {bucket: this rank's piece} (a loaded checkpoint)."""
        self.discard()
        values = {}
        for bi, piece in pieces.items():
            for i, at in self.items[bi]:
                n = self.optimizer.params[i].numel()
                values[i] = piece[at:at + n]
        self.optimizer.write_params(values)


_OFFLOADED = ("this rank's piece of a ZeRO-3 parameter is offloaded (offload_param): it is read back only "
              "for its module's gather; read the parameters inside `with optimizer.gathered_parameters():`")
