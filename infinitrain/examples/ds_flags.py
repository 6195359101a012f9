"""--deepspeed_config FILE (and DeepSpeed's `--deepspeed --deepspeed_config FILE` form) on the
examples: the config sets what the flags set (infinitrain.deepspeed.config.settings), each
example saying by a table which of its flags each config key sets. A flag typed on the command
line that the config also sets is refused naming both; a config key the example has no flag for
is refused naming it (it would otherwise be silently ignored)."""
from __future__ import annotations

import warnings

from infinitrain.deepspeed import add_config_arguments
from infinitrain.deepspeed.config import ConfigError, parse_config, settings
from infinitrain.examples.flags import refuse

__all__ = ["add_config_arguments", "take_deepspeed_config", "typed_flags"]


def typed_flags(argv) -> set:
    """The flags typed on the command line (--name or --name=value), without their dashes."""
    return {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}


def take_deepspeed_config(args, argv, dp: int, device_type: str, table: dict, is_main: bool = True):
    """Applies args.deepspeed_config to args. table: config key -> (flag or None, convert), where
    convert(value, args) gives the flag's value; flag None: an attribute with no flag of its own
    (it cannot conflict); a key missing from the table: refused. Returns the DeepSpeedConfig, or
    None without --deepspeed_config."""
    if not args.deepspeed_config:
        if args.deepspeed:
            refuse("--deepspeed trains with a DeepSpeed config: add --deepspeed_config FILE")
        return None
    try:
        with warnings.catch_warnings(record=True) as unknown:
            warnings.simplefilter("always")
            cfg = parse_config(args.deepspeed_config, dp, device_type)
    except FileNotFoundError:
        refuse(f"--deepspeed_config {args.deepspeed_config}: no such file")
    except ConfigError as e:
        refuse(f"--deepspeed_config {args.deepspeed_config}: {e}")
    if is_main:
        for w in unknown:
            print(f"--deepspeed_config {args.deepspeed_config}: {w.message}", flush=True)
        if cfg.notes:
            print(f"--deepspeed_config: accepted, no effect here: {', '.join(cfg.notes)}", flush=True)
    given = typed_flags(argv)
    for key, value in settings(cfg).items():
        if key not in table:
            refuse(f"--deepspeed_config sets {key}, which this example has no flag for: remove it from the config")
        flag, convert = table[key]
        if flag is None:
            convert(value, args)
            continue
        if flag in given:
            refuse(f"--{flag} and --deepspeed_config's {key} both set {flag}: give one of them")
        setattr(args, flag, convert(value, args))
    args.monitor = cfg.monitor
    return cfg


def same(value, args):
    return value


def adamw_only(value, args):
    if value != "AdamW":
        refuse(f"--deepspeed_config's optimizer is {value}; this example trains with AdamW (\"type\": \"AdamW\", or "
               "\"Adam\" with adam_w_mode true)")


def offload(value, args):
    return value or "none"


def dtype(value, args):
    return "bfloat16" if value else "float32"


def setter(name: str):
    """A converter that sets an attribute without a flag (betas, eps) and returns nothing."""
    def put(value, args):
        setattr(args, name, value)
    return put


# the keys every example maps the same way (the batch sizes and the schedule differ)
COMMON = {"gradient_clipping": ("grad_clip", same), "optimizer.type": (None, adamw_only),
          "optimizer.params.lr": ("learning_rate", same), "optimizer.params.betas": (None, setter("betas")),
          "optimizer.params.eps": (None, setter("eps")), "optimizer.params.weight_decay": ("weight_decay", same),
          "zero_optimization.stage": ("zero_stage", same),
          "zero_optimization.offload_optimizer.device": ("offload_optimizer", offload),
          "zero_optimization.offload_param.device": ("offload_param", offload),
          "zero_optimization.offload_optimizer.nvme_path": ("offload_path", same),
          "bf16.enabled": ("dtype", dtype)}


def config_schedule(args, optimizer):
    """The DeepSpeed config's scheduler (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle) on
    optimizer, stepped once per optimizer step as DeepSpeed does; None without one."""
    if getattr(args, "ds_scheduler", None) is None:
        return None
    from infinitrain.deepspeed.lr_schedules import SCHEDULES
    try:
        return SCHEDULES[args.ds_scheduler["type"]](optimizer, **args.ds_scheduler["params"])
    except (TypeError, ValueError) as e:
        refuse(f"--deepspeed_config's scheduler ({args.ds_scheduler['type']}): {e}")
