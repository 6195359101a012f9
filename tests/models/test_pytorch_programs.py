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


# (program, its arguments, rtol of the losses). 1e-5 where each step's arithmetic is PyTorch's
# in the same order; the measured worst is given for each looser one
CASES = [
    ("minimal_gpt", {"steps": 4}, 1e-5),                  # worst 1.7e-7
    ("minimal_gpt", {"steps": 3, "flash": False}, 1e-5),  # the explicit masked softmax
    ("cnn_classifier", {"steps": 4}, 1e-5),               # 1.1e-7
    ("lstm_language_model", {"steps": 4}, 1e-5),          # 3.3e-7
    ("vae", {"steps": 4}, 1e-5),                          # 1.7e-7
    ("text_classifier", {"steps": 3}, 1e-5),              # 1.7e-7
    ("mixed_precision", {"steps": 4}, 1e-5),              # float32: the scaler's power of two is exact
    ("dcgan", {"steps": 3}, 1e-5),                        # 3.0e-7
    # AdamW divides each step by the root of the squared gradients' average, so a last-bit
    # difference in a small gradient moves a weight by up to lr; the losses fall to 0.02 and
    # agree to 7.5e-6 after six steps
    ("resume_from_checkpoint", {"steps": 6}, 5e-5),
    # bfloat16 keeps 8 bits: one rounding is up to 3.9e-3 relative, and which of the products
    # and sums are rounded is autocast's list; the losses agree to 3.4e-4
    ("mixed_precision", {"steps": 4, "dtype": "bfloat16"}, 2e-3),
    ("mixed_precision", {"steps": 4, "dtype": "float16"}, 1e-4),  # 11 bits: 2.2e-5
]
# torch.compile is the identity here; PyTorch's dynamo costs seconds on its first call and, with
# any backend, keeps the arithmetic, so PyTorch runs the program with it off
THEIRS = {"resume_from_checkpoint": {"compile": False}}


def _id(name, kwargs):
    return "-".join([name, *(f"{k}={v}" for k, v in kwargs.items() if k != "steps")])


@pytest.mark.filterwarnings("ignore:infinitrain.compile:UserWarning")
@pytest.mark.parametrize("name,kwargs,rtol", CASES, ids=[_id(n, k) for n, k, _ in CASES])
def test_program_gives_pytorchs_losses(name, kwargs, rtol):
    ours = losses(name, True, **kwargs)
    theirs = losses(name, False, **kwargs, **THEIRS.get(name, {}))
    assert len(ours) == len(theirs) and np.isfinite(ours).all()
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=0, err_msg=name)


@pytest.mark.filterwarnings("ignore:infinitrain.compile:UserWarning")
def test_a_checkpoint_round_trip_loses_nothing():
    """Model, optimizer and scheduler saved half way and loaded into fresh ones: the same losses,
    to the bit, as the run that never stopped."""
    assert losses("resume_from_checkpoint", True) == losses("resume_from_checkpoint", True, resume=False)


def test_dropout_trains_with_its_own_masks():
    """Dropout draws its masks from the library's own generator, whose stream is not PyTorch's:
    the program runs and learns, and its losses are not compared."""
    with_dropout = losses("cnn_classifier", True, steps=3, p_drop=0.5)
    assert np.isfinite(with_dropout).all() and with_dropout != losses("cnn_classifier", True, steps=3)

