"""Pipeline parallelism against one process. The stage split and the schedules are checked on
paper (every schedule free of deadlock for P <= 8, V <= 4, M <= 16; 1F1B holding fewer
micro-batches than GPipe); stage models against the whole model's initial weights; then tiny
GPT-2 and LLaMA-3 with 8 layers trained under PP 2, 4, 8, PP4 x V2 with M in {1, 2, 4, 8}
(M < P included), TP2+SP+PP2+V2 and DP2 x TP2 x PP2 with clipping, fp32 and bf16: the
per-step losses equal the one-process losses on the same global batch (fp32 within 1e-5
relative, bf16 within 1e-2), and the three schedules agree with each other within 1e-6. A
checkpoint written by DP2 x TP2 x PP2 resumes under that layout, one process, TP4 x DP2 and
PP4 x V2."""
import re

import numpy as np
import pytest

from infinitrain.plot import RANK0_PREFIX

import infinitrain as it
from infinitrain.models import GPT2Config, LLaMA3Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.models.llama3 import LLaMA3
from infinitrain.nn.parallel.pp import PipelineStage, chunk_layers, schedule, simulate

from helpers import BatchedRuns, assert_same, losses, one_process, parallel_train, parallel_train_runs, write_llmc

LAYERS = ["--layers", "8", "--batch", "8", "--steps", "6"]
# 8 layers at lr 1e-2 already amplify round-off chaotically (TP 2 alone drifts by 4e-5 in 6
# steps): both dtypes use 3e-3, where any two layouts agree to ~1e-7 and the loss still falls
LR = {"float32": "3e-3", "bfloat16": "3e-3"}


def reference(model, dtype, *flags):
    return one_process("--model", model, "--dtype", dtype, "--lr", LR[dtype], *LAYERS, *flags)


# ---- on paper ---------------------------------------------------------------------------------

