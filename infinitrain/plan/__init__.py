"""The layout planner: `python -m infinitrain.plan` lists every DP x TP x PP x CP (x EP) layout
the examples accept for a model, a batch and a cluster, with each one's predicted peak memory
per rank and step time by component, ranked, and the command that runs it;
`python -m infinitrain.plan calibrate` measures this machine's rates into a profile. Its
pieces: layouts (the candidates and the engine's checks of them), cost (memory from the memory
plan, time from the profile, the pipeline simulator and an alpha-beta model of collectives),
profile (the rates' file), calibrate (their measurement), auto (the examples' --layout auto and
the memory refusal's suggestions). It sits in the top layer beside the examples, whose flags it
writes. docs/planning.md says how far to trust it."""
from __future__ import annotations

from .cost import Cluster, Prediction, predict
from .layouts import Candidate, enumerate_candidates, parse, refusal
from .profile import Profile

__all__ = ["Candidate", "Cluster", "Prediction", "Profile", "enumerate_candidates", "parse", "predict", "refusal",
           "best_layouts"]


def best_layouts(world: int, config, model_class, cluster: Cluster, profile: Profile, global_batch: int,
                 seq_len: int, dtype: str = "float32", **options) -> list:
    """The Predictions of every candidate on `world` ranks, those that fit first, each group by
    predicted step time (options: enumerate_candidates')."""
    kept, _ = enumerate_candidates(world, config, model_class, global_batch, seq_len, **options)
    out = [predict(c, config, model_class, cluster, profile, global_batch, seq_len, dtype) for c in kept]
    return sorted(out, key=lambda p: (not p.fits, p.step_time))
