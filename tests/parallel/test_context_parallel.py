"""Context parallelism against full attention and against one process: ring and all-gather
attention (head-tail and contiguous splits, grouped-query heads, a sequence length that is not
a power of two) equal full causal attention on the whole sequence; tiny GPT-2 and LLaMA-3
trained for 10 AdamW steps under CP alone and combined with DP, TP+SP, PP (interleaved too),
ZeRO-2/3, recomputation and LoRA print the one-process losses (fp32 within 1e-5 relative,
bf16 within 1e-2); a checkpoint written under CP2 x TP2 resumes at one process and at CP4."""
from types import SimpleNamespace

import numpy as np
import pytest

from infinitrain.nn.parallel import Layout
from infinitrain.nn.parallel.context_parallel import ContextParallel
from helpers import (MPI_SCRIPTS, BatchedRuns, assert_same, example, losses, mpirun, one_process, parallel_train,
                     parallel_train_runs)

LR = {"float32": "1e-2", "bfloat16": "3e-3"}


def reference(model, dtype="float32", *flags):
    return one_process("--model", model, "--dtype", dtype, "--lr", LR[dtype], *flags)


def test_the_layout_puts_cp_between_tp_and_dp():
    L = Layout(16, tp=2, cp=2, pp=2)
    assert L.dp == 2 and L.rank_of(tp=1, cp=1, dp=1, pp=1) == 15
    assert L.coords(6) == L.coords(6) and (L.coords(6).tp, L.coords(6).cp, L.coords(6).dp) == (0, 1, 1)
    assert L.all_groups("cp")[:2] == [(0, 2), (1, 3)]
    assert L.all_groups("dp_cp")[:2] == [(0, 2, 4, 6), (1, 3, 5, 7)]  # DP x CP reduces gradients
    assert L.all_groups("dp")[:2] == [(0, 4), (1, 5)]
    assert "CP=2" in L.describe()
    with pytest.raises(ValueError, match="context parallel 4"):
        Layout(8, tp=4, cp=4)


def test_the_head_tail_split_balances_causal_work():
    cp = ContextParallel(SimpleNamespace(size=4, rank=0))
    assert [cp.chunks(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    work = [sum(i + 1 for i in cp.chunks(r)) for r in range(4)]  # key chunks each rank's queries see
    assert len(set(work)) == 1
    contiguous = ContextParallel(SimpleNamespace(size=4, rank=0), balanced=False)
    assert [sum(i + 1 for i in contiguous.chunks(r)) for r in range(4)] == [1, 2, 3, 4]
    np.testing.assert_array_equal(ContextParallel(SimpleNamespace(size=2, rank=1)).positions(12, "cpu").numpy(),
                                  [3, 4, 5, 6, 7, 8])


def test_impossible_sizes_are_refused_with_the_sizes():
    from infinitrain.models import GPT2, GPT2Config
    cp = ContextParallel(SimpleNamespace(size=2, rank=0))
    with pytest.raises(ValueError, match="sequence length 6 must be a multiple of 4"):
        cp.check_sequence(6)
    with pytest.raises(ValueError, match=r"tensor parallel 4 \(sequence parallelism\): the sequence length 12 "
                                         "must be a multiple of 8"):
        cp.check_sequence(12, tp_multiple=4)  # 6 tokens per CP rank do not split over TP 4
    with pytest.raises(ValueError, match="communication must be one of"):
        ContextParallel(SimpleNamespace(size=2, rank=0), comm_type="ulysses")
    model = GPT2(GPT2Config(block_size=16, vocab_size=50, n_layer=1, n_head=2, n_embd=8), cp=cp)
    import infinitrain as it
    with pytest.raises(ValueError, match="context parallel 2 splits each sequence into 4 equal chunks"):
        model.check_batch(it.zeros(1, 10, dtype=it.int64))


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4])
def test_ring_all_gather_and_all_to_all_attention_equal_full_attention(n):
    out = mpirun(n, [str(MPI_SCRIPTS / "cp_attention.py")])
    assert out.count(" OK") == n, out


CASES = [  # (ranks, flags)
    (2, ["--cp", "2"]),
    (4, ["--cp", "4"]),
    (2, ["--cp", "2", "--cp_comm", "all_gather"]),
    (4, ["--cp", "2", "--tp", "2", "--sp"]),
    (4, ["--cp", "2"]),                                        # DP 2
    (4, ["--cp", "2", "--pp", "2", "--micro", "2"]),
    (4, ["--cp", "2", "--pp", "2", "--vpp", "2", "--layers", "4", "--micro", "2"]),
    (8, ["--cp", "2", "--tp", "2"]),                           # DP 2
    (2, ["--cp", "2", "--zero", "1"]),
    (2, ["--cp", "2", "--zero", "2", "--micro", "2"]),
    (4, ["--cp", "2", "--zero", "3"]),                         # DP 2
    (2, ["--cp", "2", "--recompute", "full"]),
]
# CP's layouts on both models; what ZeRO and recomputation add to CP is the same code for both:
# those rows run on one model each, alternating
ONE_MODEL = {("--zero", "1"): "gpt2", ("--zero", "2"): "llama3", ("--zero", "3"): "gpt2",
             ("--recompute", "full"): "llama3"}
