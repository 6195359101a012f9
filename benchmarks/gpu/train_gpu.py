"""One timed training run on one GPU: GPT-2 or LLaMA-3 (random weights), infinitrain or PyTorch
(eager, or torch.compile with the fused AdamW), timed as benchmarks/gpt2_train.py times a step
(forward + backward + AdamW + loss.item(), batches already on the device; the median step after
the warm-up). Prints one JSON line (tok_s, ms, mfu, peak_mb, loss, ...) and writes it to --out;
a framework that cannot run here (PyTorch without CUDA) gives {"error": "no CUDA ..."} and exit 0,
a run that fails the error and exit 1.

    python benchmarks/gpu/train_gpu.py --framework infinitrain --model gpt2 --B 16 --T 1024
    python benchmarks/gpu/train_gpu.py --framework torch-compiled --model llama3.2-1b --B 4 --T 1024

--model: a GPT-2 or LLaMA-3 preset of infinitrain.models (gpt2, llama3.2-1b, ...), written
gpt2:NAME or llama3:NAME where both have it (tiny, small). MFU is llm.c's FLOPs count (6 per
parameter per token plus attention's) against --peak_tflops (989: an H100's or H200's dense bf16).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FRAMEWORKS = ("infinitrain", "torch-eager", "torch-compiled")


def resolve(model: str):
    """'gpt2', 'llama3.2-1b', 'gpt2:tiny', 'llama3:tiny' -> (arch, preset, config)."""
    from infinitrain.models import GPT2_PRESETS, LLAMA3_PRESETS
    presets = {"gpt2": GPT2_PRESETS, "llama3": LLAMA3_PRESETS}
    arch, _, name = model.rpartition(":")
    if not arch:
        arches = [a for a, p in presets.items() if name in p]
        if len(arches) != 1:
            raise ValueError(f"--model {model!r}: " + (f"both GPT-2 and LLaMA-3 have it: write gpt2:{name} or "
                                                       f"llama3:{name}" if arches else "no such preset"))
        arch = arches[0]
    if arch not in presets or name not in presets[arch]:
        raise ValueError(f"--model {model!r}: no such preset (GPT-2: {', '.join(GPT2_PRESETS)}; "
                         f"LLaMA-3: {', '.join(LLAMA3_PRESETS)})")
    return arch, name, presets[arch][name]


def flops_per_token(arch: str, cfg, T: int) -> int:
    from infinitrain.examples.mfu import flops_per_token
    from infinitrain.models import GPT2, LLaMA3
    return flops_per_token((GPT2 if arch == "gpt2" else LLaMA3).active_parameters(cfg), cfg.n_layer, cfg.n_embd, T)


def no_cuda(framework: str) -> str | None:
    """Why `framework` cannot run on a GPU here, or None."""
    if framework == "infinitrain":
        import infinitrain as it
        return None if it.cuda.is_available() else f"no CUDA device ({it.build_info().split('CUDA: ', 1)[-1]})"
    import torch
    return None if torch.cuda.is_available() else f"no CUDA (PyTorch {torch.__version__})"


def make_step(framework: str, arch: str, cfg, dtype: str, device: str = "cuda"):
    """(prepare, step, peak_bytes) of one model and AdamW (lr 1e-4, betas 0.9 / 0.95, no weight
    decay) on `device`: prepare(batch [B, T + 1] int64 numpy) moves inputs and targets to the
    device; step(them) runs forward, backward, the update and loss.item() and returns the loss;
    peak_bytes() is the allocator's peak so far."""
    if framework == "infinitrain":
        import infinitrain as it
        from infinitrain.models import GPT2, LLaMA3
        it.manual_seed(0)
        model = (GPT2 if arch == "gpt2" else LLaMA3)(cfg).to(device)
        opt = it.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0)

        def prepare(b):
            return it.from_numpy(b[:, :-1].copy()).to(device), it.from_numpy(b[:, 1:].copy()).to(device)

        def step(xy):
            with it.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != "float32"):
                _, loss = model(*xy, return_logits=False)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.item()
        return prepare, step, lambda: it.cuda.max_memory_allocated(device)
    import torch
    torch.manual_seed(0)
    with torch.device(device):  # drawn on the device: a 1B model's weights in a moment
        if arch == "gpt2":
            sys.path.insert(0, str(HERE.parent))
            from torch_gpt2 import TorchGPT2
            # the unpadded vocabulary, as a PyTorch user writes it (as benchmarks/gpt2_train.py does)
            model = TorchGPT2(cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.block_size, cfg.vocab_size)
            # GPT-2's initialisation, as infinitrain's model has it: PyTorch's defaults draw the tied
            # embedding from N(0, 1), whose first loss is ~90 instead of ~11 (the timing is the same)
            for m in model.modules():
                if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                    torch.nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, torch.nn.Linear) and m.bias is not None:
                    torch.nn.init.zeros_(m.bias)
        else:
            sys.path.insert(0, str(HERE))
            from torch_llama import TorchLLaMA3
            model = TorchLLaMA3(cfg)
    model = model.to(device)  # the buffers made from numpy (the rotary tables) too
    compiled = framework == "torch-compiled"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0,
                            **({"fused": True} if compiled else {}))
    if compiled:
        model = torch.compile(model)  # compiles during the warm-up steps

    def prepare(b):
        return torch.from_numpy(b[:, :-1].copy()).to(device), torch.from_numpy(b[:, 1:].copy()).to(device)

    def step(xy):
        with torch.autocast(device.split(":")[0], dtype=getattr(torch, dtype), enabled=dtype != "float32"):
            loss = model(*xy)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return prepare, step, lambda: torch.cuda.max_memory_allocated(device)


