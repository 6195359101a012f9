"""The C ABI under hostile calls (see native_fuzz.py): run in a subprocess so that a crash is a
failed test with its output, not a dead test session."""
import subprocess
import sys
from pathlib import Path


def test_hostile_calls_into_the_c_abi_are_refused_never_crash():
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("native_fuzz.py")), "3000"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "hostile calls refused" in out.stdout, \
        f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
