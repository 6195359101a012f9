"""The zero-bubble pipeline schedules (ZB-H1): each backward split into its input part (B) and
its weight part (W, autograd's defer_weight_grads). On paper: free of deadlock, every pass
once, the bubble (P-1)(F+B-W) against 1F1B's (P-1)(F+B+W) with 1F1B's activation peak; the
refusals name the sizes. Under MPI: GPT-2 and LLaMA-3 trained so give the one-process losses
(fp32 1e-5, bf16 1e-2) alone and with DP, TP + SP, ZeRO and recomputation."""
import pytest

from infinitrain.nn import parallel
from infinitrain.nn.parallel.pp import schedule, simulate

from helpers import assert_same, losses, one_process, parallel_train

COMMON = ["--layers", "4", "--batch", "8", "--steps", "4", "--lr", "3e-3"]


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


def test_zero_bubble_refusals_name_the_sizes():
    with pytest.raises(ValueError, match="needs at least as many micro-batches per step as pipeline stages: "
                                         "got 2 micro-batches for 4 stages"):
        schedule("zb-h1", 4, 1, 2, 0)
    with pytest.raises(ValueError, match="ZB-H1 runs one chunk per stage"):
        schedule("zb-h1", 4, 2, 8, 0)
    layout = parallel.Layout(4, pp=4)
    with pytest.raises(ValueError, match="zb-h1 runs one chunk per stage; with --virtual_pipeline_parallel 2"):
        parallel.ParallelPlan(layout, 0, virtual_pipeline_parallel=2, pipeline_schedule="zb-h1")


CASES = [  # (model, dtype, ranks, flags)
    ("gpt2", "float32", 2, ["--pp", "2", "--micro", "2"]),
    ("llama3", "float32", 4, ["--pp", "4", "--micro", "4"]),
    ("gpt2", "float32", 4, ["--pp", "2", "--micro", "2", "--zero", "2", "--recompute", "full"]),   # DP 2
    ("llama3", "float32", 4, ["--tp", "2", "--sp", "--pp", "2", "--micro", "2", "--zero", "1"]),
    ("llama3", "bfloat16", 4, ["--tp", "2", "--sp", "--pp", "2", "--micro", "2"]),
]


@pytest.mark.mpi
@pytest.mark.parametrize("model,dtype,n,flags", CASES,
                         ids=[f"{m}-{d}-" + "".join(f).replace("--", "-") for m, d, _, f in CASES])
def test_zb_h1_matches_one_process(model, dtype, n, flags):
    common = ["--model", model, "--dtype", dtype, *COMMON]
    got = losses(parallel_train(n, common + ["--schedule", "zb-h1", *flags]))
    assert_same(got, one_process(*common), dtype, f"{model} {dtype} ZB-H1 {n} ranks {flags}")
