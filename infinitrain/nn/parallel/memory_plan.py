"""The memory plan: what each rank of a job will hold, estimated from its ParallelPlan and the
model's configuration before anything is built, so that a job that would not fit is refused
with a way to make it fit rather than killed by the system halfway through its first step.

Per parameter: 4 bytes of weights, 4 of gradient and 8 of AdamW moments (+2 for bfloat16
copies), each pipeline stage's own (its blocks in the split the pipeline uses, the embeddings on
the first, the head on the last: GPT-2 124M on two stages holds 103M and 60M), split over TP,
and ZeRO's shares over DP x CP; the busiest stage is the answer. At stages 2 and 3 two buckets
are in flight (each at most a sixteenth of the model), and under a pipeline the token
embedding's gradient is whole during backward (a gradient is reduce-scattered only once it is
final: the tied embedding's at the very end; without one each use's share is reduce-scattered
as it is made); at stage 3 the embedding's weights are gathered too. Activations
(forward_activation_bytes): the tensors each block's autograd nodes save, per token
(block_activation_bytes: dtype, recomputation, TP, SP; no T x T scores, the fused attention
keeps its output and a log-sum-exp), the head's (one copy
of the logits, their gradient written over them; the float32 softmax and a new gradient under
TP), times the micro-batches in flight on the stage (all M under GPipe, PP - stage under 1F1B,
one without a pipeline). The step's peak is the busiest of three moments: backward's start
(every activation, the head's weight gradient being made, the gradients only where DDP's
buckets, accumulation or a pipeline keep them), its end (every gradient, the input embedding's
being made whole) and AdamW's step (a temporary the size of the largest parameter). The
process itself (Python, numpy, MPI, BLAS buffers, the data) is ~350 MB. With offload_optimizer
"nvme" the moments are on disk (parts["on disk"], not counted in the memory) and the staging
buffers stay; with offload_param "nvme" (stage 3, also on one rank) the parameter pieces are
there too, and what stays of the parameters is the units gathered at a time (the embedding and
two blocks). Held to the examples' measured peaks in docs/planning.md (benchmarks/plan_validate.py).
"""
from __future__ import annotations

from ...optim.offload import staging_bytes
from ...runtime import available_memory
from .pp.stage import chunk_layers

PROCESS_BYTES = 350 * 2**20  # Python, numpy, MPI, BLAS buffers, the data
BUCKET_BYTES = 25 * 2**20    # the trainer's buckets


def stage_parameters(plan, config, model_class) -> tuple:
    """(the parameters each pipeline stage holds before TP splits them, the blocks each holds):
    its blocks in the split the pipeline will use, plus the embeddings on the first stage, the
    final norm and head on the last, and there a copy of a tied embedding."""
    # expert parallelism: a rank holds E/EP experts (under ZeRO their state is sharded over the
    # E/EP holders' DP x CP / EP ranks, which is E / (DP x CP) as for the dense weights: counted so)
    first, block, last = model_class.parameter_parts(config, 1 if plan.zero else plan.ep)
    L, P = config.n_layer, plan.pp
    head = model_class.head_work(config) if plan.pipeline_split == "balanced" else 0.0
    chunks = chunk_layers(L, P, plan.virtual_pipeline_parallel, head)
    blocks = [sum(len(c) for g, c in enumerate(chunks) if g % P == s) for s in range(P)]
    tied = embedding_rows(config) * config.n_embd if model_class.ties_embedding and P > 1 else 0
    return [blocks[s] * block + (first if s == 0 else 0) + (last + tied if s == P - 1 else 0) for s in range(P)], blocks


def embedding_rows(config) -> int:
    return getattr(config, "padded_vocab_size", config.vocab_size)


