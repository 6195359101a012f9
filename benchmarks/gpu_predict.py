"""What each kernel family of a GPT-2 training step should take on an H100 or H200, from its
FLOPs and bytes, beside what the last GPU run measured (and, given a kernel table, beside a new
run's): the predictions the next GPU run checks.

    python benchmarks/gpu_predict.py                        # GPT-2 124M, bf16 autocast, 16 x 1024, H200
    python benchmarks/gpu_predict.py --gpu h100 --B 8 --T 1024
    python benchmarks/gpu_predict.py --model gpt2-medium    # any GPT-2 preset of infinitrain.models
    python benchmarks/gpu_predict.py --kernels OUT/kernels.log   # a run's per-kernel table (PyTorch's
                                                             # profiler, as benchmarks/gpu/run.sh writes it)

The model of each family: a product's time is its FLOPs at the rate such kernels reach on the
GPU (cuBLAS's large bf16 products 80 % of the dense peak, the H200 runs reached 72-77 %; attention
at the rates cuDNN's fused kernels reached on the H200 at GPT-2's shape, 225 TFLOP/s forward and
179 backward, though the backward here does 7 products to their 5: the price of a dQ without
atomics); a memory-bound kernel's is the bytes it must move at 80 % of the memory bandwidth.
"Measured" is the first H200 run (2026-11-27, main 8fbef9e: CUPTI, one step), before the kernels
these figures led to.
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

GPUS = {  # dense bf16 TFLOP/s, memory TB/s (SXM datasheets)
    "h100": dict(name="H100 SXM", tflops=989.0, tbs=3.35),
    "h200": dict(name="H200 SXM", tflops=989.0, tbs=4.8),
}
GEMM_EFFICIENCY, BANDWIDTH_EFFICIENCY = 0.80, 0.80
ATTENTION_FWD_TFLOPS, ATTENTION_BWD_TFLOPS = 225.0, 179.0

# kernel-name patterns of each family (infinitrain's kernels and cuBLAS's), and the H200's
# measured ms at 16 x 1024 (2026-11-27; attention: the WMMA kernels)
FAMILIES = {
    "matrix products (cuBLAS)": (r"gemm|cutlass|sm90_xmma|nvjet|cublas", 16.0),
    "attention forward": (r"flash_forward|mma_forward|attention_fwd", 5.2),
    "attention backward": (r"flash_backward|mma_backward|attention_d(kv|q)|attention_delta", 18.6),
    "float casts": (r"cast_kernel|cast_float_kernel", 4.8),
    "bias gradients": (r"column_chunks|column_partials|row_chunks|row_partials|reduce_kernel", 4.4),
    "cross-entropy": (r"ce_fwd|ce_bwd|cross_entropy", 4.7),
    "GELU": (r"unary_kernel|unary_grad_kernel|gelu", 4.7),
    "LayerNorm": (r"layernorm|norm_bwd", 4.4),
    "head split / merge copies": (r"copy_strided|copy_kernel", 2.9),
    "residual adds, gradient sums": (r"binary_flat_kernel|binary_kernel", None),
    "AdamW": (r"adamw", 1.0),
    "embedding": (r"embedding", 0.3),
}


@dataclass
class Shape:
    B: int = 16
    T: int = 1024
    L: int = 12
    C: int = 768
    H: int = 12
    V: int = 50304  # padded as llm.c and the engine pad it
    P: int = 1024  # positions (the block size)

    @classmethod
    def preset(cls, name: str, B: int, T: int) -> "Shape":
        """The sizes of infinitrain's GPT-2 preset `name` at batch B x T."""
        from infinitrain.models import GPT2_PRESETS
        if name not in GPT2_PRESETS:
            raise SystemExit(f"--model {name!r}: not a GPT-2 preset ({', '.join(GPT2_PRESETS)})")
        c = GPT2_PRESETS[name]
        return cls(B=B, T=T, L=c.n_layer, C=c.n_embd, H=c.n_head, V=c.padded_vocab_size, P=c.block_size)

    @property
    def N(self):
        return self.B * self.T


