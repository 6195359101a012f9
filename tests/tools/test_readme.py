"""The README and the pages of docs/ as written: the README's Python example runs and prints what
its comments say, every command any page gives for an example (`python -m infinitrain.examples.X
...`, under mpirun, srun or mpi_launch) is accepted by that example's own flags, every training
command runs, and every relative link lands on a file of this repository (and a heading of it),
so a renamed or misspelt flag, file or section fails here, naming the page, rather than for a
reader."""
import contextlib
import glob
import io
import json
import re
import shlex
import sys

import pytest

from helpers import ROOT, launch, run

# the README first, then every page of docs/; each block below carries the page it came from
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text()
         for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
README = PAGES["README.md"]
# before the README was split into docs/, it alone gave 18 example commands and 14 training
# commands; the pages together give these, and neither may drop
N_EXAMPLE_COMMANDS = 23
N_TRAINING_COMMANDS = 21


def _blocks(language: str) -> list:
    """(page, text) of every ```language block of every page."""
    return [(page, block) for page, text in PAGES.items()
            for block in re.findall(rf"```{language}\n(.*?)```", text, re.S)]


def _lines(block: str):
    """The block's command lines: continuations joined, spaces collapsed, what a `&&` chain
    runs last, without its comment."""
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        yield re.sub(r"[ \t]{2,}", " ", line.split(" # ")[0].split("&&")[-1].strip())


def test_the_python_example_prints_what_its_comments_say():
    (page, block), = [(p, b) for p, b in _blocks("python") if "import infinitrain as it" in b]
    assert page == "README.md"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, page, "exec"), {})
    claims = [c.strip() for c in re.findall(r"^print\(.*\)\s*#\s*(.*)$", block, re.M)]
    assert claims and printed.getvalue().splitlines() == claims, page


def _example_commands() -> dict:
    """(module, its flags) of every command that runs an example -> the pages that give it."""
    found = {}
    for page, block in _blocks("bash"):
        for line in _lines(block):
            m = re.search(r"-m (infinitrain\.examples\.\w+)(.*)$", line)
            if m and not line.startswith("#"):
                key = m.group(1), tuple(shlex.split(m.group(2).replace("...", "").replace("…", "")))
                found.setdefault(key, []).append(page)
    return found


EXAMPLE_COMMANDS = _example_commands()
COMMANDS = sorted(EXAMPLE_COMMANDS)


def _id(pages, words) -> str:
    return f"{'+'.join(dict.fromkeys(pages))}: {' '.join(words)}"[:110]


def test_the_pages_have_example_commands():
    assert len(COMMANDS) >= N_EXAMPLE_COMMANDS and {m for m, _ in COMMANDS} >= {
        "infinitrain.examples.gpt2", "infinitrain.examples.llama3", "infinitrain.examples.mnist",
        "infinitrain.examples.transformer"}
    # the README's tour gives a command for each capability, and each topic's page its own
    pages = {p for ps in EXAMPLE_COMMANDS.values() for p in ps}
    assert pages >= {"README.md", "docs/training.md", "docs/parallelism.md", "docs/memory-and-offload.md",
                     "docs/failures.md", "docs/clusters.md", "docs/interop.md", "docs/benchmarks.md"}, pages
    in_readme = [k for k, ps in EXAMPLE_COMMANDS.items() if "README.md" in ps]
    assert len(in_readme) >= 15, in_readme


def _parse(module: str, flags: list):
    name = module.rsplit(".", 1)[-1]
    if name in ("mnist", "transformer"):
        from importlib import import_module
        return import_module(module).parse_args(flags)
    from infinitrain.examples.lm_flags import parse_args
    from infinitrain.models import GPT2_PRESETS, LLAMA3_PRESETS
    presets, default = (GPT2_PRESETS, "gpt2") if name == "gpt2" else (LLAMA3_PRESETS, "llama3-8b")
    return parse_args(flags, "", presets, default, moe=name == "llama3")


@pytest.mark.parametrize("module,flags", COMMANDS,
                         ids=[_id(EXAMPLE_COMMANDS[c], [c[0].split(".")[-1], *c[1]]) for c in COMMANDS])
def test_every_example_command_in_the_pages_parses(module, flags, capsys):
    where = ", ".join(dict.fromkeys(EXAMPLE_COMMANDS[module, flags]))
    if "--help" in flags:
        with pytest.raises(SystemExit) as done:
            _parse(module, list(flags))
        assert done.value.code == 0 and "--input_bin" in capsys.readouterr().out, where
    else:
        try:
            _parse(module, list(flags))
        except SystemExit as refused:
            pytest.fail(f"{where}: {module} {' '.join(flags)} is refused by its flags "
                        f"(exit {refused.code}): {capsys.readouterr().err.strip()}")


