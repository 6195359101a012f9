"""The memory plan (nn.parallel.memory_plan) under pipeline parallelism: each stage estimated from
the split the pipeline uses, held against the peaks the ranks of a real run measure."""
import re

import numpy as np
import pytest

from infinitrain.data import write_shard
from infinitrain.models import GPT2, GPT2_PRESETS
from infinitrain.nn.parallel import Layout, ParallelPlan
from infinitrain.nn.parallel.memory_plan import (PROCESS_BYTES, forward_activation_bytes, memory_plan, stage_estimates,
                                                 stage_parameters)
from helpers import example


def test_each_stage_holds_its_own_blocks_and_ends():
    """GPT-2 124M on two stages: the balanced split gives stage 0 nine blocks and the embeddings
    (103.2M parameters), stage 1 three blocks, the final norm and the tied head's copy (59.9M); an
    even split over four stages gives each three blocks (the estimate said 62M and 31M before)."""
    cfg = GPT2_PRESETS["gpt2"]
    two, blocks = stage_parameters(ParallelPlan(Layout(2, pp=2)), cfg, GPT2)
    assert blocks == [9, 3] and [round(n / 1e5) for n in two] == [1032, 599]
    four, blocks = stage_parameters(ParallelPlan(Layout(4, pp=4), pipeline_split="even"), cfg, GPT2)
    # the first stage has the position embedding (1024 x 768), the last the final norm (2 x 768)
    assert blocks == [3, 3, 3, 3] and four[0] - four[3] == 1024 * 768 - 2 * 768 and four[1] == four[2] < four[0] / 2
    plan = ParallelPlan(Layout(2, pp=2), device="cpu")
    text = memory_plan(plan, cfg, GPT2, 4, 256, 4, "float32", 2)[2]
    assert "103.2M parameters, pipeline stage 0 of 2 (the busiest)" in text, text


@pytest.mark.parametrize("kind, dtype, recompute", [("gpt2", "float32", "none"), ("llama3", "float32", "none"),
                                                     ("gpt2", "bfloat16", "selective"), ("llama3", "bfloat16", "none"),
                                                     ("llama3", "float32", "full")])
def test_the_activation_estimate_is_what_a_forward_keeps(kind, dtype, recompute):
    """What one forward pass keeps for backward (the allocator's bytes after it, less those before,
    the gradients already there) is the memory plan's blocks and head within 10% (they are the
    tensors the blocks save: under 1% apart here), for GPT-2 and LLaMA-3, float32 and bfloat16
    autocast, without and with recomputation."""
    import gc
    from dataclasses import replace

    import infinitrain as it
    from infinitrain.amp import autocast
    from infinitrain.models import LLaMA3
    from infinitrain.models.gpt2 import GPT2Config
    from infinitrain.models.llama3_config import PRESETS
    V, B, T = 512, 2, 64
    cfg = GPT2Config(block_size=T, vocab_size=V, n_layer=2, n_head=2, n_embd=64) if kind == "gpt2" else \
        replace(PRESETS["tiny"], block_size=T, vocab_size=V, n_layer=2)
    model = (GPT2 if kind == "gpt2" else LLaMA3)(cfg, seed=0).set_recompute(recompute)
    x = it.from_numpy(np.random.default_rng(0).integers(0, V, (B, T)))

    def forward():
        with autocast("cpu", dtype=dtype, enabled=dtype != "float32"):
            return model(x, x, return_logits=False)[1]
    forward().backward()  # the gradients exist before the measured forward, as in training
    gc.collect()
    before = it.memory_stats()["allocated_bytes"]
    loss = forward()
    kept = it.memory_stats()["allocated_bytes"] - before
    block, head = forward_activation_bytes(ParallelPlan(Layout(1), recompute=recompute), cfg, B, T, dtype)
    assert abs((cfg.n_layer * block + head) / kept - 1) < 0.10, (kept, cfg.n_layer * block, head)
    del loss


@pytest.mark.mpi
@pytest.mark.parametrize("stages", [2, 4])
def test_the_estimate_of_every_stage_matches_its_measured_peak(tmp_path, stages):
    """The example on PP 2 and PP 4 (GPT-2 small: its 50k-row embedding and tied head dwarf its
    blocks, so the ends of the pipeline hold the most) prints every rank's peak; each is within
    10% of its stage's estimate (which counts what the run holds, not a margin: the refusal's is
    the process's share), and the busiest stage is the one estimated the busiest."""
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    out = example(stages, "gpt2", ["--input_bin", tmp_path / "t.bin", "--model", "small", "--batch_size", "2",
                                   "--sequence_length", "64", "--total_batch_size", "512", "--num_iteration", "3",
                                   "--pipeline_parallel", stages], timeout=600)
    measured = [int(v) * 2**20 for v in re.search(r"peak used per rank \(MB\): ([\d ]+) \|", out).group(1).split()]
    plan = ParallelPlan(Layout(stages, pp=stages), device="cpu")
    estimates = [sum(parts.values()) - PROCESS_BYTES
                 for parts, *_ in stage_estimates(plan, GPT2_PRESETS["small"], GPT2, 2, 64, 4, "float32")]
    assert len(measured) == stages, out
    for s, (got, want) in enumerate(zip(measured, estimates)):
        # (within 2 MB on PP 4's middle stages, one block each: the pipeline's send and receive
        # buffers are not counted)
        assert abs(got - want) <= max(0.1 * want, 2 * 2**20), (s, got / 2**20, want / 2**20)
    assert measured.index(max(measured)) == estimates.index(max(estimates)), (estimates, measured)
