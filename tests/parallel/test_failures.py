"""Surviving failures: `mpi_launch --max_restarts` starts a failed job again and the example
resumes from its --save folder's latest checkpoint by itself (`--resume auto`), printing the
uninterrupted run's losses bit for bit; a job that fails every time gives up after N restarts
with the reason; a job restarted at another size keeps the global batch and continues the run.
The failures are made by INFINITRAIN_FAIL_AT (RANK:STEP:HOW), a hook for tests."""
import json
import re

import pytest

from helpers import ENV, mpirun

pytestmark = pytest.mark.mpi

COMMON = ["-m", "infinitrain.examples.gpt2", "--model", "tiny", "--batch_size", "2", "--sequence_length", "32",
          "--num_iteration", "6", "--learning_rate", "1e-3"]


def launch(n: int, *args, fail: str | None = None, restarts: int = 0):
    env = dict(ENV, INFINITRAIN_FAIL_AT=fail) if fail else ENV
    return mpirun(1, ["-m", "mpi_launch", "--nproc_per_node", str(n), "--max_restarts", str(restarts),
                      *COMMON, *args], env=env, check=False)


def step_lines(out: str) -> dict:
    """step -> the step's train loss exactly as printed."""
    return {int(s): loss for s, loss in re.findall(r"step +(\d+)/\d+ \| train loss (\S+)", out)}


@pytest.fixture(scope="module")
def uninterrupted():
    out = launch(4, "--total_batch_size", "256")
    assert out.returncode == 0, out.stdout + out.stderr
    return step_lines(out.stdout)


@pytest.mark.parametrize("how", ["kill", "raise"])
def test_a_failed_rank_restarts_the_job_which_resumes_bit_for_bit(uninterrupted, tmp_path, how):
    out = launch(4, "--total_batch_size", "256", "--save", str(tmp_path / "ck"), "--save_interval", "2",
                 fail=f"2:5:{how}", restarts=2)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"mpi_launch: the job failed \(exit code \d+: .*(Killed|RuntimeError).*\); restart 1 of 2",
                     out.stderr), out.stderr
    assert "restart 1: resuming from" in out.stdout and "at step 4" in out.stdout, out.stdout
    steps = step_lines(out.stdout.split("restart 1: resuming")[1])
    assert sorted(steps) == [5, 6] and all(steps[s] == uninterrupted[s] for s in steps), (steps, uninterrupted)


def test_a_job_that_fails_every_time_gives_up_after_its_restarts(tmp_path):
    out = launch(2, "--save", str(tmp_path / "ck"), "--save_interval", "2", fail="1:3:raise:always", restarts=2)
    assert out.returncode != 0
    assert out.stderr.count("mpi_launch: the job failed") == 3, out.stderr
    assert "the job failed 3 times, giving up; the last failure: [1] RuntimeError: INFINITRAIN_FAIL_AT: " \
           "rank 1 fails at step 3" in out.stderr, out.stderr


def test_a_job_restarted_at_another_size_keeps_the_global_batch(uninterrupted, tmp_path):
    """Saved at step 4 by 4 ranks, continued by 2 (the checkpoint's global batch: 2 accumulation
    steps instead of 1), within 1e-5 of the uninterrupted 4-rank run."""
    first = launch(4, "--save", str(tmp_path / "ck"), "--num_iteration", "4")  # 2 x 32 x 4 = 256 tokens
    assert first.returncode == 0, first.stderr
    out = launch(2, "--save", str(tmp_path / "ck"), "--resume", "auto")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "x 2 accumulation steps x 2 data-parallel ranks = 256 tokens" in out.stdout, out.stdout
    steps = step_lines(out.stdout)
    assert sorted(steps) == [5, 6]
    for s in steps:
        assert abs(float(steps[s]) - float(uninterrupted[s])) <= 1e-5 * float(uninterrupted[s]), \
            (s, steps, uninterrupted)


def test_the_launcher_without_restarts_returns_the_failure(tmp_path):
    out = launch(2, fail="0:2:raise")
    assert out.returncode != 0 and "restart" not in out.stderr, out.stderr


def _without_flags(meta: dict) -> dict:
    meta["extra"].pop("args")
    meta.pop("meta_sha256")
    return meta


