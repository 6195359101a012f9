"""DistributedDataParallel: replicas on the data-parallel ranks, gradients averaged.

The Reducer keeps the gradients in the flat buffer (param_buffer.py: the first bucket ~1 MB so
that communication starts early, then ~25 MB). Each parameter's .grad is a view into its
bucket, so the autograd engine accumulates straight into the buffer that is communicated.
When the last gradient of a bucket lands (post-accumulate-grad hook) the bucket's all-reduce
starts while backward goes on; buckets are launched strictly in order so that every rank issues the same collectives in
the same sequence. At the end of backward the Reducer launches whatever is left (a parameter
that got no gradient contributes zeros, so unused parameters cannot hang the job) and waits.
After the first backward DDP packs the buckets again in the order the gradients arrived.
A tied embedding (GPT-2's wte, also the head's weight) is reduced in two parts: the head's
share, final early in backward, in its bucket while backward goes on; the lookup's share, which
arrives last but touches only the rows of the tokens looked up, as those rows (gathered from
every rank and added once the bucket is reduced) instead of the whole table at the end.
A reduce dtype other than the gradients' (PyTorch DDP's mixed_precision=_MixedPrecision(reduce_dtype=),
FSDP2's MixedPrecisionPolicy(reduce_dtype=), Megatron's --accumulate-allreduce-grads-in-fp32)
reduces a copy of each bucket in that dtype and writes the mean back: bf16 gradients summed in
fp32 and rounded once, or fp32 gradients sent as bf16 (half the bytes where the backend reduces
bf16 itself, as NCCL does; the MPI group sums bf16 through an fp32 copy, so there it saves nothing).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import numpy as np

from ...autograd import is_grad_enabled, no_grad
from ...autograd.engine import queue_callback
from ...creation import tensor, zeros
from ...device import as_device
from ...dtypes import as_dtype, int64
from ...kernels.index import index_add
from .. import functional as F
from ..module import Module
from ..modules import Embedding
from .param_buffer import ParamAndGradBuffer, broadcast_replicas, mark_ready, pack, trainable
from .expert_parallel import is_expert_param, require_expert_group
from .process_group import ProcessGroup, ReduceOp, _then, default_data_parallel_group


class Reducer:
    """All-reduces (averages) the gradients of params over group, bucket by bucket, as backward
    produces them (buckets: param_buffer.pack). expert_group: under expert parallelism, the
    group that reduces the experts' parameters (marked `expert_parallel`; the ranks holding the
    same experts, a part of `group`): each expert's gradient there already sums the tokens of
    its EP group's ranks, so it is summed over expert_group and divided by group's size, the
    mean over every rank's loss as the other gradients.

    order_by_backward (DDP's): after the first synchronised backward the buckets are packed
    again in the order the gradients arrived there (rank 0's, the same on every rank), as
    PyTorch's DDP rebuilds its buckets after the first iteration: registration order puts a
    parameter used first in forward (GPT-2's position embedding; a tied embedding, final only
    when the lookup's share arrives) beside the first blocks, whose bucket then waits for it
    until backward ends instead of leaving while backward goes on."""

    def __init__(self, params, group, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 expert_group=None, reduce_dtype=None, order_by_backward: bool = False):
        self.group = group
        self.reduce_dtype = None if reduce_dtype is None else as_dtype(reduce_dtype)  # None: the gradients'
        self.expert_group = expert_group if expert_group is not group else None
        self.params = trainable(params)
        self.caps = bucket_cap_mb, first_bucket_mb
        self._pack(list(reversed(self.params)))  # pack's own guess: reverse registration order
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_grad)
        self.arrivals = [] if order_by_backward else None  # the first synchronised backward's order
        self.repack = False
        self.sync = True
        self.last_wait_s = 0.0
        # called as on_reduced(params, work) when a bucket's all-reduce is queued: its gradients
        # are final once work is done (an OffloadOptimizer streams them to the host then)
        self.on_reduced = None
        self._reset_round()

    @property
    def buckets(self) -> list:
        return self.buffer.buckets

    def _packs(self, order) -> list:
        """The parameters in `order` (the first gradient expected first) as buckets: the first
        and the last at most first_bucket_mb (communication starts early, and little is left
        for after backward: GPT-2's wpe, the last gradient to arrive, stays out of the blocks'
        bucket), the others at most bucket_cap_mb."""
        cap, first = self.caps
        tail, size = [], 0
        for p in reversed(order):
            if tail and size + p.nbytes > first * 2**20:
                break
            tail.append(p)
            size += p.nbytes
        rest = order[:len(order) - len(tail)]
        return [ps for ps in pack(list(reversed(rest)), cap, first) + pack(tail, cap) if ps]

    def _pack(self, order) -> None:
        self.buffer = ParamAndGradBuffer(self._packs(order))
        for b in self.buffer:
            b.flat_grad = b.new_flat()  # the .grad views are made before each forward (prepare)

    def _repack_by_arrival(self) -> None:
        """Packs the buckets again in the order the first synchronised backward produced the
        gradients (rank 0's order, so that every rank issues the same collectives; parameters
        that got none last, in the old order). The .grad views move on the next hold_grads."""
        index = {id(p): i for i, p in enumerate(self.params)}
        arrived, seen = [index[id(p)] for p in self.arrivals], {id(p) for p in self.arrivals}
        self.arrivals = None
        if not self.params:
            return
        order = arrived + [index[id(p)] for b in self.buckets for p in b.params if id(p) not in seen]
        if self.group.size > 1:
            shared = tensor(order, dtype=int64).to(self.buckets[0].device)  # (NCCL: on the group's GPU)
            self.group.broadcast(shared, 0)
            order = shared.tolist()
        old = [[id(p) for p in b.params] for b in self.buckets]
        new = [self.params[i] for i in order]
        if [[id(p) for p in ps] for ps in self._packs(new)] != old:
            self._pack(new)

    def prepare(self, sync: bool) -> None:
        """Before a forward pass: every .grad is its bucket view again (a grad set to None by
        zero_grad starts from zero; one assigned by the user is copied in)."""
        self.sync = sync
        if self.repack:
            self.repack = False
            self._repack_by_arrival()
        self.buffer.hold_grads()
        self._reset_round()

    def _reset_round(self) -> None:
        self.lookups = []  # (parameter, rows, their gradient): tied embeddings' lookup shares
        self.pending = [len(b.params) for b in self.buckets]
        self.works = [None] * len(self.buckets)
        self.next_bucket = 0
        self.callback_queued = False
        self.finished = False  # this round's reduction is complete (finish_grad_sync ran)
        self.ready = set()

    @no_grad()
    def _on_grad(self, p) -> None:
        if not self.sync:
            return
        if not self.callback_queued:
            queue_callback(self.finish_grad_sync)
            self.callback_queued = True
        bi, _ = self.buffer.locate(p)
        if p.grad._storage is not self.buckets[bi].flat_grad._storage:  # grad replaced behind our back
            view = self.buffer.grad_view(p)
            view.copy_(p.grad)
            p.grad = view
        mark_ready(self.ready, p)
        if self.arrivals is not None:
            self.arrivals.append(p)
        self.pending[bi] -= 1
        while self.next_bucket < len(self.buckets) and self.pending[self.next_bucket] <= 0:
            self._launch(self.next_bucket)
        for w in self.works[:self.next_bucket]:  # MPI moves non-blocking calls only when asked
            w.is_completed()

    @no_grad()
    def lookup_share(self, p, alias, indices) -> None:
        """The share of tied embedding p's gradient that its lookup of `indices` produced, in
        alias.grad (the head's share is p's own gradient, reduced in p's bucket): under no_sync
        added to p's gradient; else its rows kept for finish_grad_sync. The table-sized
        alias.grad is let go at once."""
        share, alias.grad = alias.grad, None
        if not self.sync:
            p.grad.add_(share)
            return
        if not self.callback_queued:
            queue_callback(self.finish_grad_sync)
            self.callback_queued = True
        rows = tensor(np.unique(indices.cpu().numpy()), dtype=int64).to(share.device)
        self.lookups.append((p, rows, share.index_select(0, rows)))

    def _add_lookup_shares(self) -> None:
        """Every rank's lookup rows, gathered (padded to the longest with zero rows), averaged
        into each tied embedding's gradient once its bucket's all-reduce is done: the same
        additions in the same order on every rank."""
        n = self.group.size
        for p, rows, grads in self.lookups:
            device = grads.device
            counts = zeros(n, dtype=int64, device=device)
            self.group.all_gather(counts, tensor([rows.numel()], dtype=int64).to(device))
            most = max(counts.tolist())
            padded_rows, padded = zeros(most, dtype=int64, device=device), zeros(most, grads.shape[1],
                                                                                dtype=grads.dtype, device=device)
            padded_rows[:rows.numel()] = rows
            padded[:rows.numel()] = grads
            every_row = zeros(n * most, dtype=int64, device=device)
            every_grad = zeros(n * most, grads.shape[1], dtype=grads.dtype, device=device)
            self.group.all_gather(every_row, padded_rows)
            self.group.all_gather(every_grad, padded)
            every_grad.mul_(1.0 / n)
            self.works[self.buffer.locate(p)[0]].wait()
            index_add(p.grad, 0, every_row, every_grad)  # in place (Tensor.index_add_ copies the whole table)
        self.lookups = []

    def _launch(self, i: int) -> None:
        flat = self.buckets[i].flat_grad
        wire = flat if self.reduce_dtype in (None, flat.dtype) else flat.to(self.reduce_dtype)
        if self.expert_group is not None and is_expert_param(self.buckets[i].params[0]):
            scale = 1.0 / self.group.size
            work = _then(self.expert_group.all_reduce(wire, ReduceOp.SUM, async_op=True), lambda: wire.mul_(scale))
        else:
            work = self.group.all_reduce(wire, ReduceOp.AVG, async_op=True)
        # the mean, rounded once to the gradients' dtype (wire is held by the closure until then)
        self.works[i] = work if wire is flat else _then(work, lambda: flat.copy_(wire))
        self.next_bucket = i + 1
        if self.on_reduced is not None:
            self.on_reduced(self.buckets[i].params, self.works[i])

    def finish_grad_sync(self) -> None:
        """The one door through which this round's reduction completes (Megatron's
        finish_grad_sync): launches the buckets backward left (a parameter that got no gradient
        contributes zeros) and waits for every all-reduce. Runs at the end of a synchronised
        backward (an autograd callback, so that .grad is averaged when backward returns, as
        with PyTorch's DDP) and again from finalize_grads, where it has nothing left to do."""
        if not self.sync or self.finished:
            return
        self.finished = True
        while self.next_bucket < len(self.buckets):
            self._launch(self.next_bucket)
        t0 = time.perf_counter()
        self._add_lookup_shares()
        for w in self.works:
            w.wait()
        self.last_wait_s = time.perf_counter() - t0  # communication not hidden behind backward
        self.repack = self.arrivals is not None


def _split_tied_lookups(module: Module, ddp) -> None:
    """Each Embedding of module whose weight another module also holds (a tied head) looks up
    through a leaf of its own while ddp's forward runs, so that the weight's gradient is the
    head's share alone and the lookup's comes to the Reducer apart (Reducer.lookup_share)."""
    holders = {}
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None:
                holders[id(p)] = holders.get(id(p), 0) + 1
    for m in module.modules():
        if type(m) is Embedding and m.weight.requires_grad and holders[id(m.weight)] > 1:
            m.forward = partial(_lookup, m, ddp)


def _lookup(m, ddp, indices):
    if not (ddp.splitting and is_grad_enabled()):  # outside DDP's forward: as Embedding does
        return F.embedding(indices, m.weight, m.padding_idx)
    alias = m.weight.detach().requires_grad_()  # the same memory, a leaf of its own
    alias.register_post_accumulate_grad_hook(lambda a: ddp.reducer.lookup_share(m.weight, a, indices))
    return F.embedding(indices, alias, m.padding_idx)


@dataclass
class _MixedPrecision:
    """PyTorch DDP's mixed_precision= (torch.nn.parallel.distributed._MixedPrecision): here only
    reduce_dtype, the dtype gradients are all-reduced in; the computation's dtype is autocast's."""
    param_dtype: object = None
    reduce_dtype: object = None
    buffer_dtype: object = None


def _reduce_dtype(mixed_precision):
    """mixed_precision's reduce_dtype (an infinitrain dtype or its name), or None;
    param_dtype and buffer_dtype are refused: autocast decides the computation's dtype."""
    if mixed_precision is None:
        return None
    for name in ("param_dtype", "buffer_dtype"):
        if getattr(mixed_precision, name, None) is not None:
            raise ValueError(f"DistributedDataParallel: mixed_precision.{name}={getattr(mixed_precision, name)} "
                             f"is not supported (compute in low precision with autocast); only reduce_dtype is")
    if not hasattr(mixed_precision, "reduce_dtype"):
        raise ValueError(f"DistributedDataParallel: mixed_precision={mixed_precision!r} is not supported: give "
                         f"a _MixedPrecision (PyTorch's), of which only reduce_dtype is taken")
    value = mixed_precision.reduce_dtype
    if value is None:
        return None
    reduce_dtype = as_dtype(value)
    if not reduce_dtype.is_floating_point:
        raise ValueError(f"DistributedDataParallel: mixed_precision.reduce_dtype must be a floating-point dtype, "
                         f"got {reduce_dtype.name}")
    return reduce_dtype


class DistributedDataParallel(Module):
    """PyTorch's DistributedDataParallel: module replicated on every rank of process_group (the
    default: the group of init_process_group / nn.parallel.init), rank 0's parameters and
    buffers copied to the others at the start (init_sync), the gradients averaged by the
    Reducer during backward, and the buffers copied from rank 0 before each forward that
    computes gradients (broadcast_buffers, forward_sync_buffers). The module stays on its own
    device: device_ids names it (one CUDA device, or None for a CPU module), as in PyTorch.

    Accepted for PyTorch's programs and already how the Reducer works: find_unused_parameters
    (a parameter without a gradient contributes zeros, whether or not it is set),
    gradient_as_bucket_view (the gradients are always views into the buckets), static_graph,
    check_reduction, batched_grad_copy, dim. mixed_precision: its reduce_dtype only (_MixedPrecision),
    the dtype gradients are averaged in. first_bucket_mb: the first bucket's size
    (communication starts early); broadcast_from: the rank whose replica the others copy;
    expert_process_group: under expert parallelism, the group that holds the same experts and
    reduces their parameters (Reducer)."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool | None = None, init_sync: bool = True, process_group=None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None, mixed_precision=None,
                 device_mesh=None, skip_all_reduce_unused_params: bool = False, bucket_cap_mb_list=None,
                 batched_grad_copy: bool = False, forward_sync_buffers: bool | None = None, *,
                 first_bucket_mb: float = 1.0, broadcast_from: int = 0, expert_process_group=None):
        super().__init__()
        if isinstance(device_ids, ProcessGroup):
            raise TypeError("DistributedDataParallel: the second argument is device_ids, as in PyTorch; pass the "
                            "group as process_group=")
        for name, value in (("delay_all_reduce_named_params", delay_all_reduce_named_params),
                            ("param_to_hook_all_reduce", param_to_hook_all_reduce),
                            ("device_mesh", device_mesh),
                            ("bucket_cap_mb_list", bucket_cap_mb_list)):
            if value is not None:
                raise ValueError(f"DistributedDataParallel: {name}= is not supported (leave it None)")
        if skip_all_reduce_unused_params:
            raise ValueError("DistributedDataParallel: skip_all_reduce_unused_params=True is not supported: "
                             "parameters without a gradient are reduced as zeros")
        reduce_dtype = _reduce_dtype(mixed_precision)
        self.module = module
        group = process_group if process_group is not None else default_data_parallel_group()
        if not isinstance(group, ProcessGroup):
            raise TypeError(f"DistributedDataParallel: process_group must be a process group of this rank, got "
                            f"{group!r}")
        self.process_group = group
        self.device_ids, self.output_device = _check_devices(module, group, device_ids, output_device)
        # broadcast_buffers (None: True) copies the buffers at the start and before each forward;
        # forward_sync_buffers, when given, decides the latter alone (PyTorch 2.13's split)
        self.broadcast_buffers = broadcast_buffers is not False
        self.forward_sync_buffers = self.broadcast_buffers if forward_sync_buffers is None else forward_sync_buffers
        self.dim = dim
        self.find_unused_parameters, self.static_graph = find_unused_parameters, static_graph
        self.gradient_as_bucket_view = True  # what the Reducer does whatever was asked
        self.broadcast_from = broadcast_from
        require_expert_group(module.parameters(), expert_process_group, "DistributedDataParallel",
                             "expert_process_group", group)
        experts = expert_process_group if expert_process_group is not group else None
        if init_sync:
            dense = [p for p in module.parameters() if experts is None or not is_expert_param(p)]
            broadcast_replicas(dense + (list(module.buffers()) if self.broadcast_buffers else []),
                               group, broadcast_from)
            if experts is not None:  # each EP rank holds other experts: copied from their first holder
                broadcast_replicas([p for p in module.parameters() if is_expert_param(p)], experts)
        self.reducer = Reducer(module.parameters(), group, 25.0 if bucket_cap_mb is None else bucket_cap_mb,
                               first_bucket_mb, expert_group=experts, reduce_dtype=reduce_dtype,
                               order_by_backward=True)
        self._sync = True
        self.splitting = False  # DDP's forward is running: tied lookups go through their own leaf
        if group.size > 1 and experts is None:
            _split_tied_lookups(module, self)

    def forward(self, *args, **kwargs):
        if self.forward_sync_buffers and self._sync and is_grad_enabled() and self.process_group.size > 1:
            buffers = list(self.module.buffers())
            if buffers:  # running statistics and the like: every replica starts the step with rank 0's
                broadcast_replicas(buffers, self.process_group, self.broadcast_from)
        self.reducer.prepare(self._sync)
        self.splitting = True
        try:
            return self.module(*args, **kwargs)
        finally:
            self.splitting = False

    @contextmanager
    def no_sync(self):
        """Gradients accumulate locally (gradient accumulation); the next synchronised
        backward averages the sum."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous


def _check_devices(module: Module, group, device_ids, output_device):
    """(device_ids, output_device) as PyTorch keeps them: None for a CPU module, [index] for a
    module on one CUDA device; anything else is refused, as are a module and group on different
    kinds of device."""
    devices = {p.device for p in module.parameters()}
    if len(devices) > 1:
        raise ValueError(f"DistributedDataParallel: the module's parameters are on several devices "
                         f"({sorted(str(d) for d in devices)}); put the module on one device")
    device = devices.pop() if devices else None
    group_device = getattr(group, "device", None)  # NCCL groups have one; MPI groups work on the host
    on_gpu = device is not None and device.type == "cuda"
    if on_gpu != (group_device is not None):
        raise ValueError(f"DistributedDataParallel: the module is on {device or 'no device'} but the process group "
                         f"{group!r} communicates {'CUDA' if group_device is not None else 'CPU'} tensors")
    if on_gpu and group_device != device:
        raise ValueError(f"DistributedDataParallel: the module is on {device} but the process group {group!r} "
                         f"communicates on {group_device}")
    if not on_gpu:
        if device_ids or output_device is not None:
            raise ValueError(f"DistributedDataParallel: device_ids and output_device name a GPU; they must be None "
                             f"for a module on the CPU (got device_ids={device_ids}, output_device={output_device})")
        return None, None
    if device_ids is None or len(device_ids) == 0:
        return None, None
    if len(device_ids) > 1:
        raise ValueError("DistributedDataParallel: device_ids can only be None or contain a single element")
    index = _device_index(device_ids[0])
    out = index if output_device is None else _device_index(output_device)
    if index != device.index or out != device.index:
        raise ValueError(f"DistributedDataParallel: device_ids={device_ids} (output_device={output_device}) but the "
                         f"module is on {device}; move it there first (module.to(device))")
    return [index], out


def _device_index(d) -> int:
    if isinstance(d, int):
        return d
    return as_device(d).index or 0
