"""The CUDA library on an emulated GPU, where CI has no real one.

tests/cuda_emulator compiles the unchanged sources of native/src/cuda with g++ against a CPU
model of CUDA: every thread a fiber, __syncthreads() and warp shuffles real barriers, launch
limits as on the hardware, streams that run only when waited on, device memory filled with NaN
when handed out and when freed, and cuBLAS / one-rank NCCL computed by their documented
meaning (NCCL across processes: the MPI ranks of a test). Every GPU test of test_cuda.py and
test_cuda_step.py then runs through it, in a subprocess pointed at it by INFINITRAIN_CUDA_LIBRARY, and DP/TP+SP/PP/ZeRO
training over NCCL on two emulated GPUs is checked against one CPU process. What it proves: the
kernels' indexing, reductions and barriers, the host code's launch sizes, stream and event
ordering, cuBLAS argument mapping and the NCCL process groups compute what the CPU computes.
What it cannot: speed, the hardware's memory model, the real cuBLAS and NCCL."""
import importlib.util
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import ENV, mpirun, run, step_losses

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("cuda_emulator_build", HERE / "cuda_emulator" / "build.py")
emulator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(emulator)

pytestmark = [pytest.mark.cuda, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build the emulated GPU")]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("emulated-cuda")
    library = emulator.build(out)
    env = dict(ENV, INFINITRAIN_CUDA_LIBRARY=str(library))
    return out, env


def _python(code, env):
    return mpirun(1, ["-c", code], timeout=120, env=env, check=False)


def test_the_gpu_tests_pass_on_the_emulated_gpu(emulated):
    _, env = emulated
    out = mpirun(1, ["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", HERE / "test_cuda.py",
                     HERE / "test_cuda_step.py"], timeout=900, env=env, check=False)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    passed = int(re.search(r"(\d+) passed", out.stdout).group(1))
    assert "no CUDA device" not in out.stdout and passed >= 40, out.stdout[-3000:]


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    from infinitrain.data import write_shard
    path = tmp_path_factory.mktemp("data") / "t.bin"
    write_shard(path, np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    return path


def _example_losses(env, shard, ranks, *flags):
    out = mpirun(ranks, ["-m", "infinitrain.examples.gpt2", "--input_bin", shard, "--model", "tiny", "--batch_size",
                         "2", "--sequence_length", "32", "--num_iteration", "2", "--learning_rate", "3e-3",
                         "--total_batch_size", "256", "--peak_tflops", "1", *flags], timeout=600, env=env)
    if "--offload_optimizer" in flags:  # the log says where the gradients went
        assert re.search(r"offload \(rank 0\): the AdamW state in host memory; [1-9][\d.]* MB of the last step's "
                         r"gradients streamed to it during backward", out), out[-3000:]
    return step_losses(out)


@pytest.fixture(scope="module")
def cpu_reference(emulated, shard):
    """The one-process CPU run every NCCL layout is held against: the same for all of them."""
    _, env = emulated
    return _example_losses(dict(env, INFINITRAIN_CUDA_LIBRARY=""), shard, 1, "--device", "cpu")


@pytest.mark.mpi
@pytest.mark.parametrize("flags", [(), ("--tensor_parallel", "2", "--sequence_parallel"),
                                   ("--pipeline_parallel", "2"),
                                   ("--zero_stage", "2", "--offload_optimizer", "cpu"),  # ZeRO-2's collectives too
                                   ("--context_parallel", "2")],  # (all-gather: ZeRO's and SP's collective)
                         ids=["DDP2", "TP2+SP", "PP2", "ZeRO2+offload", "CP2-ring"])
def test_parallel_training_over_nccl_on_two_emulated_gpus_matches_one_cpu_process(emulated, cpu_reference, shard,
                                                                                  flags):
    """The NCCL process groups (a communicator per group and per pipeline link, collectives on
    the group's stream after an event of the caller's, point-to-point traffic), two ranks, each
    on its own emulated GPU, against the one-process CPU run on the same global batch, over two
    steps (the second runs on the weights the first step's reduced gradients updated)."""
    _, env = emulated
    losses = _example_losses(dict(env, INFINITRAIN_EMULATED_GPUS="2"), shard, 2, "--device", "cuda", *flags)
    assert len(cpu_reference) == 2
    np.testing.assert_allclose(losses, cpu_reference, rtol=1e-5)


# the streaming is the same code for both models: each layout runs one of them, the two
# models alternating (every layout equals one process for both models in tests/parallel)
STREAMING = [(["--zero", "0"], 1, 2, "gpt2"), (["--zero", "2"], 0.5, 2, "gpt2"),
             (["--zero", "3"], 0.5, 2, "llama3"), (["--tp", "2"], None, 2, "gpt2"),
             (["--pp", "2"], 1, 4, "llama3"), (["--pp", "2"], 0, 2, "gpt2"), (["--no_clip"], 1, 1, "llama3")]


@pytest.mark.mpi
@pytest.mark.parametrize("layout,share,n,model", STREAMING,
                         ids=["DDP-gpt2", "ZeRO2-gpt2", "ZeRO3-llama3", "TP2+SP-gpt2",
                              "PP2xDP2-llama3", "PP2-gpt2", "one-rank-updates-in-backward-llama3"])
def test_offloaded_gradients_stream_during_backward_over_nccl_with_the_same_bits(emulated, model, layout, share, n):
    """n ranks on as many emulated GPUs (tests/cuda/offload_streaming.py): DDP streams each
    bucket once its all-reduce is done on the device, ZeRO 2 and 3 each rank's shard as its
    reduce-scatter lands (ZeRO-1 reduces after backward: nothing to stream), TP + SP streams
    every gradient and copies again the ones finalize_grads sums over TP, a pipeline's chunk
    reducers each bucket after the chunk's last backward (the tied embedding copied again after
    its sum over the stages; on one DP rank there is no reducer: nothing streams); one rank
    without clipping, where the host also updates each parameter during backward; each the
    bits of the run without offload."""
    _, env = emulated
    out = mpirun(n, [HERE / "offload_streaming.py", "--model", model, *layout],
                 env=dict(env, INFINITRAIN_EMULATED_GPUS=str(n)), check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ranks = [tuple(map(int, line.split()[1:])) for line in out.stdout.splitlines() if line.startswith("OK ")]
    assert len(ranks) == n, out.stdout
    for streamed, everything in ranks:  # TP: every gradient of the rank's shard of the model
        assert streamed == (everything if share is None else int(everything * share)), ranks


@pytest.mark.mpi
def test_weights_broadcast_into_the_parameters_between_offloaded_steps_are_kept(emulated):
    """tests/cuda/offload_broadcast.py on two emulated GPUs: after the first step every rank takes
    rank 0's weights by broadcast. A collective moved no storage version, so the host masters kept
    between steps (commit d01a541) were stale on rank 1 and the next step wrote its old weights
    back; every collective now moves the version of the tensor it writes."""
    _, env = emulated
    out = mpirun(2, [HERE / "offload_broadcast.py"], env=dict(env, INFINITRAIN_EMULATED_GPUS="2"), check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count(": OK") == 2, out.stdout


def test_the_gpu_offload_benchmark_compares_the_three_ways_on_the_emulated_gpu(emulated):
    """benchmarks/offload.py --device cuda: the GPU's AdamW, the host's with the gradients copied
    at the step, and with them streamed during backward; the same losses, and only the last
    moving bytes during backward (the emulated GPU's timings mean nothing)."""
    _, env = emulated
    out = mpirun(1, [HERE.parents[1] / "benchmarks" / "offload.py", "--device", "cuda", "--layers", "1", "--embd", "64",
                     "--seq", "16", "--steps", "1"], timeout=600, env=env, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {line.split("|")[0].strip(): line.split("|")[-1].strip() for line in out.stdout.splitlines() if "|" in line}
    assert rows["on the GPU"] == "0" and rows["host, at step"] == "0" and int(rows["host, streamed"]) > 0, out.stdout
    assert "losses bit-identical" in out.stdout, out.stdout


def test_a_stream_that_does_not_wait_reads_unfinished_work(emulated):
    """Streams run lazily, so a consumer that skips the event wait sees its input unwritten
    (NaN), where a real GPU would usually hide the bug by timing; with the wait it is right."""
    _, env = emulated
    code = """
import infinitrain as it
for wait in (False, True):
    a = it.ones(1000, device="cuda")  # queued on the device's own stream
    e = it.cuda.Event()
    e.record()
    s = it.cuda.Stream()
    if wait:
        s.wait_event(e)
    with it.cuda.stream(s):
        b = (a * 2).sum().item()
    print(wait, b)
"""
    out = _python(code, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "nan", "True", "2000.0"], out.stdout


def test_memory_never_written_reads_as_nan(emulated):
    _, env = emulated
    out = _python("import infinitrain as it; print(it.empty(4, device='cuda').tolist())", env)
    assert out.returncode == 0 and out.stdout.strip() == "[nan, nan, nan, nan]", out.stdout + out.stderr


@pytest.mark.parametrize("case,launch,running,wrong", [
    ("divergent-barrier", "no error", "deadlocks: some threads wait at __syncthreads()", None),
    ("partial-warp-shuffle", "no error", "a full-warp shuffle in warp 1 of a block of 48 threads", None),
    ("too-many-threads", "invalid configuration argument", "no error", None),
    ("race", "no error", "no error", 32),   # read shared memory that another warp has not written yet
    ("no-race", "no error", "no error", 0),
    ("async-copy-waited", "no error", "no error", 0),
    ("async-copy-unwaited", "no error", "no error", 64),  # cp.async read before cp.async.wait_group
    ("big-shared", "invalid configuration argument", "no error", None),  # 64 KB without cudaFuncSetAttribute
    ("big-shared-allowed", "no error", "no error", 0),
    ("ldmatrix-past-shared", "no error", "an ldmatrix row outside the block's shared memory", None),
])
def test_the_emulator_catches_kernels_that_break_the_programming_model(emulated, case, launch, running, wrong):
    out_dir, _ = emulated
    program = emulator.build_program(HERE / "cuda_emulator" / "selftest.cu", out_dir)
    out = run([program, case], timeout=60)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert lines["launch"] == launch and running in lines["run"], out.stdout
    if wrong is not None:
        assert int(lines["wrong"]) == wrong, out.stdout


@pytest.mark.mpi
def test_a_gpu_named_by_index_is_the_one_taken_and_ranks_take_their_local_gpu(emulated):
    """As PyTorch: --device cuda:1 on one process is GPU 1, an index that does not exist is an
    error, and ranks sharing a node each take the GPU of their local rank (an index is refused)."""
    _, env = emulated
    env = dict(env, INFINITRAIN_EMULATED_GPUS="2")
    code = "import sys; from infinitrain.nn import parallel; print(parallel.init(device=sys.argv[1]).device)"
    picked = [mpirun(1, ["-c", code, d], timeout=120, env=env, check=False) for d in ("cuda", "cuda:1", "cuda:3")]
    assert [p.stdout.strip() for p in picked[:2]] == ["cuda:0", "cuda:1"], [p.stderr for p in picked]
    assert picked[2].returncode != 0 and "'cuda:3' does not exist: this node has 2 GPU(s)" in picked[2].stderr
    two = mpirun(2, ["-c", code, "cuda"], timeout=120, env=env, check=False)
    assert two.returncode == 0 and sorted(two.stdout.split()) == ["cuda:0", "cuda:1"], two.stdout + two.stderr
    named = mpirun(2, ["-c", code, "cuda:1"], timeout=120, env=env, check=False)
    assert named.returncode != 0 and "each takes the GPU of its local rank" in named.stdout + named.stderr