def _run_as_written(line: str, cwd, extra=()):
    """One command line from a page, run from cwd: `mpirun -np N` (or `mpi_launch
    --nproc_per_node N`) becomes the tests' launcher for N ranks, `python` this Python; extra
    flags go last, where argparse lets them win. Returns what it printed; fails with it unless it
    exits 0."""
    words = shlex.split(line)
    if words[0] == "mpirun":
        n = int(words[words.index("-np") + 1])
        words = launch(n) + words[words.index("-np") + 2:]
    elif words[0] == "mpi_launch":
        n = int(words[words.index("--nproc_per_node") + 1])
        words = launch(n) + ["python"] + words[words.index("--nproc_per_node") + 2:]
    words = [sys.executable if w == "python" else w for w in words] + list(extra)
    out = run(words, timeout=600, cwd=cwd)
    assert out.returncode == 0, f"{line}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout + out.stderr


def _runnable_lines() -> dict:
    """Every line of a page that trains with an example here -> the pages that give it. Left
    out: srun lines (tests/parallel/test_cluster.py runs srun), --help, and the precision
    checker's lines (its pair is run below as written)."""
    found = {}
    for page, block in _blocks("bash"):
        for line in _lines(block):
            if (re.search(r"-m infinitrain\.examples\.\w+", line)
                    and line.split()[0] in ("python", "mpirun", "mpi_launch")
                    and "--help" not in line and "..." not in line and "--precision_check" not in line):
                found.setdefault(line, []).append(page)
    return found


RUNNABLE_PAGES = _runnable_lines()
RUNNABLE = sorted(RUNNABLE_PAGES)
# what keeps each run to a few seconds; argparse takes the last value of a flag
SHORT = {"mnist": ["--epochs", "1", "--train_subset", "256"],
         "transformer": ["--num_iteration", "2", "--batch_size", "8", "--max_len", "16", "--translate", "2",
                         "--beam", "2"],
         "lm": ["--num_iteration", "2", "--batch_size", "2", "--sequence_length", "32"]}


@pytest.fixture(scope="module")
def gpt2_124m_file(tmp_path_factory):
    """An llm.c GPT-2 124M checkpoint, written once for every command that names one."""
    from infinitrain.models import gpt2
    path = tmp_path_factory.mktemp("llmc") / "gpt2_124M.bin"
    gpt2("gpt2").save_llmc(path)
    return path


# a command that reads a folder -> the flag of the command that writes it (the adapters the
# LoRA command saves, the transformers folder the export writes)
STARTS_FROM = {"--lora_load_path": "--lora_save_path", "--from_pretrained": "--save_pretrained"}


def _folder(line: str, flag: str) -> str:
    words = shlex.split(line)
    return words[words.index(flag) + 1].rstrip("/")


