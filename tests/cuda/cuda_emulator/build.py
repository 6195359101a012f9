"""Builds libinfinitrain_cuda.so from native/src/cuda/ for the emulated GPU of include/emulated_cuda.h.

    python tests/cuda/cuda_emulator/build.py OUT_DIR

OUT_DIR receives libinfinitrain_cuda.so (the project's unchanged CUDA sources, launches
rewritten to emu_launch, compiled by g++), libemulated_cudart.so (the runtime it links) and the
emulated libcublas.so.13 and libnccl.so.2 that it opens. Point libinfinitrain at it with
INFINITRAIN_CUDA_LIBRARY=OUT_DIR/libinfinitrain_cuda.so; INFINITRAIN_EMULATED_GPUS sets how many
devices it reports (1 unless set; MPI ranks on one machine each take the one of their local
rank), INFINITRAIN_EMULATED_CUDA_TRACE=1 prints every queued and run kernel, copy and free.
Sources are only recompiled when they changed.
"""
import concurrent.futures
import hashlib
import os
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CUDA_SOURCES = ROOT / "native" / "src" / "cuda"
FLAGS = ["-std=c++17", "-O2", "-fPIC", "-g0", "-w", "-I", str(HERE / "include"),
         "-I", str(ROOT / "native" / "include"), "-I", str(CUDA_SOURCES)]
# kernel<<<grid, block, shared, stream>>>(  ->  emu_launch("kernel", kernel, grid, block, shared, stream)(
LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[\w:, ]*>)?)\s*<<<(.*?)>>>", re.S)


def rewrite_launches(source):
    return LAUNCH.sub(lambda m: f'emu_launch("{m.group(1)}", {m.group(1)}, {m.group(2)})', source)


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"emulated CUDA build failed: {' '.join(cmd)}\n{done.stdout}{done.stderr}")


def compile_object(source_text, name, out):
    """Compiles one translation unit unless an object of the same text, headers and flags exists."""
    headers = "".join(p.read_text() for p in sorted([*(HERE / "include").glob("*.h"),
                                                     *CUDA_SOURCES.glob("*.cuh"),
                                                     *(ROOT / "native" / "include").glob("*.h"),
                                                     ROOT / "native" / "src" / "cuda_bridge.h"]))
    key = hashlib.sha256((source_text + headers + " ".join(FLAGS)).encode()).hexdigest()[:16]
    obj = out / "obj" / f"{name}.{key}.o"
    if not obj.exists():
        for stale in (out / "obj").glob(f"{name}.*.o"):
            stale.unlink()
        src = out / "src" / f"{name}.cpp"
        src.write_text(source_text)
        run(["g++", *FLAGS, "-c", str(src), "-o", str(obj)])
    return obj


def build_program(source, out):
    """A CUDA program (a .cu file) built for the emulated GPU beside a build()'s libraries."""
    out = pathlib.Path(out).resolve()
    source = pathlib.Path(source)
    obj = compile_object(f'#line 1 "{source}"\n' + rewrite_launches(source.read_text()), source.stem, out)
    exe = out / source.stem
    run(["g++", str(obj), "-o", str(exe), "-L", str(out), "-lemulated_cudart", "-Wl,-rpath," + str(out)])
    return exe


def build(out):
    out = pathlib.Path(out).resolve()
    (out / "src").mkdir(parents=True, exist_ok=True)
    (out / "obj").mkdir(exist_ok=True)
    units = {f"cuda_{p.stem}": f'#line 1 "{p}"\n' + rewrite_launches(p.read_text())
             for p in sorted(CUDA_SOURCES.glob("*.cu"))}
    for name in ("emulator", "cublas", "nccl"):
        path = HERE / f"{name}.cpp"
        units[name] = f'#line 1 "{path}"\n' + path.read_text()
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        objs = dict(zip(units, pool.map(lambda kv: compile_object(kv[1], kv[0], out), units.items())))
    link = ["g++", "-shared", "-Wl,--no-undefined", "-Wl,-rpath,$ORIGIN"]
    run([*link, str(objs["emulator"]), "-o", str(out / "libemulated_cudart.so"), "-lpthread"])
    for lib, name in (("libcublas.so.13", "cublas"), ("libnccl.so.2", "nccl")):
        run([*link, str(objs[name]), "-o", str(out / lib), "-L", str(out), "-lemulated_cudart"])
    kernels = [str(objs[n]) for n in units if n.startswith("cuda_")]
    run([*link, *kernels, "-o", str(out / "libinfinitrain_cuda.so"), "-L", str(out),
         "-lemulated_cudart", "-ldl", "-lpthread"])
    return out / "libinfinitrain_cuda.so"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(build(sys.argv[1]))
