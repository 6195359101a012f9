"""Trains GPT-2 on llm.c token shards, with InfiniTrain's flags and log line.

    python -m infinitrain.examples.gpt2 --model small --num_iteration 50 --sample_every 50

With no data flags it trains on Shakespeare (prepared on first use, offline); --llmc_filepath
starts from an llm.c GPT-2 checkpoint. Run with --help for the flags.
"""
from __future__ import annotations

from infinitrain.examples.flags import run_example
from infinitrain.examples.lm_flags import parse_args
from infinitrain.examples.lm_train import recorded_config, train
from infinitrain.models import GPT2, GPT2_PRESETS, gpt2


def build_model(args, tp=None, pp=None, cp=None, ep=None):
    """tp, pp, cp: the TensorParallel layout, PipelineStage and ContextParallel to build this
    rank's part of the model in (None: one process's model). GPT-2 has no experts: ep is not
    used (the trainer refuses --expert_parallel for a model without them)."""
    if args.llmc_filepath:
        return GPT2.from_llmc(args.llmc_filepath, tp=tp, pp=pp, cp=cp)
    if args.from_pretrained:
        return GPT2.from_pretrained(args.from_pretrained, tp=tp, pp=pp, cp=cp)
    recorded = recorded_config(args, GPT2)  # --load alone: the model its checkpoint records
    if recorded is not None:
        return GPT2(recorded, tp=tp, pp=pp, cp=cp)
    return gpt2(args.model, tp=tp, pp=pp, cp=cp)


def main(argv=None) -> int:
    return train(parse_args(argv, __doc__, GPT2_PRESETS, "gpt2"), build_model)


if __name__ == "__main__":
    run_example(main)
