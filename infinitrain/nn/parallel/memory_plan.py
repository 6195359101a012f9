"""The memory plan: what each rank of a job will hold, estimated from its ParallelPlan and the
model's configuration before anything is built, so that a job that would not fit is refused
with a way to make it fit rather than killed by the system halfway through its first step.

Per parameter: 4 bytes of weights, 4 of gradient and 8 of AdamW moments (+2 for bfloat16
copies), each pipeline stage's own (its blocks in the split the pipeline uses, the embeddings on
the first, the head on the last: GPT-2 124M on two stages holds 103M and 60M), split over TP,
and ZeRO's shares over DP x CP; the busiest stage is the answer. The embedding-shaped gradients
a stage makes whole in backward before adding them into .grad (the input embedding's on the
first stage, a tied head's on the last) count once more. At stages 2 and 3 the token
embedding's gradient is whole during backward (a gradient is reduce-scattered only once it is
final: the tied embedding's at the very end) and two buckets are in flight; at stage 3 the
embedding's weights are gathered too. Activations of the stage that holds the most: its
blocks (the split the pipeline makes) times the micro-batches in flight there (all M under
GPipe, PP - stage under 1F1B, one without a pipeline) at about 24 B T C floats per block plus
the attention scores, the logits and their gradient on the last stage, and ~350 MB for the
process itself (Python, numpy, MPI, BLAS buffers, the data). With offload_optimizer "nvme"
the moments are on disk (parts["on disk"], not counted in the memory) and the staging buffers
stay; with offload_param "nvme" (stage 3, also on one rank) the parameter pieces are there
too, and what stays of the parameters is the units gathered at a time (the embedding and two
blocks).
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


def stage_estimates(plan, config, model_class, batch_size: int, seq_len: int, micro_batches: int,
                    dtype: str) -> list:
    """Each pipeline stage's estimate, [(bytes by component, the AdamW state's bytes, parameters,
    micro-batches in flight)] per stage (one without a pipeline), for a rank of that stage."""
    L = plan.layout
    per_stage, blocks = stage_parameters(plan, config, model_class)
    # under CP a rank holds T / CP tokens, and its attention a T/CP x T/CP block at a time
    B, T, C = batch_size, seq_len // L.cp, config.n_embd
    per_layer = 4 * (24 * B * T * C / L.tp + 2 * B * (config.n_head / L.tp) * T * T)
    # the micro-batches in flight on each stage: all M under GPipe, PP - stage under 1F1B (and
    # ZB-H1, whose deferred W's keep less than that), PP on every stage under ZBV
    in_flight = [1] if L.pp == 1 else [micro_batches if plan.pipeline_schedule == "gpipe" else
                                       min(micro_batches, L.pp if plan.pipeline_schedule == "zbv" else L.pp - s)
                                       for s in range(L.pp)]
    embedding = 4 * embedding_rows(config) * C / L.tp  # the bytes of the token embedding
    # the embedding-shaped gradients a stage makes whole before adding them into .grad: the
    # input embedding's on the first stage, a tied head's (the embedding again) on the last
    made = [(s == 0) + (model_class.ties_embedding and s == L.pp - 1) for s in range(L.pp)]
    logits = 2 * 4 * B * T * embedding_rows(config) / L.tp  # the last stage's logits and their gradient
    out = []
    for s in range(L.pp):
        activations = in_flight[s] * blocks[s] * per_layer + (logits if s == L.pp - 1 else 0.0)
        parts, state = _stage_parts(plan, dtype, per_stage[s] / L.tp, embedding if made[s] else 0.0,
                                    made[s] * embedding, activations, config.n_layer / L.pp)
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


def _stage_parts(plan, dtype: str, params: float, embedding: float, made: float, activations: float,
                 blocks_per_stage: float):
    """(bytes by component, the AdamW state's bytes) of a rank holding `params` parameters (its
    TP share of its stage's), `embedding` bytes of them the token embedding's (0 if it holds
    none), `made` bytes of embedding-shaped gradients made whole in backward, and `activations`
    bytes of activations."""
    moments = 10 if dtype == "bfloat16" else 8
    shards, stage = plan.dp_cp, plan.active_zero_stage
    state = params * moments / (shards if stage >= 1 else 1)
    parts = {"parameters": params * 4 / (shards if stage >= 3 else 1),
             "gradients": params * 4 / (shards if stage >= 2 else 1) + (embedding if stage >= 2 else 0),
             "AdamW state": state if plan.offload_optimizer != "nvme" else min(state, staging_bytes())}
    if plan.offload_param == "nvme":  # the gathered units only: the embedding and a block running with the next read
        parts["parameters"] = embedding + 2 * 4 * max(0.0, params - embedding / 4) / max(1, blocks_per_stage)
    elif stage >= 3:
        parts["parameters"] += embedding
    if stage >= 2:  # a full-size bucket reducing while the next fills
        parts["buckets in flight"] = min(2 * BUCKET_BYTES, params * 4)
    if made:
        parts["embedding gradients being made"] = made
    parts["activations"] = activations
    parts["process"] = PROCESS_BYTES
    return parts, state
