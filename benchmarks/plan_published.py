"""The planner's simulation held against figures the anchors published for machines this
project cannot measure: each published run's model, batch, layout and cluster go through the
planner (infinitrain.plan.predict, with the shipped GPU profiles written from datasheets:
`python -m infinitrain.plan --profile h100-sxm ...`), and its tokens/s per GPU and MFU are
printed beside the published ones, with the planner's own best layout for that cluster after.

    python benchmarks/plan_published.py
    python benchmarks/plan_published.py --overlap 0.9      # DP/FSDP traffic 90% hidden, as the anchors' prefetching

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
]


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
        best = best_layouts(world, config, cls, cluster, profile, run.global_batch, run.seq, "bfloat16",
                            max_tp=run.gpus_per_node, max_cp=8, micro_batches=[c.batch_size])
        fit = next((b for b in best if b.fits), None)
        choice = (f"{fit.candidate.name} ({run.global_batch * run.seq / fit.step_time / world:,.0f})" if fit
                  else "none fits")
        print(f"{run.who:<16} {run.model:<10} {world:>5} {run.layout:<38} | {rate:9,.0f} {run.tokens_per_gpu:9,.0f} "
              f"{rate / run.tokens_per_gpu:5.2f} | {mfu:4.0%} {pub_mfu:4.0%} | {pred.memory_per_rank / GiB:6.1f} | "
              f"{choice}", flush=True)
    print("\nsources and notes:")
    for run in RUNS:
        print(f"  {run.who} {run.model} x{run.nodes * run.gpus_per_node}: {run.note}; {run.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
