"""Compiler flags for C hosts that embed libinfinitrain, pkg-config style:

    cc host.c $(python -m infinitrain.config --cflags --libs) -o host
"""
from __future__ import annotations

import argparse
import sys

from ._native import HEADER_PATH, LIBRARY_PATH


def cflags() -> str:
    return f"-I{HEADER_PATH.parent}"


def libs() -> str:
    d = LIBRARY_PATH.parent
    return f"-L{d} -linfinitrain -Wl,-rpath,{d}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m infinitrain.config", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cflags", action="store_true", help="include flags for infinitrain.h")
    p.add_argument("--libs", action="store_true", help="link flags for libinfinitrain")
    p.add_argument("--includedir", action="store_true", help="the folder holding infinitrain.h")
    p.add_argument("--libdir", action="store_true", help="the folder holding the library")
    a = p.parse_args(argv)
    out = []
    if a.cflags:
        out.append(cflags())
    if a.libs:
        out.append(libs())
    if a.includedir:
        out.append(str(HEADER_PATH.parent))
    if a.libdir:
        out.append(str(LIBRARY_PATH.parent))
    if not out:
        p.print_help()
        return 2
    print(" ".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