def _short(line: str) -> list:
    """The flags that cut a command to two short steps. A command that sets --total_batch_size
    keeps its page's number of micro-batches per step (the schedule it shows): the global batch
    scaled by the short micro-batch against the page's. A GPT-2 command that names no model
    trains the small one: the default, 124M, trains in the commands that start from its llm.c
    file (one process, and TP 2 with LoRA)."""
    kind = re.search(r"examples\.(\w+)", line).group(1)
    short = SHORT.get(kind, SHORT["lm"])
    words = shlex.split(line)
    if kind == "gpt2" and not {"--model", "--llmc_filepath", "--from_pretrained", "--load"} & set(words):
        short = short + ["--model", "small"]
    if "--total_batch_size" in words and kind in ("gpt2", "llama3"):
        module = words.index("-m") + 1
        page, cut = _parse(words[module], words[module + 1:]), _parse(words[module], words[module + 1:] + short)
        total = int(words[words.index("--total_batch_size") + 1])
        short = short + ["--total_batch_size", str(total * cut.batch_size * cut.sequence_length
                                                   // (page.batch_size * page.sequence_length))]
    return short


@pytest.fixture(scope="module")
def ran(tmp_path_factory, request):
    """Runs a command once in a folder of its own: line -> (that folder, what it printed). A
    command whose folder another command starts from is run once for both of their tests."""
    done = {}

    def run_once(line):
        if line not in done:
            cwd = tmp_path_factory.mktemp("run")
            if "gpt2_124M.bin" in line:
                (cwd / "gpt2_124M.bin").symlink_to(request.getfixturevalue("gpt2_124m_file"))
            done[line] = cwd, _run_as_written(line, cwd, _short(line))
        return done[line]
    return run_once


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("line", RUNNABLE, ids=[_id(RUNNABLE_PAGES[ln], [ln]) for ln in RUNNABLE])
def test_every_training_command_in_the_pages_runs(line, tmp_path, request):
    """Each command as its page writes it, with the files it names where it names them (an
    llm.c GPT-2 124M checkpoint; the adapters the LoRA command saves for the one that loads
    them; the transformers folder one command exports for the one that starts from it: each
    saver run once, for its own test and its reader's), cut to two short steps."""
    where = ", ".join(dict.fromkeys(RUNNABLE_PAGES[line]))
    if any(f" {flag} " in line for flag in STARTS_FROM.values()):
        tmp_path, out = request.getfixturevalue("ran")(line)
    else:
        if "gpt2_124M.bin" in line:
            (tmp_path / "gpt2_124M.bin").symlink_to(request.getfixturevalue("gpt2_124m_file"))
        for reader, writer in STARTS_FROM.items():
            if f" {reader} " in line:
                (saver,) = [ln for ln in RUNNABLE if f" {writer} " in ln]
                saved, _ = request.getfixturevalue("ran")(saver)
                (tmp_path / _folder(line, reader)).symlink_to(saved / _folder(saver, writer))
        if "my_data/" in line:  # the text the page's `prepare text` line prepares, from files of its names
            _prepare_own_text(tmp_path)
        out = _run_as_written(line, tmp_path, _short(line))
    assert re.search(r"step +2/2 .*train loss|epoch 1", out), f"{where}\n{out[-2000:]}"
    for generate in [ln for _, b in _blocks("bash") for ln in _lines(b) if "infinitrain.generate --load my_run" in ln
                     and "--save my_run" in line]:  # generation from the checkpoint the run saved
        prompt = shlex.split(generate)[shlex.split(generate).index("--prompt") + 1]
        assert prompt in _run_as_written(generate, tmp_path), f"{where}: {generate}"
    if "--profile" in line:
        assert (tmp_path / "trace.json").stat().st_size > 0, where


def _prepare_own_text(cwd) -> None:
    """The README's `prepare text` line into my_data/, run on three documents of the kinds it
    names (its globs expanded as a shell would)."""
    (line,) = {ln for page, b in _blocks("bash") for ln in _lines(b) if page == "README.md"
               and ln.startswith("python -m infinitrain.data.prepare text") and "--out my_data" in ln}
    words = " ".join(["the cat sat on the mat and then it ran away."] * 40)
    (cwd / "my_texts").mkdir()
    for name in ("a.txt", "b.txt"):
        (cwd / "my_texts" / name).write_text(words)
    (cwd / "my_texts" / "c.jsonl").write_text(json.dumps({"text": words}) + "\n")
    expanded = [w2 for w in shlex.split(line) for w2 in (sorted(glob.glob(w, root_dir=cwd)) if "*" in w else [w])]
    out = run([sys.executable if w == "python" else w for w in expanded], cwd=cwd)
    assert out.returncode == 0 and (cwd / "my_data" / "val_000000.bin").is_file(), f"{line}\n{out.stderr[-2000:]}"


def test_the_pages_have_training_commands_to_run():
    assert len(RUNNABLE) >= N_TRAINING_COMMANDS
    assert len([ln for ln in RUNNABLE if "--lora_save_path" in ln]) == 1  # the one the LoRA loader needs


@pytest.mark.mpi
@pytest.mark.slow
def test_the_precision_checker_example_runs_as_written(tmp_path):
    """The one-process baseline and the two-rank comparison as their page writes them (mpirun is
    the launcher the tests use), with the short micro-batch of the training commands (the page's
    micro-batches per step kept): every tensor within tolerance."""
    (page, block), = [(p, b) for p, b in _blocks("bash")
                      if "--precision_check" in b and "output_path=" in b and "baseline=" in b]
    lines = [ln for ln in re.sub(r"\\\n\s*", " ", block).splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lines) == 2, page
    outs = [_run_as_written(line, tmp_path, _short(line)) for line in lines]
    summary = re.findall(r"(\d+) tensors compared with one, (\d+) beyond", outs[-1])
    assert len(summary) == 2 and all(int(n) > 100 and bad == "0" for n, bad in summary), f"{page}\n{outs[-1][-2000:]}"


def _anchors(text: str) -> set:
    """GitHub's anchors for a page's headings (code blocks left out): lower case, punctuation
    dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _links():
    """(page, target) of every markdown link and image of every page, code spans and blocks left out."""
    for page, text in PAGES.items():
        text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            yield page, target


LINKS = sorted(set(_links()))


def test_the_pages_link_to_each_other():
    """The README links every page of docs/, and every page links back to the README and starts
    with its title and a paragraph that sums it up."""
    linked = {t.split("#")[0] for p, t in LINKS if p == "README.md"}
    for page, text in PAGES.items():
        if page == "README.md":
            continue
        assert page in linked, f"README.md does not link {page}"
        assert "](../README.md" in text, f"{page} has no link back to the README"
        title, blank, summary = text.split("\n")[:3]
        assert title.startswith("# ") and not blank and summary and not summary.startswith(("#", "`", "|", "[")), page


@pytest.mark.parametrize("page,target", LINKS, ids=[f"{p}: {t}"[:110] for p, t in LINKS])
def test_every_relative_link_lands_in_the_repository(page, target):
    """A link from a page is a web address or a path, relative to the page, to a file or folder
    of this repository (never outside it, such as ../shared/), and its #anchor a heading there."""
    if re.match(r"[a-z]+:", target):
        assert target.startswith(("https://", "http://", "mailto:")), f"{page}: {target}"
        return
    path, _, anchor = target.partition("#")
    base = (ROOT / page).parent
    resolved = (base / path).resolve() if path else (ROOT / page).resolve()
    assert not path.startswith("/") and resolved.is_relative_to(ROOT.resolve()), \
        f"{page}: {target} leaves the repository"
    assert resolved.exists(), f"{page}: {target} does not exist"
    if anchor:
        assert resolved.suffix == ".md", f"{page}: {target}"
        assert anchor in _anchors(resolved.read_text()), f"{page}: {target}: no such heading"
