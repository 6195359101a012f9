"""Multi-process tests: each starts `mpiexec -n N` (oversubscribed on small machines) and fails
with the ranks' output when a rank fails."""
import contextlib
import re
import threading

import numpy as np
import pytest

from infinitrain.data import write_shard
from infinitrain.nn.parallel import Layout
from infinitrain.plot import rank_prefix

from helpers import ENV, MPI_SCRIPTS, PARALLEL_TRAIN, mpirun, step_losses


def test_layout_unit():
    L = Layout(8, tp=2, pp=2)
    assert L.dp == 2 and L.rank_of(dp=1, tp=1, pp=1) == 7
    assert [L.coords(r) for r in (0, 5)] == [L.coords(0), L.coords(5)]
    assert L.coords(5).tp == 1 and L.coords(5).dp == 0 and L.coords(5).pp == 1
    assert L.tp_group(5) == [4, 5] and L.dp_group(5) == [5, 7] and L.pp_group(5) == [1, 5]
    assert L.all_groups("pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    with pytest.raises(ValueError, match="cannot be split"):
        Layout(6, tp=4)
    with pytest.raises(ValueError, match="= 12 ranks, but the world has 8"):
        Layout(8, tp=2, dp=6)


@pytest.mark.parametrize("profiling", [False, True])
def test_the_flight_recorder_closes_what_completes_or_fails_and_keeps_what_is_in_flight(profiling):
    """A collective that raised failed (its error says so): left open, the watchdog would later
    call it a hang."""
    from infinitrain import profiler
    from infinitrain.nn.parallel import watchdog
    from infinitrain.nn.parallel.process_group import ProcessGroup, Work, traced_collective

    class Group(ProcessGroup):
        ranks, rank, size = [0], 0, 1

        @traced_collective(0)
        def all_reduce(self, t, fail=False, async_op=False):
            if fail:
                raise ValueError("wrong size")
            return Work(event=threading.Event()) if async_op else None

    g, t = Group(), np.zeros(4, np.float32)
    saved, watchdog.recorder = watchdog.recorder, watchdog.FlightRecorder()
    try:
        with profiler.profile() if profiling else contextlib.nullcontext():
            g.all_reduce(t)
            with pytest.raises(ValueError, match="wrong size"):
                g.all_reduce(t, fail=True)
            work = g.all_reduce(t, async_op=True)
            assert [r[3] for r in watchdog.recorder.in_flight()] == ["all_reduce"]
            work._event.set()
            work.wait()
        assert watchdog.recorder.in_flight() == [] and len(watchdog.recorder.ring) == 3
    finally:
        watchdog.recorder = saved


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 4, 8])
def test_collectives(n):
    out = mpirun(n, [str(MPI_SCRIPTS / "collectives.py")])
    assert out.count("OK") == n


@pytest.mark.mpi
def test_layout_subgroups_2x2x2():
    assert mpirun(8, [str(MPI_SCRIPTS / "layout_groups.py")]).count("OK") == 8


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_ddp_mechanics(n):
    assert mpirun(n, [str(MPI_SCRIPTS / "ddp_mechanics.py")]).count("OK") == n


@pytest.mark.mpi
def test_data_parallel_gpt2_matches_one_process(tmp_path):
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    args = ["-m", "infinitrain.examples.gpt2", "--input_bin", str(tmp_path / "t.bin"), "--model", "tiny",
            "--batch_size", "2", "--sequence_length", "32", "--num_iteration", "10", "--learning_rate", "3e-3"]
    single = step_losses(mpirun(1, args + ["--total_batch_size", "512"]))
    eight = mpirun(8, args)
    two_accum = mpirun(2, args + ["--total_batch_size", "512"])
    ENV["INFINITRAIN_COMM_THREAD"] = "1"  # reductions on the communication thread, during backward
    try:
        threaded = mpirun(2, args + ["--total_batch_size", "512"])
    finally:
        del ENV["INFINITRAIN_COMM_THREAD"]
    assert "DP=8, TP=1, SP=0, PP=1" in eight and "x 4 accumulation steps x 2 data-parallel" in two_accum
    assert len(single) == 10
    np.testing.assert_allclose(step_losses(eight), single, rtol=0, atol=1e-5)
    np.testing.assert_allclose(step_losses(two_accum), single, rtol=0, atol=1e-5)
    np.testing.assert_allclose(step_losses(threaded), single, rtol=0, atol=1e-5)
    assert single[-1] < single[0] - 1.0


