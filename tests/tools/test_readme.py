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
    if name == "mnist":
        from infinitrain.examples.mnist import parse_args
        return parse_args(flags)
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


@pytest.mark.mpi
@pytest.mark.slow
def test_the_precision_checker_example_runs_as_written(tmp_path):
    """The README's one-process baseline and its two-rank comparison, exactly as written there
    (mpirun is the launcher the tests use): every tensor within tolerance."""
    import subprocess
    import sys
    from helpers import ENV, launch
    (block,) = [b for b in _blocks("bash") if "--precision_check" in b and "baseline=" in b]
    lines = [ln for ln in re.sub(r"\\\n\s*", " ", block).splitlines() if ln.strip() and not ln.startswith("#")]
    outs = []
    for line in lines:
        words = shlex.split(line)
        if words[0] == "mpirun":  # `mpirun -np N python ...`: the tests' launcher for N ranks
            n = int(words[words.index("-np") + 1])
            words = launch(n) + words[words.index("-np") + 2:]
        words = [sys.executable if w == "python" else w for w in words]
        out = subprocess.run(words, capture_output=True, text=True, timeout=600, env=ENV, cwd=tmp_path)
        assert out.returncode == 0, f"{line}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        outs.append(out.stdout + out.stderr)
    summary = re.findall(r"(\d+) tensors compared with one, (\d+) beyond", outs[-1])
    assert len(summary) == 2 and all(int(n) > 100 and bad == "0" for n, bad in summary), outs[-1][-2000:]
