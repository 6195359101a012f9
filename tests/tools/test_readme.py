"""The README as written: its Python example runs and prints what its comments say, and every
command it gives for an example (`python -m infinitrain.examples.X ...`, under mpirun, srun or
mpi_launch) is accepted by that example's own flags, so a renamed or misspelt flag in the
README fails here rather than for a reader."""
import contextlib
import io
import re
import shlex

import pytest

from helpers import ROOT

README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def test_the_python_example_prints_what_its_comments_say():
    (block,) = [b for b in _blocks("python") if "import infinitrain as it" in b]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, "README.md", "exec"), {})
    claims = [c.strip() for c in re.findall(r"^print\(.*\)\s*#\s*(.*)$", block, re.M)]
    assert claims and printed.getvalue().splitlines() == claims


def _example_commands():
    """(module, its flags) of every README command that runs an example."""
    for block in _blocks("bash"):
        joined = re.sub(r"\\\n\s*", " ", block)  # continuation lines
        for line in joined.splitlines():
            line = line.split(" # ")[0].split("&&")[-1].strip()  # after the set-up, before a comment
            m = re.search(r"-m (infinitrain\.examples\.\w+)(.*)$", line)
            if m and not line.startswith("#"):
                yield m.group(1), shlex.split(m.group(2).replace("...", "").replace("…", ""))


COMMANDS = sorted(set((m, tuple(a)) for m, a in _example_commands()))


def test_the_readme_has_example_commands():
    assert len(COMMANDS) >= 10 and {m for m, _ in COMMANDS} >= {"infinitrain.examples.gpt2",
                                                                "infinitrain.examples.llama3"}


def _parse(module: str, flags: list):
    name = module.rsplit(".", 1)[-1]
    if name in ("mnist", "transformer"):
        from importlib import import_module
        return import_module(module).parse_args(flags)
    from infinitrain.examples.lm_flags import parse_args
    from infinitrain.models import GPT2_PRESETS, LLAMA3_PRESETS
    presets, default = (GPT2_PRESETS, "gpt2") if name == "gpt2" else (LLAMA3_PRESETS, "llama3-8b")
    return parse_args(flags, "", presets, default)


@pytest.mark.parametrize("module,flags", COMMANDS, ids=[" ".join([m.split(".")[-1], *a])[:80] for m, a in COMMANDS])
def test_every_example_command_in_the_readme_parses(module, flags, capsys):
    if "--help" in flags:
        with pytest.raises(SystemExit) as done:
            _parse(module, list(flags))
        assert done.value.code == 0 and "--input_bin" in capsys.readouterr().out
    else:
        _parse(module, list(flags))


def _run_as_written(line: str, cwd, extra=()):
    """One README command line, run from cwd: `mpirun -np N` (or `mpi_launch --nproc_per_node
    N`) becomes the tests' launcher for N ranks, `python` this Python; extra flags go last, where
    argparse lets them win. Returns what it printed; fails with it unless it exits 0."""
    import subprocess
    import sys
    from helpers import ENV, launch
    words = shlex.split(line)
    if words[0] == "mpirun":
        n = int(words[words.index("-np") + 1])
        words = launch(n) + words[words.index("-np") + 2:]
    elif words[0] == "mpi_launch":
        n = int(words[words.index("--nproc_per_node") + 1])
        words = launch(n) + ["python"] + words[words.index("--nproc_per_node") + 2:]
    words = [sys.executable if w == "python" else w for w in words] + list(extra)
    out = subprocess.run(words, capture_output=True, text=True, timeout=600, env=ENV, cwd=cwd)
    assert out.returncode == 0, f"{line}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout + out.stderr


def _runnable_lines():
    """Every README line that trains with an example here: what a `&&` chain runs last, without
    its comment. Left out: srun lines (tests/parallel/test_cluster.py runs srun), --help, and the
    precision-checker pair (run below as written)."""
    for block in _blocks("bash"):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" # ")[0].split("&&")[-1].strip()
            if (re.search(r"-m infinitrain\.examples\.\w+", line) and line.split()[0] in ("python", "mpirun", "mpi_launch")
                    and "--help" not in line and "..." not in line and "--precision_check" not in line):
                yield line


RUNNABLE = sorted(set(_runnable_lines()))
# what keeps each run to a few seconds; argparse takes the last value of a flag
SHORT = {"mnist": ["--epochs", "1", "--train_subset", "256"],
         "transformer": ["--num_iteration", "2", "--batch_size", "8", "--translate", "2", "--beam", "2"],
         "lm": ["--num_iteration", "2", "--batch_size", "2", "--sequence_length", "32"]}


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("line", RUNNABLE, ids=[ln[:90] for ln in RUNNABLE])
def test_every_training_command_in_the_readme_runs(line, tmp_path):
    """Each command as the README writes it, with the files it names where it names them (an
    llm.c GPT-2 124M checkpoint; the adapters the first LoRA command saves for the second), cut
    to two short steps."""
    if "gpt2_124M.bin" in line:
        from infinitrain.models import gpt2
        gpt2("gpt2").save_llmc(tmp_path / "gpt2_124M.bin")
        if "--lora_load_path" in line:
            (saver,) = [ln for ln in RUNNABLE if "--lora_save_path" in ln]
            _run_as_written(saver, tmp_path, SHORT["lm"])
    kind = re.search(r"examples\.(\w+)", line).group(1)
    out = _run_as_written(line, tmp_path, SHORT.get(kind, SHORT["lm"]))
    assert re.search(r"step +2/2 .*train loss|epoch 1", out), out[-2000:]
    if "--profile" in line:
        assert (tmp_path / "trace.json").stat().st_size > 0


def test_the_readme_has_training_commands_to_run():
    assert len(RUNNABLE) >= 10


@pytest.mark.mpi
@pytest.mark.slow
def test_the_precision_checker_example_runs_as_written(tmp_path):
    """The README's one-process baseline and its two-rank comparison, exactly as written there
    (mpirun is the launcher the tests use): every tensor within tolerance."""
    (block,) = [b for b in _blocks("bash") if "--precision_check" in b and "baseline=" in b]
    lines = [ln for ln in re.sub(r"\\\n\s*", " ", block).splitlines() if ln.strip() and not ln.startswith("#")]
    outs = [_run_as_written(line, tmp_path) for line in lines]
    summary = re.findall(r"(\d+) tensors compared with one, (\d+) beyond", outs[-1])
    assert len(summary) == 2 and all(int(n) > 100 and bad == "0" for n, bad in summary), outs[-1][-2000:]
