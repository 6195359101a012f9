"""A DeepSpeed configuration (ds_config.json), read key by key as DeepSpeed documents it, into
the options infinitrain's own training step takes (ParallelPlan's ZeRO stage and offload, the
optimizer class and its keywords, clipping, bf16 autocast, recomputation).

Every key falls in one of four kinds: one that maps onto an option here; one that changes
nothing here (a communication or memory tuning knob of DeepSpeed's own kernels: buckets,
overlap, prefetch sizes), accepted and named once in `notes`; one that is unknown (a warning
naming it, as a misspelt key would otherwise be silently ignored); and a wrong type or value (a
ValueError naming the key). fp16 is refused: it needs loss scaling, which this step does not do.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

OPTIMIZERS = ("Adam", "AdamW", "SGD")
SCHEDULERS = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


class ConfigError(ValueError):
    """A key of a DeepSpeed config with a wrong type or value, or keys that contradict."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _positive_int(key, v):
    if not _is_int(v) or v < 1:
        raise ConfigError(f"{key} must be a positive integer, got {v!r}")
    return v


def _nonnegative_number(key, v):
    if not _is_number(v) or v < 0:
        raise ConfigError(f"{key} must be a number >= 0, got {v!r}")
    return float(v)


def _boolean(key, v):
    if not isinstance(v, bool):
        raise ConfigError(f"{key} must be true or false, got {v!r}")
    return v


def _string(key, v):
    if not isinstance(v, str):
        raise ConfigError(f"{key} must be a string, got {v!r}")
    return v


def _block(key, v) -> dict:
    if not isinstance(v, dict):
        raise ConfigError(f"{key} must be an object ({{...}}), got {type(v).__name__} {v!r}")
    return v


# keys DeepSpeed has that change nothing here: DeepSpeed's own kernels' tuning (buckets, overlap,
# prefetch, pinned buffers), logging services this engine does not run, and checks of its own
NO_EFFECT_TOP = {"prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "zero_allow_untested_optimizer",
                 "zero_force_ds_cpu_optimizer", "communication_data_type", "dump_state", "memory_breakdown",
                 "wandb", "comet", "comms_logger", "elasticity", "checkpoint", "data_types",
                 "seq_parallel_communication_data_type", "graph_harvesting",
                 "use_data_before_expert_parallelism", "amp"}
NO_EFFECT_ZERO = {"overlap_comm", "contiguous_gradients", "reduce_scatter", "allgather_partitions",
                  "allgather_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                  "stage3_max_live_parameters", "stage3_max_reuse_distance",
                  "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                  "sub_group_size", "round_robin_gradients",
                  "elastic_checkpoint", "ignore_unused_parameters", "load_from_fp32_weights", "memory_efficient_linear",
                  "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients",
                  "stage3_module_granularity_threshold", "mics_shard_size", "mics_hierarchical_params_gather",
                  "cpu_offload_use_pin_memory", "log_trace_cache_warnings", "use_multi_rank_bucket_allreduce"}
NO_EFFECT_OFFLOAD = {"pin_memory", "buffer_count", "buffer_size", "fast_init", "ratio", "max_in_cpu", "pipeline_read",
                     "pipeline_write", "pipeline"}
