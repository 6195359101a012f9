#!/usr/bin/env bash
# Runs on the GPU machine, offline, from a folder made by benchmarks/gpu/prepare.sh (which copies this script into
# it): the GPU tests, compute-sanitizer's memcheck, GPT-2 124M and LLaMA-3.2-1B training steps of infinitrain beside
# PyTorch eager and torch.compile, the attention kernels beside PyTorch's, and the GPU time of each kernel of
# infinitrain's GPT-2 step; then one summary table (benchmarks/gpu/summary.py, also written to OUT/summary.md).
#
#   bash PACK_DIR/run.sh PACK_DIR [OUT_DIR]          (OUT_DIR default /tmp/gpu-out; every step's log goes there)
#
# Every step is capped by `timeout`, and all of them by GPU_BUDGET seconds (default 480): a step that would start with
# less than 20 s left is skipped, so the summary always comes. About 5-7 minutes on an H200 (torch.compile's
# warm-ups about 2 of them). Settings (environment):
#   GPU_SKIP        comma-separated parts to leave out: tests, memcheck, gpt2, llama, infinitrain, eager, compile,
#                   kernels, attention (e.g. GPU_SKIP=compile,memcheck,llama)
#   GPU_B, GPU_T    GPT-2's batch and sequence (16 x 1024: llm.c's GPT-2 size per GPU)
#   GPU_LLAMA_B, GPU_LLAMA_T   LLaMA-3.2-1B's (4 x 1024: see README.md for why)
#   GPU_GPT2_MODEL, GPU_LLAMA_MODEL   the presets (gpt2, llama3.2-1b; gpt2:tiny, llama3:tiny for a smoke test)
#   GPU_STEPS, GPU_WARMUP   measured and warm-up steps (8 and 3; LLaMA runs GPU_LLAMA_STEPS, 5)
#   GPU_PEAK_TFLOPS the GPU's dense bf16 peak for MFU (989: H100 / H200 SXM)
#   GPU_ATTENTION   benchmarks/attention.py's arguments (default: its two shapes, 20 repeats)
#   GPU_TESTS_K     pytest's -k for the GPU tests (default "not ecosystem")
set -u
pack=$(cd "${1:?usage: run.sh PACK_DIR [OUT_DIR]}" && pwd); out=${2:-/tmp/gpu-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
proj=$pack/proj; gpu=$proj/benchmarks/gpu
start=$SECONDS; budget=${GPU_BUDGET:-480}; skip=",${GPU_SKIP:-},"
B=${GPU_B:-16}; T=${GPU_T:-1024}; LB=${GPU_LLAMA_B:-4}; LT=${GPU_LLAMA_T:-1024}
steps=${GPU_STEPS:-8}; warmup=${GPU_WARMUP:-3}; lsteps=${GPU_LLAMA_STEPS:-5}; peak=${GPU_PEAK_TFLOPS:-989}
gpt2=${GPU_GPT2_MODEL:-gpt2}; llama=${GPU_LLAMA_MODEL:-llama3.2-1b}
# the image's nvidia-* wheels (cuBLAS 13, NCCL) where libinfinitrain_cuda.so's RUNPATH looks: $ORIGIN/../../nvidia
nv=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null) && ln -sfn "$nv" "$pack/site/nvidia"
export PYTHONPATH=$pack/site${PYTHONPATH:+:$PYTHONPATH} INFINITRAIN_DATA=$pack/data PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export LD_LIBRARY_PATH=$pack/site/scipy_openblas32/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cd "$proj" || exit 1
: > "$out/steps.txt"

skipped() { case "$skip" in *",$1,"*) return 0;; esac; return 1; }
# step NAME CAP_SECONDS COMMAND...: runs COMMAND under timeout (the cap, or what is left of the budget) with its output
# in OUT/NAME.log, and records "NAME rc seconds" (rc "skipped" when no time is left) in OUT/steps.txt
step() {
  local name=$1 cap=$2 left=$((budget - (SECONDS - start))); shift 2
  [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 20 ]; then echo "$name skipped 0" >> "$out/steps.txt"; echo "=== $name: skipped, budget spent"; return; fi
  echo "=== $name ($(date +%T), at most ${cap} s)"
  local t0=$SECONDS
  timeout -k 5 "$cap" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name $rc $((SECONDS - t0))" >> "$out/steps.txt"
  tail -n 3 "$out/$name.log" | cut -c1-200
}

