"""What the tests share: paths, the one environment and the runners of subprocesses (`run` for
any program, `mpirun` and `example` for Python on N ranks: no test module starts a process
itself), the multi-process training script (several of its runs batched into one job) and its
one-process reference (cached), log parsing through the package's own parser, the equivalence
assertion, and numeric references. Test modules import from here, never from each other."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

import infinitrain as it
from infinitrain.plot import RANK0_PREFIX, parse_log
from mpi_launch import find_mpiexec, start

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
MPI_SCRIPTS = TESTS / "parallel" / "mpi"          # programs run under mpiexec by the tests
PARALLEL_TRAIN = MPI_SCRIPTS / "parallel_train.py"  # the trainer's own step, any layout
# the launcher: $MPIEXEC (a cluster's mpirun, say), else the mpich extra's next to this Python
MPIEXEC = find_mpiexec()
# one thread per rank: 8 oversubscribed ranks on a 2-core machine stay responsive
ENV = dict(os.environ, OMP_NUM_THREADS="1")


# ---- running programs ----------------------------------------------------------------------

def launch(n: int) -> list:
    """`MPIEXEC -n N` and the flags its kind needs to start N ranks here (Open MPI: beyond the
    cores, as root)."""
    return start(n, MPIEXEC)


def run(cmd, timeout: float = 300, env=None, check: bool = False, wait: bool = True, **kw):
    """Any program: `cmd` (strings or paths) with ENV unless env is given, its output captured as
    text; kw goes to subprocess (cwd, input, ...). Returns the CompletedProcess; check=True fails
    with its output unless it exits 0; wait=False returns the started Popen (stdout and stderr on
    pipes) for the caller to wait for. The one place the tests start processes from."""
    cmd, env = [str(c) for c in cmd], ENV if env is None else env
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    assert not check or out.returncode == 0, f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out


def mpirun(n: int, args, timeout: float = 300, env=None, check: bool = True, **kw):
    """`python args...` on n MPI ranks (n == 1: a plain process, as a user would start it).
    check=True: fails with every rank's output unless all exit 0, and returns stdout;
    check=False: returns the CompletedProcess. kw: run's."""
    out = run((launch(n) if n > 1 else []) + [sys.executable, *args], timeout, env, check, **kw)
    return out.stdout if check else out


def example(n: int, name: str, args, **kw):
    """`python -m infinitrain.examples.<name> args...` on n ranks (mpirun's keywords)."""
    return mpirun(n, ["-m", f"infinitrain.examples.{name}", *args], **kw)