NO_EFFECT_ACTIVATION = {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                        "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}
NO_EFFECT_BF16 = {"immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                  "bf16_optimizer_states"}
MONITOR_KEYS = {"enabled", "output_path", "job_name"}
FLOPS_PROFILER_KEYS = {"enabled", "recompute_fwd_factor", "profile_step", "module_depth", "top_modules", "detailed",
                       "output_file"}


@dataclass
class DeepSpeedConfig:
    """A parsed DeepSpeed config: the batch sizes (all three, derived with the data-parallel
    size), what the step does, and `notes` (keys accepted here that change nothing, each
    named once)."""
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    gradient_clipping: float = 0.0
    steps_per_print: int = 10
    optimizer: dict | None = None  # {"type": ..., "params": {...}}
    scheduler: dict | None = None
    bf16: bool = False
    zero_stage: int = 0
    offload_optimizer: str | None = None  # "cpu" | "nvme" | None
    offload_param: str | None = None
    offload_path: str | None = None
    reduce_bucket_size: int | None = None  # elements, DeepSpeed's unit
    activation_checkpointing: bool = False
    monitor: dict = field(default_factory=dict)  # {"tensorboard": {...}, "csv_monitor": {...}}
    flops_profiler: dict = field(default_factory=dict)
    wall_clock_breakdown: bool = False
    notes: list = field(default_factory=list)
    raw: dict = field(default_factory=dict)


def read_config(config) -> dict:
    """A config given as a dict, or a path to its JSON file."""
    if isinstance(config, dict):
        return dict(config)
    if isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            raise FileNotFoundError(f"DeepSpeed config {path}: no such file")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"DeepSpeed config {path} is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"DeepSpeed config {path} must hold a JSON object, got {type(data).__name__}")
        return data
    raise TypeError(f"config must be a dict or the path of a JSON file, got {type(config).__name__}")


class _Reader:
    """Walks the config's keys, collecting the unknown ones (a warning each) and the ones with
    no effect here (a note each)."""

    def __init__(self):
        self.notes, self.unknown = [], []

    def keys(self, where: str, block: dict, known: set, no_effect: set = frozenset()) -> None:
        for k in block:
            name = f"{where}.{k}" if where else k
            if k in no_effect:
                self.notes.append(name)
            elif k not in known:
                self.unknown.append(name)


def batch_sizes(train: int | None, micro: int | None, accumulation: int | None, dp: int) -> tuple:
    """DeepSpeed's rule: train_batch_size = micro x accumulation x DP; any two give the third
    (micro alone: accumulation 1; train alone: micro = train / DP). A contradiction or a
    fraction is an error naming the three."""
    def wrong(why):
        return ConfigError(f"train_batch_size ({train}), train_micro_batch_size_per_gpu ({micro}) and "
                           f"gradient_accumulation_steps ({accumulation}) with {dp} data-parallel ranks: {why} "
                           "(train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps "
                           "x data-parallel ranks)")
    if train is None and micro is None:
        raise wrong("set train_batch_size or train_micro_batch_size_per_gpu")
    if train is not None and micro is not None and accumulation is not None:
        if train != micro * accumulation * dp:
            raise wrong("they contradict")
    elif train is not None and micro is not None:
        if train % (micro * dp):
            raise wrong("train_batch_size is not a multiple of micro batch x data-parallel ranks")
        accumulation = train // (micro * dp)
    elif train is not None:
        accumulation = accumulation or 1
        if train % (accumulation * dp):
            raise wrong("train_batch_size is not a multiple of accumulation x data-parallel ranks")
        micro = train // (accumulation * dp)
    else:
        accumulation = accumulation or 1
        train = micro * accumulation * dp
    return train, micro, accumulation


def _offload(reader: _Reader, key: str, block) -> tuple:
    block = _block(key, block)
    reader.keys(key, block, {"device", "nvme_path"}, NO_EFFECT_OFFLOAD)
    device = block.get("device", "none")
    if device not in OFFLOAD_DEVICES:
        raise ConfigError(f"{key}.device must be one of {', '.join(OFFLOAD_DEVICES)}, got {device!r}")
    path = block.get("nvme_path")
    if path is not None:
        _string(f"{key}.nvme_path", path)
    if device == "nvme" and not path:
        raise ConfigError(f"{key}.device nvme needs {key}.nvme_path, a folder on a local disk")
    return (None if device == "none" else device), (path if device == "nvme" else None)


def _zero(reader: _Reader, cfg: DeepSpeedConfig, z) -> None:
    z = _block("zero_optimization", z)
    reader.keys("zero_optimization", z, {"stage", "offload_optimizer", "offload_param", "reduce_bucket_size",
                                         "cpu_offload"}, NO_EFFECT_ZERO)
    stage = z.get("stage", 0)
    if not _is_int(stage) or stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    cfg.zero_stage = stage
    if z.get("cpu_offload"):  # DeepSpeed's older spelling of offload_optimizer.device cpu
        _boolean("zero_optimization.cpu_offload", z["cpu_offload"])
        cfg.offload_optimizer = "cpu"
    if "offload_optimizer" in z:
        cfg.offload_optimizer, cfg.offload_path = _offload(reader, "zero_optimization.offload_optimizer",
                                                           z["offload_optimizer"])
    if "offload_param" in z:
        cfg.offload_param, path = _offload(reader, "zero_optimization.offload_param", z["offload_param"])
        if path is not None and cfg.offload_path is not None and path != cfg.offload_path:
            raise ConfigError("zero_optimization.offload_param.nvme_path must be offload_optimizer.nvme_path: the "
                              "step keeps ZeRO-3's parameter pieces with the optimizer state, in one folder")
        cfg.offload_path = cfg.offload_path or path
    size = z.get("reduce_bucket_size")
    if size is not None and size != "auto":
        if not _is_number(size) or size < 1:
            raise ConfigError(f"zero_optimization.reduce_bucket_size must be a positive number, got {size!r}")
        cfg.reduce_bucket_size = int(size)


def _named_block(reader: _Reader, key: str, block, choices) -> dict:
    block = _block(key, block)
    reader.keys(key, block, {"type", "params"})
    kind = block.get("type")
    names = {c.lower(): c for c in choices}  # DeepSpeed matches the type's name in any case
    if not isinstance(kind, str) or kind.lower() not in names:
        raise ConfigError(f"{key}.type must be one of {', '.join(choices)}, got {kind!r}")
    params = _block(f"{key}.params", block.get("params", {}))
    return {"type": names[kind.lower()], "params": dict(params)}


def _monitor(reader: _Reader, key: str, block) -> dict:
    block = _block(key, block)
    reader.keys(key, block, MONITOR_KEYS)
    out = {"enabled": _boolean(f"{key}.enabled", block.get("enabled", False))}
    for k in ("output_path", "job_name"):
        if k in block:
            out[k] = _string(f"{key}.{k}", block[k])
    return out


def parse_config(config, dp: int = 1, device_type: str = "cpu") -> DeepSpeedConfig:
    """config: a dict or a JSON file's path. dp: the job's data-parallel size (the batch sizes'
    rule); device_type: where the model runs ("cpu" refuses fp16, and takes offload to cpu as
    what already happens). Warns once per unknown key; raises ConfigError naming a wrong one."""
    raw = read_config(config)
    reader = _Reader()
    known = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
             "steps_per_print", "optimizer", "scheduler", "bf16", "bfloat16", "fp16", "zero_optimization",
             "activation_checkpointing", "tensorboard", "csv_monitor", "flops_profiler", "wall_clock_breakdown"}
    reader.keys("", raw, known, NO_EFFECT_TOP)
    if raw.get("amp", {}).get("enabled") if isinstance(raw.get("amp"), dict) else False:
        raise ConfigError("amp.enabled is NVIDIA Apex's mixed precision, which infinitrain does not have: use "
                          '"bf16": {"enabled": true}')

    def opt(key, check):
        v = raw.get(key)
        return None if v is None or v == "auto" else check(key, v)
    train, micro = opt("train_batch_size", _positive_int), opt("train_micro_batch_size_per_gpu", _positive_int)
    accumulation = opt("gradient_accumulation_steps", _positive_int)
    train, micro, accumulation = batch_sizes(train, micro, accumulation, dp)
    cfg = DeepSpeedConfig(train, micro, accumulation, raw=raw)
    if opt("gradient_clipping", _nonnegative_number) is not None:
        cfg.gradient_clipping = float(raw["gradient_clipping"])
    if "steps_per_print" in raw:
        cfg.steps_per_print = _positive_int("steps_per_print", raw["steps_per_print"])
    if "optimizer" in raw:
        cfg.optimizer = _named_block(reader, "optimizer", raw["optimizer"], OPTIMIZERS)
    if "scheduler" in raw:
        cfg.scheduler = _named_block(reader, "scheduler", raw["scheduler"], SCHEDULERS)
    fp16 = _block("fp16", raw.get("fp16", {}))
    if _boolean("fp16.enabled", fp16.get("enabled", False)):
        why = ("float16 training needs loss scaling (DeepSpeed's dynamic loss scaler), which this engine's step "
               "does not do")
        if device_type == "cpu":
            why = "float16 is a GPU format: on a CPU it has no fast kernels and needs loss scaling besides"
        raise ConfigError(f'fp16.enabled: {why}; use "bf16": {{"enabled": true}} instead (the same memory, the '
                          "range of float32, no loss scaling)")
    for key in ("bf16", "bfloat16"):  # DeepSpeed reads both spellings
        if key in raw:
            block = _block(key, raw[key])
            reader.keys(key, block, {"enabled"}, NO_EFFECT_BF16)
            cfg.bf16 = cfg.bf16 or _boolean(f"{key}.enabled", block.get("enabled", False))
    if "zero_optimization" in raw:
        _zero(reader, cfg, raw["zero_optimization"])
    if device_type == "cpu":  # the state is in host memory already: offloading it there is what happens
        for what in ("offload_optimizer", "offload_param"):
            if getattr(cfg, what) == "cpu":
                setattr(cfg, what, None)
                reader.notes.append(f"zero_optimization.{what}.device cpu (on a CPU the state is in host memory "
                                    "already)")
    if "activation_checkpointing" in raw:
        block = _block("activation_checkpointing", raw["activation_checkpointing"])
        reader.keys("activation_checkpointing", block, set(), NO_EFFECT_ACTIVATION)
        cfg.activation_checkpointing = True
    for key in ("tensorboard", "csv_monitor"):
        if key in raw:
            cfg.monitor[key] = _monitor(reader, key, raw[key])
    if "flops_profiler" in raw:
        block = _block("flops_profiler", raw["flops_profiler"])
        reader.keys("flops_profiler", block, FLOPS_PROFILER_KEYS)
        cfg.flops_profiler = {"enabled": _boolean("flops_profiler.enabled", block.get("enabled", False)),
                              "profile_step": _positive_int("flops_profiler.profile_step",
                                                            block.get("profile_step", 1)),
                              "output_file": block.get("output_file")}
    if "wall_clock_breakdown" in raw:
        cfg.wall_clock_breakdown = _boolean("wall_clock_breakdown", raw["wall_clock_breakdown"])
    for name in reader.unknown:
        warnings.warn(f"DeepSpeed config: unknown key {name!r} ignored", stacklevel=2)
    cfg.notes = reader.notes
    return cfg


# DeepSpeed's defaults for what a config leaves out of its optimizer block (its fused Adam's)
OPTIMIZER_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}


