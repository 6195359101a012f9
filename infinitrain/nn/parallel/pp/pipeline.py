"""The pipeline engine: runs a schedule's passes on this stage's model chunks.

One training step takes the step's M micro-batches (every stage gets the same ones: the
first stage reads the tokens, the last the targets) and returns the mean loss, known on
every stage. On the way it
- sends each chunk's output to the stage holding the next chunk, and each input's gradient
  back (p2p.py), with shapes and dtype known up front from the model (`hidden_spec`);
- scales each micro-batch's loss by 1/M (finalize.scale_loss), so that the gradients are the mean over the step,
  as gradient accumulation in one process;
- with data parallelism, keeps one Reducer per chunk and lets it all-reduce only in that
  chunk's last backward of the step, which the schedule tells (decided at backward time:
  under 1F1B the last forward is not followed by the last backward);
and leaves the rest of the step's gradient fix-ups to finalize_grads (finalize.py: the tied
embedding's copies summed over the first and last stage, partial gradients summed).
"""
from __future__ import annotations

from contextlib import nullcontext

from .... import _trace
from ....autograd import no_grad
from ....autograd.engine import backward as autograd_backward
from ....autograd.engine import defer_weight_grads
from ....creation import empty, zeros
from ....dtypes import float64
from ..ddp import Reducer
from ..expert_parallel import is_expert_param, require_expert_group
from ..finalize import scale_loss
from ...moe import aux_loss_scale
from ..param_buffer import broadcast_replicas
from .p2p import P2P
from .schedules import SPLIT_BACKWARD, schedule


_PASS_NAMES = {"F": "pipeline F", "B": "pipeline B", "W": "pipeline W"}


class _SingleStage:
    """The pipeline of a model that is not split: one stage, one chunk."""
    size, stage, virtual, is_first, is_last, last_stage = 1, 0, 1, True, True, 0
    group = embedding_group = None

    @staticmethod
    def global_chunk(local: int) -> int:
        return local

    @staticmethod
    def stage_of(g: int) -> int:
        return 0


