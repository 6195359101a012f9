"""Fixtures, the test groups and the guard that keeps them honest. Shared helpers are in
helpers.py; the markers (registered in pyproject.toml) let a fast tier run alone:
`pytest -m "not mpi and not slow"`.

The guard: a test that starts a process must be marked `mpi` or `slow`, and one that starts an
MPI job (mpiexec/mpirun/srun/sbatch, mpi_launch, a program of tests/parallel/mpi/) must be
marked `mpi`, so that the fast tier starts none. It holds in every run, not only the fast tier:
- subprocess.Popen (run, check_output, os.popen), os.system, os.fork (multiprocessing, the
  os.spawn* family), os.forkpty and os.posix_spawn[p] refuse to start anything for a test that
  lacks the mark, before the process exists, naming the command;
- a refusal the test swallows still fails it (at teardown), and so does any child the checks
  above did not see (a fork in C, a reference taken before the guard): its resource usage
  reaches this process when it is waited for (RUSAGE_CHILDREN), and one still running is
  listed in /proc/self/task/*/children;
- a test module that starts a process when imported fails to collect (it would run in every
  tier, marks or not)."""
import functools
import os
import posix
import resource
import subprocess
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
MPI_SCRIPTS = TESTS / "parallel" / "mpi"
PROCESS_MARKS = {"mpi", "slow"}
LAUNCHERS = {"mpiexec", "mpirun", "mpiexec.hydra", "orterun", "srun", "sbatch", "salloc",
             Path(os.environ.get("MPIEXEC") or "mpiexec").name}


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# ---- the guard -----------------------------------------------------------------------------

class ProcessGuardError(RuntimeError):
    pass


_now = {"item": None, "collecting": False, "refused": []}


def _is_mpi_job(argv) -> bool:
    words = [str(w) for w in argv]
    if not words:
        return False
    if Path(words[0]).name in LAUNCHERS and "--version" not in words:
        return True
    if any(a == "-m" and b.split(".")[0] == "mpi_launch" for a, b in zip(words, words[1:])):
        return True
    return any(Path(w).is_absolute() and Path(w).parent == MPI_SCRIPTS for w in words)


def _refuse_unless_marked(what: str, argv=None) -> None:
    item = _now["item"]
    if item is None:
        if not _now["collecting"]:
            return  # between tests: pytest's own business
        problem = (f"a test module starts a process when it is imported ({what}): it would run in every tier, "
                   f"whatever the marks; start it inside a marked test")
    else:
        marks = {m.name for m in item.iter_markers()}
        if not marks & PROCESS_MARKS:
            problem = (f"{item.nodeid} starts a process ({what}) but is marked neither `mpi` nor `slow`: "
                       f"the fast tier would start it")
        elif argv is not None and _is_mpi_job(argv) and "mpi" not in marks:
            problem = f"{item.nodeid} starts an MPI job ({what}) but is not marked `mpi`"
        else:
            return
    _now["refused"].append(problem)
    raise ProcessGuardError(problem)


def _guarded(original, describe):
    @functools.wraps(original)  # its name and module too: pickle still finds os.system as posix.system
    def guarded(*args, **kwargs):
        what, argv = describe(*args, **kwargs)
        _refuse_unless_marked(what, argv)
        return original(*args, **kwargs)
    return guarded


def _popen_command(self, args, *rest, **kwargs):
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    return " ".join(map(str, argv))[:300], argv


def _os_command(name):
    if name.startswith("posix_spawn"):
        return lambda path, argv, *a, **k: (" ".join(map(str, argv))[:300], argv)
    if name == "system":
        return lambda command: (f"os.system({command!r})", None)
    return lambda *a, **k: (f"os.{name}()", None)


def pytest_configure(config):
    subprocess.Popen.__init__ = _guarded(subprocess.Popen.__init__, _popen_command)
    for name in ("system", "fork", "forkpty", "posix_spawn", "posix_spawnp"):
        original = getattr(os, name, None)
        if original is not None:
            setattr(os, name, _guarded(original, _os_command(name)))
            if getattr(posix, name, None) is original:
                setattr(posix, name, getattr(os, name))


def _children() -> tuple:
    """(page faults of every child waited for so far, the pids of the children running now)."""
    running = set()
    for task in Path("/proc/self/task").glob("*"):
        try:
            running |= set((task / "children").read_text().split())
        except OSError:
            pass
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt, running


def _unseen_children(before) -> str:
    """A child started and not refused since `before`: one waited for (its resource usage
    grew, while no child that was running before went away) or one running still."""
    (faults, running), (faults_now, running_now) = before, _children()
    if running_now - running:
        return f"child process(es) {sorted(running_now - running)} still running"
    if faults_now != faults and running <= running_now:
        return "a child process that ran and was waited for (RUSAGE_CHILDREN grew)"
    return ""


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    _now["collecting"], before = True, _children()
    try:
        return (yield)
    finally:
        _now["collecting"] = False
        unseen = _unseen_children(before)
        if unseen:
            raise pytest.UsageError(f"collecting the tests started a process: {unseen}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    _now["item"], _now["refused"] = item, []
    item.stash[_BEFORE] = _children()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        refused, _now["item"], _now["refused"] = _now["refused"], None, []
        unseen = ""
        if not {m.name for m in item.iter_markers()} & PROCESS_MARKS:
            unseen = _unseen_children(item.stash[_BEFORE])
            if unseen:
                refused.append(f"{item.nodeid} started a process unseen by the guard ({unseen}) but is "
                               f"marked neither `mpi` nor `slow`")
        if unseen or (refused and not item.stash.get(_FAILED, False)):  # a refusal swallowed, or no refusal
            pytest.fail("\n".join(dict.fromkeys(refused)), pytrace=False)


_BEFORE = pytest.StashKey[tuple]()
_FAILED = pytest.StashKey[bool]()
