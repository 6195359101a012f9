"""Loss curves to a PNG: from the examples' log lines ("step 5/100 | train loss 4.56 ..." and
"val loss 4.78"), one run or several on one chart (one process against a parallel layout, say).

    python -m infinitrain.plot run.log [other.log ...] -o loss.png [--title TEXT]

Needs matplotlib (`pip install 'infinitrain[plot]'`).
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

# a launcher's rank prefix, if any: Hydra's and mpi_launch's "[0] ", Open MPI's
# "[1,0]<stdout>:", srun --label's "0: " (only rank 0's lines carry the log)
def rank_prefix(rank: int) -> str:
    """A regex of a rank's line prefix under each launcher: Hydra's and mpi_launch's "[r] ",
    Open MPI's "[job,r]<stdout>:", srun --label's "r: "."""
    return rf"(?:\[{rank}\] |\[\d+,{rank}\]<std(?:out|err)>:|{rank}: )"


RANK0_PREFIX = rank_prefix(0) + "?"  # rank 0's lines, prefixed or not
_STEP = re.compile(rf"^{RANK0_PREFIX}step\s+(\d+)/\d+ \| train loss ([-+0-9.eE]+|nan|inf)", re.M)
_VAL = re.compile(rf"^{RANK0_PREFIX}val loss ([-+0-9.eE]+|nan|inf)", re.M)


def parse_log(text: str) -> dict:
    """{"train": [(step, loss)], "val": [(steps trained, loss)]}: a val loss is placed at the
    steps trained when it was measured (the examples evaluate before a step and at the end)."""
    train, val, last = [], [], 0
    for m in re.finditer(f"{_STEP.pattern}|{_VAL.pattern}", text, re.M):
        if m.group(1) is not None:
            last = int(m.group(1))
            train.append((last, float(m.group(2))))
        else:
            val.append((last, float(m.group(3))))
    return {"train": train, "val": val}


MAX_LINE = 1 << 20  # a log line longer than this is not one the examples wrote


def read_log(path) -> dict:
    """parse_log of a log file, read line by line with each line bounded: a file that is not a
    log (a binary, /dev/zero, a pipe that never ends a line) is refused, not read into memory."""
    curves = {"train": [], "val": []}
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE), ""), 1):
            if len(line) == MAX_LINE and not line.endswith("\n"):
                raise ValueError(f"{path}: line {number} is longer than {MAX_LINE:,} characters; not a training log")
            part = parse_log(line)
            curves["train"] += part["train"]
            if part["val"]:  # a val loss is placed at the last train step seen
                last = curves["train"][-1][0] if curves["train"] else 0
                curves["val"] += [(last, loss) for _, loss in part["val"]]
    return curves


def pyplot():
    """matplotlib's pyplot (drawing to files), or an error that says how to install it: the
    examples call this before training, so that --plot fails at once, not after the run."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("plotting needs matplotlib: pip install 'infinitrain[plot]'") from None
    return plt


def plot_losses(runs: dict, path, title: str = "loss") -> None:
    """runs: {label: {"train": [(step, loss)], "val": [(step, loss)]}} -> an image at exactly
    path (PNG unless its suffix names another format matplotlib writes: .svg, .pdf)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for label, curves in runs.items():
        if curves["train"]:
            line, = ax.plot(*zip(*curves["train"]), label=f"{label} train", linewidth=1.2)
            color = line.get_color()
        else:
            color = None
        if curves["val"]:
            ax.plot(*zip(*curves["val"]), "o--", color=color, label=f"{label} val", markersize=4)
    if not ax.lines:
        plt.close(fig)
        raise ValueError("no losses to plot: no 'step N/M | train loss X' or 'val loss X' lines")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    suffix = Path(path).suffix.lower().lstrip(".")
    fig.savefig(path, format=suffix if suffix in ("png", "svg", "pdf") else "png")  # no ".png" added
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", help="log files of the examples")
    p.add_argument("-o", "--output", default="loss.png")
    p.add_argument("--title", default="loss")
    args = p.parse_args(argv)
    runs = {}
    for f in args.logs:
        try:
            runs[Path(f).stem] = read_log(f)
        except OSError as e:
            raise SystemExit(f"cannot read {f}: {e.strerror or e}")
        except ValueError as e:
            raise SystemExit(str(e))
    try:
        plot_losses(runs, args.output, args.title)
    except (RuntimeError, ValueError) as e:
        raise SystemExit(str(e))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
