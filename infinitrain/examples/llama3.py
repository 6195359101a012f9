"""Trains LLaMA-3 on llm.c token shards, with the same flags and log line as the GPT-2 example.

    python -m infinitrain.examples.llama3 --model small --num_iteration 50 --sample_every 50

With no data flags it trains the `small` preset (GPT-2 vocabulary) on Shakespeare;
--llmc_filepath starts from an InfiniTrain/llm.c-style LLaMA-3 checkpoint (magic 20240803).
Presets: llama3.2-1b, llama3.2-3b, llama3-8b, small, tiny. Run with --help for the flags.
"""
from __future__ import annotations

from infinitrain.examples.flags import run_example
from infinitrain.examples.lm_flags import parse_args
from infinitrain.examples.lm_train import recorded_config, train
from infinitrain.models import LLAMA3_PRESETS, LLaMA3, llama3


def build_model(args, tp=None, pp=None, cp=None):
    """tp, pp, cp: the TensorParallel layout, PipelineStage and ContextParallel to build this
    rank's part of the model in (None: one process's model)."""
    if args.llmc_filepath:
        return LLaMA3.from_llmc(args.llmc_filepath, tp=tp, pp=pp, cp=cp)
    if args.from_pretrained:
        return LLaMA3.from_pretrained(args.from_pretrained, tp=tp, pp=pp, cp=cp)
    recorded = recorded_config(args, LLaMA3)  # --load alone: the model its checkpoint records
    if recorded is not None:
        return LLaMA3(recorded, tp=tp, pp=pp, cp=cp)
    return llama3(args.model, tp=tp, pp=pp, cp=cp)


def main(argv=None) -> int:
    return train(parse_args(argv, __doc__, LLAMA3_PRESETS, "small"), build_model)


if __name__ == "__main__":
    run_example(main)
