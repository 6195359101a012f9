"""The PyTorch programs of tests/programs/, written as a PyTorch user writes them, run on
infinitrain with only their imports changed (`import torch` -> `import infinitrain as torch`,
`from torch.x` -> `from infinitrain.x`) and give PyTorch's losses (skipped without torch).

Each program draws its data and its starting weights with numpy, so both libraries start from
the same numbers whatever their own random generators do; the losses then differ only by the
order of floating-point sums inside the kernels (BLAS blocking, reduction trees), which a few
optimizer steps carry forward: the tolerance of each program says what it allows and why."""
import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
_IMPORTS = [  # the only lines a user changes
    (re.compile(r"^(\s*)import torch(\s|$)", re.M), r"\1import infinitrain as torch\2"),
    (re.compile(r"^(\s*)import torch\.", re.M), r"\1import infinitrain."),
    (re.compile(r"^(\s*)from torch(\.| )", re.M), r"\1from infinitrain\2"),
]


def ported(source: str) -> str:
    """The program with its torch imports pointed at infinitrain, and nothing else changed."""
    for pattern, replacement in _IMPORTS:
        source = pattern.sub(replacement, source)
    return source


def _program(name: str, port: bool):
    """The program's namespace after running its source as a module (not as __main__)."""
    path = PROGRAMS / f"{name}.py"
    source = path.read_text()
    if port:
        source = ported(source)
    namespace = {"__name__": f"programs_{name}", "__file__": str(path)}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace


def losses(name: str, port: bool, **kwargs) -> list:
    return _program(name, port)["main"](**kwargs)


def test_only_the_imports_change():
    for path in sorted(PROGRAMS.glob("*.py")):
        before, after = path.read_text().splitlines(), ported(path.read_text()).splitlines()
        changed = [(a, b) for a, b in zip(before, after) if a != b]
        assert changed and all("torch" in a and "import" in a for a, _ in changed), path.name
        assert all("infinitrain" in b and "torch" not in b.replace("as torch", "") for _, b in changed), changed


# (program, arguments, rtol): rtol 1e-5 where a step's arithmetic is the same in the same order
CASES = [
    ("minimal_gpt", {"steps": 5}, 1e-5),
    ("minimal_gpt", {"steps": 5, "flash": False}, 1e-5),
]


@pytest.mark.parametrize("name,kwargs,rtol", CASES, ids=[f"{n}-{'-'.join(map(str, k.values()))}" for n, k, _ in CASES])
def test_program_gives_pytorchs_losses(name, kwargs, rtol):
    ours, theirs = losses(name, True, **kwargs), losses(name, False, **kwargs)
    assert len(ours) == len(theirs) and all(np.isfinite(ours))
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=0, err_msg=name)
