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