def test_stage_split_is_contiguous_with_the_remainder_first():
    assert chunk_layers(8, 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert chunk_layers(8, 4, 2) == [[i] for i in range(8)]
    assert chunk_layers(10, 2, 2) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    with pytest.raises(ValueError, match="cannot fill pipeline parallel 4 x virtual 2"):
        chunk_layers(6, 4, 2)


class _Group:  # a stand-in for a process group where no communication happens
    def __init__(self, rank, size):
        self.rank, self.size, self.ranks = rank, size, list(range(size))


def test_a_balanced_split_gives_the_stage_with_the_head_fewer_blocks():
    """GPT-2 124M's head is 5.5 blocks' worth (50304 x 768 against 12 x 768^2): the busiest stage
    does as little as any split allows, at least one block per chunk."""
    from infinitrain.models import GPT2_PRESETS

    def work(chunks, P, head):
        stages = [0.0] * P
        for g, c in enumerate(chunks):
            stages[g % P] += len(c)
        stages[-1] += head
        return max(stages)
    head = GPT2.head_work(GPT2_PRESETS["gpt2"])
    assert head == pytest.approx(50304 * 768 / (12 * 768 ** 2))
    assert [len(c) for c in chunk_layers(12, 2, head=head)] == [9, 3]
    assert [len(c) for c in chunk_layers(12, 4, head=head)] == [4, 4, 3, 1]
    assert [len(c) for c in chunk_layers(4, 2, head=100.0)] == [3, 1]  # one block at least
    assert chunk_layers(8, 3, head=0.0) == chunk_layers(8, 3)  # nothing to balance: even
    for L, P, V in ((12, 2, 1), (12, 4, 1), (24, 4, 2), (48, 8, 1), (7, 3, 1)):
        best = chunk_layers(L, P, V, head)
        assert sum(map(len, best)) == L and work(best, P, head) <= work(chunk_layers(L, P, V), P, head)
    cfg = GPT2Config(block_size=32, vocab_size=300, n_layer=6, n_head=2, n_embd=16)  # head ~2 blocks
    parts = [GPT2(cfg, seed=1, pp=PipelineStage(_Group(s, 2))).stage_layers for s in range(2)]
    assert parts == [[[0, 1, 2, 3]], [[4, 5]]]
    assert [GPT2(cfg, seed=1, pp=PipelineStage(_Group(s, 2), split="even")).stage_layers for s in range(2)] == \
        [[[0, 1, 2]], [[3, 4, 5]]]
    with pytest.raises(ValueError, match="'balanced' or 'even'"):
        PipelineStage(_Group(0, 2), split="uneven")


def test_schedules_are_free_of_deadlock_and_1f1b_holds_less():
    for P in range(1, 9):
        for M in range(1, 17):
            simulate("1f1b", P, 1, M)
            for V in (1, 2, 3, 4):
                simulate("gpipe", P, V, M)
                if V > 1:
                    simulate("interleaved", P, V, M)
    # each stage runs every pass of every (micro-batch, chunk) once
    plan = schedule("interleaved", 4, 2, 5, 1)
    assert sorted(plan) == sorted((k, m, v) for k in "FB" for m in range(5) for v in range(2))
    # 1F1B: warm-up P - s - 1 forwards, then alternate
    assert [a.kind for a in schedule("1f1b", 4, 1, 6, 1)] == list("FFFBFBFBFBBB")
    # bubble (P - 1) / (M + P - 1) for GPipe and 1F1B, less when interleaved
    assert simulate("1f1b", 4, 1, 8)["bubble"] == pytest.approx(3 / 11)
    assert simulate("interleaved", 4, 2, 8)["bubble"] == pytest.approx(3 / 19)
    # an uneven split: the last stage does 3 times the first's work and sets the pace (by hand:
    # stage 1 waits only for the first forward, stage 0 finishes the last backward after it)
    uneven = simulate("1f1b", 2, 1, 4, chunk_work=[1, 3])
    assert uneven["time"] == 39 and uneven["stage_bubbles"] == pytest.approx([27 / 39, 3 / 39])
    assert uneven["bubble"] == pytest.approx(30 / 78)
    assert simulate("interleaved", 4, 2, 8, chunk_work=[0.5] * 8)["bubble"] == pytest.approx(3 / 19)
    with pytest.raises(ValueError, match="chunk_work gives 3 chunks' work, the pipeline has 2 x 1"):
        simulate("1f1b", 2, 1, 4, chunk_work=[1, 1, 1])
    for P, M in ((2, 4), (4, 8), (8, 16)):
        gpipe, ofob = simulate("gpipe", P, 1, M), simulate("1f1b", P, 1, M)
        assert gpipe["peak_in_flight"][0] == M and ofob["peak_in_flight"][0] == P
    with pytest.raises(ValueError, match="needs virtual pipeline parallel >= 2"):
        schedule("interleaved", 4, 1, 4, 0)
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        schedule("zero-bubble", 4, 1, 4, 0)


def test_messages_pair_by_order_on_every_link():
    """The engine's messages carry only their direction (NCCL has no tags): every schedule must
    send each neighbour its activations and gradients in the order the neighbour takes them,
    and the check must catch a schedule that does not."""
    from infinitrain.nn.parallel.pp.schedules import Action, _check_link_order
    for P in range(2, 9):
        for M in range(1, 25):
            simulate("1f1b", P, 1, M)
            for V in (2, 3):
                simulate("gpipe", P, V, M)
                simulate("interleaved", P, V, M)
    good = [schedule("1f1b", 2, 1, 2, s) for s in range(2)]
    _check_link_order("1f1b", good, 2, 1)
    swapped = [good[0], [Action("F", 1, 0), Action("F", 0, 0), Action("B", 0, 0), Action("B", 1, 0)]]
    with pytest.raises(RuntimeError, match=r"stage 0 sends stage 1 its activations .* in the order "
                                           r"\[\(0, 1\), \(1, 1\)\], which it receives as \[\(1, 1\), \(0, 1\)\]"):
        _check_link_order("1f1b", swapped, 2, 1)


@pytest.mark.parametrize("seed", [3, None], ids=["own-generator", "default-generator"])
@pytest.mark.parametrize("cls", [GPT2, LLaMA3])
def test_every_stage_holds_the_whole_models_weights(cls, seed):
    """Each stage's part, built alone, starts with exactly the one-process weights of the same
    names (drawn in one process's order) and leaves the default generator where one process
    does: uneven split of 5 layers over 2 stages x 2 chunks."""
    if cls is GPT2:
        cfg = GPT2Config(block_size=32, vocab_size=300, n_layer=5, n_head=2, n_embd=16)
    else:
        cfg = LLaMA3Config(block_size=32, vocab_size=300, n_layer=5, n_head=4, n_kv_head=2, n_embd=16,
                           ffn_dim_multiplier=None, multiple_of=16, rope_theta=10000.0)
    it.manual_seed(11)
    whole = dict(cls(cfg, seed=seed).state_dict())
    after = it.random.default_generator.get_state()
    seen = set()
    for s in range(2):
        it.manual_seed(11)
        part = cls(cfg, seed=seed, pp=PipelineStage(_Group(s, 2), virtual=2, split="even"))
        assert it.random.default_generator.get_state() == after
        assert part.stage_layers == [[0, 1], [3]] if s == 0 else [[2], [4]]
        for name, t in part.state_dict().items():
            np.testing.assert_array_equal(t.numpy(), whole[name].numpy(), err_msg=name)
            seen.add(name)
        with pytest.raises(RuntimeError, match="run it through"):
            part(it.tensor([[1, 2]]))
    assert seen == set(whole)


# ---- trained under MPI against one process ----------------------------------------------------

FP32_CASES = [  # (ranks, flags); micro-batches M per DP rank
    (2, ["--pp", "2", "--micro", "1"]),
    (3, ["--pp", "3", "--micro", "4"]),                      # 8 layers on 3 stages: 3, 3, 2
    (4, ["--pp", "4", "--micro", "2"]),                      # M < P
    (8, ["--pp", "8", "--micro", "8"]),
    (4, ["--pp", "4", "--vpp", "2", "--micro", "2"]),        # interleaved with M < P
    (8, ["--tp", "2", "--sp", "--pp", "2", "--vpp", "2", "--micro", "2"]),   # DP 2
    (8, ["--tp", "2", "--pp", "2", "--micro", "4", "--clip", "0.3"]),         # DP 2, clipping
]


BF16_CASES = [(8, ["--pp", "8", "--micro", "4"]), (4, ["--pp", "4", "--vpp", "2", "--micro", "2"]),
              (8, ["--tp", "2", "--sp", "--pp", "2", "--vpp", "2", "--micro", "2"])]


def _run(model, dtype, flags):
    return ["--model", model, "--dtype", dtype, "--lr", LR[dtype], *LAYERS, *flags]


# every layout of the two tests below run as one job per rank count (the first test of each count starts it)
RUNS = BatchedRuns([(n, _run(m, "float32", f)) for n, f in FP32_CASES for m in ("gpt2", "llama3")]
                   + [(n, _run(m, "bfloat16", f)) for n, f in BF16_CASES for m in ("gpt2", "llama3")])


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
@pytest.mark.parametrize("n,flags", FP32_CASES, ids=["".join(f).replace("--", "-") for _, f in FP32_CASES])
def test_pipeline_fp32_matches_one_process(model, n, flags):
    ref_flags = ["--clip", flags[flags.index("--clip") + 1]] if "--clip" in flags else []
    got = losses(RUNS(n, _run(model, "float32", flags)))
    assert_same(got, reference(model, "float32", *ref_flags), "float32", f"{model} {n} ranks {flags}")


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
@pytest.mark.parametrize("n,flags", BF16_CASES, ids=["pp8", "pp4-vpp2", "tp2sp-pp2-vpp2-dp2"])
def test_pipeline_bf16_matches_one_process(model, n, flags):
    got = losses(RUNS(n, _run(model, "bfloat16", flags)))
    assert_same(got, reference(model, "bfloat16"), "bfloat16", f"{model} bf16 {n} ranks {flags}")


@pytest.mark.mpi
def test_the_three_schedules_agree_and_1f1b_holds_fewer_activations():
    """GPipe, 1F1B and interleaved 1F1B on PP 2 with M = 8 >= 2P micro-batches: the same losses
    within 1e-6; on the first stage 1F1B's activation peak is below GPipe's."""
    common = ["--layers", "4", "--batch", "16", "--seq", "64", "--steps", "3", "--pp", "2", "--micro", "8"]
    schedules = ("gpipe", "1f1b", "interleaved")
    out = dict(zip(schedules, parallel_train_runs(2, [common + ["--schedule", s] + ["--vpp", "2"] * (s == "interleaved")
                                                      for s in schedules])))
    got = {s: losses(o)[0][::2] for s, o in out.items()}
    peak = {s: int(re.search(rf"^{RANK0_PREFIX}activation_peak (\d+)$", o, re.M).group(1)) for s, o in out.items()}
    print("losses", got, "\nstage-0 activation peak (bytes)", peak)
    for s in ("1f1b", "interleaved"):
        np.testing.assert_allclose(got[s], got["gpipe"], rtol=1e-6, atol=0)
    assert peak["1f1b"] < peak["gpipe"], peak


@pytest.mark.mpi
def test_sent_outputs_give_their_memory_back_and_change_no_bit():
    """GPipe on PP 2 with 8 micro-batches: the first stage holds all 8 outputs until their
    backward; freeing each once it is sent (deallocate_pipeline_outputs) lowers its activation
    peak by about 7 of them and leaves every loss, norm and parameter bit-identical."""
    common = ["--layers", "4", "--embd", "64", "--batch", "16", "--seq", "64", "--steps", "3", "--pp", "2",
              "--micro", "8", "--schedule", "gpipe"]
    freed, kept = parallel_train_runs(2, [common, common + ["--keep_sent"]])
    result = lambda o: re.findall(rf"^{RANK0_PREFIX}((?:loss|digest|sample) .*)$", o, re.M)  # noqa: E731
    assert result(freed) == result(kept) and len(result(freed)) >= 3
    peak = {k: int(re.search(rf"^{RANK0_PREFIX}activation_peak (\d+)$", o, re.M).group(1))
            for k, o in (("freed", freed), ("kept", kept))}
    output = 2 * 64 * 64 * 4  # one micro-batch's [2, 64, 64] float32 output
    assert peak["freed"] < peak["kept"] - 6 * output, (peak, output)


@pytest.mark.mpi
def test_both_directions_on_one_link_pair_by_order():
    """Interleaved PP 2 x V 2 with M = 5: each link between the two stages carries activations
    and gradients, in orders that differ between the directions; messages tagged with their
    direction alone (as over NCCL) must still reach the pass they are for."""
    common = ["--layers", "4", "--batch", "10", "--steps", "3"]
    whole = losses(parallel_train(1, common))[0][::2]
    got = losses(parallel_train(2, common + ["--pp", "2", "--vpp", "2", "--micro", "5"]))[0][::2]
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=0)


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_llmc_checkpoint_loads_split_over_a_pipeline(model, tmp_path):
    """An llm.c file written by one process, read by TP 2 x PP 2 (each rank its layers and
    slices; GPT-2's last stage its copy of the embedding): the one-process run."""
    write_llmc(model, 8, tmp_path / "m.bin")
    got = losses(parallel_train(4, ["--model", model, "--lr", LR["float32"], *LAYERS, "--tp", "2", "--pp", "2",
                         "--micro", "2", "--llmc", str(tmp_path / "m.bin")]))
    assert_same(got, reference(model, "float32"), "float32", f"{model} from llm.c at TP2 x PP2")


