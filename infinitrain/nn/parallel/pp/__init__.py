"""Pipeline parallelism: the model's blocks split into stages (and virtual chunks), run by a
schedule (GPipe, 1F1B, interleaved 1F1B, the zero-bubble ZB-H1 and ZBV) with activations and
gradients sent between stages."""
from .p2p import PipelineTimeout
from .pipeline import PipelineParallel
from .schedules import SCHEDULES, schedule, simulate
from .stage import PipelineStage, chunk_layers

__all__ = ["PipelineParallel", "PipelineStage", "PipelineTimeout", "SCHEDULES", "schedule",
           "simulate", "chunk_layers"]
