"""InfiniTrain's precision checker: statistics of every module's (level 1) or every op's
(level 2) output in forward and of the gradient flowing into it in backward, NaN/Inf flagged at
the first place it appears, tensors dumped as .npy, and a compare mode that names the first
tensor whose values differ from a baseline run's: the tool that finds where a parallel run
leaves the one-process run.

    --precision_check "level=1,format=simple,output_md5=true,save_tensors=true,output_path=out/one"
    mpirun -np 2 ... --precision_check "level=1,baseline=out/one"

Names are one-process names (`transformer.h.0.mlp`, level 2 `transformer.h.0.mlp/Linear`) with
the call's index within the step (the micro-batch) and the pass: `transformer.h.0.mlp_0_forward`.
Each rank writes `output_path/precision_check_rank_N.log` and, with save_tensors,
`output_path/rank_N/step_K/<name>.npy`. Against a baseline (a run's output_path) each tensor is
compared as it is made, with the baseline's own rank or else its rank 0 (a one-process run):
under data parallelism rank r's micro-batch m is the baseline's micro-batch m * DP + r (llm.c's
data order) and its gradients are DP times the baseline's (each rank's loss is a mean over its
own part); a tensor whose shape differs (a tensor-parallel shard) is skipped and counted.

The tolerance follows the reductions, not a fixed rtol. A parallel layout sums the same terms in
another order (a tensor-parallel all-reduce adds the ranks' partial sums, a one-process matmul
sums in one go), which changes a sum of K terms by about sqrt(K) * u * ||terms|| (K * u * sum|terms|
at worst), u the unit round-off. That is relative to the sum's terms, not to each element: an
element that cancels to near zero keeps the absolute error of its terms, so an elementwise rtol
names it. Each tensor is therefore compared with a bound on its own scale (its baseline's largest
finite |value|):

    |mine - baseline| <= steps * sqrt(D) * (2 * u_store + sqrt(K) * u_acc) * max|baseline|

- u_store: the unit round-off of the least precise floating dtype the run has made so far
  (2^-8 bfloat16, 2^-11 float16, 2^-24 float32, 2^-53 float64). Two sums that differ by a hair
  can round to neighbouring values, 2 u apart; a float32 gradient behind a bfloat16 matmul
  carries bfloat16's error, hence "so far" and not this tensor's dtype.
- u_acc: the accumulation's round-off, float32 at most (bfloat16 products accumulate in float32).
- K: the longest reduction the model runs: the largest in/out features of its layers (a Linear
  sums over in_features forward and out_features backward, the LM head over the vocabulary) and
  the longest axis of a tensor seen (an attention sums over the sequence). A TP all-reduce over
  R ranks reorders these same K terms, so it is covered by K.
- D: twice the model's leaf modules, a bound on how many reductions lie between the input and a
  tensor (forward and backward). Each passes on the error it received and adds its own; errors
  of independent roundings add in quadrature, hence sqrt(D).
- steps: the steps checked so far. The weights a step starts from carry the earlier steps'
  differences (and Adam turns a round-off sign flip of a near-zero gradient into a whole step of
  the learning rate), so the bound grows with each step.

In float32 the bound sits one to two orders above what TP round-off reaches and an order below a
1e-3 change of one weight's effect; in bfloat16 it is a few percent of a tensor's scale, the
resolution bfloat16 has. Giving rtol or atol replaces the rule with numpy's elementwise
isclose(rtol, atol) (a missing one is 0): the explicit option wins.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from . import _trace
from .autograd.engine import in_backward
from .tensor import Tensor


@dataclass
class PrecisionCheckConfig:
    level: int = 0                 # 0 off, 1 module outputs, 2 every op's
    format: str = "simple"         # simple: a line per tensor; table: aligned columns
    output_md5: bool = False
    output_path: str = "./log_precision_check"
    save_tensors: bool = False     # dump each tensor as .npy
    baseline: str | None = None    # compare with the tensors a run saved there
    rtol: float | None = None      # given: an elementwise isclose replaces the round-off bound
    atol: float | None = None

    @classmethod
    def parse(cls, text: str) -> "PrecisionCheckConfig":
        """From InfiniTrain's 'key=value,key=value' form."""
        cfg, kinds = cls(), {f.name: f.type for f in fields(cls)}
        for item in filter(None, (s.strip() for s in text.split(","))):
            key, eq, value = item.partition("=")
            key = {"path": "output_path"}.get(key.strip(), key.strip())
            if not eq or key not in kinds:
                raise ValueError(f"precision check: '{item}' is not key=value with a key of "
                                 f"{', '.join(kinds)}")
            value, kind = value.strip(), str(kinds[key]).replace(" | None", "")
            try:
                if kind in ("int", int):
                    value = int(value)
                elif kind == "float":
                    value = float(value)
                    if not np.isfinite(value) or value < 0:  # a tolerance: finite, never negative
                        raise ValueError(value)
                elif kind in ("bool", bool):
                    if value.lower() not in ("true", "false", "1", "0"):
                        raise ValueError(value)
                    value = value.lower() in ("true", "1")
            except ValueError:
                raise ValueError(f"precision check: {key}={value} is not a valid {kind}"
                                 + (" (finite, >= 0)" if kind == "float" else "")) from None
            setattr(cfg, key, value)
        if cfg.level not in (0, 1, 2):
            raise ValueError(f"precision check: level must be 0, 1 or 2, not {cfg.level}")
        if cfg.format not in ("simple", "table"):
            raise ValueError(f"precision check: format must be simple or table, not {cfg.format}")
        if cfg.baseline is not None and not Path(cfg.baseline).is_dir():
            raise ValueError(f"precision check: baseline {cfg.baseline} is not a folder of a run's tensors")
        return cfg


