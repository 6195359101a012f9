"""The zero-bubble pipeline schedules (ZB-H1, ZBV): each backward split into its input part (B)
and its weight part (W, autograd's defer_weight_grads). On paper: free of deadlock, every pass
once, ZB-H1's bubble (P-1)(F+B-W) against 1F1B's (P-1)(F+B+W) with 1F1B's activation peak,
ZBV's lower still in the V placement; the refusals name the sizes. Under MPI: GPT-2 and
LLaMA-3 trained so give the one-process losses (fp32 1e-5, bf16 1e-2) alone and with DP,
TP + SP, ZeRO and recomputation."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain.autograd import defer_weight_grads
from infinitrain.models import gpt2
from infinitrain.profiler import profile
from infinitrain.nn import parallel
from infinitrain.nn.parallel.pp import PipelineParallel
from infinitrain.nn.parallel.pp import PipelineStage, chunk_layers, schedule, simulate
from infinitrain.nn.parallel.pp.p2p import links

from helpers import assert_same, losses, one_process, parallel_train

COMMON = ["--layers", "8", "--batch", "8", "--steps", "4", "--lr", "3e-3"]


def test_zb_h1_runs_every_pass_once_and_needs_a_third_of_1f1bs_bubble():
    for P in range(1, 9):
        for M in range(P, 17):
            simulate("zb-h1", P, 1, M)  # raises on a deadlock or a link out of order
    plan = schedule("zb-h1", 4, 1, 8, 1)
    assert sorted(plan) == sorted((k, m, 0) for k in "FBW" for m in range(8))
    assert all(plan.index(("B", m, 0)) < plan.index(("W", m, 0)) for m in range(8))
    # F = B = W: 1F1B idles (P-1)(F+B+W) per stage, ZB-H1 (P-1)(F+B-W)
    ofob, zb = simulate("1f1b", 4, 1, 8), simulate("zb-h1", 4, 1, 8, weight_cost=1.0)
    assert ofob["bubble"] == pytest.approx(9 / 33) and zb["bubble"] == pytest.approx(3 / 27)
    assert zb["bubble"] <= 0.41 * ofob["bubble"]
    # 1F1B's activations; a stage owes at most P W's (1F1B's stage 0 holds P micro-batches)
    assert zb["peak_in_flight"] == ofob["peak_in_flight"] == [4, 3, 2, 1]
    assert zb["peak_awaiting_w"] == [1, 2, 3, 4]


def test_simulate_takes_each_chunks_measured_pass_costs():
    # equal costs given per pass are the costs given as a whole
    for name, V in (("1f1b", 1), ("zb-h1", 1), ("zbv", 2)):
        whole = simulate(name, 2, V, 8, weight_cost=1.0)
        split = name in ("zb-h1", "zbv")
        per_pass = simulate(name, 2, V, 8, pass_costs=[{"F": 1 / V, "B": (1 if split else 2) / V,
                                                        "W": (1 if split else 0) / V}] * (2 * V))
        assert per_pass["time"] == pytest.approx(whole["time"])
        assert per_pass["stage_bubbles"] == pytest.approx(whole["stage_bubbles"])
    # a W as dear as the rest of the backward: ZB-H1's bubble (P-1)(F+B-W) is F's alone
    costs = [{"F": 1.0, "B": 1.0, "W": 1.0}, {"F": 1.0, "B": 1.0, "W": 1.0}]
    assert simulate("zb-h1", 2, 1, 8, pass_costs=costs)["time"] == pytest.approx(8 * 3 + 1)
    with pytest.raises(ValueError, match="pass_costs gives 1 chunks' costs, the pipeline has 2 x 1"):
        simulate("zb-h1", 2, 1, 8, pass_costs=costs[:1])


def test_zb_h1_on_one_stage_gives_1f1bs_gradient_bits_and_profiles_its_passes():
    """The engine's split backward on a whole model (a pipeline of one stage): B then W per
    micro-batch gives the bits of 1F1B's plain backward; a profile shows each pass."""
    it.manual_seed(0)
    model = gpt2("tiny", n_layer=2, vocab_size=64)
    data = np.random.default_rng(0).integers(0, 64, (4, 17))
    micro = [(it.from_numpy(data[m:m + 2, :-1].copy()), it.from_numpy(data[m:m + 2, 1:].copy())) for m in (0, 2)]
    grads = {}
    for name in ("1f1b", "zb-h1"):
        model.zero_grad()
        with profile() as prof:
            loss = PipelineParallel(model, name).forward_backward(micro)
        grads[name] = (loss, [p.grad.numpy().copy() for p in model.parameters()])
        calls = {r["name"]: r["calls"] for r in prof.key_averages() if r["category"] == "pipeline"}
        assert calls == ({"pipeline F": 2, "pipeline B": 2} | ({"pipeline W": 2} if name == "zb-h1" else {}))
    assert grads["1f1b"][0] == grads["zb-h1"][0]
    for a, b in zip(grads["1f1b"][1], grads["zb-h1"][1]):
        np.testing.assert_array_equal(a, b)


