#!/usr/bin/env bash
# Prepares, on a development machine with nvcc 13 and the package registries, a folder that runs infinitrain on a
# GPU machine without network (its image: Python 3.12, torch with CUDA, the nvidia-cublas / nvidia-nccl cu13 wheels,
# numpy, ml-dtypes, tiktoken, safetensors, mpi4py, pytest, pytest-xdist, compute-sanitizer; no cffi, no
# scipy-openblas32, no infinitrain). See benchmarks/gpu/README.md.
#
#   benchmarks/gpu/prepare.sh PROJECT_DIR PACK_DIR     # e.g. benchmarks/gpu/prepare.sh . .gpu-pack
#
# PACK_DIR should be a git-ignored folder inside the checkout (so it travels with the working tree), < 60 MB:
#   PACK_DIR/site     infinitrain built with INFINITRAIN_CUDA=ON (the CPU library and libinfinitrain_cuda.so; cffi's
#                     ABI mode, so a build made under another Python 3 loads under 3.12), scipy-openblas32, cffi and
#                     pycparser for CPython 3.12
#   PACK_DIR/proj     the project's tests/, benchmarks/, examples/ and pyproject.toml (no infinitrain/ source beside
#                     them: it would shadow the installed package, which has the libraries)
#   PACK_DIR/data     the Shakespeare shards (the examples' default data)
#   PACK_DIR/run.sh   what runs there: bash PACK_DIR/run.sh PACK_DIR [OUT_DIR]
#
# INFINITRAIN_CUDA_ARCHITECTURES (default 90: H100/H200; "80;90" adds the A100) is what nvcc compiles for. The build
# folder PROJECT_DIR/build/gpu-pack-ARCH is kept, so a second prepare recompiles only what changed.
# GPU_PACK_LIBS=DIR takes libinfinitrain.so and libinfinitrain_cuda.so from a CMake build folder of yours instead of
# building (seconds instead of minutes; the libraries must match the checkout's sources). GPU_PACK_PYTHON (3.12: the GPU
# machine's) is the Python whose cffi and scipy-openblas32 wheels go in.
set -euo pipefail
proj=$(cd "${1:?usage: prepare.sh PROJECT_DIR PACK_DIR}" && pwd); pack=${2:?usage: prepare.sh PROJECT_DIR PACK_DIR}
here=$(cd "$(dirname "$0")" && pwd)
arch=${INFINITRAIN_CUDA_ARCHITECTURES:-90}
python=${PYTHON:-python3}
# only what this script makes is replaced: other files in PACK_DIR (scripts of your own) stay
mkdir -p "$pack"; pack=$(cd "$pack" && pwd)
rm -rf "$pack/site" "$pack/proj" "$pack/data" "$pack/whl" "$pack/run.sh"
mkdir -p "$pack/site" "$pack/proj" "$pack/data" "$pack/whl"
if [ -n "${GPU_PACK_LIBS:-}" ]; then
  for lib in libinfinitrain.so libinfinitrain_cuda.so; do
    [ -f "$GPU_PACK_LIBS/$lib" ] || { echo "prepare.sh: GPU_PACK_LIBS=$GPU_PACK_LIBS has no $lib" >&2; exit 1; }
  done
  # what the wheel installs: the package's sources, its header in include/, its libraries in lib/
  (cd "$proj" && tar --exclude=__pycache__ -cf - infinitrain mpi_launch) | (cd "$pack/site" && tar -xf -)
  mkdir -p "$pack/site/infinitrain/include" "$pack/site/infinitrain/lib"
  cp "$proj/native/include/infinitrain.h" "$pack/site/infinitrain/include/"
  cp "$GPU_PACK_LIBS/libinfinitrain.so" "$GPU_PACK_LIBS/libinfinitrain_cuda.so" "$pack/site/infinitrain/lib/"
else
  command -v nvcc >/dev/null || { echo "prepare.sh: no nvcc on PATH: the CUDA library cannot be built" >&2; exit 1; }
  echo "building infinitrain with CUDA for sm_$arch (minutes the first time; build folder build/gpu-pack-${arch//;/-})"
  INFINITRAIN_CUDA=ON "$python" -m pip install -q --no-deps --target "$pack/site" \
    -C cmake.define.INFINITRAIN_CUDA_ARCHITECTURES="$arch" -C build-dir="$proj/build/gpu-pack-${arch//;/-}" "$proj"
  [ -f "$pack/site/infinitrain/lib/libinfinitrain_cuda.so" ] || { echo "prepare.sh: no libinfinitrain_cuda.so built" >&2; exit 1; }
fi
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PACK_PYTHON:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$pack/whl" cffi pycparser scipy-openblas32
for w in "$pack"/whl/*.whl; do "$python" -m zipfile -e "$w" "$pack/site/"; done
rm -rf "$pack/whl" "$pack/site/bin"; find "$pack/site" -name __pycache__ -prune -exec rm -rf {} +
(cd "$proj" && tar --exclude=__pycache__ -cf - tests benchmarks examples pyproject.toml) | (cd "$pack/proj" && tar -xf -)
data=${INFINITRAIN_DATA:-$HOME/.cache/infinitrain}/shakespeare
[ -d "$data" ] || (cd "$proj" && "$python" -m infinitrain.data.prepare shakespeare)
cp -r "$data" "$pack/data/"
cp "$here/run.sh" "$pack/run.sh"
size=$(du -sm "$pack" | cut -f1)
ls -l "$pack/site/infinitrain/lib"; echo "$pack: $size MB"
[ "$size" -lt 60 ] || echo "prepare.sh: warning: $size MB, more than the 60 MB a working tree may carry with it" >&2
echo "on the GPU machine, from the checkout's root: bash $2/run.sh $2 [OUT_DIR]"