def work(s: Shape) -> dict[str, tuple[float, float]]:
    """(FLOPs, bytes) per family for one training step under bf16 autocast (16-bit activations
    into and out of every product, float32 residual stream, LayerNorm, logits' softmax and
    master weights; the minimum each kernel must read and write)."""
    N, C, L, V, B, T, H = s.N, s.C, s.L, s.V, s.B, s.T, s.H
    linear = L * 12 * C * C + C * V  # the weights of every product (q/k/v, projection, MLP, head)
    params = L * (12 * C * C + 13 * C) + V * C + s.P * C + 2 * C
    product = L * B * H * T * T * (C // H)  # one T x T x d product of every layer over the causal half
    bf, f32 = 2, 4
    return {
        "matrix products (cuBLAS)": (6.0 * N * linear, 0.0),
        "attention forward": (2 * product, 0.0),
        # two passes: dQ (S, dP, dQ) and dK/dV (S, dP, dV, dK): 7 products, deterministic
        "attention backward": (7 * product, 0.0),
        # each weight to bf16 once, and every product's float32 input to bf16 and its output back
        "float casts": (0.0, linear * (f32 + bf) + L * 2 * N * C * (f32 + bf) + L * 2 * N * C * (bf + f32)),
        # read each product's output gradient once (q/k/v 3C, projection C, MLP 4C and C)
        "bias gradients": (0.0, L * N * 9 * C * bf),
        # forward: the logits read once (online log-sum-exp); backward: read and write them
        "cross-entropy": (0.0, N * V * bf * 3),
        # forward reads x, writes y; backward reads x and dy, writes dx, on [N, 4C]
        "GELU": (0.0, L * N * 4 * C * bf * 5),
        # two per layer and the final one; forward reads x and writes y (float32), backward reads
        # x, dy and writes dx
        "LayerNorm": (0.0, (2 * L + 1) * N * C * f32 * 5),
        # q, k, v to head-major and the output back, forward and backward
        "head split / merge copies": (0.0, L * 8 * N * C * bf * 2),
        # float32 [N, C] adds, two operands read and one written: two residual adds a layer forward,
        # and the residual stream's gradient summed with each branch's in backward
        "residual adds, gradient sums": (0.0, L * 4 * N * C * f32 * 3),
        # parameter, gradient, two moments read; parameter, two moments written (float32)
        "AdamW": (0.0, params * f32 * 7),
        "embedding": (0.0, N * C * f32 * 3),
    }


def predict(s: Shape, gpu: dict) -> dict[str, float]:
    out = {}
    for family, (flops, nbytes) in work(s).items():
        if family == "matrix products (cuBLAS)":
            rate = GEMM_EFFICIENCY * gpu["tflops"] * 1e12
        elif family == "attention forward":
            rate = ATTENTION_FWD_TFLOPS * 1e12
        elif family == "attention backward":
            rate = ATTENTION_BWD_TFLOPS * 1e12
        else:
            rate = 0.0
        ms = flops / rate * 1e3 if flops else nbytes / (BANDWIDTH_EFFICIENCY * gpu["tbs"] * 1e12) * 1e3
        out[family] = ms
    return out


def _family(name: str) -> str | None:
    for family, (pattern, _) in FAMILIES.items():
        if re.search(pattern, name, re.I):
            return family
    return None


def measured_from(path: str) -> dict[str, float]:
    """Each family's GPU ms from a run's kernel table: benchmarks/gpu/kprof.py's JSON, or a
    PyTorch profiler table (its 'CUDA total' column)."""
    totals = dict.fromkeys(FAMILIES, 0.0)
    if path.endswith(".json"):
        import json
        for k in json.load(open(path))["kernels"]:
            family = _family(k["name"])
            if family:
                totals[family] += k["ms"]
        return totals
    unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    for line in open(path):
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) < 6:
            continue
        times = [c for c in cells if re.fullmatch(r"[\d.]+(us|ms|s)", c)]
        if not times:
            continue
        family = _family(cells[0])
        if family:
            value, u = re.fullmatch(r"([\d.]+)(us|ms|s)", times[-2] if len(times) > 1 else times[0]).groups()
            totals[family] += float(value) * unit[u]
    return totals


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", default="h200", choices=sorted(GPUS))
    p.add_argument("--model", default="gpt2", help="a GPT-2 preset (default gpt2: 124M)")
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--kernels", help="a run's per-kernel table to put beside the predictions")
    args = p.parse_args(argv)
    s, gpu = Shape.preset(args.model, args.B, args.T), GPUS[args.gpu]
    pred, w = predict(s, gpu), work(s)
    new = measured_from(args.kernels) if args.kernels else None
    print(f"GPT-2 {args.model} ({s.L} layers x {s.C}), bf16 autocast, {s.B} x {s.T}, "
          f"{gpu['name']} ({gpu['tflops']:.0f} TFLOP/s, {gpu['tbs']} TB/s)")
    head = "| kernels | GFLOP | GB | ceiling ms | H200 measured ms (2026-11-27) |" + (" this run ms |" if new else "")
    print(head)
    print("|---|--:|--:|--:|--:|" + ("--:|" if new else ""))
    for family, ms in pred.items():
        flops, nbytes = w[family]
        last = FAMILIES[family][1]
        row = f"| {family} | {flops / 1e9:.0f} | {nbytes / 1e9:.2f} | {ms:.2f} | {'-' if last is None else last} |"
        print(row + (f" {new[family]:.2f} |" if new else ""))
    total = sum(pred.values())
    last = sum(m for _, m in FAMILIES.values() if m is not None)
    print(f"| **step (sum)** | | | **{total:.1f}** | {last:.1f} |" + (f" {sum(new.values()):.1f} |" if new else ""))
    print(f"tokens/s at the ceiling: {s.N / total * 1e3:,.0f} (eager PyTorch measured 231,223 on the H200)")


if __name__ == "__main__":
    main()
