"""Pipeline schedules: for each stage, the order in which it runs the forward ("F") and
backward ("B") passes of (micro-batch, local chunk) pairs in one training step.

A schedule is plain data; the engine (pipeline.py) runs it, sending activations and gradients
with non-blocking sends and blocking only on the receive a pass needs. A stage therefore
waits only on its own next pass's input, and a schedule is free of deadlock exactly when
`simulate` can run it to the end, which the tests check for every (P, V, M) they use.
Messages pair by order on each directed link (p2p.py), so `simulate` also checks that every
stage sends each neighbour its activations (and its gradients) in the order that neighbour
receives them.

- GPipe: every forward, then every backward. Peak activations: all M micro-batches.
- 1F1B: min(P - s - 1, M) forwards to fill the pipe, then one forward and one backward in
  turn, then the remaining backwards. Peak activations: about P - s micro-batches.
- Interleaved 1F1B (V > 1 chunks per stage): Megatron's order. Micro-batches go in groups of
  P through chunk 0, then the same group through chunk 1, ...; backwards walk the chunks in
  reverse; warm-up is 2 (P - s - 1) + (V - 1) P forwards (all of them when M < P or when
  that exceeds M V), then 1F1B.
- ZB-H1 (Qi et al., ICLR 2024, "zero bubble" with 1F1B's memory): each backward is split into
  its input part "B", which the previous stage waits for, and its weight part "W" (autograd's
  defer_weight_grads), which can run any time after. 1F1B's order of F and B; stage s holds
  back its first s W's and then runs one after each B, so the W's it owes fill the cooldown's
  idle slots. Every stage then keeps at most P micro-batches short of their W (stage 0's
  count under 1F1B), and the bubble falls from (P-1)(F+B+W) to (P-1)(F+B-W).
- ZBV (two chunks per stage in a V: stage s holds chunks s and 2P-1-s, stage.py): the order is
  found by playing the step out with equal F, B and W costs, each stage taking, whenever it is
  free, the first pass whose input is there in the order B of chunk 1, B of chunk 0, F of
  chunk 1, F of chunk 0 (deepest work first, so gradients reach the stages below soonest),
  else its oldest W; a stage that owes P W's runs its oldest first, and starts no forward
  while it holds 2P chunk activations (1F1B's stage-0 memory: P micro-batches of its whole
  part). Each (pass, chunk) runs its micro-batches in order, which keeps every link's
  messages in order.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from .stage import global_chunk, stage_of

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv")
SPLIT_BACKWARD = ("zb-h1", "zbv")  # the schedules whose "B" is the input part, with a "W" apart


def placement(name: str) -> str:
    """Where a schedule puts the chunks (stage.py): a V for ZBV, else a loop."""
    return "v" if name == "zbv" else "loop"


class Action(NamedTuple):
    kind: str    # "F", "B" (the whole backward, or its input part where a "W" follows), "W"
    micro: int   # micro-batch
    chunk: int   # local chunk on this stage (0..V-1)


def gpipe(stages: int, virtual: int, micro: int, stage: int) -> list:
    fwd = [Action("F", m, v) for v in range(virtual) for m in range(micro)]
    bwd = [Action("B", m, v) for v in reversed(range(virtual)) for m in range(micro)]
    return fwd + bwd


def _one_forward_one_backward(fwd: list, bwd: list, warmup: int) -> list:
    warmup = min(warmup, len(fwd))
    out = fwd[:warmup]
    for i in range(len(fwd) - warmup):
        out += [fwd[warmup + i], bwd[i]]
    return out + bwd[len(fwd) - warmup:]


def one_f_one_b(stages: int, virtual: int, micro: int, stage: int) -> list:
    if virtual != 1:
        raise ValueError("1F1B runs one chunk per stage; with virtual chunks use 'interleaved'")
    fwd = [Action("F", m, 0) for m in range(micro)]
    bwd = [Action("B", m, 0) for m in range(micro)]
    return _one_forward_one_backward(fwd, bwd, stages - stage - 1)


def zb_h1(stages: int, virtual: int, micro: int, stage: int) -> list:
    if virtual != 1:
        raise ValueError("ZB-H1 runs one chunk per stage; with two chunks per stage use 'zbv'")
    plan = one_f_one_b(stages, 1, micro, stage)
    out, held, next_w = [], stage, 0
    for a in plan:
        out.append(a)
        if a.kind == "B":
            if held:
                held -= 1
            else:
                out.append(Action("W", next_w, 0))
                next_w += 1
    return out + [Action("W", m, 0) for m in range(next_w, micro)]


def zbv(stages: int, virtual: int, micro: int, stage: int) -> list:
    if virtual != 2:
        raise ValueError(f"ZBV places two chunks per stage in a V: it needs virtual pipeline parallel 2, "
                         f"got {virtual}")
    return list(_zbv_plans(stages, micro)[stage])


@lru_cache(maxsize=64)
def _zbv_plans(P: int, M: int) -> tuple:
    """Every stage's ZBV order (see the module's docstring), played out on paper."""
    last, cap = 2 * P - 1, 2 * P  # cap: chunk activations held
    order = (("B", 1), ("B", 0), ("F", 1), ("F", 0))
    nxt = [{(k, c): 0 for k in "FBW" for c in (0, 1)} for _ in range(P)]
    plans, free, done = [[] for _ in range(P)], [0.0] * P, {}
    held, owed = [0] * P, [0] * P

    def ready(s, kind, m, c):
        g = global_chunk(s, c, P, "v")
        if kind == "F":
            return 0.0 if g == 0 else done.get(("F", m, g - 1))
        if kind == "B":
            return done.get(("B", m, g + 1) if g < last else ("F", m, g))
        return done.get(("B", m, g))

    for _ in range(6 * M * P):
        best = None
        for s in range(P):
            passes = []  # (time it could start, pass) of the next F / B of each chunk
            for kind, c in order:
                m = nxt[s][(kind, c)]
                if m < M and not (kind == "F" and held[s] >= cap):
                    t = ready(s, kind, m, c)
                    if t is not None:
                        passes.append((max(t, free[s]), Action(kind, m, c)))
            owing = sorted((ready(s, "W", nxt[s][("W", c)], c), c) for c in (0, 1)
                           if nxt[s][("W", c)] < M and ready(s, "W", nxt[s][("W", c)], c) is not None)
            now = [a for t, a in passes if t <= free[s]]
            if now and owed[s] < P:
                choice = (free[s], now[0])
            elif owing:
                choice = (free[s], Action("W", nxt[s][("W", owing[0][1])], owing[0][1]))
            elif passes:
                choice = min(passes, key=lambda p: p[0])
            else:
                continue
            if best is None or choice[0] < best[0]:
                best = (choice[0], s, choice[1])
        t, s, a = best
        free[s] = t + 1.0
        done[(a.kind, a.micro, global_chunk(s, a.chunk, P, "v"))] = free[s]
        nxt[s][(a.kind, a.chunk)] += 1
        plans[s].append(a)
        held[s] += {"F": 1, "B": -1, "W": 0}[a.kind]
        owed[s] += {"F": 0, "B": 1, "W": -1}[a.kind]
    return tuple(tuple(p) for p in plans)


def interleaved(stages: int, virtual: int, micro: int, stage: int) -> list:
    P, V, M = stages, virtual, micro
    G = _group_size(P, M)
    fwd, bwd = [], []
    for start in range(0, M, G):  # groups of G micro-batches go through the chunks together
        group = range(start, min(start + G, M))
        fwd += [Action("F", m, v) for v in range(V) for m in group]
        bwd += [Action("B", m, v) for v in reversed(range(V)) for m in group]
    warmup = M * V if M < P else 2 * (P - stage - 1) + (V - 1) * G
    return _one_forward_one_backward(fwd, bwd, warmup)


def _group_size(stages: int, micro: int) -> int:
    """Micro-batches per group in the interleaved order: P when it divides M; otherwise the
    smallest G >= P whose last group is whole or at least P long (a shorter last group leaves
    a stage waiting on a backward that comes after its own next forward: deadlock)."""
    if micro <= stages:
        return max(micro, 1)
    for G in range(stages, micro + 1):
        if micro % G == 0 or micro % G >= stages:
            return G
    return micro


def schedule(name: str, stages: int, virtual: int, micro: int, stage: int) -> list:
    """The action list of `stage` for one step of `micro` micro-batches."""
    if micro < 1:
        raise ValueError(f"a pipeline step needs at least one micro-batch, got {micro}")
    make = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "zb-h1": zb_h1,
            "zbv": zbv}.get(name)
    if make is None:
        raise ValueError(f"unknown pipeline schedule {name!r}; choose from {', '.join(SCHEDULES)}")
    if name == "interleaved" and virtual < 2:
        raise ValueError("the interleaved schedule needs virtual pipeline parallel >= 2")
    if name in SPLIT_BACKWARD and micro < stages:
        raise ValueError(f"the {name} schedule needs at least as many micro-batches per step as pipeline "
                         f"stages: got {micro} micro-batches for {stages} stages")
    return make(stages, virtual, micro, stage)


def _check_link_order(name: str, plans: list, P: int, last: int) -> None:
    """Raises RuntimeError unless, on every link (from stage, to stage, direction), the
    messages leave in the order the receiver takes them: the k-th sent is the k-th received."""
    where = placement(name)
    sent, taken = {}, {}
    for s, plan in enumerate(plans):
        for a in plan:
            if a.kind == "W":
                continue  # nothing travels
            g = global_chunk(s, a.chunk, P, where)
            step = 1 if a.kind == "F" else -1  # activations go up the chunks, gradients down
            if 0 <= g - step <= last and stage_of(g - step, P, where) != s:  # its input came from g - step
                taken.setdefault((stage_of(g - step, P, where), s, a.kind), []).append((a.micro, g))
            if 0 <= g + step <= last and stage_of(g + step, P, where) != s:  # its output goes to g + step
                sent.setdefault((s, stage_of(g + step, P, where), a.kind), []).append((a.micro, g + step))
    for link, messages in sent.items():
        if taken.get(link) != messages:
            raise RuntimeError(f"schedule {name}: stage {link[0]} sends stage {link[1]} its "
                               f"{'activations' if link[2] == 'F' else 'gradients'} (micro-batch, chunk) "
                               f"in the order {messages}, which it receives as {taken.get(link)}")


def simulate(name: str, stages: int, virtual: int, micro: int, forward_cost: float = 1.0,
             backward_cost: float = 2.0, chunk_work=None, weight_cost: float | None = None,
             pass_costs=None) -> dict:
    """Runs the schedule of every stage on paper, with the engine's rule (a pass waits for
    its input, sends never wait). Raises RuntimeError on a deadlock; returns the step's
    length, the idle share of it (the pipeline bubble: `bubble` over all stages, and each
    stage's in `stage_bubbles`), each stage's peak count of chunk activations held (forward
    done, backward not yet: `peak_in_flight`) and of those whose weight gradients wait (B
    done, W not yet: `peak_awaiting_w`, which keep the weight products' inputs). chunk_work:
    the work of each of the P x V global chunks, as a multiple of the costs (an uneven split:
    blocks per chunk, the head's blocks' worth on the last); by default every chunk does 1/V
    of a stage's equal share. weight_cost: the W part of backward_cost where the schedule
    splits it (default half: a product for the input's gradient, one for the weight's).
    pass_costs: instead of the costs and chunk_work, each global chunk's measured cost of one
    pass of each kind, {"F": ..., "B": ..., "W": ...} ("B" the whole backward, or its input part
    where the schedule splits it and "W" the rest)."""
    P, V, last = stages, virtual, stages * virtual - 1
    work = [1.0 / V] * (P * V) if chunk_work is None else [float(w) for w in chunk_work]
    if len(work) != P * V:
        raise ValueError(f"chunk_work gives {len(work)} chunks' work, the pipeline has {P} x {V}")
    if pass_costs is not None and len(pass_costs) != P * V:
        raise ValueError(f"pass_costs gives {len(pass_costs)} chunks' costs, the pipeline has {P} x {V}")
    plans = [schedule(name, P, V, micro, s) for s in range(P)]
    _check_link_order(name, plans, P, last)
    at, clock = [0] * P, [0.0] * P
    held, peak, awaiting, peak_w = [0] * P, [0] * P, [0] * P, [0] * P
    busy = [0.0] * P  # each stage's time in passes
    w_cost = backward_cost / 2 if weight_cost is None else weight_cost
    cost = {"F": forward_cost, "B": backward_cost, "W": w_cost}
    if name in SPLIT_BACKWARD:
        cost["B"] = backward_cost - w_cost
    done = {}  # ("F"|"B", micro, global chunk) -> finish time

    where = placement(name)

    def ready(s: int, a: Action):
        g = global_chunk(s, a.chunk, P, where)
        if a.kind == "F":
            dep = ("F", a.micro, g - 1) if g > 0 else None
        elif a.kind == "W":
            dep = ("B", a.micro, g)
        else:
            dep = ("B", a.micro, g + 1) if g < last else ("F", a.micro, g)
        if dep is None:
            return 0.0
        return done.get(dep)

    remaining = sum(len(p) for p in plans)
    while remaining:
        progressed = False
        for s in range(P):
            while at[s] < len(plans[s]):
                a = plans[s][at[s]]
                t = ready(s, a)
                if t is None:
                    break
                start = max(clock[s], t)
                g = global_chunk(s, a.chunk, P, where)
                took = cost[a.kind] * work[g] if pass_costs is None else float(pass_costs[g][a.kind])
                clock[s] = start + took
                busy[s] += took
                done[(a.kind, a.micro, g)] = clock[s]
                held[s] += 1 if a.kind == "F" else -1 if a.kind == "B" else 0
                if name in SPLIT_BACKWARD and a.kind != "F":
                    awaiting[s] += 1 if a.kind == "B" else -1
                peak[s], peak_w[s] = max(peak[s], held[s]), max(peak_w[s], awaiting[s])
                at[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {s: plans[s][at[s]] for s in range(P) if at[s] < len(plans[s])}
            raise RuntimeError(f"schedule {name} deadlocks at P={P}, V={V}, M={micro}: "
                               f"stages wait on {stuck}")
    span = max(clock)
    return {"time": span, "bubble": 1.0 - sum(busy) / (P * span),
            "stage_bubbles": [1.0 - b / span for b in busy], "peak_in_flight": peak, "peak_awaiting_w": peak_w}