@pytest.mark.parametrize("n,layout", [(2, []), (4, ["--pipeline_parallel", "2"])], ids=["dp2", "pp2-dp2"])
def test_an_async_save_writes_the_synchronous_saves_bytes(tmp_path, n, layout):
    for mode in ("sync", "async"):
        out = launch(n, "--total_batch_size", "256", "--num_iteration", "4", "--save", str(tmp_path / mode),
                     "--save_interval", "2", *layout, *(["--async_save"] if mode == "async" else []))
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "in the background" in out.stdout
    for step in ("step_000002", "step_000004"):
        files = sorted(p.name for p in (tmp_path / "sync" / step).iterdir())
        assert files == sorted(p.name for p in (tmp_path / "async" / step).iterdir())
        for f in files:
            sync, done = ((tmp_path / mode / step / f).read_bytes() for mode in ("sync", "async"))
            if f == "meta.json":  # the same but for the flags it records (--save, --async_save) and its digest
                sync, done = (_without_flags(json.loads(m)) for m in (sync, done))
            assert sync == done, f
    assert (tmp_path / "async" / "latest").read_text().strip() == "step_000004"


def test_a_rank_killed_during_an_async_save_resumes_bit_for_bit(uninterrupted, tmp_path):
    out = launch(4, "--total_batch_size", "256", "--save", str(tmp_path / "ck"), "--save_interval", "2",
                 "--async_save", fail="0:4:kill_in_save", restarts=1)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    resumed = re.search(r"restart 1: resuming from \S+ at step (\d+)", out.stdout)
    assert resumed and resumed.group(1) in ("2", "4"), out.stdout  # the save in flight, or the one before
    steps = step_lines(out.stdout.split("restart 1: resuming")[1])
    first = int(resumed.group(1)) + 1
    assert sorted(steps) == list(range(first, 7)) and all(steps[s] == uninterrupted[s] for s in steps)


def test_init_fails_within_its_bound_naming_the_rank_that_never_came(tmp_path):
    script = tmp_path / "late.py"
    script.write_text("import time\nfrom mpi4py import MPI\n"
                      "if MPI.COMM_WORLD.Get_rank() == 1:\n    time.sleep(3600)\n"
                      "from infinitrain.nn import parallel\nparallel.init()\n")
    import time
    t0 = time.monotonic()
    out = mpirun(3, [script], env=dict(ENV, INFINITRAIN_INIT_TIMEOUT="2"), check=False, timeout=60)
    assert out.returncode != 0 and time.monotonic() - t0 < 30
    assert "rank(s) [1] of 3 did not reach init() within 2 s" in out.stderr, out.stderr


def _flight_records(folder) -> dict:
    import json
    return {int(p.name.split("-")[-1].split(".")[0]): json.loads(p.read_text())
            for p in folder.glob("flight-recorder-rank-*.json")}


def test_the_watchdog_names_a_stopped_rank(tmp_path):
    """Rank 1 stops (SIGSTOP) at the start of step 3: rank 0 waits in DDP's all-reduce; past
    the timeout the job ends, naming the operation and rank 1, with rank 0's flight record."""
    import time
    t0 = time.monotonic()
    out = mpirun(2, COMMON + ["--collective_timeout", "3", "--flight_recorder_dir", str(tmp_path)],
                 env=dict(ENV, INFINITRAIN_FAIL_AT="1:3:stop"), check=False, timeout=120)
    assert out.returncode != 0 and time.monotonic() - t0 < 60
    assert re.search(r"\[rank 0\] watchdog: waited 3\.\d s \(collective timeout 3\) in all_reduce #\d+ of group "
                     r"dp\[0, 1\]: rank 1 did not answer", out.stderr), out.stderr
    records = _flight_records(tmp_path)
    assert sorted(records) == [0] and any(op["end"] is None for op in records[0]["ops"])


@pytest.mark.parametrize("mode,verdict", [
    ("desync", "rank 1 called barrier as #3 of group world (a desync)"),
    ("loop", "rank 1 is stuck before it (its last on that group: #2; it is in no collective)")])
def test_the_watchdog_names_a_desynchronised_or_busy_rank(tmp_path, mode, verdict):
    from helpers import MPI_SCRIPTS
    out = mpirun(2, [MPI_SCRIPTS / "hang.py", mode], check=False, timeout=60,
                 env=dict(ENV, INFINITRAIN_COLLECTIVE_TIMEOUT="2", INFINITRAIN_FLIGHT_RECORDER_DIR=str(tmp_path)))
    assert out.returncode != 0
    assert "[rank 0] watchdog: waited 2." in out.stderr and f"in all_reduce #3 of group world[0, 1]: {verdict}" \
        in out.stderr, out.stderr
    records = _flight_records(tmp_path)
    assert sorted(records) == [0, 1]  # the busy rank's watchdog answered too
    assert [op["op"] for op in records[1]["ops"]][-1] == ("barrier" if mode == "desync" else "all_reduce")