FP32_RUNS = [(m, n, f) for n, f in CASES for m in ("gpt2", "llama3")
             if ONE_MODEL.get(tuple(f[2:4]), m) == m]


@pytest.mark.mpi
@pytest.mark.parametrize("model,n,flags", FP32_RUNS,
                         ids=[f"{n}ranks{''.join(f)}-{m}".replace("--", "-") for m, n, f in FP32_RUNS])
def test_context_parallel_fp32_matches_one_process(model, n, flags):
    extra = ["--layers", flags[flags.index("--layers") + 1]] if "--layers" in flags else []
    got = losses(RUNS(n, _fp32(model, flags)))
    assert_same(got, reference(model, "float32", *extra), "float32", f"{model} {n} ranks {flags}")


A2A_CASES = [  # all-to-all attention (DeepSpeed-Ulysses): the heads split over CP inside attention.
    # The layouts are the ring's (both models each, above); the all-to-all is the same code for
    # both models but for the heads it splits: both models at CP 2, then each layout one model
    (2, ["--cp", "2"], "gpt2"),
    (2, ["--cp", "2"], "llama3"),
    (4, ["--cp", "4"], "llama3"),                              # LLaMA's 4 KV heads: one each
    (4, ["--cp", "4"], "gpt2"),
    (4, ["--cp", "2", "--tp", "2", "--sp"], "gpt2"),
    (4, ["--cp", "2", "--pp", "2", "--micro", "2"], "llama3"),
    (2, ["--cp", "2", "--zero", "2", "--micro", "2"], "gpt2"),
    (4, ["--cp", "4", "--cp_comm", "a2a+p2p", "--cp_a2a_size", "2"], "llama3"),   # all-to-all in pairs, a ring of 2
]


@pytest.mark.mpi
@pytest.mark.parametrize("n,flags,model", A2A_CASES,
                         ids=[f"{n}ranks{''.join(f)}-{m}".replace("--", "-") for n, f, m in A2A_CASES])
def test_all_to_all_context_parallel_matches_one_process(model, n, flags):
    got = losses(RUNS(n, _a2a(model, flags)))
    assert_same(got, reference(model, "float32"), "float32", f"{model} {n} ranks a2a {flags}")


BF16_CASES = [(2, ["--cp", "2"]), (4, ["--cp", "2", "--tp", "2", "--sp"]), (2, ["--cp", "2", "--cp_comm", "a2a"])]


def _fp32(model, flags):
    return ["--model", model, "--lr", LR["float32"], *flags]


def _a2a(model, flags):
    return ["--model", model, "--lr", LR["float32"], "--cp_comm", "a2a", *flags]


def _bf16(model, flags):
    return ["--model", model, "--dtype", "bfloat16", "--lr", LR["bfloat16"], *flags]


def _lora(model):
    return ["--model", model, "--lora", "4", "--steps", "5", "--lr", LR["float32"]]


# every layout above and below run as one job per rank count (the first test of each count starts it)
RUNS = BatchedRuns([(n, _fp32(m, f)) for m, n, f in FP32_RUNS] + [(n, _a2a(m, f)) for n, f, m in A2A_CASES]
                   + [(n, _bf16(m, f)) for m in ("gpt2", "llama3") for n, f in BF16_CASES]
                   + [(2, _lora(m) + ["--cp", "2"]) for m in ("gpt2", "llama3")])


def test_the_hybrids_all_to_all_groups_are_one_nodes_cp_ranks_unless_sized():
    from infinitrain.nn.parallel import Layout, ParallelPlan

    class Env:  # what the plan reads of a job's environment
        def __init__(self, world, local_size, **sizes):
            self.layout, self.rank, self.local_size, self.device = Layout(world, **sizes), 0, local_size, None
    assert ParallelPlan(Env(8, 8, cp=8), cp_comm="a2a+p2p").a2a_size == 8
    assert ParallelPlan(Env(16, 4, cp=8, tp=2), cp_comm="a2a+p2p").a2a_size == 2   # 4 ranks a node, TP 2
    assert ParallelPlan(Env(8, 8, cp=8), cp_comm="a2a+p2p", cp_a2a_size=4).a2a_size == 4
    with pytest.raises(ValueError, match="--cp_a2a_size 3 must divide --context_parallel 8"):
        ParallelPlan(Env(8, 8, cp=8), cp_comm="a2a+p2p", cp_a2a_size=3)
    with pytest.raises(ValueError, match="--cp_a2a_size sizes the all-to-all groups of --cp_comm a2a"):
        ParallelPlan(Env(8, 8, cp=8), cp_comm="a2a", cp_a2a_size=4)


