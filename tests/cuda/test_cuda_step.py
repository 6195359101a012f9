"""The GPU step's pieces outside attention (issue 53): the PyTorch benchmark model on any
device, the embedding backward, the bf16 weight copies made once per step, the profiler's GPU
time and the AdamW launch. The GPU tests run on a real GPU or on the emulated one
(tests/cuda/test_cuda_emulated.py); the rest run anywhere."""
import sys
from pathlib import Path

import numpy as np
import pytest

import infinitrain as it

pytestmark = pytest.mark.cuda

GPU = it.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA device on this machine")
BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


def test_the_pytorch_gpt2_takes_its_positions_on_the_inputs_device():
    """benchmarks/torch_gpt2.py on a GPU: positions built on the CPU would meet a CUDA table.
    The meta device stands in for the GPU here: it computes nothing, so only the device seen
    by the position table is checked."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(BENCHMARKS))
    from torch_gpt2 import TorchGPT2
    model = TorchGPT2(1, 2, 8, 16, 8, 16).to("meta")
    seen = []
    model.transformer.wpe.register_forward_pre_hook(lambda _, args: seen.append(args[0].device))
    idx = torch.zeros(2, 4, dtype=torch.long, device="meta")
    model(idx, idx)
    assert seen == [idx.device]


# ---- on a GPU ------------------------------------------------------------------------------
def _bits(t):
    return t.detach().cpu().float().numpy()


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows,index_dtype", [(7, "int64"), (300, "int32"), (1, "int64")],
                         ids=["repeats", "spread", "one-row"])
def test_the_embedding_gradient_has_the_cpus_bits(dtype, rows, index_dtype):
    """Each table row's incoming rows added in token order as on the CPU, onto the gradient a
    previous backward left (a table used twice, as GPT-2's wte is by the head): the same bits,
    repeats (most ids many times, the GPT-2 position table's case) or not."""
    rng = np.random.default_rng(rows)
    ids = it.from_numpy(rng.integers(0, rows, (5, 67)).astype(index_dtype))
    table = rng.standard_normal((rows, 40)).astype(np.float32)
    upstream = rng.standard_normal((5, 67, 40)).astype(np.float32)
    grads = []
    for device in ("cpu", "cuda"):
        w = it.from_numpy(table).to(dtype).to(device).requires_grad_()
        for scale in (1.0, 0.5):  # the second backward adds onto the first's gradient
            dout = (it.from_numpy(upstream) * scale).to(dtype).to(device)
            (it.nn.functional.embedding(ids.to(device), w) * dout).sum().backward()
        grads.append(_bits(w.grad))
    np.testing.assert_array_equal(grads[1], grads[0])


@needs_gpu
def test_the_embedding_gradient_skips_no_token_at_a_gpt2_size():
    """Every token once, then every token of a batch of GPT-2's position table: the sums are the
    plain loop's (integers, exact in float32)."""
    n, cols = 4 * 64, 24
    ids = it.from_numpy(np.tile(np.arange(64), 4))
    w = it.zeros(64, cols, device="cuda").requires_grad_()
    dout = it.from_numpy(np.repeat(np.arange(n, dtype=np.float32)[:, None], cols, 1)).to("cuda")
    (it.nn.functional.embedding(ids.to("cuda"), w) * dout).sum().backward()
    expected = np.arange(n, dtype=np.float32).reshape(4, 64).sum(0)
    np.testing.assert_array_equal(_bits(w.grad), np.repeat(expected[:, None], cols, 1))


def _cast_kernels(fn):
    import infinitrain.profiler as profiler
    with profiler.profile() as prof:
        out = fn()
    return out, sum(1 for name, cat, *_ in prof.events if cat == "kernel" and name == "convert")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_a_parameter_is_cast_once_per_autocast_region_with_the_same_bits(device):
    """PyTorch's autocast cache: a weight used three times in a region is cast to bfloat16 once
    (cache_enabled=False: three times), with the same loss and gradients; a write to the weight
    inside the region makes a new copy; the next region casts afresh."""
    from infinitrain import nn
    it.manual_seed(0)
    layer = nn.Linear(16, 16).to(device)
    x = it.randn(4, 16).to(device)

    def step(cache):
        layer.zero_grad()
        with it.autocast(device, dtype=it.bfloat16, cache_enabled=cache):
            loss = layer(layer(layer(x))).float().square().mean()
        loss.backward()
        return [_bits(t) for t in (loss, layer.weight.grad, layer.bias.grad)]

    hits = it.amp.cast_cache_hits[0]
    cached, casts_cached = _cast_kernels(lambda: step(True))
    assert it.amp.cast_cache_hits[0] - hits == 4  # weight and bias, second and third use
    plain, casts_plain = _cast_kernels(lambda: step(False))
    assert casts_plain - casts_cached == 4
    for a, b in zip(cached, plain):
        np.testing.assert_array_equal(a, b)
    with it.autocast(device, dtype=it.bfloat16):
        first = layer(x)
        with it.no_grad():
            layer.weight.mul_(2)  # written in the region: the old copy is stale
        second = layer(x)
    assert not np.array_equal(_bits(first), _bits(second))
    with it.autocast(device, dtype=it.bfloat16):
        np.testing.assert_array_equal(_bits(layer(x)), _bits(second))
    assert it.amp._state.cache is None  # emptied when the region ended


def test_cpu_events_carry_no_time_and_untimed_events_cannot_be_timed():
    from infinitrain._native import ffi, lib
    cpu = ffi.new("it_device *", [lib.IT_CPU, 0])[0]
    timed, plain = ffi.new("it_event **"), ffi.new("it_event **")
    assert lib.it_event_create_timing(cpu, timed) == lib.IT_OK and lib.it_event_create(cpu, plain) == lib.IT_OK
    ms = ffi.new("float *")
    assert lib.it_event_elapsed_time(timed[0], timed[0], ms) == lib.IT_ERR_NOT_SUPPORTED
    assert lib.it_event_elapsed_time(plain[0], timed[0], ms) == lib.IT_ERR_INVALID_ARGUMENT
    assert "it_event_create_timing" in ffi.string(lib.it_last_error()).decode()
    assert lib.it_event_destroy(timed[0]) == lib.IT_OK and lib.it_event_destroy(plain[0]) == lib.IT_OK


def _profiled_step(on, **kwargs):
    import infinitrain.profiler as profiler
    from infinitrain import nn
    it.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)).to(on)
    x = it.randn(3, 8).to(on)
    with profiler.profile(**kwargs) as prof:
        model(x).square().mean().backward()
    return prof