def test_a_norm_whose_w_waits_keeps_only_its_weights_gradients():
    """ZB-H1 promises 1F1B's memory: a micro-batch whose W waits keeps a product's input and
    output gradient, but of a norm (whose kernel gave the weights' gradients in B) nothing more."""
    ln, rms = it.nn.LayerNorm(256), it.nn.RMSNorm(256)
    x = it.randn(64, 256, requires_grad=True)
    for norm in (ln, rms):
        x.grad = None
        h = x * 2.0  # held by the norm alone
        loss = norm(h).sum()
        del h
        held = it.memory_stats()["allocated_bytes"]
        with defer_weight_grads() as deferred:
            loss.backward()
        # x.grad is made and h given back (kept until W, it would add its 64 kB)
        assert it.memory_stats()["allocated_bytes"] - held < 64 * 256 * 4 // 2
        assert norm.weight.grad is None
        deferred.backward_weight()
        assert norm.weight.grad is not None


def test_zbv_places_chunks_in_a_v_and_needs_less_bubble_than_zb_h1():
    class Group:
        def __init__(self, rank):
            self.rank, self.size = rank, 4
    stages = [PipelineStage(Group(s), 2, placement="v") for s in range(4)]
    assert [[st.global_chunk(v) for v in range(2)] for st in stages] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [st.is_last for st in stages] == [True, False, False, False]  # stage 0 holds both ends
    assert all(st.embedding_group is None for st in stages)
    # the head's work counts on stage 0, which holds the last chunk
    assert [len(c) for c in chunk_layers(9, 2, 2, head=3.0, placement="v")] == [3, 3, 2, 1]
    assert (3, 3, 0) not in links(4, 2, "v") and (0, 1, 0) in links(4, 2, "v") and (1, 0, 0) in links(4, 2, "v")
    for P in range(1, 7):
        for M in range(P, 13):
            simulate("zbv", P, 2, M)
    plan = schedule("zbv", 4, 2, 8, 2)
    assert sorted(plan) == sorted((k, m, v) for k in "FBW" for m in range(8) for v in range(2))
    zbv, zb = simulate("zbv", 4, 2, 8, weight_cost=1.0), simulate("zb-h1", 4, 1, 8, weight_cost=1.0)
    assert zbv["bubble"] < 0.6 * zb["bubble"], (zbv["bubble"], zb["bubble"])
    # 2P chunk activations: P micro-batches of a stage's whole part, 1F1B's stage-0 peak
    assert zbv["peak_in_flight"] == [8, 8, 8, 8] and max(zbv["peak_awaiting_w"]) <= 4


def test_zero_bubble_refusals_name_the_sizes():
    with pytest.raises(ValueError, match="needs at least as many micro-batches per step as pipeline stages: "
                                         "got 2 micro-batches for 4 stages"):
        schedule("zb-h1", 4, 1, 2, 0)
    with pytest.raises(ValueError, match="ZB-H1 runs one chunk per stage"):
        schedule("zb-h1", 4, 2, 8, 0)
    with pytest.raises(ValueError, match="ZBV places two chunks per stage in a V: it needs virtual pipeline "
                                         "parallel 2, got 3"):
        schedule("zbv", 4, 3, 8, 0)
    with pytest.raises(ValueError, match="got 3 micro-batches for 4 stages"):
        schedule("zbv", 4, 2, 3, 0)
    layout = parallel.Layout(4, pp=4)
    with pytest.raises(ValueError, match="--pipeline_schedule zbv places two chunks per stage in a V: it needs "
                                         "--virtual_pipeline_parallel 2, got 1"):
        parallel.ParallelPlan(layout, 0, pipeline_schedule="zbv")
    with pytest.raises(ValueError, match="zb-h1 runs one chunk per stage; with --virtual_pipeline_parallel 2"):
        parallel.ParallelPlan(layout, 0, virtual_pipeline_parallel=2, pipeline_schedule="zb-h1")


ZB = ["--schedule", "zb-h1"]
ZBV = ["--schedule", "zbv", "--vpp", "2"]
CASES = [  # (model, dtype, ranks, flags)
    ("gpt2", "float32", 2, ZB + ["--pp", "2", "--micro", "2"]),
    ("llama3", "float32", 4, ZB + ["--pp", "4", "--micro", "4"]),
    ("gpt2", "float32", 4, ZB + ["--pp", "2", "--micro", "2", "--zero", "2", "--recompute", "full"]),   # DP 2
    ("llama3", "bfloat16", 4, ZB + ["--tp", "2", "--sp", "--pp", "2", "--micro", "2", "--zero", "1"]),
    ("gpt2", "float32", 4, ZBV + ["--pp", "4", "--micro", "4"]),        # tied embedding: both ends on stage 0
    ("gpt2", "float32", 4, ZBV + ["--pp", "2", "--micro", "2", "--recompute", "full"]),   # DP 2: reducers
    ("llama3", "float32", 4, ZBV + ["--tp", "2", "--sp", "--pp", "2", "--micro", "2", "--zero", "2"]),
]


@pytest.mark.mpi
@pytest.mark.parametrize("model,dtype,n,flags", CASES, ids=[
    f"{m}-{d}-" + "-".join(x for x in f if x != "--schedule").replace("--", "") for m, d, _, f in CASES])
def test_zero_bubble_matches_one_process(model, dtype, n, flags):
    common = ["--model", model, "--dtype", dtype, *COMMON]
    got = losses(parallel_train(n, common + flags))
    assert_same(got, one_process(*common), dtype, f"{model} {dtype} {n} ranks {flags}")