class PipelineParallel:
    """model: a CausalLM built with pp=PipelineStage (or a whole one: a pipeline of one
    stage). schedule: "gpipe", "1f1b", "interleaved" (needs virtual >= 2), "zb-h1" or "zbv"
    (needs the V placement of 2 chunks) (their backwards split into B and a deferred W,
    schedules.py). dp_group: the data-parallel group of this stage's replicas (gradients
    averaged over it); expert_group: the ranks holding the same experts under expert
    parallelism (ddp.Reducer).
    deallocate_outputs: a chunk's output gives its memory back once it is sent (Megatron's
    deallocate_pipeline_outputs; the backward needs only its shape). post_receives: each pass
    posts the next pass's receive before it computes, so a neighbour's send can land meanwhile."""

    def __init__(self, model, schedule: str = "1f1b", dp_group=None, timeout: float = 300.0,
                 deallocate_outputs: bool = True, post_receives: bool = True, expert_group=None):
        self.model, self.deallocate_outputs, self.post_receives = model, deallocate_outputs, post_receives
        self.stage = model.pp if model.pp is not None else _SingleStage()
        self.schedule = schedule
        s = self.stage
        self.chunk_layers = model.stage_layers
        self.device = next(iter(model.parameters())).device
        self.V = len(self.chunk_layers)
        self.last_chunk = s.size * self.V - 1
        self.p2p = P2P(s, self.device, timeout) if s.size > 1 else None
        self.dp_group = dp_group if dp_group is not None and dp_group.size > 1 else None
        self.reducers = []
        self._inputs, self._outputs = {}, {}  # per (micro-batch, chunk) until its backward
        self._weights = {}  # per (micro-batch, chunk): the weight gradients its B left for its W
        self._handed = {}  # (backward, global chunk) -> tensors passed between two chunks of this stage
        if self.dp_group is not None:
            # replicas start equal (they do by seed; a loaded model is made so)
            require_expert_group(model.parameters(), expert_group, "PipelineParallel", "expert_group", self.dp_group)
            experts = expert_group if expert_group is not dp_group else None
            dense = [p for p in model.parameters() if experts is None or not is_expert_param(p)]
            broadcast_replicas(dense + list(model.buffers()), self.dp_group)
            if experts is not None:  # each EP rank holds other experts
                broadcast_replicas([p for p in model.parameters() if is_expert_param(p)], experts)
            self.reducers = [Reducer(params, self.dp_group, expert_group=experts)
                             for params in self._chunk_parameters()]

    def _chunk_parameters(self) -> list:
        """Each local chunk's parameters (the model's model_chunks), each parameter in the first
        chunk that reaches it (a tied head's weight is the embedding's)."""
        seen, out = set(), []
        for modules in self.model.model_chunks():
            params = []
            for m in modules:
                for p in m.parameters():
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
            out.append(params)
        return out

    def _sharing_chunks(self) -> list:
        """For each local chunk, the local chunks that reach one of its reducer's parameters (in
        a V, stage 0's head ties the embedding of its chunk 0)."""
        reach = [{id(p) for m in modules for p in m.parameters()} for modules in self.model.model_chunks()]
        return [[c for c, r in enumerate(reach) if any(id(p) in r for p in params)]
                for params in self._chunk_parameters()]

    def _global(self, chunk: int) -> int:
        return self.stage.global_chunk(chunk)

    def _neighbour(self, g: int) -> int:
        return self.stage.stage_of(g)

    def _send(self, t, to_chunk: int, backward: bool, release: bool = False) -> None:
        """t to the stage of global chunk to_chunk; on this stage (a V's turn) it is handed over."""
        if self._neighbour(to_chunk) == self.stage.stage:
            self._handed.setdefault((backward, to_chunk), []).append(t.detach())
        else:
            self.p2p.send(t, self._neighbour(to_chunk), backward=backward, release=release)

    # ---- one training step ------------------------------------------------------------------
    def forward_backward(self, micro_batches, forward_context=None) -> float:
        """micro_batches: [(idx, targets)] int [B, T] each. Runs forward and backward of all
        of them as the schedule orders; gradients end up in .grad (mean over micro-batches,
        averaged over DP). Returns the mean loss, on every stage."""
        # every stage's MoE auxiliary losses start their backward as the last stage's loss
        # does (nn.moe.aux_loss), though only the last stage scales a loss
        with aux_loss_scale(1.0 / len(micro_batches)):
            return self._forward_backward(micro_batches, forward_context)

    def _forward_backward(self, micro_batches, forward_context) -> float:
        M = len(micro_batches)
        s = self.stage
        plan = schedule(self.schedule, s.size, self.V, M, s.stage)
        # a chunk's reducer all-reduces in its last backward (its last W where split), or the
        # last of any chunk that shares its parameters: its gradients are complete after it
        last_pass = {a[2]: i for i, a in enumerate(plan) if a[0] == ("W" if self.schedule in SPLIT_BACKWARD else "B")}
        sync_before = {}
        for c, sharing in enumerate(self._sharing_chunks() if self.reducers else ()):
            sync_before.setdefault(max(last_pass[d] for d in sharing), []).append(c)
        for r in self.reducers:
            r.prepare(sync=False)
        self._inputs, self._outputs, self._weights, self._handed = {}, {}, {}, {}
        context = forward_context or nullcontext
        loss_sum = None  # the last chunk's losses, summed on the device
        posted = -1  # the last pass whose receive is posted
        for i, (kind, micro, chunk) in enumerate(plan):
            if self.p2p is not None and self.post_receives:  # this pass's receive and the next's
                for j in range(max(i, posted + 1), min(i + 2, len(plan))):
                    self._post(micro_batches, *plan[j])
                posted = max(posted, i + 1)
            for c in sync_before.get(i, ()):
                self.reducers[c].sync = True  # the chunk's gradients are complete after this pass
            loss = self._run_pass(micro_batches, kind, micro, chunk, context)
            if loss is not None:
                loss_sum = loss if loss_sum is None else loss_sum + loss
            if self.p2p is not None:
                self.p2p.poll()
        if self.p2p is not None:
            self.p2p.flush()
        return self._share_loss(loss_sum, M)

    def _run_pass(self, batches, kind: str, micro: int, chunk: int, context):
        """One pass of the schedule; a forward of the last chunk returns its loss (float64, on the
        device). Recorded as a span "pipeline F" / "pipeline B" / "pipeline W" while a profiler
        runs (with the waits for its input inside)."""
        with _trace.span(_PASS_NAMES[kind], "pipeline", {"micro": micro, "chunk": chunk}):
            if kind == "F":
                with context():
                    return self._forward(batches, micro, chunk, num_micro_batches=len(batches))
            if kind == "W":
                self._weights.pop((micro, chunk)).backward_weight()
            else:
                self._backward(batches, micro, chunk)
            return None

    def _forward(self, batches, micro: int, chunk: int, num_micro_batches: int):
        model, g = self.model, self._global(chunk)
        idx, targets = batches[micro]
        T = idx.shape[1]
        if g == 0:
            model.check_batch(idx, targets)
            x = model.embed(idx)
        else:
            x = self._recv(idx, backward=False, micro=micro, g=g)
            x.requires_grad_(True)
            self._inputs[(micro, chunk)] = x
        x = model.run_blocks(self.chunk_layers[chunk], x, T)
        if g == self.last_chunk:
            _, loss = model.head(x, targets, return_logits=False)
            self._outputs[(micro, chunk)] = scale_loss(loss, num_micro_batches)
            return loss.detach().double()  # read once per step, not per micro-batch
        self._check_spec(x, idx, "the activation it sends on")
        self._send(x, g + 1, backward=False, release=self.deallocate_outputs)
        self._outputs[(micro, chunk)] = x
        return None

    def _backward(self, batches, micro: int, chunk: int) -> None:
        g = self._global(chunk)
        out = self._outputs.pop((micro, chunk))
        x = self._inputs.pop((micro, chunk), None)
        grad = None if g == self.last_chunk else self._recv(batches[micro][0], backward=True, micro=micro, g=g)
        if self.schedule in SPLIT_BACKWARD:  # the input part now, the weights' in the schedule's W
            with defer_weight_grads() as weights:
                autograd_backward(out, grad)
            self._weights[(micro, chunk)] = weights
        else:
            autograd_backward(out, grad)
        if g > 0:
            self._send(x.grad, g - 1, backward=True)

    def _post(self, batches, kind: str, micro: int, chunk: int) -> None:
        """Posts the receive pass (kind, micro, chunk) will need, if it needs one."""
        g = self._global(chunk)
        backward = kind == "B"
        if kind == "W" or ((g == self.last_chunk) if backward else g == 0):
            return
        if self._neighbour(g + 1 if backward else g - 1) == self.stage.stage:
            return  # handed over on this stage
        shape, dtype = self.model.hidden_spec(*batches[micro][0].shape)
        self.p2p.post(shape, dtype, self._neighbour(g + 1 if backward else g - 1), backward)

    def _recv(self, idx, backward: bool, micro: int, g: int):
        shape, dtype = self.model.hidden_spec(*idx.shape)
        src = self._neighbour(g + 1 if backward else g - 1)
        if src == self.stage.stage:
            return self._handed[(backward, g)].pop(0)
        return self.p2p.recv(shape, dtype, src, backward, micro, g)

    def _check_spec(self, x, idx, what: str) -> None:
        shape, dtype = self.model.hidden_spec(*idx.shape)
        if tuple(x.shape) != tuple(shape) or x.dtype is not dtype:
            raise RuntimeError(f"{self.stage}: {what} is {tuple(x.shape)} {x.dtype.name}, but "
                               f"stages exchange {tuple(shape)} {dtype.name} (the model's hidden_spec)")

    def _share_loss(self, loss_sum, M: int) -> float:
        """The last stage's mean loss (loss_sum: the sum of its M micro-batches' losses, None
        on the other stages), on every stage."""
        t = (loss_sum / M).reshape(1) if loss_sum is not None else zeros(1, dtype=float64, device=self.device)
        if self.stage.size > 1:
            t = t.contiguous()
            self.stage.group.broadcast(t, self.stage.last_stage)
        return t.item()

    # ---- forward only: evaluation and sampling ------------------------------------------------
    @no_grad()
    def eval_step(self, micro_batches, forward_context=None) -> float:
        """The mean loss of the micro-batches, no gradients; on every stage."""
        M, context = len(micro_batches), forward_context or nullcontext
        loss_sum = None  # the last chunk's losses, summed on the device
        with context():
            for chunk in range(self.V):
                for micro in range(M):
                    self._inputs, self._outputs = {}, {}  # nothing is kept for a backward
                    loss = self._forward(micro_batches, micro, chunk, num_micro_batches=1)
                    if loss is not None:
                        loss_sum = loss if loss_sum is None else loss_sum + loss
        if self.p2p is not None:
            self.p2p.flush()
        return self._share_loss(loss_sum, M)

    @no_grad()
    def logits(self, idx):
        """The model's logits [B, T, vocab_size] (float32) for idx, on every stage: what
        CausalLM.generate needs (pass forward=pipeline.logits)."""
        model, s = self.model, self.stage
        T = idx.shape[1]
        x = None
        for chunk in range(self.V):
            g = self._global(chunk)
            x = model.embed(idx) if g == 0 else self._recv(idx, backward=False, micro=0, g=g)
            x = model.run_blocks(self.chunk_layers[chunk], x, T)
            if g != self.last_chunk:
                self._send(x, g + 1, backward=False)
        if self.p2p is not None:
            self.p2p.flush()
        B, V = idx.shape[0], model.config.vocab_size
        out = model.head(x, None, return_logits=True)[0].float().contiguous() if s.is_last \
            else empty(B, T, V, device=self.device)
        if s.size > 1:
            s.group.broadcast(out, s.last_stage)
        return out