def device_name(framework: str) -> str:
    try:
        if framework == "infinitrain":
            import infinitrain as it
            return it.cuda.get_device_name()
        import torch
        return torch.cuda.get_device_name()
    except Exception as e:  # the emulated GPU has no driver to name it
        return f"(unnamed: {type(e).__name__})"


def timed_run(framework: str, model: str, B: int, T: int, steps: int, warmup: int, dtype: str,
              peak_tflops: float) -> dict:
    arch, preset, cfg = resolve(model)
    result = dict(framework=framework, model=preset, arch=arch, B=B, T=T, dtype=dtype, steps=steps, warmup=warmup)
    why = no_cuda(framework)
    if why:
        return dict(result, error=why)
    if T > cfg.block_size:
        raise ValueError(f"--T {T} is longer than {model}'s block size {cfg.block_size}")
    prepare, step, peak_bytes = make_step(framework, arch, cfg, dtype)
    rng = np.random.default_rng(0)
    times, losses = [], []
    for _ in range(warmup + steps):
        xy = prepare(rng.integers(0, cfg.vocab_size, (B, T + 1)))
        t0 = time.perf_counter()
        losses.append(step(xy))
        times.append(time.perf_counter() - t0)
    measured = sorted(times[warmup:])
    median = measured[len(measured) // 2]
    tok_s = B * T / median
    return dict(result, device=device_name(framework), tok_s=tok_s, ms=1e3 * median,
                mfu=flops_per_token(arch, cfg, T) * tok_s / (peak_tflops * 1e12), peak_tflops=peak_tflops,
                peak_mb=peak_bytes() / 2**20, loss=losses[-1], first_loss=losses[0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--framework", required=True, choices=FRAMEWORKS)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--steps", type=int, default=8, help="measured steps (the median is reported)")
    p.add_argument("--warmup", type=int, default=3, help="steps before them (torch.compile compiles here)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="autocast dtype")
    p.add_argument("--peak_tflops", type=float, default=989.0, help="the GPU's peak for MFU")
    p.add_argument("--out", type=Path, help="also write the JSON line here")
    a = p.parse_args(argv)
    for flag in ("B", "T", "steps"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} must be at least 1, got {getattr(a, flag)}")
    try:
        r = timed_run(a.framework, a.model, a.B, a.T, a.steps, a.warmup, a.dtype, a.peak_tflops)
        rc = 0
    except Exception as e:  # reported in the table: an out-of-memory, a kernel's error
        r = dict(framework=a.framework, model=a.model, B=a.B, T=a.T,
                 error=f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
        rc = 1
        import traceback
        traceback.print_exc()
    line = json.dumps(r)
    print(line, flush=True)
    if a.out:
        a.out.write_text(line + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
