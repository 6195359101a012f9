"""infinitrain.deepspeed: DeepSpeed's front door on infinitrain's own machinery. A program
written for DeepSpeed runs with its import changed:

    from infinitrain import deepspeed
    engine, optimizer, loader, scheduler = deepspeed.initialize(model=model, config="ds_config.json",
                                                                model_parameters=model.parameters())
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint("ckpt", client_state={"epoch": 1})

under `mpirun -n N` or `python -m mpi_launch` as any infinitrain job. The config (config.py) is
read key by key as DeepSpeed documents it; the engine (engine.py) runs TrainStep's step (ZeRO
1-3, offload, clipping, bf16 autocast); the schedules (lr_schedules.py) are DeepSpeed's.
Example configs for ZeRO stages 1, 2 and 3 with CPU offload: infinitrain/deepspeed/configs/.
"""
from __future__ import annotations

import argparse
import inspect
from pathlib import Path

from ..nn import parallel
from ..nn.parallel.plan import ParallelPlan
from ..nn.parallel.train_step import TrainStep
from ..optim import SGD, Adam, AdamW
from ..optim.optimizer import Optimizer
from ..utils.data import DataLoader, DistributedSampler
from .config import ConfigError, DeepSpeedConfig, batch_sizes, parse_config, read_config
from .engine import DeepSpeedEngine
from .lr_schedules import SCHEDULES, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

CONFIGS = Path(__file__).parent / "configs"  # ds_config_stage1.json, ..._stage2, ..._stage3_offload

__all__ = ["initialize", "add_config_arguments", "DeepSpeedEngine", "DeepSpeedConfig", "ConfigError",
           "parse_config", "read_config", "batch_sizes", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
           "CONFIGS"]


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """DeepSpeed's flags on a program's parser: --deepspeed (accepted, as DeepSpeed's launcher
    passes it) and --deepspeed_config FILE."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="train with the DeepSpeed config (--deepspeed_config)")
    group.add_argument("--deepspeed_config", default=None, type=str, metavar="FILE", help="a DeepSpeed ds_config.json")
    return parser


def _env(model, mpu):
    """The job's GlobalEnv and, when mpu is a ParallelPlan, the plan whose layout it keeps."""
    if mpu is not None:
        if not isinstance(mpu, ParallelPlan):
            raise TypeError("mpu: pass the job's infinitrain ParallelPlan (Megatron's mpu objects are not "
                            f"supported), got {type(mpu).__name__}")
        if mpu.pipelined:
            raise ValueError("mpu: a pipeline-parallel plan needs the pipeline's schedule, which this engine does "
                             "not run: use infinitrain.examples' trainer for --pipeline_parallel")
        return mpu.env, mpu
    try:
        return parallel.get_env(), None
    except RuntimeError:  # neither init_process_group nor nn.parallel.init ran: start the job now
        device = next(iter(model.parameters())).device
        return parallel.init(device=device.type), None


def _groups(model, model_parameters) -> list:
    params = list(model_parameters) if model_parameters is not None else \
        [p for p in model.parameters() if p.requires_grad]
    if params and isinstance(params[0], dict):
        return [dict(g, params=list(g["params"])) for g in params]
    return [{"params": params}]


def _config_optimizer(block: dict):
    """The optimizer class and keywords of the config's optimizer block, as DeepSpeed reads it:
    "Adam" is AdamW (decoupled decay) unless params.adam_w_mode is false; weight_decay 0 unless
    given (DeepSpeed's fused Adam's default); torch_adam chooses an implementation (no effect)."""
    params = dict(block["params"])
    params.pop("torch_adam", None)
    kind = block["type"]
    if kind == "Adam":
        mode = params.pop("adam_w_mode", True)
        if not isinstance(mode, bool):
            raise ConfigError(f"optimizer.params.adam_w_mode must be true or false, got {mode!r}")
        cls = AdamW if mode else Adam
    else:
        cls = {"AdamW": AdamW, "SGD": SGD}[kind]
    if cls is not SGD:
        params.setdefault("weight_decay", 0.0)
    allowed = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    for k in params:
        if k not in allowed:
            raise ConfigError(f"optimizer.params.{k}: {kind} takes {', '.join(sorted(allowed))}")
    for k, v in params.items():
        if k == "betas":
            if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(_number(b) for b in v)):
                raise ConfigError(f"optimizer.params.betas must be two numbers, got {v!r}")
            params[k] = tuple(v)
        elif k != "nesterov" and not _number(v):
            raise ConfigError(f"optimizer.params.{k} must be a number, got {v!r}")
    return cls, params


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _client_optimizer(optimizer, groups):
    """A client optimizer, rebuilt by the step (ZeRO shards it, offload moves its state): its
    class, its groups with their settings, its defaults. A callable is called with the groups."""
    if not isinstance(optimizer, Optimizer):
        if not callable(optimizer):
            raise TypeError(f"optimizer must be an infinitrain optimizer or a callable, got {type(optimizer).__name__}")
        optimizer = optimizer(groups)
    if any(getattr(optimizer, "state", None) or ()):
        raise ValueError("optimizer: pass it before it has stepped (the engine rebuilds it under ZeRO; its state "
                         "would be lost)")
    return type(optimizer), [dict(g) for g in optimizer.param_groups], dict(optimizer.defaults)


