"""The shape the code is meant to keep, checked on the source (fast tier):
- only tests/helpers.py starts processes (`run`, `mpirun`, `example`, ...): no other file under
  tests/ imports subprocess or multiprocessing or calls os.system/fork/spawn, but for the few
  listed below with why;
- a test that starts a process through the helpers (itself, or through a function or fixture
  of its module) is marked `mpi` or `slow`, and `mpi` when it starts MPI ranks; this holds for
  tests that do not run here (a GPU's), where conftest.py's run-time guard cannot look;
- no file of infinitrain/ is over 500 lines unless tests/tools/long_files.txt says why, and
  every file listed there is still over 500 lines, so that the list only shrinks."""
import ast
import re
from pathlib import Path

import pytest

from helpers import ENV, ROOT, TESTS, mpirun

LONG = 500
LONG_FILES = TESTS / "tools" / "long_files.txt"

# files under tests/ that start processes themselves, and why
MAY_START_PROCESSES = {
    "tests/helpers.py": "the one place the tests start processes from",
    "tests/conftest.py": "starts none: wraps subprocess.Popen and os's process calls to refuse unmarked tests",
    "tests/cuda/cuda_emulator/build.py": "a program of its own (python build.py OUT) that runs g++ to build the "
                                         "emulated GPU; test_cuda_emulated.py imports it",
}
PROCESS_MODULES = {"subprocess", "multiprocessing", "pty", "concurrent.futures.process"}
OS_PROCESS_CALLS = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"}

# what starts a process when a test calls it: the helpers' runners (RUNS: a module's BatchedRuns
# of the training script), mpi_launch's probes, the emulated GPU's build and the data sets'
# first preparation (pip download)
BATCHED = {"parallel_train_runs", "BatchedRuns", "RUNS"}
RUNNERS = {"run", "mpirun", "example", "parallel_train", "launch", "one_process", "launcher_kind",
           "srun_mpi_plugin", "build", "build_program", "mnist_file", "translation_file", "shakespeare_files"} | BATCHED
# ...and what makes it an MPI job (ranks; mpi_launch; the multi-process training script)
MPI_RUNNERS = {"launch", "parallel_train", "one_process"} | BATCHED
MPI_WORDS = {"PARALLEL_TRAIN", "MPI_SCRIPTS", "MPIEXEC", "mpi_launch"}


def _python_files():
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _starts_processes(tree) -> list:
    """Where a module imports a process module or calls os's process functions itself."""
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "__import__" or isinstance(f, ast.Attribute) and \
                    f.attr == "import_module":
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "os" and \
                    (f.attr in OS_PROCESS_CALLS or f.attr.startswith(("spawn", "exec"))):
                found.append(f"line {node.lineno}: os.{f.attr}")
        elif isinstance(node, ast.Attribute) and node.attr == "ProcessPoolExecutor":
            found.append(f"line {node.lineno}: ProcessPoolExecutor")
        for name in names:
            if name in PROCESS_MODULES or name.split(".")[0] in PROCESS_MODULES - {"concurrent.futures.process"}:
                found.append(f"line {node.lineno}: {name}")
    return found


def test_only_the_helpers_start_processes():
    offenders = []
    for path in _python_files():
        if _rel(path) not in MAY_START_PROCESSES:
            offenders += [f"{_rel(path)} {where}" for where in _starts_processes(ast.parse(path.read_text()))]
    assert not offenders, ("start processes through tests/helpers.py (run, mpirun, example) instead:\n"
                           + "\n".join(offenders))


def test_every_file_allowed_to_start_processes_still_does():
    stale = [f for f in MAY_START_PROCESSES if not (ROOT / f).is_file()
             or not _starts_processes(ast.parse((ROOT / f).read_text()))]
    assert not stale, f"no longer start processes themselves: drop them from MAY_START_PROCESSES: {stale}"


# ---- marks ---------------------------------------------------------------------------------

def _marks(decorators) -> set:
    found = set()
    for d in decorators:
        for node in ast.walk(d):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and \
                    node.value.attr == "mark":
                found.add(node.attr)
    return found


def _module_marks(tree) -> set:
    return set().union(*[_marks([n.value]) for n in tree.body if isinstance(n, ast.Assign)
                         and any(getattr(t, "id", None) == "pytestmark" for t in n.targets)])


