"""The C ABI under hostile calls (see native_fuzz.py): run in a subprocess so that a crash is a
failed test with its output, not a dead test session."""
from pathlib import Path

import pytest

from helpers import mpirun


@pytest.mark.slow
def test_hostile_calls_into_the_c_abi_are_refused_never_crash():
    out = mpirun(1, [Path(__file__).with_name("native_fuzz.py"), "3000"], check=False)
    assert out.returncode == 0 and "hostile calls refused" in out.stdout, \
        f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