def test_a_nan_loss_stops_the_run_once_with_a_message_unless_asked_to_train_on(tmp_path):
    """Megatron's check_for_nan_in_loss_and_grad: --learning_rate 1e30 diverges at step 2."""
    args = COMMON + ["--learning_rate", "1e30"]
    out = mpirun(2, args, check=False)
    assert out.returncode != 0 and out.stderr.count("step 2: the loss is nan; the first tensor that is not: ") == 1, \
        out.stderr
    # step 1 with lr 1e30 leaves weights near 1e30 (finite) whose logits overflow: the gradients are NaN
    assert "the first tensor that is not: transformer.wte.weight.grad (rank 0)" in out.stderr, out.stderr
    assert "step    3/6" not in out.stdout
    on = mpirun(2, args[:args.index("--num_iteration") + 1] + ["3", "--learning_rate", "1e30",
                                                               "--no_check_for_nan_in_loss_and_grad"], check=False)
    assert on.returncode == 0 and "step    3/3 | train loss nan" in on.stdout, on.stderr


def test_sigterm_saves_at_the_step_boundary_and_the_restarted_job_resumes_bit_for_bit(uninterrupted, tmp_path):
    """Preemption: SIGTERM reaches one rank during step 3 (a scheduler's --signal); every rank
    stops after step 3 together, the checkpoint of step 3 is saved (no --save_interval asked for
    it), and the job exits with 143 (128 + SIGTERM), which mpi_launch --max_restarts starts again;
    the restart resumes from step 3 with the uninterrupted losses."""
    once = launch(4, "--total_batch_size", "256", "--save", str(tmp_path / "once"), fail="1:3:term")
    assert once.returncode == 143, once.stdout[-3000:] + once.stderr[-3000:]
    assert "preempted: SIGTERM received, stopping after step 3; saved" in once.stdout
    assert sorted(step_lines(once.stdout)) == [1, 2, 3]
    assert (tmp_path / "once" / "latest").read_text().strip().endswith("step_000003")
    out = launch(4, "--total_batch_size", "256", "--save", str(tmp_path / "ck"), fail="1:3:term", restarts=1)
    assert out.returncode == 0 and "restart 1: resuming from" in out.stdout and "at step 3" in out.stdout, out.stdout
    steps = step_lines(out.stdout.split("restart 1: resuming")[1])
    assert sorted(steps) == [4, 5, 6] and all(steps[s] == uninterrupted[s] for s in steps), (steps, uninterrupted)


def test_an_unusable_flight_recorder_folder_is_refused_at_start(tmp_path):
    """--flight_recorder_dir naming a file: the job is refused when it starts (the watchdog
    printed an OSError twice a second at a hang and never aborted the job)."""
    (tmp_path / "afile").write_text("not a folder")
    out = launch(2, "--flight_recorder_dir", str(tmp_path / "afile"))
    assert out.returncode != 0 and "flight recorder folder" in out.stderr and "not a folder" in out.stderr, \
        out.stderr[-2000:]


@pytest.mark.mpi
def test_the_watchdog_aborts_a_hung_job_even_when_its_records_cannot_be_written(tmp_path, capsys):
    """A hang whose flight records cannot be written (the folder became a file, a full disk)
    still ends the job, saying so."""
    import time
    from types import SimpleNamespace
    from infinitrain.nn.parallel.watchdog import FlightRecorder, Watchdog
    aborted = []
    dog = object.__new__(Watchdog)  # its state without its thread
    (tmp_path / "afile").write_text("")
    dog.comm = SimpleNamespace(Abort=aborted.append)
    dog.timeout, dog.folder, dog.job, dog.rank, dog.world, dog.poll = 1.0, tmp_path / "afile", "job", 0, 2, 0.01
    dog.recorder, dog.answered = FlightRecorder(8), set()
    rec = dog.recorder.start(SimpleNamespace(name="dp", ranks=[0, 1]), "all_reduce", 8)
    dog._hang(rec, time.time() + 5)
    assert aborted == [1]
    err = capsys.readouterr().err
    assert "could not be written" in err and "aborting the job" in err, err


def test_a_rank_that_leaves_alone_ends_the_whole_job_at_once(tmp_path):
    """Ctrl-C that reaches rank 0 only: it printed its line and exited cleanly, and the other
    ranks waited in their next collective for the whole collective timeout (600 s)."""
    import time
    t0 = time.monotonic()
    out = mpirun(2, COMMON + ["--save", str(tmp_path)], env=dict(ENV, INFINITRAIN_FAIL_AT="0:3:int"),
                 check=False, timeout=300)
    assert out.returncode == 130 and time.monotonic() - t0 < 60, out.stderr[-2000:]
    assert "interrupted at step 3" in out.stderr and "Traceback" not in out.stderr
