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


@pytest.mark.parametrize("row_offset,block_rows", [(2**63 - 1, 1), (2**63 - 2, 2**20), (3, 2), (-1, 1)])
def test_a_window_past_the_rows_is_refused_even_when_its_end_wraps(row_offset, block_rows):
    """it_attention_merge tested row_offset + block_rows <= rows in int64: an offset near 2^63
    wrapped, returned OK and wrote before the output (or crashed)."""
    from infinitrain._native import ffi, lib
    cpu = ffi.new("it_device *", [lib.IT_CPU, 0])[0]
    buf = ffi.new("float[64]")
    status = lib.it_attention_merge(cpu, lib.IT_FLOAT32, buf, buf, buf, buf, 1, 4, block_rows, row_offset, 2)
    assert status != lib.IT_OK and b"falls outside [0, 4)" in ffi.string(lib.it_last_error())