def settings(cfg: DeepSpeedConfig) -> dict:
    """What the config decides that a trainer's flags also set, by the config's key: as
    DeepSpeed runs it, a key left out takes DeepSpeed's default (no clipping, ZeRO stage 0, no
    offload, float32, no recomputation; Adam's lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight
    decay), not the trainer's. The optimizer's settings only with an optimizer block (its type
    given as the class it trains with: "AdamW", "Adam" or "SGD"); the schedule only with a
    scheduler block."""
    out = {"train_batch_size": cfg.train_batch_size,
           "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
           "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
           "gradient_clipping": cfg.gradient_clipping}
    if cfg.optimizer is not None:
        params = cfg.optimizer["params"]
        adamw = cfg.optimizer["type"] == "AdamW" or (cfg.optimizer["type"] == "Adam" and
                                                     params.get("adam_w_mode", True))
        out["optimizer.type"] = "AdamW" if adamw else cfg.optimizer["type"]
        for k, default in OPTIMIZER_DEFAULTS.items():
            v = params.get(k, default)
            out[f"optimizer.params.{k}"] = tuple(v) if k == "betas" else v
    out["zero_optimization.stage"] = cfg.zero_stage
    out["zero_optimization.offload_optimizer.device"] = cfg.offload_optimizer or "none"
    out["zero_optimization.offload_param.device"] = cfg.offload_param or "none"
    if cfg.offload_path:
        out["zero_optimization.offload_optimizer.nvme_path"] = cfg.offload_path
    out["bf16.enabled"] = cfg.bf16
    out["activation_checkpointing"] = cfg.activation_checkpointing
    if cfg.scheduler is not None:
        out["scheduler"] = cfg.scheduler
    return out
