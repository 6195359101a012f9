"""TrainStep in one process: the step the trainer and the multi-process tests share equals the
loop a user writes by hand (accumulation, clipping, AdamW), and picks the wrappers a layout
needs. Every parallel layout is held against this one-process step by tests/parallel/mpi."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain.models import GPT2Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.nn.parallel import Layout, ParallelPlan
from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
from infinitrain.nn.utils import clip_grad_norm_
from infinitrain.optim import AdamW

CFG = GPT2Config(block_size=16, vocab_size=300, n_layer=2, n_head=2, n_embd=16)


ONE = ParallelPlan(Layout(1))  # this process alone: no process group is needed


def batches(step):
    tokens = np.random.default_rng(step).integers(0, 300, (2, 2, 9))  # 2 micro-batches of 2 x 8
    return [(it.tensor(t[:, :-1].copy()), it.tensor(t[:, 1:].copy())) for t in tokens]


def test_the_step_equals_the_loop_written_by_hand():
    model = GPT2(CFG, seed=3)
    step = TrainStep(model, ONE, decay_groups(model, 0.1), AdamW, lr=1e-2, betas=(0.9, 0.95))
    plain = GPT2(CFG, seed=3)
    opt = AdamW(decay_groups(plain, 0.1), lr=1e-2, betas=(0.9, 0.95))
    for s in range(3):
        loss, norm = step.step(batches(s), grad_clip=0.5)
        total = 0.0
        for x, y in batches(s):
            _, part = plain(x, y, return_logits=False)
            (part / 2).backward()
            total += part.item() / 2
        want = clip_grad_norm_(plain.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        assert loss == pytest.approx(total, rel=1e-12) and norm == pytest.approx(want, rel=1e-12)
    for p, q in zip(model.parameters(), plain.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())


def test_one_rank_needs_no_wrapper_and_refuses_zero3_under_a_pipeline():
    model = GPT2(CFG, seed=3)
    step = TrainStep(model, ParallelPlan(Layout(1), zero_stage=2), decay_groups(model, 0.0), AdamW, lr=1e-3)
    assert step.net is model and step.pipe is None and not step.zero  # ZeRO needs DP > 1
    assert step.step(batches(0))[1] is None  # no clipping asked: no norm
    with pytest.raises(ValueError, match="--zero_stage 3 does not compose with --pipeline_parallel"):
        ParallelPlan(Layout(2, pp=2), zero_stage=3)