def write_tokens(path, n: int = 12000, seed: int = 0) -> Path:
    """An llm.c token shard of GPT-2 ids: 300 random ids repeated (the loss can fall)."""
    from infinitrain.data import write_shard
    write_shard(path, np.tile(np.random.default_rng(seed).integers(0, 50257, 300), n // 300))
    return Path(path)


# ---- the multi-process training script (the trainer's own step) ---------------------------

def parallel_train(n: int, args, timeout: float = 300) -> str:
    """tests/parallel/mpi/parallel_train.py on n ranks; every rank must finish."""
    out = mpirun(n, [PARALLEL_TRAIN, *args], timeout=timeout)
    assert out.count(" OK") == n, out
    return out


def parallel_train_runs(n: int, runs, timeout: float = 300) -> list:
    """Several runs of parallel_train (each a list of flags) one after the other in ONE job of n
    ranks, each its own layout over all of them: one start, import and MPI setup for them all.
    Returns what each run printed on rank 0 (losses() reads it)."""
    runs = [list(r) for r in runs]
    if len(runs) == 1:
        return [parallel_train(n, runs[0], timeout)]
    out = parallel_train(n, [w for i, r in enumerate(runs) for w in ["--then"] * (i > 0) + r],
                         timeout + 60 * len(runs))
    parts = re.split(rf"^{RANK0_PREFIX}run \d+$", out, flags=re.M)
    assert len(parts) == len(runs) + 1, out
    return parts[1:]


class BatchedRuns:
    """parallel_train runs a test module will ask for, started as one job per rank count
    (parallel_train_runs): the module lists every (ranks, flags) up front; the first test that
    asks for a run of n ranks runs all of n's, and every test reads its own run's lines. A run
    not listed is started alone; a job that failed fails every test that asks for one of its runs."""

    def __init__(self, runs):
        self.listed = {}
        for n, flags in runs:
            self.listed.setdefault(n, {})[tuple(flags)] = None
        self.done = {}

    def __call__(self, n: int, flags) -> str:
        key = (n, tuple(flags))
        if key not in self.done:
            batch = list(self.listed.get(n, {})) if key[1] in self.listed.get(n, {}) else [key[1]]
            try:
                outs = parallel_train_runs(n, batch)
            except (AssertionError, subprocess.TimeoutExpired) as failed:
                outs = [failed] * len(batch)
            self.done.update({(n, f): out for f, out in zip(batch, outs)})
        if isinstance(self.done[key], Exception):
            raise AssertionError(f"the job of {n} ranks that ran {list(key[1])} failed:\n{self.done[key]}")
        return self.done[key]


def losses(stdout: str):
    """parallel_train's per-step losses and gradient norms (before clipping) interleaved, and
    its sampled tokens (as floats, compared exactly)."""
    sample = re.search(rf"^{RANK0_PREFIX}sample \[(.*)\]$", stdout, re.M)
    steps = re.findall(rf"^{RANK0_PREFIX}loss \d+ (\S+) norm (\S+)$", stdout, re.M)
    assert steps and sample, f"no 'loss N v norm g' or 'sample' lines in:\n{stdout}"
    return [float(v) for step in steps for v in step], [float(v) for v in sample.group(1).split(",")]


@lru_cache(maxsize=None)
def one_process(*args: str):
    """losses() of parallel_train on one process with these flags: the reference every layout
    is held against, computed once per flag set."""
    return losses(parallel_train(1, list(args)))


def step_losses(stdout: str) -> list:
    """The per-step train losses of an example's log (the package's own log parser)."""
    return [loss for _, loss in parse_log(stdout)["train"]]


def assert_same(got, want, dtype: str, what: str) -> None:
    """losses() of a parallel layout against one process: losses within 1e-5 relative (fp32) or
    1e-2 (bf16), the sampled tokens exactly (fp32). The gradient norm of step 1 (same weights
    everywhere) as tightly; later norms, into which AdamW amplifies round-off (a near-zero
    moment flips sign), within 1e-2 / 5e-2 relative."""
    (got, got_sample), (want, want_sample) = got, want
    if dtype == "float32":
        assert got_sample == want_sample, f"{what}: sampled {got_sample}, one process {want_sample}"
    assert len(got) == len(want), f"{what}: {got} vs {want}"
    print(f"{what}\n  one process: {want}\n  parallel:    {got}")
    for i, (a, b) in enumerate(zip(got, want)):
        step, kind = i // 2 + 1, ("loss", "gradient norm")[i % 2]
        if kind == "loss" or step == 1:
            ok = abs(a - b) <= (1e-5 * abs(b) if dtype == "float32" else 1e-2 * max(1.0, abs(b)))
        else:
            ok = abs(a - b) <= (1e-2 if dtype == "float32" else 5e-2) * abs(b)
        assert ok, f"{what}: step {step} {kind} {a} vs one process {b}\n{got}\n{want}"


def reference_model(model: str, layers: int):
    """The one-process model parallel_train.py builds (seed 5)."""
    from infinitrain.models import GPT2Config, LLaMA3Config
    from infinitrain.models.gpt2 import GPT2
    from infinitrain.models.llama3 import LLaMA3
    if model == "gpt2":
        return GPT2(GPT2Config(block_size=64, vocab_size=50257, n_layer=layers, n_head=4, n_embd=32), seed=5)
    return LLaMA3(LLaMA3Config(block_size=64, vocab_size=50257, n_layer=layers, n_head=8, n_kv_head=4, n_embd=32,
                               ffn_dim_multiplier=None, multiple_of=32, rope_theta=10000.0), seed=5)


def write_llmc(model: str, layers: int, path) -> None:
    """The llm.c file of the model parallel_train.py builds (seed 5), written by one process."""
    reference_model(model, layers).save_llmc(path)


# ---- numeric references --------------------------------------------------------------------

def bf16_round(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 and back to float32 (the reference for bf16 inputs)."""
    import ml_dtypes
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def to_np(t) -> np.ndarray:
    """A float32 (or integer) numpy copy of a tensor."""
    a = t.numpy()
    return a.astype(np.float32) if t.dtype is it.bfloat16 else np.array(a)


def numerical_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar f(x) in float64."""
    x = x.astype(np.float64)
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f(x)
        flat[i] = old - eps
        fm = f(x)
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return g


def torch_pair(torch, rng, *shapes):
    """([ours], [torch's]) leaf tensors that require grad, of the same random float32 values."""
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return ([it.tensor(a, requires_grad=True) for a in arrays], [torch.tensor(a, requires_grad=True) for a in arrays])


def assert_as_torch(torch, ours_out, theirs_out, ours_in, theirs_in, rng, tol=None) -> None:
    """Values, then the gradients of every input under the same random output gradient
    (fp32: 1e-5 relative and absolute unless tol says otherwise)."""
    tol = tol or dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours_out.detach().numpy(), theirs_out.detach().numpy(), **tol)
    g = rng.standard_normal(tuple(theirs_out.shape)).astype(np.float32)
    (ours_out * it.tensor(g)).sum().backward()
    (theirs_out * torch.tensor(g)).sum().backward()
    for o, t in zip(ours_in, theirs_in):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), **tol)