def block_activation_bytes(config, dtype: str, recompute: str, tp: int = 1, sp: bool = False) -> tuple:
    """(bytes per token, bytes per micro-batch) one block keeps from its forward for its backward
    on a rank: the tensors its autograd nodes save, read off the blocks' forward (and held to
    the allocator's counters in tests/parallel/test_memory_plan.py). Per token, with a the
    activation itemsize (2 under bfloat16 autocast, else 4), the residual stream always fp32:
    each norm's input (4 C, and its mean/rstd or rstd: 2 or 1 floats), each linear's input (a C;
    under autocast each linear casts its own copy, so LLaMA's two MLP inputs are two), the fused
    attention's q, k, v and output (a (2H + 2KV) D) and a float32 log-sum-exp per head (no T x T
    scores), the output projection's input (a H D), and the MLP's: GPT-2 GELU's input and output
    (2 a F), LLaMA SwiGLU's gate, up and output (3 a F). Selective recomputation drops the
    activation's output (rerun in backward), full keeps only the block's input (4 C). Under TP
    the head- and MLP-wide tensors are split, under SP the C-wide ones too (a column-parallel
    linear saves its sequence shard and gathers it again in backward). Per micro-batch: under
    autocast each linear's weight cast to bfloat16 (a forward saves that copy: 2 bytes per
    weight), not kept for what recomputation reruns."""
    C = config.n_embd
    a = 2 if dtype == "bfloat16" else 4
    llama = hasattr(config, "n_kv_head")
    H = config.n_head / tp
    KV = (config.n_kv_head if llama else config.n_head) / tp
    D = config.head_dim if llama else C // config.n_head
    if getattr(config, "num_experts", 0):  # routed tokens through top_k experts' MLPs (not validated)
        F = config.moe_top_k * (config.moe_ffn_hidden or config.ffn_hidden) / tp
    else:
        F = (config.ffn_hidden if llama else 4 * C) / tp
    Cs = C / tp if sp else C  # the C-wide tensors' share on this rank
    if recompute == "full":
        return 4 * Cs, 0.0
    norms = 2 * (4 * Cs + (1 if llama else 2) * 4 * Cs / C)
    mlp_inputs = 2 if llama and a == 2 else 1
    linear_inputs = a * Cs * (1 + mlp_inputs) + a * H * D
    attention = a * (2 * H + 2 * KV) * D + 4 * H
    mlp = a * F * ((3 if llama else 2) - (recompute == "selective"))
    # (selective recomputation casts the down projection's weight again in backward)
    mlp_weights = F * C * ((3 if llama else 2) - (recompute == "selective"))
    weights = 2 * (C * (H + 2 * KV) * D + H * D * C + mlp_weights) if a == 2 else 0.0
    return norms + linear_inputs + attention + mlp, weights


def forward_activation_bytes(plan, config, batch_size: int, seq_len: int, dtype: str,
                             recompute: str | None = None) -> tuple:
    """(bytes one block keeps for backward, bytes the head keeps) of one micro-batch of
    batch_size x seq_len tokens on a rank of `plan` (under CP it holds T / CP of them), under
    the plan's recomputation or `recompute`."""
    L = plan.layout
    C, V = config.n_embd, embedding_rows(config)
    tokens = batch_size * seq_len // L.cp
    sp = bool(plan.sequence_parallel) and L.tp > 1
    per_token, per_micro_batch = block_activation_bytes(config, dtype, recompute or plan.recompute, L.tp, sp)
    a = 2 if dtype == "bfloat16" else 4
    # the head's: the final norm's input (fp32) and the output product's (a, C wide; split under
    # SP), a float32 log-sum-exp per token, under autocast the output weight's bfloat16 copy, and
    # the logits: on one rank the loss keeps them (a) and writes their gradient over them; under
    # TP the vocab-parallel loss keeps their float32 softmax and makes their gradient (a) in a new
    # buffer on a rank holding padding columns (counted on every rank: the busiest has them)
    logits = a * V if L.tp == 1 else (4 + a) * V / L.tp
    head = tokens * ((4 + a) * C / (L.tp if sp else 1) + logits + 4) + (2 * V * C / L.tp if a == 2 else 0)
    return tokens * per_token + per_micro_batch, head


