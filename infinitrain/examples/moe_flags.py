"""The mixture-of-experts flags of the LLaMA-3 example (Megatron's names) and what the training
loop does with an MoE model each step: the selection biases updated from the step's loads
(summed over the data-parallel ranks), the auxiliary loss and the load imbalance on the log
line, the tokens per expert every --moe_log_every steps. Under pipeline parallelism rank 0
reports the layers of the first stage (each stage updates its own layers' biases)."""
from __future__ import annotations

from dataclasses import replace

from infinitrain.examples.flags import nonnegative_float, nonnegative_int, positive_float, positive_int

# flag -> the LLaMA3Config field it sets (None as a flag's value: the preset's)
MOE_FIELDS = {"num_experts": "num_experts", "moe_top_k": "moe_top_k", "moe_shared_experts": "moe_shared_experts",
              "moe_router": "moe_router", "moe_aux_loss_coeff": "moe_aux_loss_coeff",
              "moe_z_loss_coeff": "moe_z_loss_coeff", "moe_capacity_factor": "moe_capacity_factor",
              "moe_bias_update_rate": "moe_bias_update_rate", "moe_ffn_hidden": "moe_ffn_hidden",
              "moe_layer_freq": "moe_layer_freq"}


def add_moe_flags(p) -> None:
    g = p.add_argument_group("mixture of experts (default: the preset's; moe-tiny, moe-small, mixtral-8x7b, "
                             "qwen3-30b-a3b, deepseek-v3-small have experts)")
    g.add_argument("--num_experts", type=nonnegative_int, default=None, help="routed experts per MoE layer (0: dense)")
    g.add_argument("--moe_top_k", type=positive_int, default=None, help="experts each token is routed to")
    g.add_argument("--moe_shared_experts", type=nonnegative_int, default=None,
                   help="shared experts every token goes through (DeepSeek, Qwen2-MoE)")
    g.add_argument("--moe_router", default=None, choices=["softmax", "sigmoid"], help="the router's scores")
    g.add_argument("--moe_aux_loss_coeff", type=nonnegative_float, default=None,
                   help="coefficient of the load-balancing loss (per sequence, Switch/GShard)")
    g.add_argument("--moe_z_loss_coeff", type=nonnegative_float, default=None, help="coefficient of the router z-loss")
    g.add_argument("--moe_capacity_factor", type=positive_float, default=None,
                   help="drop assignments past ceil(factor * T * k / E) per expert per sequence (first choices "
                        "first, then by position); default dropless")
    g.add_argument("--moe_bias_update_rate", type=nonnegative_float, default=None,
                   help="> 0: DeepSeek-V3's bias-based balancing, the selection biases moved by this much per step")
    g.add_argument("--moe_ffn_hidden", type=positive_int, default=None, help="each expert's width")
    g.add_argument("--moe_layer_freq", type=positive_int, default=None, help="every n-th layer has experts")
    g.add_argument("--moe_log_every", type=nonnegative_int, default=0,
                   help="print the tokens per expert of every MoE layer every N steps (0 = never)")


def moe_overrides(args) -> dict:
    """The configuration fields the MoE flags given set."""
    return {field: getattr(args, flag) for flag, field in MOE_FIELDS.items() if getattr(args, flag) is not None}


def apply_moe_flags(args, error) -> None:
    """The preset with the MoE flags applied and checked (error(message) refuses)."""
    overrides = moe_overrides(args)
    args.moe_overrides = overrides
    if not overrides or (args.load and not args.model_given):  # (--load's recorded model: at build)
        return
    if args.llmc_filepath or args.from_pretrained:
        error(f"--{next(iter(overrides))}: the MoE flags set up a preset (--model); the model of --llmc_filepath / "
              "--from_pretrained is the one its files describe (a Mixtral or Qwen3-MoE folder keeps its routing "
              "as transformers' config says, without auxiliary losses)")
    cfg = replace(args.presets[args.model], **overrides)
    if not cfg.num_experts:
        error(f"--{next(iter(overrides))} needs experts: --model {args.model} is dense, give --num_experts")
    try:
        cfg.validate()
    except ValueError as e:
        error(f"the MoE flags describe no valid model: {e}")
    args.presets = {**args.presets, args.model: cfg}


def moe_reducer(plan, device):
    """Sums a host array over the data-parallel ranks (DP x CP), or None on one."""
    if plan.dp_cp == 1:
        return None
    from functools import partial
    from infinitrain.nn.parallel.process_group import sum_host_array
    return partial(sum_host_array, groups=[plan.gradient_group], device=device)


class MoEStepLog:
    """After each optimizer step: the biases updated, the log line's text and the loads."""

    def __init__(self, model, plan, device, log_every: int, log):
        self.model, self.log_every, self.log = model, log_every, log
        self.active = bool(getattr(model, "moe_layers", dict)())
        self.reduce = moe_reducer(plan, device) if self.active else None
        self.stats = None

    def after_step(self, step: int) -> str:
        """Returns the log line's MoE part ('' for a dense model); prints the loads when asked."""
        if not self.active:
            return ""
        self.stats = s = self.model.update_moe_biases(self.reduce)
        if self.log_every and step % self.log_every == 0:
            for i, load in s.tokens_per_expert.items():
                self.log(f"step {step:4d} layer {i} tokens per expert: {' '.join(str(int(n)) for n in load)}"
                         + (f" | dropped {s.dropped[i]}" if s.dropped[i] else ""), flush=True)
        aux = f"aux {s.aux_loss:.4f} | " if s.aux_loss is not None else ""
        return f"{aux}imbalance {s.imbalance:.2f} | "

    def scalars(self) -> dict:
        """The step's MoE figures for the monitor (none for a dense model)."""
        if self.stats is None:
            return {}
        return {"moe_aux_loss": self.stats.aux_loss, "moe_z_loss": self.stats.z_loss,
                "moe_load_imbalance": self.stats.imbalance}