def _recompute(model) -> bool:
    """activation_checkpointing: the model's recomputation on (set_recompute("full"), or every
    block's .recompute switch). False when the model has neither."""
    if hasattr(model, "set_recompute"):
        model.set_recompute("full")
        return True
    found = False
    for m in model.modules():
        if isinstance(getattr(m, "recompute", None), bool):
            m.recompute, found = True, True
    return found


def _scheduler(cfg: DeepSpeedConfig, optimizer, client):
    if cfg.scheduler is not None:  # as DeepSpeed: the config's schedule over a client one
        cls = SCHEDULES[cfg.scheduler["type"]]
        try:
            return cls(optimizer, **cfg.scheduler["params"])
        except TypeError as e:
            raise ConfigError(f"scheduler.params ({cfg.scheduler['type']}): {e}") from None
    if client is None:
        return None
    if callable(client) and not hasattr(client, "step"):
        return client(optimizer)
    if hasattr(client, "optimizer"):  # built on the client's optimizer, which the step rebuilt
        client.optimizer = optimizer
    return client


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, config=None, config_params=None, collate_fn=None, dist_init_required=None,
               mpu=None, mesh_param=None):
    """DeepSpeed's initialize: returns (engine, optimizer, training_dataloader, lr_scheduler).
    config: a dict or a JSON file's path (or config_params, or args.deepspeed_config). The
    processes are the job's (mpirun / mpi_launch): all of them data parallel, or the layout of
    mpu, a ParallelPlan. The optimizer is the config's, or `optimizer` (an infinitrain
    optimizer or a callable taking the parameter groups), rebuilt on the same groups so that
    ZeRO can shard it."""
    if model is None:
        raise ValueError("initialize: model is required")
    if mesh_param is not None:
        raise ValueError("initialize: mesh_param is not supported; pass the job's ParallelPlan as mpu")
    if config is not None and config_params is not None:
        raise ValueError("initialize: give config or config_params, not both")
    config = config if config is not None else config_params
    from_args = getattr(args, "deepspeed_config", None) if args is not None else None
    if config is not None and from_args is not None:
        raise ValueError(f"initialize: config given and args.deepspeed_config ({from_args}) too; keep one of them")
    config = config if config is not None else from_args
    if config is None:
        raise ValueError("initialize: no DeepSpeed config: pass config= (a dict or a ds_config.json path) or "
                         "args with --deepspeed_config")
    env, plan = _env(model, mpu)
    device = next(iter(model.parameters())).device
    dp = plan.dp if plan is not None else env.world_size  # (context-parallel ranks share their samples)
    cfg = parse_config(config, dp, device.type)
    options = dict(zero_stage=cfg.zero_stage, offload_optimizer=cfg.offload_optimizer,
                   offload_param=cfg.offload_param, offload_path=cfg.offload_path, device=device)
    plan = plan.with_options(**options) if plan is not None else ParallelPlan(env, **options)
    groups = _groups(model, model_parameters)
    if optimizer is not None and cfg.optimizer is not None:
        raise ValueError("initialize: an optimizer was passed and the config has one too; keep one of them")
    if optimizer is not None:
        cls, groups, kwargs = _client_optimizer(optimizer, groups)
    elif cfg.optimizer is not None:
        cls, kwargs = _config_optimizer(cfg.optimizer)
    else:
        raise ValueError("initialize: no optimizer: add an \"optimizer\" block to the config or pass optimizer=")
    notes = list(cfg.notes)
    if cfg.activation_checkpointing and not _recompute(model):
        notes.append("activation_checkpointing (the model has no set_recompute() nor blocks with .recompute)")
    bucket_mb = cfg.reduce_bucket_size * 4 / 2**20 if cfg.reduce_bucket_size else 25.0  # elements of float32
    trainer = TrainStep(model, plan, groups, cls, bucket_cap_mb=bucket_mb, **kwargs)
    scheduler = _scheduler(cfg, trainer.optimizer, lr_scheduler)
    loader = None
    if training_data is not None:
        sampler = DistributedSampler(training_data, num_replicas=dp, rank=plan.coords.dp)
        loader = DataLoader(training_data, batch_size=cfg.train_micro_batch_size_per_gpu, sampler=sampler,
                            collate_fn=collate_fn)
    engine = DeepSpeedEngine(trainer, cfg, scheduler, env, loader)
    if env is None or env.is_main:
        if notes:
            print(f"DeepSpeed config: accepted, no effect here: {', '.join(notes)}", flush=True)
    return engine, trainer.optimizer, loader, scheduler