@pytest.mark.mpi
def test_3d_checkpoint_resumes_under_any_layout(tmp_path):
    """Saved by DP2 x TP2 x PP2 at step 5 (one file per stage), resumed at step 6 under the same
    layout, one process, TP4 x DP2 and PP4 x V2: the uninterrupted one-process losses."""
    common = ["--layers", "8", "--batch", "8", "--micro", "2", "--clip", "0.5"]
    whole = losses(parallel_train(1, common + ["--steps", "8"]))[0][::2]
    resume = common + ["--steps", "8", "--first", "6", "--load", str(tmp_path / "ck")]
    at_8 = [["--tp", "2", "--pp", "2"], ["--tp", "4"]]  # resumed in the job of 8 that saved, one run after another
    save = common + ["--tp", "2", "--pp", "2", "--steps", "5", "--save", str(tmp_path / "ck")]
    _, *outs = parallel_train_runs(8, [save] + [resume + flags for flags in at_8])
    files = sorted(p.name for p in (tmp_path / "ck" / "step_000005").iterdir())
    assert files == ["meta.json", "model-stage-0-of-2.safetensors", "model-stage-1-of-2.safetensors",
                     "optimizer-stage-0-of-2.safetensors", "optimizer-stage-1-of-2.safetensors"], files
    others = [(1, []), (4, ["--pp", "4", "--vpp", "2"])]
    outs += [parallel_train(n, resume + flags) for n, flags in others]
    for (n, flags), out in zip([(8, f) for f in at_8] + others, outs):
        got = losses(out)[0][::2]
        print(n, flags, got, whole[5:])
        np.testing.assert_allclose(got, whole[5:], rtol=1e-5, atol=0, err_msg=f"{n} ranks {flags}")


def test_a_whole_model_is_a_pipeline_of_one_stage():
    """PipelineParallel over a model that is not split runs the schedule on one stage: the
    gradients are those of plain gradient accumulation over the micro-batches."""
    from infinitrain.nn.parallel.pp import PipelineParallel
    cfg = GPT2Config(block_size=16, vocab_size=200, n_layer=2, n_head=2, n_embd=16)
    rng = np.random.default_rng(0)
    batches = [(it.from_numpy(rng.integers(0, 200, (2, 8))), it.from_numpy(rng.integers(0, 200, (2, 8))))
               for _ in range(3)]
    plain = GPT2(cfg, seed=1)
    want = 0.0
    for x, y in batches:
        loss = plain(x, y, return_logits=False)[1]
        (loss / 3).backward()
        want += loss.item() / 3
    for name in ("gpipe", "1f1b"):
        model = GPT2(cfg, seed=1)
        got = PipelineParallel(model, name).forward_backward(batches)
        assert got == pytest.approx(want, rel=1e-6)
        for (n, p), q in zip(model.named_parameters(), plain.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-7, err_msg=n)
