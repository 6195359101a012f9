"""Point-to-point traffic between pipeline stages: activations forward, their gradients back.

Sends are non-blocking and kept until done; a receive blocks only when the pass needing it
runs, and never forever: past the timeout it raises, naming this rank, its stage, the
micro-batch and the rank it was waiting for (a dead or hung neighbour), and the job aborts.
Over NCCL the host does not wait at all: the compute stream waits for the receive's event.

Messages are matched by order, not by name: the tag is only the direction (activations 0,
gradients 1), and the k-th message one stage sends another in a direction is the k-th that
stage receives from it in that direction. The schedules keep that order on every link
(`schedules.simulate` checks it), which is what lets the same engine run over NCCL, which
has no tags: there each directed link is its own two-rank communicator and stream.
"""
from __future__ import annotations

import time

from .... import _trace
from ....creation import empty
from .stage import stage_of


def links(stages: int, virtual: int, placement: str = "loop") -> list:
    """The directed links (from stage, to stage, tag) a pipeline sends on: activations (tag 0)
    from each chunk to the next, gradients (tag 1) back; with virtual chunks in a loop the last
    stage feeds the first. Two chunks on one stage (a V's turn) hand over without a link."""
    at = [stage_of(g, stages, placement) for g in range(stages * virtual)]
    pairs = {(at[g], at[g + 1]) for g in range(len(at) - 1) if at[g] != at[g + 1]}
    return sorted({(a, b, 0) for a, b in pairs} | {(b, a, 1) for a, b in pairs})


class PipelineTimeout(RuntimeError):
    """A pipeline stage waited longer than the timeout for a neighbour."""


class P2P:
    def __init__(self, stage, device, timeout: float = 300.0):
        if not timeout > 0:
            raise ValueError(f"the pipeline timeout must be positive seconds, got {timeout}")
        self.stage, self.group, self.timeout = stage, stage.group, float(timeout)
        self.device = device
        self.group.open_p2p_links(links(stage.size, stage.virtual, getattr(stage, "placement", "loop")))
        self.pending = []  # (work, tensor, release): sends in flight and the memory they read
        self.posted = {}  # (from stage, backward) -> [(work, tensor)]: receives posted ahead, in order
        self.wait_s = 0.0  # time spent blocked on neighbours: this stage's share of the bubble

    def send(self, t, to_stage: int, backward: bool, release: bool = False) -> None:
        """release: once sent, t's memory is given back while t itself stays (Megatron's
        deallocate_output_tensor: a chunk's output is kept for its backward only as the root
        of the graph, whose shape is all the backward reads)."""
        work = self.group.isend(t, to_stage, int(backward))
        self.pending.append((work, t, release))

    def post(self, shape, dtype, from_stage: int, backward: bool) -> None:
        """Posts the next receive on a link ahead of the pass that needs it, so that the
        neighbour's send can complete while this stage computes (MPI; NCCL's receives wait on
        the device anyway). Receives on a link are posted and taken in order."""
        if self.group.waits_on_host:
            t = empty(*shape, dtype=dtype, device=self.device)
            self.posted.setdefault((from_stage, backward), []).append(
                (self.group.irecv(t, from_stage, int(backward)), t))

    def recv(self, shape, dtype, from_stage: int, backward: bool, micro: int, chunk: int):
        """chunk: the global chunk (on this stage) that needs the tensor."""
        ahead = self.posted.get((from_stage, backward))
        if ahead:
            work, t = ahead.pop(0)
        else:
            t = empty(*shape, dtype=dtype, device=self.device)
            work = self.group.irecv(t, from_stage, int(backward))
        what = "gradient" if backward else "activation"
        self._wait(work, lambda: f"the {what} of micro-batch {micro} for chunk {chunk} from "
                                 f"stage {from_stage} (rank {self.group.ranks[from_stage]})")
        self.poll()  # what the neighbour took while this stage waited goes before the pass allocates
        return t

    def poll(self) -> None:
        """Lets finished sends go (MPI moves messages along inside such calls)."""
        still = []
        for work, t, release in self.pending:
            if not work.is_completed():
                still.append((work, t, release))
            elif release:
                t._storage.release(_SENT)
        self.pending = still

    def flush(self) -> None:
        for work, t, release in self.pending:
            self._wait(work, lambda: "a send to a neighbouring stage to be received")
            if release:
                t._storage.release(_SENT)
        self.pending = []

    def _wait(self, work, describe) -> None:
        if not self.group.waits_on_host:  # NCCL: the compute stream waits, the host goes on
            work.wait()
            return
        if work.is_completed():
            return
        with _trace.span("wait for neighbour stage", "comm"):  # the bubble, in a profile
            self._block(work, describe)

    def _block(self, work, describe) -> None:
        start = time.monotonic()
        if not sleep_until(work.is_completed, start + self.timeout):
            s = self.stage
            raise PipelineTimeout(
                f"rank {self.group.ranks[s.stage]} (pipeline stage {s.stage} of {s.size}) waited "
                f"{self.timeout:.0f} s for {describe()}: that rank died or hung. If a stage is "
                "legitimately that slow, raise the pipeline timeout (--pipeline_timeout)")
        self.wait_s += time.monotonic() - start


def sleep_until(done, deadline: float = float("inf")) -> bool:
    """Poll done() until it holds (True) or time.monotonic() passes the deadline (False),
    sleeping between polls in pauses doubling from 10 us to 1 ms: sleeping, not spinning, because
    ranks oversubscribing cores need them to compute (what such a wait still takes from them,
    waking that often, is the planner's measured pipeline_wait_cpu)."""
    pause = 0.0
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(max(2 * pause, 1e-5), 1e-3)
    return True


_SENT = ("this activation was sent to the next pipeline stage and its memory given back (the "
         "pipeline keeps it only as the root of its backward)")