def _widest(config) -> int:
    """The MLP's width (a block's widest matrix is C x that)."""
    return getattr(config, "ffn_hidden", 4 * config.n_embd)


def stage_estimates(plan, config, model_class, batch_size: int, seq_len: int, micro_batches: int,
                    dtype: str) -> list:
    """Each pipeline stage's estimate, [(bytes by component, the AdamW state's bytes, parameters,
    micro-batches in flight)] per stage (one without a pipeline), for a rank of that stage."""
    L = plan.layout
    per_stage, blocks = stage_parameters(plan, config, model_class)
    C, V = config.n_embd, embedding_rows(config)
    a = 2 if dtype == "bfloat16" else 4
    per_block, head = forward_activation_bytes(plan, config, batch_size, seq_len, dtype)
    logits_bytes = batch_size * seq_len // L.cp * a * V / L.tp
    # the micro-batches in flight on each stage: all M under GPipe, PP - stage under 1F1B (and
    # ZB-H1, whose deferred W's keep less than that), PP on every stage under ZBV
    in_flight = [1] if L.pp == 1 else [micro_batches if plan.pipeline_schedule == "gpipe" else
                                       min(micro_batches, L.pp if plan.pipeline_schedule == "zbv" else L.pp - s)
                                       for s in range(L.pp)]
    embedding = 4 * V * C / L.tp  # the bytes of the token embedding
    # the output product's weight gradient, made whole at the start of the last stage's backward
    # (under autocast in bfloat16 first, then its float32 copy): a tied head's is the embedding's
    head_gradient = V * C / L.tp * (4 + (2 if a == 2 else 0))
    # gradients live through the whole step where DDP's buckets hold them (DP x CP > 1), where
    # micro-batches accumulate into them or under a pipeline; on one rank with one micro-batch
    # (.grad set to None after each step) only what backward has made so far
    persistent = plan.dp_cp > 1 or micro_batches > 1 or L.pp > 1
    out = []
    for s in range(L.pp):
        last = s == L.pp - 1
        activations = in_flight[s] * (blocks[s] * per_block + (head if last else 0.0))
        if last and plan.pipeline_schedule == "zb-h1":
            # ZB-H1 runs the head's weight gradient (W) after its input gradient (B): the logits'
            # gradient waits for it beside the next micro-batch's (measured: 374 MB against 312
            # without it, GPT-2 small at PP 2; ZBV's V places the head on stage 0, within 3% without)
            activations += logits_bytes
        # AdamW's step makes a temporary the size of the largest parameter it updates: the
        # embedding (or the head) at the ends of the model, a block's widest matrix between
        widest = embedding if s == 0 or last else 4 * C * max(3 * C, _widest(config)) / L.tp
        parts, state = _stage_parts(plan, dtype, per_stage[s] / L.tp, embedding if s == 0 else 0.0,
                                    activations, head_gradient if last else 0.0, embedding if s == 0 else 0.0,
                                    persistent, config.n_layer / L.pp, widest)
        out.append((parts, state, per_stage[s] / L.tp, in_flight[s]))
    return out