def test_the_profiler_on_the_host_alone_has_no_gpu_columns():
    prof = _profiled_step("cpu", device="cpu")
    assert "GPU ms" not in prof.table() and prof.gpu_busy_ns is None
    assert all(r["gpu_ns"] == 0 for r in prof.key_averages())


@needs_gpu
def test_the_profiler_times_every_span_on_the_gpu(tmp_path):
    """A CUDA event pair around every op, backward and kernel (the emulated GPU's clock stands
    still: there the times are 0, the plumbing is what is checked); the table's GPU column, the
    GPU's busy share under it, the kernels on a GPU track of the Chrome trace; the events are
    reused by the next profiling window."""
    import json
    prof = _profiled_step("cuda")
    kernels = [i for i, e in enumerate(prof.events) if e[1] == "kernel"]
    assert kernels and set(kernels) <= set(prof.gpu_spans)
    assert {prof.events[i][1] for i in prof.gpu_spans} >= {"op", "backward", "kernel"}
    assert all(0 <= t0 <= t1 for t0, t1 in prof.gpu_spans.values())
    table = prof.table(sort_by="gpu")
    assert "GPU ms" in table.splitlines()[0] and "GPU (cuda:0) busy with these kernels" in table
    assert 0 <= prof.gpu_busy_ns and all(r["gpu_ns"] >= 0 for r in prof.key_averages())
    prof.export_chrome_trace(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert sum(e.get("cat") == "gpu" for e in trace) == len(kernels)
    clock = prof._clock
    assert not clock.used and len(clock.free) == 2 * len(prof.gpu_spans) + 1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_adamw_steps_all_parameters_in_one_call_with_each_ones_bits(device, dtype):
    """AdamW's step: one multi-tensor update per (device, dtype, step count) of a group, each
    parameter's result the bits of the one-tensor kernel; a parameter that joined later (a
    smaller step count) is stepped in its own call."""
    import infinitrain.profiler as profiler
    from infinitrain.kernels import optim as kopt
    rng = np.random.default_rng(1)
    shapes = [(7, 5), (3000,), (1,), (4, 33, 9)]
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    params = [it.from_numpy(v).to(dtype).to(device).requires_grad_() for v in values]
    opt = it.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ref = [it.from_numpy(v).to(dtype).to(device) for v in values]
    moments = [(it.zeros(*s, device=device), it.zeros(*s, device=device)) for s in shapes]
    for step, gs in enumerate(grads, 1):
        late = step == 1  # the last parameter gets no gradient on the first step
        for k, (p, g) in enumerate(zip(params, gs)):
            p.grad = None if late and k == len(params) - 1 else it.from_numpy(g).to(dtype).to(device)
        with profiler.profile(device="cpu") as prof:
            opt.step()
        calls = [e[0] for e in prof.events if e[1] == "kernel" and e[0].startswith("adamw")]
        assert calls == ["adamw_step_multi"] * (2 if step > 1 else 1), calls
        for k, (r, g) in enumerate(zip(ref, gs)):
            if late and k == len(params) - 1:
                continue
            kstep = step - 1 if k == len(params) - 1 else step
            kopt.adamw_step(r, it.from_numpy(g).to(dtype).to(device), *moments[k], lr=1e-2, beta1=0.9, beta2=0.95,
                            eps=1e-8, weight_decay=0.1, step=kstep)
        for p, r in zip(params, ref):
            np.testing.assert_array_equal(_bits(p), _bits(r))