def _tests(tree):
    """(test function, its own marks and its class's) of a module."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            yield node, _marks(node.decorator_list)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test"):
                    yield f, _marks(node.decorator_list) | _marks(f.decorator_list)


def _callee(call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _process_kinds(fn, functions: dict, seen: set) -> set:
    """{"process"} or {"process", "mpi"}: what fn starts, itself or through the module's own
    functions and fixtures it calls or takes."""
    kinds = set()
    uses = [a.arg for a in fn.args.args]
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node)
        uses.append(name)
        if name in RUNNERS:
            kinds.add("process")
            words = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
                {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            first = node.args[0] if node.args else None
            several = name in ("mpirun", "example") and not (isinstance(first, ast.Constant) and first.value == 1)
            if name in MPI_RUNNERS or several or words & MPI_WORDS:
                kinds.add("mpi")
    for name in uses:
        if name in functions and name not in seen:
            seen.add(name)
            kinds |= _process_kinds(functions[name], functions, seen)
    return kinds


def test_tests_that_start_processes_are_marked_for_it():
    wrong = []
    for path in _python_files():
        if not path.name.startswith("test_"):
            continue
        tree = ast.parse(path.read_text())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for fn, marks in _tests(tree):
            test = f"{_rel(path)}::{fn.name}"
            marks = marks | _module_marks(tree)
            kinds = _process_kinds(fn, functions, {fn.name})
            if kinds and not marks & {"mpi", "slow"}:
                wrong.append(f"{test}: starts a process; mark it slow (or mpi)")
            elif "mpi" in kinds and "mpi" not in marks:
                wrong.append(f"{test}: starts MPI ranks; mark it mpi")
    assert not wrong, "\n".join(wrong)


# ---- long files ----------------------------------------------------------------------------

def _line_counts() -> dict:
    """{path: lines} of every text file of infinitrain/."""
    counts = {}
    for path in sorted((ROOT / "infinitrain").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            try:
                counts[_rel(path)] = len(path.read_text().splitlines())
            except UnicodeDecodeError:  # a built library
                pass
    return counts


def _long_files() -> dict:
    """{path: why} from tests/tools/long_files.txt (`path  why` per line)."""
    listed = {}
    for line in LONG_FILES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            path, _, why = line.strip().partition(" ")
            listed[path] = why.strip()
    return listed


def test_no_file_of_the_package_is_long_without_a_reason():
    listed = _long_files()
    long = {p: n for p, n in _line_counts().items() if n > LONG and not listed.get(p)}
    assert not long, (f"over {LONG} lines: split them, or add `path  why` to {_rel(LONG_FILES)}: "
                      + ", ".join(f"{p} ({n})" for p, n in long.items()))


def test_every_listed_long_file_is_still_long():
    counts = _line_counts()
    stale = {p: counts.get(p) for p in _long_files() if counts.get(p, 0) <= LONG}
    assert not stale, (f"remove from {_rel(LONG_FILES)} (gone, or {LONG} lines or fewer now): "
                       + ", ".join(f"{p} ({'gone' if n is None else n})" for p, n in stale.items()))


@pytest.mark.parametrize("text,problem", [("import subprocess", "subprocess"),
                                          ("from multiprocessing import Pool", "multiprocessing"),
                                          ("__import__('subprocess').run(['ls'])", "subprocess"),
                                          ("import os\nos.system('ls')", "os.system"),
                                          ("import os\nos.posix_spawn('/bin/ls', ['ls'], {})", "os.posix_spawn")])
def test_the_process_check_sees_each_way_in(text, problem):
    found = _starts_processes(ast.parse(text))
    assert found and problem in found[0], found


# ---- the run-time guard (conftest.py), on tests made for it --------------------------------

GUARDED = '''
import ctypes, os, subprocess, sys
import pytest

def test_unmarked():
    subprocess.run([sys.executable, "-c", "pass"])

def test_unmarked_swallowing_the_refusal():
    try:
        subprocess.run([sys.executable, "-c", "pass"])
    except Exception:
        pass

def test_unmarked_os_system():
    os.system("true")

def test_unmarked_fork_in_c():
    ctypes.CDLL(None).system(b"true")

@pytest.mark.slow
def test_slow_but_mpi():
    subprocess.run(["mpiexec", "-n", "2", "true"])

@pytest.mark.slow
def test_slow():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.mpi
def test_mpi():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_starting_nothing():
    pass
'''


@pytest.mark.slow
def test_the_guard_fails_each_unmarked_start_and_passes_the_marked(tmp_path):
    """conftest.py loaded as a plugin into a pytest of its own, on tests that start processes
    every way it watches, marked and not, and on a module that starts one when collected."""
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    (tmp_path / "test_at_import.py").write_text("import subprocess, sys\nsubprocess.run([sys.executable, '-c', "
                                                "'pass'])\n\ndef test_nothing():\n    pass\n")
    out = mpirun(1, ["-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-rA",
                     "--continue-on-collection-errors", "--rootdir", tmp_path, tmp_path],
                 env=dict(ENV, PYTHONPATH=str(TESTS)), cwd=tmp_path, timeout=120, check=False)
    results = {name: outcome for outcome, name in re.findall(r"^(PASSED|FAILED|ERROR) \S+?::(\w+)", out.stdout,
                                                            re.M)}
    assert results == {"test_unmarked": "FAILED", "test_unmarked_swallowing_the_refusal": "ERROR",
                       "test_unmarked_os_system": "FAILED", "test_unmarked_fork_in_c": "ERROR",
                       "test_slow_but_mpi": "FAILED", "test_slow": "PASSED", "test_mpi": "PASSED",
                       "test_starting_nothing": "PASSED"}, out.stdout
    assert "ERROR test_at_import.py" in out.stdout and "starts a process when it is imported" in out.stdout
    assert "is marked neither `mpi` nor `slow`" in out.stdout and "is not marked `mpi`" in out.stdout, out.stdout