def test_all_to_all_refuses_heads_that_do_not_split():
    from infinitrain.nn.parallel.context_parallel.a2a_attention import head_ranges
    with pytest.raises(ValueError, match=r"6 query heads must be a multiple of 4"):
        head_ranges(6, 6, 4)
    with pytest.raises(ValueError, match=r"its 6 key/value heads a multiple or a divisor of it"):
        head_ranges(12, 6, 4)
    q, kv = head_ranges(8, 2, 4)  # fewer K/V heads than ranks: each goes to two
    assert [list(r) for r in kv] == [[0], [0], [1], [1]] and [list(r) for r in q][1] == [2, 3]


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
@pytest.mark.parametrize("n,flags", BF16_CASES, ids=["cp2", "cp2-tp2sp", "cp2-a2a"])
def test_context_parallel_bf16_matches_one_process(model, n, flags):
    got = losses(RUNS(n, _bf16(model, flags)))
    assert_same(got, reference(model, "bfloat16"), "bfloat16", f"{model} bf16 {n} ranks {flags}")


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_lora_under_context_parallelism_matches_one_process(model):
    common = _lora(model)
    assert_same(losses(RUNS(2, common + ["--cp", "2"])), losses(parallel_train(1, common)),
                "float32", f"{model} LoRA CP 2")


@pytest.mark.mpi
def test_a_cp2_tp2_checkpoint_resumes_at_one_process_and_at_cp4(tmp_path):
    """And the other way: one process's checkpoint resumes at CP2 x DP2."""
    common = ["--model", "llama3", "--lr", LR["float32"], "--seq", "32"]
    whole = losses(parallel_train(1, common))[0][::2]
    parallel_train(1, common + ["--steps", "5", "--save", str(tmp_path / "one")])
    resume = ["--load", str(tmp_path / "ck"), "--first", "6"]
    # saved and resumed in one job of 4 ranks: each run starts when the one before has finished
    _, at_cp4, from_one = parallel_train_runs(4, [
        common + ["--cp", "2", "--tp", "2", "--sp", "--steps", "5", "--save", str(tmp_path / "ck")],
        common + ["--cp", "4"] + resume,
        common + ["--cp", "2", "--load", str(tmp_path / "one"), "--first", "6"]])
    at_one = parallel_train(1, common + resume)
    for out, what in ((at_one, "1 rank from ck"), (at_cp4, "CP 4 from ck"), (from_one, "CP 2 x DP 2 from one")):
        np.testing.assert_allclose(losses(out)[0][::2], whole[5:], rtol=1e-5, atol=0, err_msg=what)


@pytest.mark.mpi
def test_the_example_refuses_a_sequence_cp_cannot_split():
    out = example(2, "gpt2", ["--model", "tiny", "--context_parallel", "2", "--sequence_length", "30",
                              "--batch_size", "1", "--num_iteration", "1"], check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert "--sequence_length 30: context parallel 2 splits each sequence into 4 equal chunks" in out.stderr, out.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["llama3"])
def test_the_example_trains_validates_and_samples_under_4d_parallelism(model):
    """The front door at CP2 x TP2 (+SP) x PP2 on 8 ranks, with validation and sampling: the
    one-process losses, validation losses and samples, and CP in the log line. (GPT-2's example
    runs DP x TP x PP in tests/parallel/test_distributed.py; both models run every CP layout
    through parallel_train above.)"""
    import re
    from infinitrain.plot import parse_log
    args = ["--model", "tiny", "--batch_size", "2", "--sequence_length", "64", "--num_iteration", "4",
            "--val_loss_every", "2", "--val_max_steps", "2", "--sample_every", "4", "--sample_length", "8",
            "--total_batch_size", "256", "--learning_rate", "1e-3"]
    one = example(1, model, args)
    four_d = example(8, model, args + ["--context_parallel", "2", "--tensor_parallel", "2", "--sequence_parallel",
                                       "--pipeline_parallel", "2"])
    assert "DP=1, TP=2, SP=2, PP=2, CP=2" in four_d
    a, b = parse_log(one), parse_log(four_d)
    np.testing.assert_allclose([v for _, v in b["train"]], [v for _, v in a["train"]], rtol=1e-5)
    np.testing.assert_allclose([v for _, v in b["val"]], [v for _, v in a["val"]], rtol=1e-5)
    samples = [re.findall(r"---- sample ----\n(.*?)\n----", out, re.S) for out in (one, four_d)]
    assert samples[0] and samples[0] == samples[1], samples


@pytest.mark.mpi
def test_the_profiler_and_the_precision_checker_run_under_cp(tmp_path):
    out = example(2, "gpt2", ["--model", "tiny", "--context_parallel", "2", "--sequence_length", "32",
                              "--batch_size", "1", "--num_iteration", "3", "--profile_steps", "1",
                              "--profile", str(tmp_path / "trace.json"),
                              "--precision_check", f"level=1,output_path={tmp_path / 'check'}"])
    assert "RingAttention" in out and (tmp_path / "trace.json").stat().st_size > 0
    assert out.count("no NaN/Inf") == 2, out
