"""Tensor and sequence parallelism against one process: each layer against its unsharded twin,
then tiny GPT-2 and LLaMA-3 (grouped-query attention) trained for 10 AdamW steps at TP 2 and
4, with and without SP, with DP > 1 too, fp32 and bf16: the per-step losses equal the
one-process losses on the same global batch (fp32 within 1e-5 relative, bf16 within 1e-2).
Each multi-rank run also checks that replicated parameters stay bit-identical across TP."""
import pytest

from infinitrain.nn.parallel import tensor_parallel as tpm
from helpers import (ENV, MPI_SCRIPTS, BatchedRuns, assert_same, losses, mpirun, one_process, parallel_train,
                     reference_model, write_llmc)

# bf16 with AdamW at a high learning rate amplifies round-off chaotically (even DP alone, which
# only sums gradients in another order, drifts by 5e-3 over 10 steps at lr 1e-2): bf16 runs
# use lr 3e-3, where DP alone drifts by ~1e-4 and the loss still falls by a nat.
LR = {"float32": "1e-2", "bfloat16": "3e-3"}


def reference(model, dtype, steps=10):
    return one_process("--model", model, "--dtype", dtype, "--lr", LR[dtype], "--steps", str(steps))


@pytest.mark.mpi
@pytest.mark.parametrize("n, comm_thread", [(2, "0"), (4, "0"), (2, "1")])
def test_each_layer_matches_its_unsharded_twin(n, comm_thread):
    """comm_thread: the MPI group's asynchronous collectives on a thread of their own (as with
    two or more cores per rank) rather than MPI's non-blocking calls."""
    out = mpirun(n, [MPI_SCRIPTS / "tp_layers.py"], env=dict(ENV, INFINITRAIN_COMM_THREAD=comm_thread), check=False)
    assert out.returncode == 0 and out.stdout.count("OK") == n, out.stdout + out.stderr


CASES = [  # (ranks, flags): DP = ranks / TP
    (2, ["--tp", "2"]), (2, ["--tp", "2", "--sp"]), (4, ["--tp", "4", "--sp"]),
    (4, ["--tp", "2", "--sp"]), (8, ["--tp", "4", "--sp"]),
]


BF16_CASES = [(4, ["--tp", "4", "--sp"]), (4, ["--tp", "2"])]


def _run(model, dtype, flags):
    return ["--model", model, "--dtype", dtype, "--lr", LR[dtype], *flags]


# every layout of the two tests below run as one job per rank count (the first test of each count starts it)
RUNS = BatchedRuns([(n, _run(m, "float32", f)) for n, f in CASES for m in ("gpt2", "llama3")]
                   + [(n, _run(m, "bfloat16", f)) for n, f in BF16_CASES for m in ("gpt2", "llama3")])


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
@pytest.mark.parametrize("n,flags", CASES, ids=[f"{n}ranks{''.join(f)}" for n, f in CASES])
def test_tensor_parallel_fp32_matches_one_process(model, n, flags):
    got = losses(RUNS(n, _run(model, "float32", flags)))
    assert_same(got, reference(model, "float32"), "float32", f"{model} {n} ranks {flags}")


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
@pytest.mark.parametrize("n,flags", BF16_CASES, ids=["tp4sp", "dp2tp2"])
def test_tensor_parallel_bf16_matches_one_process(model, n, flags):
    got = losses(RUNS(n, _run(model, "bfloat16", flags)))
    assert_same(got, reference(model, "bfloat16"), "bfloat16", f"{model} bf16 {n} ranks {flags}")


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_checkpoint_saved_at_tp2_resumes_at_tp1_and_tp4(model, tmp_path):
    full = reference(model, "float32")
    parallel_train(2, ["--model", model, "--lr", LR["float32"], "--tp", "2", "--sp", "--steps", "5",
            "--save", str(tmp_path)])
    for n, flags in ((1, []), (4, ["--tp", "4"])):
        got = losses(parallel_train(n, ["--model", model, "--lr", LR["float32"], *flags, "--load", str(tmp_path),
                             "--first", "6", "--steps", "10"]))
        assert_same(got, (full[0][2 * 5:], full[1]), "float32", f"{model} resumed at {n} ranks {flags}")


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_llmc_checkpoint_loads_sliced_under_tp(model, tmp_path):
    """An llm.c file written by one process, read at TP 2 with SP: each rank keeps its slice and
    the run is the one-process run (the file holds the same seed-5 weights)."""
    write_llmc(model, 2, tmp_path / "m.bin")
    got = losses(parallel_train(2, ["--model", model, "--lr", LR["float32"], "--tp", "2", "--sp",
                         "--llmc", str(tmp_path / "m.bin")]))
    assert_same(got, reference(model, "float32"), "float32", f"{model} from llm.c at TP 2")


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gpt2", "llama3"])
@pytest.mark.parametrize("flags", [["--tp", "2", "--sp"], ["--pp", "2", "--micro", "2"]], ids=["tp2-sp", "pp2"])
def test_a_transformers_folder_loads_sliced_under_tp_and_pp(model, flags, tmp_path):
    """save_pretrained by one process (transformers' layout), read at TP 2 or PP 2: each rank
    reads its slice and the run is the one-process run."""
    reference_model(model, 2).save_pretrained(tmp_path / "hf")
    got = losses(parallel_train(2, ["--model", model, "--lr", LR["float32"], *flags, "--hf", str(tmp_path / "hf")]))
    assert_same(got, reference(model, "float32"), "float32", f"{model} from transformers' format, {' '.join(flags)}")


@pytest.mark.mpi
def test_qwen3s_qk_norm_and_wide_heads_split_over_tp_as_one_process(tmp_path):
    """Qwen3's attention (QK-norm, heads wider than n_embd / n_head), started from a
    transformers folder: at TP 2 + SP each rank holds half the heads and adds its heads' share
    to the whole QK-norm weights' gradients."""
    from dataclasses import replace
    from infinitrain.models.llama3 import LLaMA3
    cfg = replace(reference_model("llama3", 2).config, head_size=8, qk_norm=True)
    LLaMA3(cfg, seed=5).save_pretrained(tmp_path / "hf")
    flags = ["--model", "llama3", "--lr", LR["float32"], "--steps", "4", "--hf", str(tmp_path / "hf")]
    assert_same(losses(parallel_train(2, flags + ["--tp", "2", "--sp"])), losses(parallel_train(1, flags)),
                "float32", "Qwen3-style attention at TP 2 + SP")


def test_divisibility_is_checked_at_construction():
    from infinitrain.models import GPT2Config, LLaMA3Config
    from infinitrain.models.gpt2 import GPT2
    from infinitrain.models.llama3 import LLaMA3

    class Four:  # a group of 4 (construction checks sizes before any communication)
        size, rank = 4, 0

    tp = tpm.TensorParallel(Four())
    with pytest.raises(ValueError, match=r"does not divide n_head \(6\)"):
        GPT2(GPT2Config(block_size=8, vocab_size=100, n_layer=1, n_head=6, n_embd=24), tp=tp)
    with pytest.raises(ValueError, match=r"n_kv_head.*\(2\)"):
        LLaMA3(LLaMA3Config(block_size=8, vocab_size=100, n_layer=1, n_head=8, n_kv_head=2, n_embd=32,
                            ffn_dim_multiplier=None, multiple_of=32), tp=tp)
    with pytest.raises(ValueError, match="input_is_parallel"):
        tpm.RowParallelLinear(8, 8, tpm.TensorParallel(Four(), sequence_parallel=True),
                              input_is_parallel=False)