class PrecisionChecker:
    """Watches `model` as `config` says. begin_step(k) / end_step() bracket what is checked
    (a training step's forward and backward); close() takes the hooks away and returns the
    summary. dp=(rank, size) maps micro-batches and gradients onto a one-process baseline."""

    def __init__(self, model, config: PrecisionCheckConfig, rank: int = 0, world: int = 1, dp=(0, 1)):
        self.cfg, self.rank, (self.dp_rank, self.dp) = config, rank, dp
        self.out = Path(config.output_path)
        self.out.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            (self.out / "precision_check_meta.json").write_text(json.dumps({"world": world, "dp": dp[1]}))
        self.baseline = self._baseline_layout(world) if config.baseline else None
        self.log = open(self.out / f"precision_check_rank_{rank}.log", "w")
        self.step_no, self.active, self.counters = 0, False, {}
        self.saved_bytes, self.steps_checked = 0, 0
        self.total_steps = None  # the run's steps, for the size estimate of save_tensors (set by the caller)
        self.first_nonfinite = self.first_divergence = None
        self.compared = self.skipped = self.diverged = 0
        self.names = {id(m): n or "model" for n, m in model.named_modules()}
        # the round-off bound's K (grows with the tensors seen), D and u_store (see the module's note)
        self.reduction = max([1] + [int(getattr(m, a, 0) or 0) for m in model.modules()
                                    for a in ("in_features", "out_features")])
        self.depth = 2 * max(1, sum(1 for m in model.modules() if next(m.children(), None) is None))
        self.u_store, self.worst = 0.0, 0.0  # worst: the largest |diff| / tolerance compared
        self.stack = []
        self.handles = []
        for m in model.modules():
            self.handles.append(m.register_forward_pre_hook(self._enter))
            self.handles.append(m.register_forward_hook(self._leave))
        if config.level == 2:
            if _trace.inspector is not None:
                raise RuntimeError("a precision checker is watching the ops already")
            _trace.inspector = self
        if config.format == "table":
            self._write(f"{'step':>4} {'tensor':<48} {'dtype':<8} {'shape':<16} {'min':>11} {'max':>11} "
                        f"{'mean':>11} {'NaN':>5} {'Inf':>5}" + (f" {'md5':<32}" if config.output_md5 else ""))

    # ---- the steps ----------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step_no, self.active, self.counters = step, True, {}

    def end_step(self) -> None:
        self.active = False
        self.log.flush()  # a run that dies later still leaves what it saw
        self.steps_checked += 1
        if self.steps_checked == 1 and self.cfg.save_tensors and self.rank == 0:
            # every module's tensors of every step: a baseline of a real model runs to gigabytes
            per_step = self.saved_bytes / 2**20
            total = f"; about {per_step * self.total_steps / 1024:.1f} GB for the run's {self.total_steps} steps" \
                if self.total_steps else ""
            print(f"precision check: step {self.step_no} saved {per_step:.0f} MB of tensors per rank to {self.out}"
                  f"{total} (fewer steps, level=1 or a smaller model keep it small)", file=sys.stderr, flush=True)

    def close(self) -> str:
        for h in self.handles:
            h.remove()
        if _trace.inspector is self:
            _trace.inspector = None
        lines = [f"precision check: rank {self.rank}: "
                 + (f"first NaN/Inf at {self.first_nonfinite}" if self.first_nonfinite else "no NaN/Inf")]
        if self.cfg.baseline:
            lines.append(f"precision check: rank {self.rank}: {self.compared} tensors compared with "
                         f"{self.cfg.baseline}, {self.diverged} beyond {self._rule()} (the largest |diff| "
                         f"was {self.worst:.3g} of its tolerance), {self.skipped} skipped (other shape or "
                         "not in the baseline)"
                         + (f"; first divergence: {self.first_divergence}" if self.first_divergence else ""))
        summary = "\n".join(lines)
        self._write(summary)
        self.log.close()
        return summary

    # ---- hooks ------------------------------------------------------------------------------
    def _enter(self, module, args):
        self.stack.append(self.names.get(id(module), type(module).__name__))

    def _leave(self, module, args, output):
        name = self.stack.pop() if self.stack else self.names.get(id(module), "?")
        if self.active and self.cfg.level == 1:
            outs = output if isinstance(output, tuple) else (output,)
            if not in_backward():  # a recomputation's replay repeats a forward already checked
                self._check(name, "forward", outs)
            for i, t in enumerate(outs):  # (in a replay, the gradients are still to come)
                if isinstance(t, Tensor) and t.requires_grad:
                    key = name if len(outs) == 1 else f"{name}.{i}"
                    t.register_hook(lambda g, key=key: self._check(key, "backward", (g,)))
        return None

    def op(self, name: str, stage: str, tensors) -> None:
        """Level 2: an autograd op's outputs (forward) or input gradients (backward)."""
        if self.active and not (stage == "forward" and in_backward()):  # not a recomputation's replay
            where = self.stack[-1] if self.stack else "model"
            self._check(f"{where}/{name}", stage, tensors)

    # ---- one tensor ------------------------------------------------------------------------------
    def _check(self, name: str, stage: str, tensors) -> None:
        tensors = [t for t in tensors if isinstance(t, Tensor) and t.dtype.is_floating_point]
        for i, t in enumerate(tensors):
            base = name if len(tensors) == 1 else f"{name}.{i}"
            idx = self.counters.get((base, stage), 0)
            self.counters[(base, stage)] = idx + 1
            self._one(f"{base}_{idx}_{stage}", base, idx, stage, t.detach())

    def _one(self, key: str, base: str, idx: int, stage: str, t: Tensor) -> None:
        raw = np.ascontiguousarray(t.cpu().numpy())
        self.u_store = max(self.u_store, _UNIT_ROUNDOFF.get(t.dtype.name, 2.0 ** -24))
        self.reduction = max([self.reduction, *t.shape[1:]])
        a = raw.astype(np.float32) if raw.dtype != np.float32 and raw.dtype != np.float64 else raw
        finite = np.isfinite(a)
        nan, inf = int(np.isnan(a).sum()), int((~finite).sum() - np.isnan(a).sum())
        vals = a[finite] if not finite.all() else a
        lo, hi, mean = (float(vals.min()), float(vals.max()), float(vals.mean())) if vals.size else (0.0, 0.0, 0.0)
        md5 = hashlib.md5(raw.tobytes()).hexdigest() if self.cfg.output_md5 else None
        bad = nan or inf
        if self.cfg.format == "table":
            line = (f"{self.step_no:4d} {key:<48} {t.dtype.name:<8} {str(tuple(t.shape)):<16} {lo:11.4e} "
                    f"{hi:11.4e} {mean:11.4e} {nan:5d} {inf:5d}" + (f" {md5}" if md5 else ""))
        else:
            first = ", ".join(f"{v:.6g}" for v in a.reshape(-1)[:6])
            line = (f"[step {self.step_no}] {key}: dtype={t.dtype.name} shape={tuple(t.shape)} min={lo:.6g} "
                    f"max={hi:.6g} mean={mean:.6g} [{first}{', ...' if a.size > 6 else ''}] "
                    f"[NaN:{nan} Inf:{inf}]" + (f" md5={md5}" if md5 else ""))
        self._write(line + (" <- ERROR" if bad else ""))
        if bad and self.first_nonfinite is None:
            self.first_nonfinite = f"step {self.step_no}, {key} ({nan} NaN, {inf} Inf)"
            print(f"precision check (rank {self.rank}): the first NaN/Inf appears in {key} at step "
                  f"{self.step_no}: {nan} NaN, {inf} Inf", file=sys.stderr, flush=True)
        if self.cfg.save_tensors:
            folder = self.out / f"rank_{self.rank}" / f"step_{self.step_no}"
            folder.mkdir(parents=True, exist_ok=True)
            np.save(folder / f"{_file_name(key)}.npy", a)
            self.saved_bytes += a.nbytes
        if self.cfg.baseline:
            self._compare(base, idx, stage, a)

    def _baseline_layout(self, world: int):
        """(folder of the tensors to compare with, whether it is a one-process run)."""
        root = Path(self.cfg.baseline)
        try:
            meta = json.loads((root / "precision_check_meta.json").read_text())
            theirs_world, theirs_dp = int(meta["world"]), int(meta["dp"])
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"precision check: {root} was not written by a precision check run "
                             "(no readable precision_check_meta.json)") from None
        if theirs_world == 1:
            return root / "rank_0", True
        if (theirs_world, theirs_dp) == (world, self.dp):
            return root / f"rank_{self.rank}", False
        raise ValueError(f"precision check: the baseline ran {theirs_world} ranks with DP {theirs_dp}, this run "
                         f"{world} with DP {self.dp}: compare with a one-process run or one of the same layout")

    def _compare(self, base: str, idx: int, stage: str, a: np.ndarray) -> None:
        folder, one_process = self.baseline
        # a one-process baseline ran this rank's micro-batch m as its m * DP + r (llm.c's order)
        mapped = idx * self.dp + self.dp_rank if one_process else idx
        path = folder / f"step_{self.step_no}" / f"{_file_name(f'{base}_{mapped}_{stage}')}.npy"
        if not path.is_file():
            self.skipped += 1
            return
        b = np.load(path)
        if one_process and stage == "backward":
            b = b * self.dp  # this rank's loss is a mean over a DP-th of the baseline's tokens
        if b.shape != a.shape:
            self.skipped += 1
            return
        self.compared += 1
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        diff = np.abs(a64 - b64)  # NaN where either is NaN or both are the same infinity
        same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        if self.cfg.rtol is None and self.cfg.atol is None:
            finite = np.isfinite(b64)
            tol = self.tolerance(float(np.abs(b64[finite]).max()) if finite.any() else 0.0)
        else:  # the user's elementwise rule
            tol = (self.cfg.atol or 0.0) + (self.cfg.rtol or 0.0) * np.abs(b64)
        close = same | (diff <= tol)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff / tol))
        if ratio.size:
            self.worst = max(self.worst, float(ratio.max()))
        if close.all():
            return
        self.diverged += 1
        if self.first_divergence is None:
            where = np.unravel_index(int(np.argmax(~close)), a.shape) if a.ndim else ()
            bound = tol if np.ndim(tol) == 0 else tol[where]
            self.first_divergence = (f"step {self.step_no}, {base}_{idx}_{stage}: max |diff| "
                                     f"{float(np.nanmax(diff)):.3g} (tolerance {float(bound):.3g}), first at "
                                     f"{tuple(int(i) for i in where)} ({float(a[where]):.8g} vs baseline "
                                     f"{float(b[where]):.8g})")
            print(f"precision check (rank {self.rank}): first divergence from the baseline: "
                  f"{self.first_divergence}", file=sys.stderr, flush=True)

    def tolerance(self, scale: float, steps: int | None = None) -> float:
        """The round-off bound on |mine - baseline| for a tensor whose baseline's largest |value| is
        `scale`, in the step being checked or after `steps` (the module's note derives it)."""
        u_acc = min(self.u_store, 2.0 ** -24)
        per_reduction = 2 * self.u_store + np.sqrt(self.reduction) * u_acc
        steps = self.steps_checked + 1 if steps is None else steps
        return steps * np.sqrt(self.depth) * per_reduction * scale

    def _rule(self) -> str:
        if self.cfg.rtol is None and self.cfg.atol is None:
            return (f"the round-off bound (u {self.u_store:.3g}, longest reduction K {self.reduction}, "
                    f"depth D {self.depth}: {self.tolerance(1.0, 1):.3g} of a tensor's scale per step)")
        return f"rtol {self.cfg.rtol or 0:g} / atol {self.cfg.atol or 0:g}"

    def _write(self, line: str) -> None:
        self.log.write(line + "\n")


# half the gap between 1 and the next number: the largest relative error of one rounding
_UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def _file_name(key: str) -> str:
    return key.replace("/", "__")