def memory_plan(plan, config, model_class, batch_size: int, seq_len: int, micro_batches: int, dtype: str,
                local_size: int):
    """(bytes this node's local_size ranks will need, bytes available, a line saying so, the
    bytes per rank by component) for a job laid out as `plan` (a ParallelPlan) training
    model_class(config) on batch_size x seq_len micro-batches, micro_batches per step, in dtype:
    each pipeline stage estimated apart (stage_estimates) and the busiest one reported (every
    rank of the node is assumed to need as much, the safe answer for a node holding several
    stages); None where it cannot be known (a GPU's memory is not the host's; no /proc/meminfo)."""
    if plan.device is not None and plan.device.type != "cpu":  # this is the host's memory
        return None
    available = available_memory()
    if available is None:
        return None
    stages = stage_estimates(plan, config, model_class, batch_size, seq_len, micro_batches, dtype)
    busiest = max(range(len(stages)), key=lambda s: sum(stages[s][0].values()))
    parts, state, params, held = stages[busiest]
    stage, shards, P = plan.active_zero_stage, plan.dp_cp, len(stages)
    per_rank = sum(parts.values())
    need = per_rank * local_size
    detail = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in parts.items())
    on_disk = ""
    if plan.offload_optimizer == "nvme":
        moments = 10 if dtype == "bfloat16" else 8
        parts["on disk"] = state * 8 / moments  # the moments; bfloat16 copies are not state
        what = "AdamW moments"
        if plan.offload_param == "nvme":
            parts["on disk"] += params * 4 / shards
            what = "AdamW moments and parameters"
        on_disk = f"; {parts['on disk'] * local_size / 2**30:.2f} GB of {what} on disk"
    where = f", pipeline stage {busiest} of {P} (the busiest)" if P > 1 else ""
    text = (f"memory: about {per_rank / 2**30:.2f} GB per rank ({params / 1e6:.1f}M parameters{where}"
            f"{f', ZeRO-{stage} over {shards}' if stage else ''}; GB: {detail}; activations of "
            f"{held} micro-batch(es)) x {local_size} rank(s) on this node = {need / 2**30:.1f} GB of "
            f"{available / 2**30:.1f} GB available{on_disk}")
    return need, available, text, parts


def _stage_parts(plan, dtype: str, params: float, embedding: float, activations: float, head_gradient: float,
                 embedding_gradient: float, persistent: bool, blocks_per_stage: float, widest: float):
    """(bytes by component, the AdamW state's bytes) of a rank holding `params` parameters (its
    TP share of its stage's), `embedding` bytes of them the token embedding's (0 if it holds
    none), at the busier of two moments of its backward: its start (every activation held, the
    head's weight gradient `head_gradient` being made on the last stage) and its end (the
    activations gone, every gradient there, the input embedding's gradient
    `embedding_gradient` made whole before it is added into .grad on the first stage)."""
    moments = 10 if dtype == "bfloat16" else 8
    shards, stage = plan.dp_cp, plan.active_zero_stage
    state = params * moments / (shards if stage >= 1 else 1)
    # under a pipeline a ZeRO-2 tied embedding's gradient is whole until the end of backward;
    # without one each use's gradient is reduce-scattered as it is made (zero/shared.py)
    gradients = params * 4 / (shards if stage >= 2 else 1) + (embedding if stage >= 2 and plan.layout.pp > 1 else 0)
    parts = {"parameters": params * 4 / (shards if stage >= 3 else 1),
             "AdamW state": state if plan.offload_optimizer != "nvme" else min(state, staging_bytes())}
    if plan.offload_param == "nvme":  # the gathered units only: the embedding and a block running with the next read
        parts["parameters"] = embedding + 2 * 4 * max(0.0, params - embedding / 4) / max(1, blocks_per_stage)
    elif stage >= 3:
        parts["parameters"] += embedding
    if stage >= 2:  # a bucket reducing while the next fills: stage 2's at most a 16th of the model, stage 3's
        # a unit's (measured: GPT-2 small at DP 4 holds at stage 3 what stage 2 does, 228 and 232 MB)
        parts["buckets in flight"] = min(2 * BUCKET_BYTES, params * 4 / 8)
    # (gradients, embedding-shaped gradients being made, activations, the optimizer's temporary)
    start = (gradients if persistent else 0.0, head_gradient, activations, 0.0)
    end = (gradients, embedding_gradient, 0.0, 0.0)
    # AdamW's step on the rank's share (ZeRO >= 1: its pieces, at most a shard of the widest)
    optimizer = (gradients, 0.0, 0.0, widest / (shards if stage >= 1 else 1))
    held, made, kept, temporary = max(start, end, optimizer, key=sum)
    parts["gradients"] = held
    if made:
        parts["embedding gradients being made"] = made
    if temporary:
        parts["optimizer step's temporary"] = temporary
    parts["activations"] = kept
    parts["process"] = PROCESS_BYTES
    return parts, state
