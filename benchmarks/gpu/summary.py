"""The one table of a GPU run: reads the folder benchmarks/gpu/run.sh wrote and prints markdown:
the GPU, the tests passed / failed / skipped, memcheck's errors, tokens/s, step time, MFU and peak
memory of each model and framework, the attention kernels' milliseconds per shape, and the
kernels that took the most GPU time in one step.

    python benchmarks/gpu/summary.py OUT_DIR
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FRAMEWORKS = {"infinitrain": "infinitrain", "torch-eager": "PyTorch eager", "torch-compiled": "torch.compile"}
MODELS = {"gpt2": "GPT-2", "llama": "LLaMA-3"}  # the run's model keys (train-KEY-FRAMEWORK.json)
TIMED_OUT = ("124", "137")  # timeout's status, and a kill after it


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def steps(out: Path) -> dict:
    """{step: (rc, seconds)} from steps.txt."""
    rows = {}
    for line in read(out / "steps.txt").splitlines():
        parts = line.split()
        if len(parts) == 3:
            rows[parts[0]] = (parts[1], int(parts[2]))
    return rows


def step_note(name: str, done: dict) -> str | None:
    """Why a step left no result: timed out, skipped, failed; None if it did not run at all."""
    if name not in done:
        return None
    rc, seconds = done[name]
    if rc in TIMED_OUT:
        return f"timed out ({seconds} s)"
    if rc == "skipped":
        return "skipped (time budget spent)"
    if rc == "none":
        return "not installed"
    return f"failed (rc {rc}, {seconds} s)" if rc != "0" else None


def cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def environment(out: Path) -> str:
    """The GPU (nvidia-smi's name, driver, memory), infinitrain's CUDA build, PyTorch's version."""
    lines = read(out / "env.log").splitlines()

    def after(prefix):
        return next((x[len(prefix):].strip() for x in lines if x.startswith(prefix)), None)
    parts = [after("gpu ") or "unknown GPU"]
    build = after("infinitrain ")
    if build:
        parts.append("infinitrain's " + (build.split("CUDA: ", 1)[1].split(";")[0] if "CUDA: " in build else build))
    if after("torch "):
        parts.append("torch " + after("torch "))
    return "; ".join(parts)


def tests(out: Path, done: dict) -> str:
    log = read(out / "tests.log")
    counts = {k: 0 for k in ("passed", "failed", "skipped", "error")}
    tail = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    if not tail:
        return step_note("tests", done) or ("no result" if "tests" in done else "not run")
    for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", tail[-1]):
        counts[kind.rstrip("s") if kind.startswith("error") else kind] += int(n)
    text = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    if counts["error"]:
        text += f", {counts['error']} errors"
    failed = [line.split()[1] for line in log.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if failed:
        text += " — " + ", ".join(f.split("::")[-1] for f in failed[:8]) + (" …" if len(failed) > 8 else "")
    note = step_note("tests", done)
    return text + (f" ({note})" if note else "")


def memcheck(out: Path, done: dict) -> str:
    m = re.search(r"ERROR SUMMARY: (\d+) errors?", read(out / "memcheck.log"))
    note = step_note("memcheck", done)
    if m is None:
        return "compute-sanitizer not installed" if note == "not installed" else (note or "not run")
    return f"{m.group(1)} errors" + (f" ({note})" if note and m.group(1) == "0" else "")


def memory(mb: float) -> str:
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.0f} MiB"


def training(out: Path, done: dict) -> list[str]:
    rows, peak = [], None
    for key, label in MODELS.items():
        results = {}
        for fw in FRAMEWORKS:
            path = out / f"train-{key}-{fw}.json"
            if path.exists():
                results[fw] = json.loads(read(path).strip().splitlines()[-1])
            elif f"train-{key}-{fw}" in done:
                results[fw] = {"error": step_note(f"train-{key}-{fw}", done) or "no result"}
        eager = results.get("torch-eager", {}).get("tok_s")
        for fw, r in results.items():
            name = f"{label} {r['model'].split(':')[-1]}" if "model" in r else label
            shape = f"{r['B']} × {r['T']}" if "B" in r else ""
            if "tok_s" not in r:
                rows.append(f"| {cell(name)} | {shape} | {FRAMEWORKS[fw]} | {cell(r.get('error', 'no result'))} "
                            "| | | | | |")
                continue
            peak = r.get("peak_tflops", peak)
            ratio = f"{r['tok_s'] / eager:.2f}x" if eager else ""
            rows.append(f"| {cell(name)} | {shape} | {FRAMEWORKS[fw]} | {r['tok_s']:,.0f} | {r['ms']:.1f} | "
                        f"{100 * r['mfu']:.1f} % | {memory(r['peak_mb'])} | {r['loss']:.3f} | {ratio} |")
    if not rows:
        return []
    head = [f"### Training step: bf16 autocast, AdamW, the median step after warm-up (MFU against "
            f"{peak or 989:g} TFLOP/s)", "",
            "| model | B × T | framework | tok/s | step ms | MFU | peak memory | loss | vs eager |",
            "|---|---|---|--:|--:|--:|--:|--:|--:|"]
    return head + rows + [""]


ATTENTION_ROW = re.compile(r"^(B\d+ H\d+/\d+ T\d+ d\d+)\s+(.+?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def attention(out: Path, done: dict) -> list[str]:
    rows = [m.groups() for m in map(ATTENTION_ROW.match, read(out / "attention.log").splitlines()) if m]
    note = step_note("attention", done)
    if not rows:
        return [f"### Attention: {note or 'no result'}", ""] if "attention" in done else []
    head = ["### Attention, causal (benchmarks/attention.py: ms per call)" + (f" — {note}" if note else ""), "",
            "| shape | implementation | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |", "|---|---|--:|--:|--:|--:|"]
    return head + [f"| {s} | {cell(impl)} | {f} | {ft} | {b} | {bt} |" for s, impl, f, ft, b, bt in rows] + [""]


def kernel_name(name: str) -> str:
    """A demangled kernel name without its return type and argument list, at most 90 characters."""
    name = re.sub(r"^void ", "", name.strip())
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the first "(" outside template brackets starts the arguments
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    name = name[:cut]
    return name if len(name) <= 90 else name[:89] + "…"


def kernels(out: Path, done: dict, top: int = 10) -> list[str]:
    lines = []
    for path in sorted(out.glob("kernels-*.json")):
        r = json.loads(read(path).strip().splitlines()[-1])
        title = f"### Top {top} kernels by GPU time"
        if "error" in r:
            lines += [f"{title}: {r['error']}", ""]
            continue
        lines += [f"{title}: {r['framework']}, {r['model']} {r['B']} × {r['T']}, one step "
                  f"({r['gpu_ms']:.1f} ms of kernels in a {r['step_ms']:.1f} ms step)", "",
                  "| # | kernel | calls | GPU ms | share |", "|--:|---|--:|--:|--:|"]
        for i, k in enumerate(r["kernels"][:top], 1):
            lines.append(f"| {i} | `{cell(kernel_name(k['name']))}` | {k['calls']} | {k['ms']:.2f} | "
                         f"{100 * k['ms'] / r['gpu_ms']:.1f} % |")
        lines.append("")
    key = "kernels-gpt2"
    if not lines and key in done:
        lines = [f"### Top {top} kernels by GPU time: {step_note(key, done) or 'no result'}", ""]
    return lines


def summary(out: Path) -> str:
    out = Path(out)
    done = steps(out)
    lines = [f"## GPU run: {environment(out)}", "", "| check | result |", "|---|---|",
             f"| GPU tests (tests/cuda) | {cell(tests(out, done))} |",
             f"| memcheck (GPT-2 tiny, bf16, 2 steps) | {cell(memcheck(out, done))} |", ""]
    lines += training(out, done) + attention(out, done) + kernels(out, done)
    if done:
        total = sum(s for _, s in done.values())
        lines.append("Steps (status, seconds): " + ", ".join(
            f"{name} {'ok' if rc == '0' else rc} {s}" for name, (rc, s) in done.items()) + f"; {total} s in all.")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        sys.exit(f"usage: summary.py OUT_DIR (the folder run.sh wrote; got {' '.join(argv) or 'nothing'})")
    print(summary(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
