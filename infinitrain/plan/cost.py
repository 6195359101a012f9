"""The cost model: a candidate's peak memory per rank and step time, each by component, with
the arithmetic written out (--explain).

Memory is the memory plan's (nn.parallel.memory_plan.stage_estimates, the numbers the
examples refuse a job with), the busiest pipeline stage's. Time is the busiest stage's:

- compute: the FLOPs of its blocks (and the head on the last stage) per micro-batch, the
  matrix products at the rate of the rank's threads for the product a block's MLP makes (the
  size the rate depends on; the head's product from the profile's head tables, measured at its
  own [C, vocab] shape; profile.Rates: the threads' measured rates, the share of the cores
  where ranks take turns on them), the backward's products (twice forward's FLOPs) at their own
  measured rate, attention at its rate, the elementwise work as the activations' bytes (the
  memory plan's) moved three times at the memory bandwidth, the logits through the loss at its
  measured rate; full recomputation a block's forward more, selective a sixth of its products
  (the head is not recomputed);
- bubble: the pipeline schedule played out by the simulator (nn.parallel.pp.simulate) with
  those forward and backward costs and the split's work per chunk; its idle time. Where ranks
  share cores, a stage waiting for its neighbour leaves its core to the others (the pipeline's
  wait sleeps rather than spinning in MPI);
- communication per group from the profile's alpha-beta model per collective (ring; a group
  inside one node uses the intra-node link, else the inter-node one), less the share the
  profile says the engine hides behind computation (overlap, measured, 0 unless known), and
  stretched where ranks share cores for the share of it their cores are busy;
- optimizer: AdamW over the parameters the rank updates (its ZeRO share) at the profile's rate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from ..nn.parallel.memory_plan import BUCKET_BYTES, embedding_rows, forward_activation_bytes, stage_estimates
from ..nn.parallel.pp.schedules import placement, simulate
from ..nn.parallel.pp.stage import chunk_layers, global_chunk
from .layouts import Candidate, model_facts

GB = 2 ** 30


@dataclass(frozen=True)
class Cluster:
    """nodes x ranks_per_node ranks; cores_per_node shared by a node's ranks (a CPU's rates
    scale with each rank's share); memory_per_node bytes (a GPU node: its GPUs' memory)."""
    nodes: int
    ranks_per_node: int
    cores_per_node: int
    memory_per_node: float
    device: str = "cpu"

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def cores_per_rank(self) -> float:
        return self.cores_per_node / self.ranks_per_node


@dataclass
class Prediction:
    candidate: Candidate
    memory: dict            # bytes per rank by component (the busiest stage's)
    time: dict              # seconds per step by component (the busiest stage's)
    fits: bool
    lines: list = field(default_factory=list)  # the arithmetic, for --explain
    passes: tuple = (0.0, 0.0)  # seconds of one block's forward and backward on one micro-batch
    chunk_work: list = field(default_factory=list)  # each global chunk's work in blocks' worth

    @property
    def memory_per_rank(self) -> float:
        return sum(v for k, v in self.memory.items() if k != "on disk")

    @property
    def step_time(self) -> float:
        return sum(self.time.values())


def _inside_node(stride: int, size: int, cluster: Cluster) -> bool:
    """A group of `size` ranks `stride` apart (layout.py's order) lies in one node."""
    return size <= 1 or (stride * size <= cluster.ranks_per_node and cluster.ranks_per_node % (stride * size) == 0)


def predict(c: Candidate, config, model_class, cluster: Cluster, profile, global_batch: int, seq_len: int,
            dtype: str = "float32") -> Prediction:
    """The candidate's memory and step time (it must be one refusal() accepts)."""
    plan = c.plan()
    lines = []
    say = lines.append
    M = global_batch // (c.batch_size * c.dp)
    stages = stage_estimates(plan, config, model_class, c.batch_size, seq_len, M, dtype)
    busiest = max(range(len(stages)), key=lambda s: sum(stages[s][0].values()))
    parts, _, params, held = stages[busiest]
    memory = dict(parts)
    per_rank = sum(v for k, v in memory.items() if k != "on disk")
    fits = per_rank * cluster.ranks_per_node <= cluster.memory_per_node
    say(f"memory (the memory plan's, stage {busiest} of {c.pp}): " + ", ".join(
        f"{k} {v / 2**20:.1f} MB" for k, v in memory.items()) + f" = {per_rank / 2**20:.1f} MB per rank x "
        f"{cluster.ranks_per_node} ranks per node vs {cluster.memory_per_node / GB:.1f} GB: "
        f"{'fits' if fits else 'does NOT fit'}")

    time = {}
    rates = profile.rates(cluster.cores_per_node, cluster.ranks_per_node)
    C, T, B, L = config.n_embd, seq_len, c.batch_size, config.n_layer
    tokens = B * T // c.cp  # a rank's tokens of one micro-batch
    first, last, active, _ = model_facts(model_class, config)
    block = (active - first - last) / L  # the parameters a token multiplies with
    head = embedding_rows(config) * C
    size = 2 * tokens * C * 4 * C / c.tp  # the MLP's product: the size a block's products are rated at
    mm_rate, mm_back = rates.matmul(size), rates.matmul_backward(size)
    att_flops = 2 * tokens * C * T / c.tp  # causal: half of Q K^T and A V over the whole sequence (llm.c's 6LCT)
    att_rate = rates.attention(att_flops)
    # one block's activations of one micro-batch, as its forward writes them (the memory plan's,
    # without recomputation)
    per_block_acts = forward_activation_bytes(plan, config, B, T, dtype, recompute="none")[0]
    logits = B * (T // c.cp) * embedding_rows(config) / c.tp  # a rank's logits of one micro-batch
    bw = rates.bandwidth
    f_mm, f_att, f_ew = 2 * tokens * block / c.tp / mm_rate, att_flops / att_rate, per_block_acts / bw
    f = f_mm + f_att + f_ew
    b_mm = 2 * f_mm * mm_rate / mm_back  # the input's and the weight's gradients: twice forward's FLOPs
    extra = {"none": 0.0, "selective": f_mm / 6, "full": f}[c.recompute]
    b = b_mm + 2 * (f_att + f_ew) + extra
    say(f"per block and micro-batch ({B} x {T}/{c.cp} tokens, TP {c.tp}"
        f"{rates.describe()}): products 2 x {tokens} x {block / 1e6:.2f}M / {c.tp} at {mm_rate / 1e9:.1f} GFLOP/s "
        f"= {f_mm * 1e3:.2f} ms, attention {att_flops / 1e6:.1f} MFLOP at {att_rate / 1e9:.1f} GFLOP/s = "
        f"{f_att * 1e3:.2f} ms, elementwise {per_block_acts / 2**20:.1f} MB at {bw / 1e9:.1f} GB/s = "
        f"{f_ew * 1e3:.2f} ms; forward {f * 1e3:.2f} ms; backward: products at {mm_back / 1e9:.1f} GFLOP/s "
        f"{b_mm * 1e3:.2f} ms + 2 x the rest{' + recomputation' if extra else ''} = {b * 1e3:.2f} ms")
    head_flops = 2 * tokens * head / c.tp  # the head's product, at its own size's rate
    head_rate, head_back = rates.matmul(head_flops, head=True), rates.matmul_backward(head_flops, head=True)
    loss_rate = (rates.loss_parallel or rates.loss) if c.tp > 1 else rates.loss  # TP: the vocabulary-parallel one's
    if loss_rate:  # the cross-entropy's measured rate, its forward a third of it (it is not recomputed)
        loss_f, loss_b = logits / loss_rate / 3, 2 * logits / loss_rate / 3
    else:  # the logits (float32) written, read back and their gradient written
        loss_f, loss_b = 4 * logits / bw, 8 * logits / bw
    head_f = head_flops / head_rate + loss_f
    head_b = 2 * head_flops / head_back + loss_b
    say(f"the head: {head_flops / 1e6:.1f} MFLOP at {head_rate / 1e9:.1f} GFLOP/s forward, twice that at "
        f"{head_back / 1e9:.1f} backward, the loss over {logits / 1e6:.1f}M logits {(loss_f + loss_b) * 1e3:.2f} ms: "
        f"{head_f * 1e3:.2f} ms forward, {head_b * 1e3:.2f} ms backward (the head is not recomputed)")
    head_blocks = (head_f + head_b) / (f + b) if f + b else 0.0  # the head's work in blocks' worth
    work = _chunk_work(c, config, model_class, head_blocks)
    if c.pp > 1:
        sim = _simulate(plan.pipeline_schedule, c.pp, c.virtual_pipeline_parallel, M, f, b, work)
        where = placement(plan.pipeline_schedule)
        busy = [M * (f + b) * sum(work[global_chunk(s, v, c.pp, where)] for v in range(c.virtual_pipeline_parallel))
                for s in range(c.pp)]
        if rates.per_core > 1:  # ranks take turns on the cores, but a stage waiting for its
            # neighbour leaves its core to the others. Its wait sleeps in backoffs of up to 1 ms
            # (pp/p2p.py's sleep_until), and waking that often still takes a share of a core from
            # the busy stages: the profile's measured pipeline_wait_cpu (counting the busy shares
            # alone put the stages sharing 2 cores 12-20% fast, and made the planner choose them)
            used = sum(u + rates.waiting * (1 - u) for u in (s / sim["time"] for s in busy)) / c.pp
            relief = rates.slowdown(max(1.0, rates.per_core * used)) / rates.slowdown(rates.per_core)
            busy, sim = [s * relief for s in busy], {**sim, "time": sim["time"] * relief}
            say(f"the stages busy {used:.0%} of the step on average: the cores shared by "
                f"{max(1.0, rates.per_core * used):.2f} ranks each, not {rates.per_core:g} (x {relief:.2f})")
        time["compute"] = max(busy)
        time["pipeline bubble"] = max(0.0, sim["time"] - max(busy))  # (round-off where the busiest never waits)
        say(f"pipeline: {plan.pipeline_schedule} over {c.pp} stages x {c.virtual_pipeline_parallel} chunks, {M} "
            f"micro-batches, chunk work {[round(w, 2) for w in work]} blocks (the head's {head_blocks:.2f}): the "
            f"simulator's step {sim['time'] * 1e3:.1f} ms, the busiest stage busy {max(busy) * 1e3:.1f} ms, "
            f"bubble {time['pipeline bubble'] * 1e3:.1f} ms ({sim['bubble']:.0%} of all stages' time)")
    else:
        time["compute"] = M * (f + b) * (L + head_blocks)
        say(f"compute: {M} micro-batches x (forward + backward) x ({L} blocks + the head's {head_blocks:.2f}) "
            f"= {time['compute'] * 1e3:.1f} ms")
    _communication(c, config, model_class, cluster, profile, rates, plan, M, tokens, params, time, say)
    updated = params / (plan.dp_cp if plan.active_zero_stage >= 1 else 1)
    if plan.dp_cp > 1:  # DDP's passes over the gradients: each copied into its bucket (read and write)
        # and averaged there (mul_: read and write), at the memory bandwidth
        time["DP buckets"] = 4 * params * 4 / rates.bandwidth
        say(f"DP buckets: 4 passes over {params * 4 / 2**20:.1f} MB of gradients (the copy into the buckets, the "
            f"average) at {rates.bandwidth / 1e9:.1f} GB/s = {time['DP buckets'] * 1e3:.1f} ms")
    time["optimizer"] = updated / rates.optimizer
    say(f"optimizer: AdamW over {updated / 1e6:.2f}M parameters at {rates.optimizer / 1e6:.0f}M/s = "
        f"{time['optimizer'] * 1e3:.1f} ms")
    say("step: " + " + ".join(f"{k} {v * 1e3:.1f}" for k, v in time.items()) +
        f" = {sum(time.values()) * 1e3:.1f} ms")
    return Prediction(c, memory, time, fits, lines, (f, b), work)


def _simulate(name: str, P: int, V: int, M: int, f: float, b: float, work: list) -> dict:
    """simulate's step and bubble with forward f and backward b: a step's length is linear in the
    costs, so the schedule is played once per (schedule, sizes, b / f, work) and scaled."""
    unit = _unit_simulation(name, P, V, M, round(b / f, 9), tuple(round(w, 9) for w in work))
    return {"time": unit["time"] * f, "bubble": unit["bubble"]}


@lru_cache(maxsize=4096)
def _unit_simulation(name: str, P: int, V: int, M: int, ratio: float, work: tuple) -> dict:
    return simulate(name, P, V, M, forward_cost=1.0, backward_cost=ratio, chunk_work=list(work))


def _blocks(c: Candidate, config, model_class) -> list:
    """The blocks each pipeline stage holds (the split the engine makes)."""
    if c.pp == 1:
        return [config.n_layer]
    chunks = chunk_layers(config.n_layer, c.pp, c.virtual_pipeline_parallel, model_facts(model_class, config)[3],
                          placement(c.pipeline_schedule))
    where = placement(c.pipeline_schedule)
    return [sum(len(chunks[global_chunk(s, v, c.pp, where)]) for v in range(c.virtual_pipeline_parallel))
            for s in range(c.pp)]


def _chunk_work(c: Candidate, config, model_class, head_blocks: float) -> list:
    """Each global chunk's work in blocks' worth, the head's on the last (as benchmarks/pp_train.py)."""
    if c.pp == 1:
        return [config.n_layer + head_blocks]
    chunks = chunk_layers(config.n_layer, c.pp, c.virtual_pipeline_parallel, model_facts(model_class, config)[3],
                          placement(c.pipeline_schedule))
    work = [float(len(ch)) for ch in chunks]
    work[-1] += head_blocks
    return work


def _communication(c, config, model_class, cluster, profile, rates, plan, M, tokens, params, time, say) -> None:
    """Each group's exposed traffic per step, from the profile's alpha-beta model, stretched where
    ranks share cores (rates.stretch: the share of it their cores are busy with)."""
    overlap = profile["overlap"]
    C, blocks = config.n_embd, max(_blocks(c, config, model_class))
    sp = c.tp if plan.sp else 1

    # measured where ranks take turns on the cores: it holds their turns, and is not stretched again
    sync, sync_shared = profile.synchronization(rates.per_core)
    sync_stretch = 1.0 if sync_shared else rates.stretch

    def cost(what, collective, ranks, nbytes, count, stride, hidden_key):
        inter = not _inside_node(stride, ranks, cluster)
        # a blocking call waits for the slowest rank: the skew between computing ranks, measured
        # (DP's and ZeRO's traffic goes in buckets, each a call)
        calls = count * (math.ceil(nbytes / BUCKET_BYTES) if what == "DP communication" else 1)
        one = profile.collective(collective, ranks, nbytes, inter) * rates.stretch
        total = (one * count + sync * calls * sync_stretch) * (1 - overlap[hidden_key])
        time[what] = time.get(what, 0.0) + total
        say(f"{what}: {count:g} x {collective} of {nbytes / 2**20:.2f} MB over {ranks} ranks "
            f"({'across nodes' if inter else 'in a node'}) = {one * 1e3:.3f} ms each"
            f"{f', + {calls:g} waits for the slowest rank of {sync * 1e3:.2f} ms' if sync else ''}"
            f"{f', {overlap[hidden_key]:.0%} hidden' if overlap[hidden_key] else ''}: {total * 1e3:.1f} ms")

    if c.tp > 1:  # two all-reduces (SP: an all-gather and a reduce-scatter, the same ring traffic) each way
        per_block = 4 + (2 if c.recompute == "full" else 0)
        cost("TP communication", "all_reduce", c.tp, tokens * C * 4, M * blocks * per_block, 1, "tp")
    if c.cp > 1:
        kv = 2 * tokens * C * getattr(config, "n_kv_head", config.n_head) / config.n_head * 4 / c.tp
        if c.cp_comm == "a2a":
            cost("CP communication", "all_to_all", c.cp, tokens * C * 4 / c.tp, M * blocks * 8, c.tp, "cp")
        elif c.cp_comm == "all_gather":
            cost("CP communication", "all_gather", c.cp, kv * c.cp, M * blocks * 2, c.tp, "cp")
        else:  # the ring: K and V go CP - 1 steps forward, with their gradients twice that back
            cost("CP communication", "send_recv", 2, kv, M * blocks * 3 * (c.cp - 1), c.tp, "cp")
    if c.pp > 1:  # each micro-batch's activations forward and their gradient back over a stage boundary
        cost("PP communication", "send_recv", 2, tokens // sp * C * 4, 2 * M, c.tp * c.cp * c.dp, "cp")
    if c.ep > 1:
        moe = sum(config.is_moe_layer(i) for i in range(config.n_layer)) / c.pp
        cost("EP communication", "all_to_all", c.ep, tokens // sp * C * 4 * config.moe_top_k, M * moe * 4, c.tp,
             "dp")
    ranks = plan.dp_cp
    if ranks > 1:
        grads = params * 4
        stage = plan.active_zero_stage
        if stage == 3:  # every micro-batch: the parameters gathered for forward and backward, the gradients scattered
            cost("DP communication", "all_gather", ranks, grads, 2 * M, c.tp, "zero")
            cost("DP communication", "reduce_scatter", ranks, grads, M, c.tp, "zero")
        elif stage:
            cost("DP communication", "reduce_scatter", ranks, grads, 1, c.tp, "zero")
            cost("DP communication", "all_gather", ranks, grads, 1, c.tp, "zero")
        else:
            cost("DP communication", "all_reduce", ranks, grads, 1, c.tp, "dp")