@pytest.mark.mpi
def test_launcher_env_and_failing_rank(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys\n"
        "from infinitrain.nn import parallel\n"
        "env = parallel.init()\n"
        "print('env', os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'],"
        " os.environ['LOCAL_WORLD_SIZE'], os.environ['MASTER_PORT'], env.rank)\n"
        "if env.rank == int(sys.argv[1]):\n"
        "    raise RuntimeError('boom on purpose')\n"
        "env.world.barrier()\n")
    launcher = ["-m", "mpi_launch", "--nproc_per_node", "3", "--rdzv_endpoint", "127.0.0.1:29999", script]
    ok = mpirun(1, launcher + ["-1"], timeout=120, check=False)
    shown = f"stdout:\n{ok.stdout}\nstderr:\n{ok.stderr}"
    assert ok.returncode == 0, shown
    for r in range(3):  # each line behind its rank's prefix, in the launcher's style
        assert re.search(rf"^{rank_prefix(r)}env {r} {r} 3 3 29999 {r}$", ok.stdout, re.M), shown
    bad = mpirun(1, launcher + ["1"], timeout=120, check=False)
    shown = f"exit {bad.returncode}\nstdout:\n{bad.stdout}\nstderr:\n{bad.stderr}"
    assert bad.returncode != 0, shown
    assert "boom on purpose" in bad.stdout + bad.stderr, shown
    assert "[rank 1] uncaught exception, aborting the job" in bad.stdout + bad.stderr, shown


@pytest.mark.mpi
def test_mpi_launch_module_form_passes_the_programs_flags(tmp_path):
    """`mpi_launch --nproc_per_node 2 -m infinitrain.examples.gpt2 --model tiny ...` (the
    README's form): every flag after the module is the program's."""
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 10))
    out = mpirun(1, ["-m", "mpi_launch", "--nproc_per_node", "2", "-m", "infinitrain.examples.gpt2", "--model", "tiny",
                     "--input_bin", tmp_path / "t.bin", "--batch_size", "2", "--sequence_length", "16",
                     "--num_iteration", "2"], timeout=120)
    assert "DP=2, TP=1, SP=0, PP=1" in out and "step    2/2" in out, out
    from mpi_launch import parse
    a = parse(["--nproc_per_node=2", "train.py", "--nproc_per_node", "9", "-m", "x"])
    assert a.nproc_per_node == 2 and a.script == "train.py" and a.args == ["--nproc_per_node", "9", "-m", "x"]
    with pytest.raises(SystemExit):
        parse(["--nproc_per_node", "2"])


@pytest.mark.mpi
def test_mismatched_mpi_is_reported():
    code = "from infinitrain.nn import parallel; parallel.init()"
    out = mpirun(1, ["-c", code], timeout=60, env=dict(ENV, PMI_SIZE="4"), check=False)
    assert out.returncode != 0
    assert "started 4 processes (PMI_SIZE=4) but MPI sees a world of 1" in out.stderr
    # `srun -n 2` under Slurm's default MpiDefault=none: two tasks that each see a world of 1
    # (a batch script's SLURM_NTASKS alone is not a launch: one process is fine there)
    out = mpirun(1, ["-c", code], timeout=60, env=dict(ENV, SLURM_STEP_NUM_TASKS="2"), check=False)
    assert out.returncode != 0 and "srun started 2 tasks (SLURM_STEP_NUM_TASKS=2)" in out.stderr, out.stderr
    assert "--mpi=pmix" in out.stderr
    ok = mpirun(1, ["-c", code], timeout=60, env=dict(ENV, SLURM_NTASKS="2"), check=False)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.slow
def test_no_mpi_library_at_all_says_how_to_get_one():
    """mpi4py's wheel brings no MPI: a plain install on a machine without one."""
    code = "from infinitrain.nn import parallel; parallel.init()"
    out = mpirun(1, ["-c", code], timeout=60, env=dict(ENV, MPI4PY_LIBMPI="/nowhere/libmpi.so"), check=False)
    assert out.returncode != 0 and "no MPI library found" in out.stderr, out.stderr
    assert "pip install 'infinitrain[mpich]'" in out.stderr and "module load" in out.stderr


@pytest.mark.slow
def test_an_mpich_library_under_open_mpis_mpirun_is_told_which_launcher_goes_with_it():
    """The mpich extra's library started by Open MPI's mpirun (its environment: OMPI_COMM_WORLD_*
    and PMIx's variables) aborted inside MPI_Init with MPICH's "unsupported PMI version PMIx";
    now, before MPI starts, the example and parallel.init() say which launcher goes with which
    install. (The library here is the mpich extra's.)"""
    from mpi4py import _mpiabi
    if _mpiabi._get_mpiabi() != "mpich":
        pytest.skip("mpi4py loads another MPI than MPICH here")
    openmpi = dict(ENV, OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_LOCAL_RANK="0",
                   PMIX_RANK="0", PMIX_NAMESPACE="prterun-node-1234@1")
    for args in (["-m", "infinitrain.examples.gpt2", "--model", "tiny"],
                 ["-c", "from infinitrain.nn import parallel; parallel.init()"]):
        out = mpirun(1, args, timeout=60, env=openmpi, check=False)
        assert out.returncode != 0 and "started by Open MPI's mpirun, but mpi4py loads an MPICH" in out.stderr, out
        assert "mpiexec -n N" in out.stderr and "pip uninstall mpich" in out.stderr
        assert "MPII_Init_thread" not in out.stderr and "unsupported PMI version" not in out.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("example", ["gpt2"])  # LLaMA-3's example runs CP x TP x PP (test_context_parallel)
