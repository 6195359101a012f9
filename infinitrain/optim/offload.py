"""OffloadOptimizer: an optimizer whose state lives off the training device, as DeepSpeed's
ZeRO-Offload (device="cpu") and ZeRO-Infinity (device="nvme") keep it.

device="cpu", for parameters on a GPU: the state and a float32 master copy of the parameters
live in host memory, the masters and the gradients' host copies pinned (page-locked); each step
runs the optimizer's update on the host (the native CPU kernel, on every core) and copies the
updated weights back, queued on the GPU's stream. (The parameters are float32 here, so the host
copy is refreshed from them each step rather than kept as a separate master: weights loaded
behind the optimizer's back are never overwritten.)

Gradients streamed during backward (ZeRO-Offload's schedule): whoever knows that a gradient is
final for the step (DDP's reducer when its bucket's all-reduce is queued, ZeRO when a bucket's
reduce-scatter has landed in the shard, a parameter's own hook on one rank; TrainStep wires
them for the step's last backward) calls grads_ready(params), and their copies to the host are
queued on a copy stream of their own, after that reduction on the device, while the GPU goes on
with backward. The step waits only for what is still in flight. A gradient changed after it was
streamed must be announced first (grads_changed, grads_scaled for clipping's factor, which the
host copy then follows) so that its host copy is the one the step would have copied. A
gradient nobody streamed is copied when the step runs, as without streaming: the same bits
either way.

device="nvme": the state lives in a scratch file under `path`. On a CPU-only node this is what
lets a model whose weights + gradients + AdamW moments exceed the memory train: the moments
(8 of AdamW's 16 bytes per parameter) go to disk. The file is laid out in blocks of about
buffer_mb, each holding every state entry of a run of parameters (or pieces of one), entry after
entry, so that a block is one large sequential read and one write. A background thread reads a
block ahead of the update and writes the previous one behind it, through two host buffers, so
the step streams rather than waits. With direct I/O (O_DIRECT, where the filesystem takes it)
the file never enters the page cache; elsewhere each written block is synced and dropped from
it (posix_fadvise), so either way the state costs no memory beyond the buffers.

offload_params=True (ZeRO-3's --offload_param): the parameters themselves (this rank's float32
pieces, the only copy ZeRO-3 keeps) live there too, as one more entry of each block, so the step
updates them where they lie and the model's memory holds none of them: whoever needs them whole
reads them (`read_params`, one unit of the model at a time, ahead of use), or writes new values
(`write_params`, a loaded checkpoint).

The file is scratch, not a checkpoint: it is unlinked as soon as it is open, so it is freed when
the process ends however it ends, and state_dict() reads the state back whole for checkpoints
(which therefore resume with or without offload, under any layout). Its space is reserved when
the optimizer is made (posix_fallocate): a disk that is too small is an error then, not in the
middle of training.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import numpy as np

from .._native import lib
from ..autograd import no_grad
from ..kernels import elementwise as ew
from ..creation import empty, from_numpy, zeros
from .offload_store import BUFFERS, PIECE, Block, FileStore, HostStore, OffloadError, layout
from .offload_stream import EarlyUpdates, GradCopies, update_batch

__all__ = ["BUFFER_MB", "OffloadError", "OffloadOptimizer", "offload_target", "offloaded", "staging_bytes"]

BUFFER_MB = 64.0  # the state streamed per block by default


def staging_bytes(buffer_mb: float = BUFFER_MB) -> int:
    """The host memory device="nvme" keeps for its buffers (what stays resident of the state)."""
    return BUFFERS * int(buffer_mb * 2**20)


OFFLOAD_TARGETS = ("cpu", "nvme")


def offload_target(device: str | None) -> str | None:
    """Where state is offloaded to: "cpu" or "nvme", or None for None and "none" (DeepSpeed's
    word for no offload): the one place that reads the option."""
    if device in (None, "none"):
        return None
    if device not in OFFLOAD_TARGETS:
        raise ValueError(f"offload device must be 'none', 'cpu' or 'nvme', got {device!r}")
    return device


def offloaded(optimizer, device: str | None, path=None, offload_params: bool = False):
    """optimizer wrapped in an OffloadOptimizer when device is "cpu" or "nvme"; as it is when
    device is None or "none"."""
    if offload_target(device) is None:
        return optimizer
    return OffloadOptimizer(optimizer, device, path, offload_params=offload_params)


def _host_views(params: list) -> list:
    """For each parameter (None: none wanted) a float32 tensor of its shape in one block of
    pinned host memory (pageable, with a warning, where pinning is refused)."""
    sizes = [p.numel() if p is not None else 0 for p in params]
    if not any(sizes):
        return [None] * len(params)
    try:
        flat = empty(sum(sizes), pin_memory=True)
    except (RuntimeError, MemoryError) as e:
        warnings.warn(f"OffloadOptimizer: host memory could not be pinned ({e}); the copies to and from "
                      "the GPU will not overlap its work", RuntimeWarning, stacklevel=3)
        flat = empty(sum(sizes))
    out, at = [], 0
    for p, n in zip(params, sizes):
        out.append(flat[at:at + n].view(*p.shape) if p is not None else None)
        at += n
    return out


class OffloadOptimizer:
    """Wraps optimizer (AdamW, Adam, SGD with momentum: any whose step is Optimizer's over
    tensor_keys/counters/update) so that its state lives in host memory (device="cpu", for
    parameters on a GPU) or in a scratch file under path (device="nvme"). param_groups are the
    wrapped optimizer's (a scheduler works on either); state_dict() is the wrapped optimizer's,
    whole, so checkpoints do not depend on offload. buffer_mb: the state streamed per block
    (two such buffers are resident; default the module's BUFFER_MB). direct: None tries direct
    I/O and falls back to buffered I/O, True insists, False never tries."""

    def __init__(self, optimizer, device: str = "nvme", path=None, buffer_mb: float | None = None,
                 direct: bool | None = None, offload_params: bool = False):
        buffer_mb = BUFFER_MB if buffer_mb is None else buffer_mb
        if device not in ("cpu", "nvme"):
            raise ValueError(f"OffloadOptimizer: device must be 'cpu' or 'nvme', got {device!r}")
        if not (isinstance(buffer_mb, (int, float)) and buffer_mb > 0):
            raise ValueError(f"OffloadOptimizer: buffer_mb must be > 0, got {buffer_mb!r}")
        self.optimizer, self.device = optimizer, device
        self.param_groups = optimizer.param_groups
        self.state_type = getattr(optimizer, "state_type", type(optimizer).__name__)
        self.params = [p for g in self.param_groups for p in g["params"]]
        self.group_of = [g for g in self.param_groups for _ in g["params"]]
        kinds = {optimizer.tensor_keys(g) for g in self.param_groups}
        if len(kinds) != 1:
            raise ValueError(f"OffloadOptimizer: every parameter group must keep the same state, got "
                             f"{sorted(kinds)}")
        self.keys = kinds.pop()
        if not self.keys:
            raise ValueError(f"OffloadOptimizer: {type(optimizer).__name__} keeps no state here (SGD without "
                             "momentum?): there is nothing to offload")
        if any(p.dtype.name != "float32" for p in self.params):
            raise ValueError("OffloadOptimizer: the parameters must be float32 (master weights); under "
                             "bfloat16 training use autocast, which keeps them so")
        on_gpu = [p.device.type != "cpu" for p in self.params]
        if device == "cpu" and not any(on_gpu):
            raise ValueError("OffloadOptimizer: device='cpu' moves the state off a GPU, and these parameters "
                             "are in host memory already; device='nvme' with path= moves it to disk")
        if device == "nvme" and path is None:
            raise ValueError("OffloadOptimizer: device='nvme' needs path=, a folder on a local disk")
        self.offload_params, self.on_gpu = offload_params, on_gpu
        # a parameter on a GPU is updated through a float32 master copy in host memory (unless
        # the parameters are offloaded: then the store's copy is the master), and its gradient
        # through a host copy; both pinned, so that their copies run beside kernels
        self.host_grads = _host_views([p if gpu else None for p, gpu in zip(self.params, on_gpu)])
        self.masters = _host_views([p if gpu and not offload_params else None for p, gpu in zip(self.params, on_gpu)])
        for m, p in zip(self.masters, self.params):
            if m is not None:
                m.copy_(p.detach())
        # parameter index -> (its storage, that storage's version and alias_version) just after
        # this optimizer last wrote the weights to the GPU: while they match (_current), the master
        # copy is current and the step need not read the weights back (a loaded checkpoint, an
        # in-place edit, a collective into them, their memory handed to another library or let go
        # by one change them; the first step always reads them)
        self._pushed = {}
        self._early, self._pool = None, None  # the updates made during backward (EarlyUpdates), their worker
        # the parameters updated during this step's backward passes, by EarlyUpdates since joined:
        # the step skips them, and a gradient of theirs arriving again is an error
        self._updated_early = set()
        self._pieces = {}  # parameter index -> its views into host memory (_host_pieces)
        self.update_batch = update_batch(self.params)
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self._copies = GradCopies(self.params) if any(on_gpu) else None
        self.streamed_bytes = 0  # of the last step's gradients, how many bytes went to the host during backward
        entries = len(self.keys) + (1 if offload_params else 0)  # the parameter last
        per_block = max(PIECE, int(buffer_mb * 2**20) // (4 * entries))
        self.blocks = layout([p.numel() for p in self.params], per_block, entries)
        self.chunks_of = {}  # parameter index -> [(block, start, end, where in the block)]
        for b in self.blocks:
            for i, start, end, at in b.chunks:
                self.chunks_of.setdefault(i, []).append((b, start, end, at))
        self.store = (HostStore(self.blocks, entries) if device == "cpu"
                      else FileStore(self.blocks, entries, path, direct))
        self.counts = {}  # parameter index -> its counters (AdamW's step), once it has been stepped
        if offload_params:  # the parameters' values as they are now, into the store
            self.write_params({i: p for i, p in enumerate(self.params)})

    @property
    def state_bytes(self) -> int:
        """The bytes of state kept off the device (with offload_params, the parameters too)."""
        return sum(b.numel for b in self.blocks) * 4 * (len(self.keys) + self.offload_params)

    # ---- the parameters, when they are offloaded too ---------------------------------------
    def _param_entry(self, b: Block) -> int:
        return len(self.keys) * b.numel

    def read_params(self, items, out: np.ndarray, wait: bool = True):
        """The values of parameters [(index, where in out)] into out (a float32 host array),
        read by the background thread; wait=False returns its future (read-ahead)."""
        def read():
            for i, at in items:
                for b, start, end, where in self.chunks_of[i]:
                    offset = b.offset + (self._param_entry(b) + where) * 4
                    self.store.read_range(offset, out[at + start:at + end])
        future = self.store.submit(read)
        return future.result() if wait else future

    @no_grad()
    def write_params(self, values: dict) -> None:
        """New values {parameter index: tensor of its shape} into the store (a pass over the
        blocks that hold them)."""
        flat = {i: v.detach().reshape(-1).to("cpu") for i, v in values.items()}
        blocks = [b for b in self.blocks if any(c[0] in flat for c in b.chunks)]
        for b, array in self.store.stream(blocks):
            buffer = from_numpy(array)
            base = self._param_entry(b)
            for i, start, end, at in b.chunks:
                if i in flat:
                    buffer[base + at:base + at + end - start].copy_(flat[i][start:end])

    def __repr__(self) -> str:
        what = "/".join(self.keys + (("parameters",) if self.offload_params else ()))
        return (f"OffloadOptimizer({type(self.optimizer).__name__}, {self.state_bytes / 2**20:.1f} MB of "
                f"{what} in {self.store.description}, {len(self.blocks)} blocks)")

    def numbered_groups(self) -> list:
        return self.optimizer.numbered_groups()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._finish_early()  # the updates made stay made; their copies back come before what follows
        self._updated_early = set()
        if self._copies is not None:  # the device may overwrite the gradients once copied
            self._copies.fence()
            self._copies.clear()
        self.optimizer.zero_grad(set_to_none)

    # ---- gradients streamed to the host during backward (parameters on a GPU) -------------
    def arm(self, update: bool = False, hold=()) -> None:
        """The next grads_ready calls are for the step's final gradients (TrainStep arms for the
        step's last backward: earlier micro-batches' gradients would only be copied again).
        update=True: the host also updates each parameter as soon as its gradient has landed,
        while backward goes on, and copies its weights back (the step then only waits), for a
        caller that knows nothing will change the gradients after this backward: no clipping,
        no loss scaling, each gradient handed over once; hold: parameters whose gradients do
        change after their reduction (updated at the step, as usual). Only with the state in
        host memory (device="cpu"); elsewhere update is ignored."""
        if self._copies is not None:
            self._copies.armed = True
            if update and self.device == "cpu" and not self.offload_params:
                self._finish_early()
                self._early = EarlyUpdates(self, {self.index[id(p)] for p in hold if id(p) in self.index},
                                           self._updated_early)

    @no_grad()
    def grads_ready(self, params, after=None) -> None:
        """The gradients of params (this optimizer's parameters; others are ignored) are final
        for the step once `after` has completed (a collective's Work still in flight on the
        device), or as the current stream now stands: their copies to the host are queued now
        on the copy stream. Nothing may change them on the device before the step unless
        announced (grads_changed, grads_scaled). A no-op unless armed, or on the CPU."""
        if self._copies is None or not self._copies.armed:
            return
        items = [(i, self.params[i].grad) for i in (self.index.get(id(p)) for p in params)
                 if i is not None and self.on_gpu[i] and self.params[i].grad is not None]
        if not items:
            return
        event = getattr(after, "event", None)  # a device event (NCCL): the copies follow it there
        if after is not None and event is None:
            after.wait()  # a backend without one: the gradients are final once it is done
        landed = self._copies.queue([(self.host_grads[i], i, g) for i, g in items], event)
        if self._early is not None:
            self._early.submit([i for i, _ in items], landed)

    def grads_changed(self, params) -> None:
        """The device gradients of params are about to change (a fix-up after their reduction):
        the step copies them again. Call it before changing them."""
        if late := self._updated_during_backward() & {self.index.get(id(p)) for p in params}:
            raise RuntimeError(f"OffloadOptimizer: the gradients of parameters {sorted(late)} change after the "
                               "host updated them during backward: arm(update=True) needs hold= to name them")
        if self._copies is not None and self._copies.streamed:
            self._copies.fence()  # and disarms: what streamed from now on would miss the change
            for p in params:
                self._copies.streamed.discard(self.index.get(id(p)))

    def grads_scaled(self, factor: float) -> None:
        """Every device gradient is multiplied by factor (gradient clipping): the host copies
        already streamed are multiplied by it at the step, the same float32 product. Call it
        before scaling them, or after a grads_changed call made since they were streamed (which
        orders the copies before any change)."""
        if self._updated_during_backward():
            raise RuntimeError("OffloadOptimizer: gradients scaled (clipped) after the host updated them during "
                               "backward: arm(update=True) is only for steps without clipping")
        if self._copies is not None and self._copies.streamed:
            self._copies.fence()
            self._copies.factor = factor if self._copies.factor is None else self._copies.factor * factor

    @property
    def streams_gradients(self) -> bool:
        """Whether grads_ready streams anything: some parameters are on a GPU."""
        return self._copies is not None


    def _flat(self, t):
        return t.detach().reshape(-1)

    def _finish_early(self) -> set:
        """The parameters updated during this step's backward passes (none unless armed with
        update=True), once their updates and copies back are done."""
        early, self._early = self._early, None
        if early is not None:
            self._updated_early |= early.finish()
        return self._updated_early

    def _updated_during_backward(self) -> set:
        return self._updated_early | (self._early.done if self._early is not None else set())

    def _update_params(self, ids) -> None:
        """The whole update on the host of parameters ids (state in host memory, gradients in
        host_grads): their counters, then the optimizer's update of their master weights, the
        pieces of one group in one call (AdamW: one multi-tensor kernel over them)."""
        groups = {}
        for i in ids:
            first = i not in self.counts
            counts = self.counts.setdefault(i, self.optimizer.counters())
            for k in counts:
                counts[k] += 1
            updates = groups.setdefault(id(self.group_of[i]), (self.group_of[i], []))[1]
            for target, grad, state in self._host_pieces(i):
                updates.append((target, grad, {**counts, **state}, first))
        for group, updates in groups.values():
            self.optimizer.update_group(updates, group)

    def _host_pieces(self, i: int) -> list:
        """Parameter i's (master weights, host gradient, state tensors) per chunk of the host
        store: views made once, since the host memory behind them stays where it is."""
        pieces = self._pieces.get(i)
        if pieces is None:
            g, target = self._flat(self.host_grads[i]), self._flat(self.masters[i])
            pieces = []
            for b, start, end, at in self.chunks_of[i]:
                _, array = next(self.store.stream([b]))
                buffer = from_numpy(array)
                pieces.append((target[start:end], g[start:end],
                               {key: buffer[k * b.numel + at:k * b.numel + at + end - start]
                                for k, key in enumerate(self.keys)}))
            self._pieces[i] = pieces
        return pieces

    @no_grad()
    def step(self) -> None:
        early, self._updated_early = self._finish_early(), set()  # (those updated during backward are done)
        live = {i for i, p in enumerate(self.params) if p.grad is not None} - early
        grads = {i: self._flat(self._host_grad(i) if self.on_gpu[i] else self.params[i].grad) for i in live}
        if self._copies is not None:
            self.streamed_bytes = self._copies.bytes
            self._copies.clear()
        for i in live:  # the weights as they are now, where something else wrote them since
            if self.masters[i] is not None and not self._current(i):
                self.masters[i].copy_(self.params[i].detach())
        if isinstance(self.store, HostStore) and not self.offload_params:
            self._update_and_push(sorted(i for i in live if self.masters[i] is not None))
            # recorded once every copy back is queued: parameters that are views of one storage
            # (ZeRO's shards) move each other's version, and would all look written elsewhere
            self._record_pushed(early | live)
            live = {i for i in live if self.masters[i] is None}
        if not live:
            return
        first = {i: i not in self.counts for i in live}
        for i in live:
            counts = self.counts.setdefault(i, self.optimizer.counters())
            for k in counts:
                counts[k] += 1
        targets = {} if self.offload_params else \
            {i: self._flat(self.params[i] if self.masters[i] is None else self.masters[i]) for i in live}
        blocks = [b for b in self.blocks if any(c[0] in live for c in b.chunks)]
        chunks_left = {i: len(self.chunks_of[i]) for i in live}
        for b, array in self.store.stream(blocks):
            buffer = from_numpy(array)
            for i, start, end, at in b.chunks:
                if i not in live:
                    continue
                state = dict(self.counts[i])
                for k, key in enumerate(self.keys):
                    state[key] = buffer[k * b.numel + at:k * b.numel + at + end - start]
                if self.offload_params:  # the parameter is updated where it lies
                    base = self._param_entry(b)
                    target = buffer[base + at:base + at + end - start]
                else:
                    target = targets[i][start:end]
                self.optimizer.update(target, grads[i][start:end], state, self.group_of[i], first[i])
                chunks_left[i] -= 1
                if chunks_left[i] == 0 and self.masters[i] is not None:
                    # the updated weights back to the GPU, queued on its stream: the copy runs
                    # while the host updates the next parameters
                    self.params[i].detach().copy_(self.masters[i], non_blocking=True)
        self._record_pushed(early | live)

    def _update_and_push(self, ids) -> None:
        """Parameters ids (on a GPU, state in host memory) updated a batch at a time, each
        batch's weights copied back on the GPU's stream while the host updates the next."""
        batch, numel = [], 0
        for n, i in enumerate(ids):
            batch.append(i)
            numel += self.params[i].numel()
            if numel >= self.update_batch or n == len(ids) - 1:
                self._update_params(batch)
                for j in batch:
                    self.params[j].detach().copy_(self.masters[j], non_blocking=True)
                batch, numel = [], 0

    @contextmanager
    def same_weights(self):
        """For writes into the parameters that leave the weights as this optimizer last wrote them
        (ZeRO 1/2's all-gather after the step, which writes each rank's own shard with its own
        values): the parameters current before are current after, and the next step need not read
        them back (the collective moved their storage's version)."""
        current = [i for i in self._pushed if self._current(i)]
        yield
        self._record_pushed(current)

    def _record_pushed(self, ids) -> None:
        """Parameters ids (those with a master) as this step left them on the GPU."""
        for i in ids:
            if self.masters[i] is not None:
                self._pushed[i] = self._written(i)

    def _written(self, i: int) -> tuple:
        """What identifies parameter i's weights as last written: its storage, version and alias_version."""
        storage = self.params[i]._storage
        return storage, storage.version, storage.alias_version

    def _current(self, i: int) -> bool:
        """Whether parameter i's weights are as this optimizer last wrote them: nothing wrote them
        since (no in-place op, no collective, no other library handed or letting go of their
        memory), and no other library holds it now (it may write it any time: the weights are
        read back every step while it does)."""
        return self._pushed.get(i) == self._written(i) and not self.params[i]._storage.aliases

    def _host_grad(self, i: int):
        """Parameter i's gradient in host memory: its streamed copy (waited for, and scaled as
        the device's was since), or copied now."""
        copies, host = self._copies, self.host_grads[i]
        if i in copies.streamed:
            copies.wait()
            if copies.factor is not None:  # in place: one pass, the same product as the device's
                ew.scalar(lib.IT_SCALAR_MUL, host, copies.factor, out=host)
        else:
            host.copy_(self.params[i].grad)
        return host

    @no_grad()
    def state_dict(self) -> dict:
        """The wrapped optimizer's state_dict, whole (read back from where it is kept)."""
        self._finish_early()  # not while the worker writes it
        full = {i: {key: zeros(*self.params[i].shape) for key in self.keys} for i in self.counts}
        blocks = [b for b in self.blocks if any(c[0] in full for c in b.chunks)]
        for b, array in self.store.stream(blocks, write=False):
            for i, start, end, at in b.chunks:
                if i in full:
                    for k, key in enumerate(self.keys):
                        full[i][key].view(-1)[start:end].copy_(
                            from_numpy(array[k * b.numel + at:k * b.numel + at + end - start]))
        state = {i: {**self.counts[i], **{k: v.to(self.params[i].device) for k, v in full[i].items()}}
                 for i in sorted(full)}
        return {"state": state, "param_groups": self.numbered_groups()}

    @no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Takes the wrapped optimizer's state_dict (checked as it would check it) into where the
        state is kept."""
        self._finish_early()  # not while the worker writes it
        loaded = self.optimizer.checked_state(state_dict)
        entries = {i: loaded[p] for i, p in enumerate(self.params) if loaded.get(p)}
        for b, array in self.store.stream(self.blocks):
            array[:len(self.keys) * b.numel] = 0  # the state (the parameters, if here, stay)
            buffer = from_numpy(array)
            for i, start, end, at in b.chunks:
                if i in entries:
                    for k, key in enumerate(self.keys):
                        src = entries[i][key].detach().reshape(-1)[start:end]
                        buffer[k * b.numel + at:k * b.numel + at + end - start].copy_(src.to("cpu"))
        self.counts = {i: {k: int(entries[i][k]) for k in self.optimizer.counters()} for i in entries}
        self.optimizer.load_hyperparameters(state_dict)

    def close(self) -> None:
        """Frees the offloaded state (its scratch file). The optimizer is unusable after."""
        self._finish_early()
        if self._pool is not None:
            self._pool.shutdown()
        self.store.close()

    def __del__(self):
        store = getattr(self, "store", None)
        if store is not None:
            store.close()
