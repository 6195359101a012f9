"""Activation recomputation: checkpoint() gives the gradients of the plain run (random numbers
and autocast replayed), and GPT-2 / LLaMA-3 trained with --recompute full or selective give
the losses of no recomputation, bit for bit, with less activation memory; also under DP, TP+SP,
PP and ZeRO-3 layouts against one process."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn
from infinitrain.amp import autocast
from infinitrain.autograd import checkpoint
from helpers import BatchedRuns, assert_same, losses, one_process, parallel_train, parallel_train_runs


def _block(x, lin):
    return nn.functional.dropout(nn.functional.gelu(lin(x)), 0.3, training=True) * x


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_checkpoint_gradients_equal_the_plain_run(dtype):
    lin = nn.Linear(6, 6)
    x0 = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    grads = []
    for recompute in (False, True):
        it.manual_seed(3)
        lin.zero_grad()
        x = it.from_numpy(x0.copy()).requires_grad_()
        with autocast("cpu", dtype=dtype, enabled=dtype != "float32"):
            y = checkpoint(_block, x, lin) if recompute else _block(x, lin)
            z = checkpoint(_block, y, lin) if recompute else _block(y, lin)  # two in a row
        z.float().sum().backward()
        grads.append([x.grad.numpy().copy(), lin.weight.grad.numpy().copy(), lin.bias.grad.numpy().copy()])
        after = it.rand(3).numpy()  # the generator continues where the plain run leaves it
        grads[-1].append(after)
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_hooks_and_end_of_backward_callbacks_run_once():
    """Parameters inside a recomputed piece get their post-accumulate hooks during the outer
    backward; callbacks queued from them run once, when the outer pass ends."""
    from infinitrain.autograd.engine import queue_callback
    lin, events = nn.Linear(3, 3), []
    lin.weight.register_post_accumulate_grad_hook(
        lambda p: (events.append("hook"), queue_callback(lambda: events.append("end"))))
    x = it.ones(2, 3, requires_grad=True)
    (checkpoint(lin, x) * 2).sum().backward()
    assert events == ["hook", "end"], events


COMMON = ["--vocab", "512", "--embd", "64", "--layers", "6", "--seq", "64", "--batch", "8", "--steps", "3"]


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_recompute_gives_the_same_losses_with_less_memory(model):
    modes = ("none", "full", "selective")
    runs = dict(zip(modes, parallel_train_runs(1, [["--model", model, *COMMON, "--recompute", m] for m in modes])))
    peak = {m: int(next(ln.split()[1] for ln in out.splitlines() if ln.startswith("activation_peak")))
            for m, out in runs.items()}
    print(model, {m: f"{v / 2**20:.1f} MB" for m, v in peak.items()})
    base = losses(runs["none"])
    for mode in ("full", "selective"):
        assert losses(runs[mode]) == base, f"{mode}: {losses(runs[mode])} vs {base}"  # bit-identical
    assert peak["full"] < 0.5 * peak["none"] and peak["selective"] < 0.9 * peak["none"], peak


LAYOUTS = [
    ("gpt2", 4, 2, ["--tp", "2", "--sp", "--micro", "2"]),
    ("llama3", 4, 2, ["--tp", "2", "--sp", "--micro", "2"]),
    ("gpt2", 4, 4, ["--pp", "2", "--micro", "4"]),
    ("llama3", 2, 2, ["--zero", "3", "--micro", "2"]),
]
LORA = ["--model", "gpt2", "--lora", "4", "--steps", "4", "--batch", "8"]


def _common(model, layers):
    return ["--model", model, "--steps", "5", "--batch", "8", "--layers", str(layers)]


# the parallel runs of the tests below as one job per rank count (the first test of each count starts it)
RUNS = BatchedRuns([(n, _common(m, layers) + flags + ["--recompute", mode])
                    for m, n, layers, flags in LAYOUTS for mode in ("full", "selective")]
                   + [(4, LORA + ["--recompute", mode, "--tp", "2", "--sp", "--micro", "2"])
                      for mode in ("full", "selective")])


@pytest.mark.mpi
@pytest.mark.parametrize("model,n,layers,flags", LAYOUTS)
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_in_parallel_layouts_matches_one_process(model, n, layers, flags, mode):
    common = _common(model, layers)
    ref = one_process(*common)
    got = losses(RUNS(n, common + flags + ["--recompute", mode]))
    assert_same(got, ref, "float32", f"{model} {mode} recomputation with {' '.join(flags)}")


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_with_lora_where_no_block_input_needs_a_gradient(mode):
    """LoRA freezes the embedding, so the first block's input needs no gradient and only the
    adapters inside the block train: the recomputed piece must still be recorded."""
    plain = one_process(*LORA)
    assert losses(parallel_train(1, LORA + ["--recompute", mode])) == plain  # bit-identical
    got = losses(RUNS(4, LORA + ["--recompute", mode, "--tp", "2", "--sp", "--micro", "2"]))
    assert_same(got, plain, "float32", f"LoRA + {mode} recomputation, TP 2 + SP")


def test_a_parameter_used_inside_and_outside_a_recomputed_piece_is_accumulated_once():
    """Its gradient leaves the replay through the recomputation's node and is summed with the
    outside use: one accumulation, one post-accumulate hook call (DDP counts on it), the
    gradient of the plain run."""
    lin = nn.Linear(3, 3)
    x0 = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    seen = []
    lin.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.numpy().copy()))
    for recompute in (False, True):
        lin.zero_grad()
        x = it.from_numpy(x0.copy()).requires_grad_()
        h = checkpoint(lin, x) if recompute else lin(x)
        (lin(h).tanh() * 2).sum().backward()
    assert len(seen) == 2, f"{len(seen) - 1} hook calls with recomputation"
    np.testing.assert_array_equal(seen[1], seen[0])