step env 60 bash -c 'echo "gpu $( (nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo none: no nvidia-smi) 2>/dev/null | head -1)"
  python3 -c "import infinitrain as it; print(\"infinitrain\", it.build_info()); print(\"cuda available\", it.cuda.is_available())"
  python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available())" || echo "torch none"'
torch_cuda=$(grep -c "^torch .* cuda True" "$out/env.log")

# pytest-xdist and pytest-timeout where installed (the GPU image has both)
plugins=$(python3 -c "import xdist; print('-n 8')" 2>/dev/null; python3 -c "import pytest_timeout; print('--timeout 80')" 2>/dev/null)
# shellcheck disable=SC2086
skipped tests || step tests 150 python3 -m pytest -q -p no:cacheprovider $plugins -rfEs --tb=short \
  tests/cuda/test_cuda.py tests/cuda/test_cuda_step.py -k "${GPU_TESTS_K:-not ecosystem}"

if ! skipped memcheck; then
  if command -v compute-sanitizer >/dev/null; then
    # NCCL's initialisation probes its own kernels (cudaFuncGetAttributes): API errors that are not the project's
    step memcheck 100 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 7 \
      python3 -m infinitrain.examples.gpt2 --device cuda --dtype bfloat16 --model tiny --batch_size 2 \
      --sequence_length 32 --total_batch_size 64 --num_iteration 2 --val_loss_every 0 --sample_every 0
  else echo "memcheck none 0" >> "$out/steps.txt"; fi
fi

# train MODEL_KEY MODEL B T STEPS CAP_INFINITRAIN CAP_EAGER CAP_COMPILED
train() {
  local key=$1 model=$2 b=$3 t=$4 n=$5 caps=("$6" "$7" "$8") fws=(infinitrain torch-eager torch-compiled)
  local parts=(infinitrain eager compile) i
  for i in 0 1 2; do
    skipped "${parts[$i]}" && continue
    if [ "$i" -gt 0 ] && [ "$torch_cuda" = 0 ]; then  # PyTorch without CUDA (a development machine): said, not run
      echo "{\"framework\": \"${fws[$i]}\", \"model\": \"$model\", \"B\": $b, \"T\": $t, \"error\": \"no CUDA\"}" \
        > "$out/train-$key-${fws[$i]}.json"; continue
    fi
    step "train-$key-${fws[$i]}" "${caps[$i]}" python3 "$gpu/train_gpu.py" --framework "${fws[$i]}" --model "$model" \
      --B "$b" --T "$t" --steps "$n" --warmup "$warmup" --peak_tflops "$peak" --out "$out/train-$key-${fws[$i]}.json"
  done
}

skipped gpt2 || train gpt2 "$gpt2" "$B" "$T" "$steps" 90 60 150
if ! skipped kernels && ! skipped gpt2; then
  if [ "$torch_cuda" = 0 ]; then echo '{"error": "no CUDA (PyTorch cannot read kernel times)"}' > "$out/kernels-gpt2.json"
  else step kernels-gpt2 60 python3 "$gpu/kprof.py" --model "$gpt2" --B "$B" --T "$T" --out "$out/kernels-gpt2.json"; fi
fi
# shellcheck disable=SC2086  # GPU_ATTENTION holds several arguments
skipped attention || step attention 60 python3 benchmarks/attention.py ${GPU_ATTENTION:---repeat 20}
skipped llama || train llama "$llama" "$LB" "$LT" "$lsteps" 120 90 180

echo "=== summary ($((SECONDS - start)) s)"
python3 "$gpu/summary.py" "$out" | tee "$out/summary.md"
