"""The memory plan: what each rank of a job will hold, estimated from its ParallelPlan and the
model's configuration before anything is built, so that a job that would not fit is refused
with a way to make it fit rather than killed by the system halfway through its first step.

Per parameter: 4 bytes of weights, 4 of gradient and 8 of AdamW moments (+2 for bfloat16
copies), split over TP x PP, and ZeRO's shares over DP x CP. At stages 2 and 3 the token
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
from .pp.stage import chunk_layers

PROCESS_BYTES = 350 * 2**20  # Python, numpy, MPI, BLAS buffers, the data
BUCKET_BYTES = 25 * 2**20    # the trainer's buckets


def available_memory() -> int | None:
    """This node's available memory (MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def memory_plan(plan, config, model_class, batch_size: int, seq_len: int, micro_batches: int, dtype: str,
                local_size: int):
    """(bytes this node's local_size ranks will need, bytes available, a line saying so, the
    bytes per rank by component) for a job laid out as `plan` (a ParallelPlan) training
    model_class(config) on batch_size x seq_len micro-batches, micro_batches per step, in dtype;
    None where it cannot be known (a GPU's memory is not the host's; no /proc/meminfo)."""
    if plan.device is not None and plan.device.type != "cpu":  # this is the host's memory
        return None
    available = available_memory()
    if available is None:
        return None
    cfg, L = config, plan.layout
    params = model_class._llmc_numel(cfg) / (L.tp * L.pp)
    moments = 10 if dtype == "bfloat16" else 8
    shards = plan.dp_cp  # ZeRO shards over the DP x CP group
    stage = plan.active_zero_stage
    offload_param = plan.offload_param == "nvme"
    vocab = getattr(cfg, "padded_vocab_size", cfg.vocab_size)
    embedding = 4 * vocab * cfg.n_embd / L.tp
    state = params * moments / (shards if stage >= 1 else 1)
    parts = {"parameters": params * 4 / (shards if stage >= 3 else 1),
             "gradients": params * 4 / (shards if stage >= 2 else 1) + (embedding if stage >= 2 else 0),
             "AdamW state": state if plan.offload_optimizer != "nvme" else min(state, staging_bytes())}
    if offload_param:  # the gathered units only: the embedding and a block running with the next read
        parts["parameters"] = embedding + 2 * 4 * max(0.0, params - embedding / 4) / max(1, cfg.n_layer / L.pp)
    elif stage >= 3:
        parts["parameters"] += embedding
    if stage >= 2:  # a full-size bucket reducing while the next fills
        parts["buckets in flight"] = min(2 * BUCKET_BYTES, params * 4)
    # under CP a rank holds T / CP tokens, and its attention a T/CP x T/CP block at a time
    B, T, C = batch_size, seq_len // L.cp, cfg.n_embd
    per_layer = 4 * (24 * B * T * C / L.tp + 2 * B * (cfg.n_head / L.tp) * T * T)
    # the stage holding the most: its blocks times the micro-batches in flight there (1F1B: PP - stage)
    head = model_class.head_work(cfg) if plan.pipeline_split == "balanced" else 0.0
    chunks = chunk_layers(cfg.n_layer, L.pp, plan.virtual_pipeline_parallel, head)
    in_flight = [1] if L.pp == 1 else [micro_batches if plan.pipeline_schedule == "gpipe" else
                                       min(micro_batches, L.pp - s) for s in range(L.pp)]
    blocks = [sum(len(c) for g, c in enumerate(chunks) if g % L.pp == s) for s in range(L.pp)]
    busiest = max(range(L.pp), key=lambda s: in_flight[s] * blocks[s])
    held = in_flight[busiest]
    parts["activations"] = held * blocks[busiest] * per_layer + 2 * 4 * B * T * vocab / L.tp
    parts["process"] = PROCESS_BYTES
    per_rank = sum(parts.values())
    need = per_rank * local_size
    detail = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in parts.items())
    on_disk = ""
    if plan.offload_optimizer == "nvme":
        parts["on disk"] = state * 8 / moments  # the moments; bfloat16 copies are not state
        what = "AdamW moments"
        if offload_param:
            parts["on disk"] += params * 4 / shards
            what = "AdamW moments and parameters"
        on_disk = f"; {parts['on disk'] * local_size / 2**30:.2f} GB of {what} on disk"
    text = (f"memory: about {per_rank / 2**30:.2f} GB per rank ({params / 1e6:.1f}M parameters"
            f"{f', ZeRO-{stage} over {shards}' if stage else ''}; GB: {detail}; activations of {held} "
            f"micro-batch(es)) x {local_size} rank(s) on this node = {need / 2**30:.1f} GB of "
            f"{available / 2**30:.1f} GB available{on_disk}")
    return need, available, text, parts
