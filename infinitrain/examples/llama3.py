"""Trains LLaMA-3 on llm.c token shards, with the same flags and log line as the GPT-2 example.

    python -m infinitrain.examples.llama3 --model small --num_iteration 50 --sample_every 50

With no data flags it trains the `small` preset (GPT-2 vocabulary) on Shakespeare;
--llmc_filepath starts from an InfiniTrain/llm.c-style LLaMA-3 checkpoint (magic 20240803).
Presets: llama3.2-1b, llama3.2-3b, llama3-8b, small, tiny, and with mixtures of experts
moe-tiny, moe-small, mixtral-8x7b, qwen3-30b-a3b, deepseek-v3-small; --num_experts and the
other --moe_* flags (Megatron's names) give a preset experts or change its own:

    python -m infinitrain.examples.llama3 --model small --num_experts 8 --moe_top_k 2 --moe_log_every 5

Run with --help for the flags.
"""
from __future__ import annotations

from dataclasses import replace

from infinitrain.examples.flags import run_example
from infinitrain.examples.lm_flags import parse_args
from infinitrain.examples.lm_train import recorded_config, train
from infinitrain.models import LLAMA3_PRESETS, LLaMA3


def build_model(args, tp=None, pp=None, cp=None, ep=None):
    """tp, pp, cp, ep: the TensorParallel layout, PipelineStage, ContextParallel and
    ExpertParallel to build this rank's part of the model in (None: one process's model)."""
    if args.llmc_filepath:
        return LLaMA3.from_llmc(args.llmc_filepath, tp=tp, pp=pp, cp=cp)
    if args.from_pretrained:
        return LLaMA3.from_pretrained(args.from_pretrained, tp=tp, pp=pp, cp=cp, ep=ep)
    recorded = recorded_config(args, LLaMA3)  # --load alone: the model its checkpoint records
    if recorded is not None:
        if args.moe_overrides and not recorded.num_experts and not args.moe_overrides.get("num_experts"):
            raise ValueError(f"--{', --'.join(args.moe_overrides)}: --load's model is dense (num_experts 0), so "
                             "the mixture-of-experts flags would do nothing")
        return LLaMA3(replace(recorded, **args.moe_overrides), tp=tp, pp=pp, cp=cp, ep=ep)
    return LLaMA3(args.presets[args.model], tp=tp, pp=pp, cp=cp, ep=ep)  # (with the MoE flags applied)


def main(argv=None) -> int:
    return train(parse_args(argv, __doc__, LLAMA3_PRESETS, "small", moe=True, rope=True), build_model)


if __name__ == "__main__":
    run_example(main)
