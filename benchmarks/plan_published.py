"""The planner's simulation held against figures the anchors published for machines this
project cannot measure: each published run's model, batch, layout and cluster go through the
planner (infinitrain.plan.predict, with the shipped GPU profiles written from datasheets:
`python -m infinitrain.plan --profile h100-sxm ...`), and its tokens/s per GPU and MFU are
printed beside the published ones, with the planner's own best layout for that cluster after.

    python benchmarks/plan_published.py
    python benchmarks/plan_published.py --overlap 0.9      # DP/FSDP traffic 90% hidden, as the anchors' prefetching

Megatron-LM's weak-scaling table (GPT models 1.7B-1T, vocabulary 51,200, sequence 2,048, on up
to 3,072 A100 80 GB of NVIDIA's Selene, 8 to a node): github.com/NVIDIA/Megatron-LM README.md,
"Our codebase is capable of efficiently training very large ... language models" (the table
image images/cases_april2021.png, the README of January 2022, commit 0747e8e558), the same runs
as Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (arXiv 2104.04473), Table 1. The table gives hidden size, layers, the model-parallel
size, GPUs, the batch and teraFLOP/s per GPU; the paper's TP x PP split of the model-parallel
size (TP up to 8, a node's GPUs, PP the rest), full activation recomputation (its FLOP count
96 B s l h^2 (1 + s / 6h + V / 16 l h) has the recomputed forward in it) and the attention heads
are the paper's Table 1 as recalled, not re-read here (the README's table, read, has only the
model-parallel size, which each TP x PP multiplies out to); the micro-batch (1) and the plain 1F1B schedule are this
script's assumptions (the table does not give them). Published tokens/s per GPU: the
teraFLOP/s per GPU over that count per token; the MFU column counts both in this script's
convention (flops_per_token).

The published figures come from other engines (TorchTitan's FSDP2, llm.c's CUDA trainer) on
their own machines (TorchTitan's H100s ran at a 500 W limit with HBM2e); the planner predicts
this engine's layouts at the profile's rates: read the ratio as how optimistic the model is,
not as a benchmark of either engine.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GiB = 2 ** 30
PEAK = {"h100-sxm": 989e12, "a100-sxm-80gb": 312e12}  # bf16 dense, the datasheets'


@dataclass
class Published:
    who: str
    model: str          # a preset of the examples
    example: str
    profile: str        # a shipped profile
    nodes: int
    gpus_per_node: int
    memory_gb: float    # per GPU
    global_batch: int   # sequences per step
    seq: int
    layout: str         # the published run's layout, in the planner's names
    tokens_per_gpu: float
    note: str
    source: str
    config: dict | None = None  # a GPT-2-shaped model's fields where no preset is it
    search: bool = True         # also search the planner's best layout (minutes at thousands of GPUs)


MEGATRON_SOURCE = ("github.com/NVIDIA/Megatron-LM README.md (Jan 2022, 0747e8e558), images/cases_april2021.png; "
                   "arXiv 2104.04473 Table 1")
# (billions, hidden, layers, heads, TP, PP, GPUs, batch, teraFLOP/s per GPU): the README's table,
# the heads and the TP x PP split of its model-parallel size from the paper's Table 1
MEGATRON_TABLE = [
    (1.7, 2304, 24, 24, 1, 1, 32, 512, 137), (3.6, 3072, 30, 32, 2, 1, 64, 512, 138),
    (7.5, 4096, 36, 32, 4, 1, 128, 512, 142), (18.4, 6144, 40, 48, 8, 1, 256, 1024, 135),
    (39.1, 8192, 48, 64, 8, 2, 512, 1536, 138), (76.1, 10240, 60, 80, 8, 4, 1024, 1792, 140),
    (145.6, 12288, 80, 96, 8, 8, 1536, 2304, 148), (310.1, 16384, 96, 128, 8, 16, 1920, 2160, 155),
    (529.6, 20480, 105, 128, 8, 35, 2520, 2520, 163), (1008.0, 25600, 128, 160, 8, 64, 3072, 3072, 163),
]
MEGATRON_SEQ, MEGATRON_VOCAB = 2048, 51200


def megatron_tokens_per_gpu(hidden: int, layers: int, teraflops: float) -> float:
    """The published teraFLOP/s per GPU as tokens/s per GPU: the paper's count per token with
    full recomputation, 96 l h^2 (1 + s / 6h + V / 16 l h)."""
    h, s, V = hidden, MEGATRON_SEQ, MEGATRON_VOCAB
    return teraflops * 1e12 / (96 * layers * h * h * (1 + s / (6 * h) + V / (16 * layers * h)))


def megatron_runs() -> list:
    runs = []
    for size, h, layers, heads, tp, pp, gpus, batch, tflops in MEGATRON_TABLE:
        dp = gpus // (tp * pp)
        layout = f"dp={dp},tp={tp},sp=0,pp={pp}" + (",schedule=1f1b" if pp > 1 else "") + ",recompute=full,mb=1"
        runs.append(Published(
            "Megatron-LM", f"{size:g}B", "gpt2", "a100-sxm-80gb", gpus // 8, 8, 80, batch, MEGATRON_SEQ, layout,
            megatron_tokens_per_gpu(h, layers, tflops), f"GPT {size:g}B, {tflops} TFLOP/s per GPU published "
            f"({tflops / 312:.0%} of peak, recomputation counted)", MEGATRON_SOURCE,
            config={"n_embd": h, "n_layer": layers, "n_head": heads, "vocab_size": MEGATRON_VOCAB,
                    "block_size": MEGATRON_SEQ}, search=gpus <= 128))
    return runs


RUNS = [
    Published("TorchTitan FSDP", "llama3-8b", "llama3", "h100-sxm", 1, 8, 96, 16, 8192,
              "dp=8,zero=3,recompute=selective,mb=2", 5762, "Llama 3.1 8B, local batch 2, selective AC, no compile",
              "github.com/pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1"),
    Published("TorchTitan FSDP", "llama3-8b", "llama3", "h100-sxm", 16, 8, 96, 256, 8192,
              "dp=128,zero=3,recompute=selective,mb=2", 5605, "the same on 128 GPUs",
              "github.com/pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 3"),
    Published("TorchTitan FSDP", "llama3-8b", "llama3", "a100-sxm-80gb", 8, 8, 80, 64, 8192,
              "dp=64,zero=3,recompute=selective,mb=1", 2973, "Llama 3 8B, local batch 1, selective op AC, MFU 58.2%",
              "github.com/pytorch/torchtitan docs/performance.md (2024)"),
    Published("llm.c", "gpt2", "gpt2", "a100-sxm-80gb", 1, 8, 80, 512, 1024,
              "dp=8,zero=1,mb=64", 10.25e9 / 5400 / 8, "GPT-2 124M: 19,560 steps of 0.5M tokens in ~90 min "
              "(evaluation included: a lower bound)", "github.com/karpathy/llm.c/discussions/481"),
    Published("llm.c", "gpt2-xl", "gpt2", "h100-sxm", 1, 8, 80, 1024, 1024,
              "dp=8,zero=1,mb=16", 0.50 * 989e12 / (6 * 1.558e9 + 6 * 48 * 1600 * 1024), "GPT-2 1558M at "
              "'~50% MFU' (1M-token steps, 24 hours on one 8xH100 node)", "github.com/karpathy/llm.c/discussions/677"),
] + megatron_runs()


def flops_per_token(config, model_class, seq: int) -> float:
    """The MFU convention of llm.c and TorchTitan: 6 x the parameters a token multiplies with
    plus attention's 6 x layers x width x sequence (causal: half of 12)."""
    from infinitrain.plan.layouts import model_facts
    active = model_facts(model_class, config)[2]
    return 6 * active + 6 * config.n_layer * config.n_embd * seq


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--overlap", type=float, default=0.0,
                   help="the share of DP / ZeRO traffic hidden behind compute (the profiles say 0)")
    args = p.parse_args(argv)
    from infinitrain.plan import Cluster, Profile, best_layouts, parse, predict, refusal
    from infinitrain.plan.layouts import model_of
    print(f"{'run':<16} {'model':<10} {'GPUs':>5} {'layout':<38} | {'tok/s/GPU':>9} {'published':>9} {'ratio':>5} | "
          f"{'MFU':>4} {'pub':>4} | {'GB/GPU':>6} | the planner's best layout (tok/s/GPU)")
    for run in RUNS:
        profile = Profile.load(run.profile)
        profile.data["overlap"] = {**profile["overlap"], "dp": args.overlap, "zero": args.overlap}
        if run.config:
            from infinitrain.models import GPT2
            config, cls = GPT2.config_class(**run.config), GPT2
        else:
            config, cls, _ = model_of(run.model, None, run.example)
        cluster = Cluster(run.nodes, run.gpus_per_node, run.gpus_per_node, run.memory_gb * GiB * run.gpus_per_node,
                          "cuda")
        c = parse(run.layout)
        why = refusal(c, config, cls, run.global_batch, run.seq)
        if why:
            raise SystemExit(f"{run.who} {run.model}: the engine refuses {run.layout}: {why}")
        pred = predict(c, config, cls, cluster, profile, run.global_batch, run.seq, "bfloat16")
        world = cluster.world_size
        rate = run.global_batch * run.seq / pred.step_time / world
        per_token = flops_per_token(config, cls, run.seq)
        mfu, pub_mfu = rate * per_token / PEAK[run.profile], run.tokens_per_gpu * per_token / PEAK[run.profile]
        # (the published micro-batch: the search over every one takes minutes at 128 ranks)
        best = [] if not run.search else best_layouts(
            world, config, cls, cluster, profile, run.global_batch, run.seq, "bfloat16", max_tp=run.gpus_per_node,
            max_cp=8, micro_batches=[c.batch_size])
        fit = next((b for b in best if b.fits), None)
        choice = (f"{fit.candidate.name} ({run.global_batch * run.seq / fit.step_time / world:,.0f})" if fit
                  else "none fits" if run.search else "not searched")
        print(f"{run.who:<16} {run.model:<10} {world:>5} {run.layout:<38} | {rate:9,.0f} {run.tokens_per_gpu:9,.0f} "
              f"{rate / run.tokens_per_gpu:5.2f} | {mfu:4.0%} {pub_mfu:4.0%} | {pred.memory_per_rank / GiB:6.1f} | "
              f"{choice}", flush=True)
    print("\nsources and notes:")
    for run in RUNS:
        print(f"  {run.who} {run.model} x{run.nodes * run.gpus_per_node}: {run.note}; {run.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