def test_tensor_parallel_example_matches_one_process(tmp_path, example):
    """The front door: `mpiexec -n 4 python -m infinitrain.examples.gpt2 --tensor_parallel 2
    --sequence_parallel` (DP 2 x TP 2, gradient clipping on, a checkpoint written) prints the
    one-process losses."""
    write_shard(tmp_path / "t.bin", np.tile(np.random.default_rng(0).integers(0, 50257, 300), 40))
    args = ["-m", f"infinitrain.examples.{example}", "--input_bin", str(tmp_path / "t.bin"),
            "--model", "tiny", "--batch_size", "2", "--sequence_length", "32", "--num_iteration", "6",
            "--learning_rate", "3e-3", "--grad_clip", "0.5", "--total_batch_size", "128"]
    one = mpirun(1, args)
    tp = mpirun(4, args + ["--tensor_parallel", "2", "--sequence_parallel", "--save", str(tmp_path / "ck")])
    assert "DP=2, TP=2, SP=2, PP=1" in tp, tp
    np.testing.assert_allclose(step_losses(tp), step_losses(one), rtol=1e-5, atol=0)
    assert (tmp_path / "ck" / "latest").is_file()
    bad = mpirun(2, args + ["--tensor_parallel", "3"], timeout=120, check=False)
    assert bad.returncode != 0 and "cannot be split into tensor parallel 3" in bad.stderr, bad.stderr
    # 3D: DP 2 x TP 2 (+SP) x PP 2 with 2 micro-batches, through the example's own flags; the
    # checkpoint it writes resumes in one process with the uninterrupted losses
    three_d = mpirun(8, args + ["--tensor_parallel", "2", "--sequence_parallel", "--pipeline_parallel", "2",
                                "--total_batch_size", "256", "--save", str(tmp_path / "ck3"),
                                "--save_interval", "3"])
    assert "DP=2, TP=2, SP=2, PP=2" in three_d and "pipeline: 1f1b schedule over 2 stages" in three_d, three_d
    one_accum = step_losses(mpirun(1, args + ["--total_batch_size", "256"]))
    np.testing.assert_allclose(step_losses(three_d), one_accum, rtol=1e-5, atol=0)
    resumed = mpirun(1, args + ["--total_batch_size", "256", "--load", tmp_path / "ck3" / "step_000003"])
    np.testing.assert_allclose(step_losses(resumed), one_accum[3:], rtol=1e-5, atol=0)


@pytest.mark.mpi
def test_a_hung_pipeline_stage_aborts_the_job_with_a_message():
    """Stage 1 stops answering: stage 0's wait times out and names who it waited for."""
    out = mpirun(2, [PARALLEL_TRAIN, "--layers", "2", "--pp", "2", "--steps", "2", "--hang_stage", "1",
                     "--pipeline_timeout", "3"], timeout=120, check=False)
    assert out.returncode != 0
    assert re.search(r"rank 0 \(pipeline stage 0 of 2\) waited 3 s for the gradient of micro-batch 0 "
                     r"for chunk 0 from stage 1 \(rank 1\)", out.stderr), out.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("mode,calls", [
    ("dtype", "rank 0: all_reduce float32[4]; rank 1: all_reduce int32[4]"),  # same bytes: garbage before
    ("op", "rank 0: all_reduce float32[4]; rank 1: broadcast float32[4] 0"),    # a hang before
])
def test_collectives_called_differently_are_named_under_torch_distributed_debug(mode, calls):
    """TORCH_DISTRIBUTED_DEBUG=DETAIL (PyTorch's switch): the ranks compare each collective's
    arguments first and every rank raises one message naming each rank's call."""
    out = mpirun(2, [MPI_SCRIPTS / "mismatched_collectives.py", mode], check=False, timeout=120,
                 env=dict(ENV, TORCH_DISTRIBUTED_DEBUG="DETAIL"))
    shown = f"exit {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert out.returncode != 0 and "no error" not in out.stdout, shown
    assert f"CollectiveError: collective #1 of group world[0, 1] was called differently by its ranks ({calls})" \
        in out.stderr and "mismatched_collectives.py:" in out.stderr and "Traceback" not in out.stderr, shown


@pytest.mark.mpi
def test_a_rank_missing_from_a_checked_collective_is_a_hang_the_watchdog_names(tmp_path):
    """Under DETAIL the argument exchange comes first: it is a recorded operation, so a rank that
    never comes is named by the watchdog as in the collective itself (not a silent hang)."""
    import time
    t0 = time.monotonic()
    out = mpirun(2, [MPI_SCRIPTS / "mismatched_collectives.py", "missing"], check=False, timeout=120,
                 env=dict(ENV, TORCH_DISTRIBUTED_DEBUG="DETAIL", INFINITRAIN_COLLECTIVE_TIMEOUT="3",
                          INFINITRAIN_FLIGHT_RECORDER_DIR=str(tmp_path)))
    assert out.returncode != 0 and time.monotonic() - t0 < 50, out.stderr[-2000:]
    assert "all_reduce (argument check) #1 of group world[0, 1]" in out.stderr, out.stderr[-2000:]
