"""The layouts a job could run: every DP x TP x PP x CP (x EP) split of its ranks with the
options the examples take (sequence parallelism, the pipeline schedule and its virtual stages,
CP's communication, the ZeRO stage, recomputation, the micro-batch), each kept only where the
examples would accept it. The checks are the engine's own, called on the candidate: Layout and
ParallelPlan (every refusal of the flags), the pipeline's chunk_layers and schedule, the
TensorParallel divisibility check on each width the model splits, CP's check of the sequence
and a2a's split of the heads, the expert count over EP, the examples' accumulation arithmetic.
tests/tools/test_planner.py builds the real model of every layout proposed for the tiny presets
to hold this list to the models' constructors."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..nn.parallel.context_parallel import ContextParallel
from ..nn.parallel.context_parallel.a2a_attention import head_ranges
from ..nn.parallel.expert_parallel import ExpertParallel
from ..nn.parallel.layout import Layout
from ..nn.parallel.plan import ParallelPlan, world_size_of
from ..nn.parallel.pp.schedules import schedule
from ..nn.parallel.pp.stage import chunk_layers
from ..nn.parallel.tensor_parallel import TensorParallel

RECOMPUTE = ("none", "selective", "full")
# (schedule, virtual stages) a pipeline is tried with
PIPELINE_SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("interleaved", 2), ("zbv", 2))


@dataclass(frozen=True)
class Candidate:
    """One layout and its options, named as the examples' flags are."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    pipeline_schedule: str | None = None
    virtual_pipeline_parallel: int = 1
    cp_comm: str = "p2p"
    zero_stage: int = 0
    recompute: str = "none"
    batch_size: int = 1  # sequences per micro-batch

    @property
    def world_size(self) -> int:
        return world_size_of(self.dp, self.tp, self.pp, self.cp)

    def layout(self) -> Layout:
        return Layout(self.world_size, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep)

    def plan(self) -> ParallelPlan:
        """The engine's ParallelPlan of this candidate (ValueError where the examples refuse it)."""
        return ParallelPlan(self.layout(), sequence_parallel=self.sequence_parallel,
                            virtual_pipeline_parallel=self.virtual_pipeline_parallel,
                            pipeline_schedule=self.pipeline_schedule, cp_comm=self.cp_comm,
                            zero_stage=self.zero_stage, recompute=self.recompute)

    @property
    def name(self) -> str:
        """dp=2,tp=2,sp=1,pp=1,cp=1,zero=1,recompute=none,mb=2 (and schedule, vpp, cp_comm, ep
        where they matter): what --explain takes back (parse)."""
        parts = [f"dp={self.dp}", f"tp={self.tp}"] + ([f"sp={int(self.sequence_parallel)}"] if self.tp > 1 else [])
        parts.append(f"pp={self.pp}")
        if self.pp > 1:
            parts += [f"schedule={self.pipeline_schedule}", f"vpp={self.virtual_pipeline_parallel}"]
        parts.append(f"cp={self.cp}")
        if self.cp > 1:
            parts.append(f"cp_comm={self.cp_comm}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        return ",".join(parts + [f"zero={self.zero_stage}", f"recompute={self.recompute}", f"mb={self.batch_size}"])

    def flags(self, global_batch: int, seq_len: int) -> list:
        """The examples' flags that run this candidate on a global batch of sequences."""
        out = ["--batch_size", str(self.batch_size), "--sequence_length", str(seq_len),
               "--total_batch_size", str(global_batch * seq_len)]
        for flag, value, default in (("--tensor_parallel", self.tp, 1), ("--pipeline_parallel", self.pp, 1),
                                     ("--context_parallel", self.cp, 1), ("--expert_parallel", self.ep, 1),
                                     ("--zero_stage", self.zero_stage, 0), ("--recompute", self.recompute, "none")):
            if value != default:
                out += [flag, str(value)]
        if self.sequence_parallel and self.tp > 1:
            out.append("--sequence_parallel")
        if self.pp > 1:
            out += ["--pipeline_schedule", self.pipeline_schedule]
            if self.virtual_pipeline_parallel > 1:
                out += ["--virtual_pipeline_parallel", str(self.virtual_pipeline_parallel)]
        if self.cp > 1 and self.cp_comm != "p2p":
            out += ["--cp_comm", self.cp_comm]
        return out


_KEYS = {"dp": "dp", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "sp": "sequence_parallel",
         "schedule": "pipeline_schedule", "vpp": "virtual_pipeline_parallel", "cp_comm": "cp_comm",
         "zero": "zero_stage", "recompute": "recompute", "mb": "batch_size"}


def parse(text: str) -> Candidate:
    """A Candidate from its name (key=value pairs; the keys left out take their defaults, a
    pipeline's schedule 1f1b)."""
    values = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in _KEYS:
            raise ValueError(f"layout {text!r}: {item!r} is not one of {', '.join(k + '=' for k in _KEYS)}")
        field = _KEYS[key]
        if field in ("pipeline_schedule", "cp_comm", "recompute"):
            values[field] = value
        else:
            try:
                values[field] = int(value)
            except ValueError:
                raise ValueError(f"layout {text!r}: {key} must be an integer, got {value!r}") from None
    c = Candidate(**values)
    c = replace(c, sequence_parallel=bool(c.sequence_parallel))
    if c.pp > 1 and c.pipeline_schedule is None:  # the schedule the examples default to
        try:
            default = ParallelPlan(c.layout(), virtual_pipeline_parallel=c.virtual_pipeline_parallel).pipeline_schedule
        except ValueError:  # sizes the engine refuses: the refusal says why, later
            default = None
        c = replace(c, pipeline_schedule=default)
    return c


def model_of(name: str, config_file: str | None, example: str | None):
    """(config, model class, the example that trains it) of a preset or a config file (the
    model class's configuration fields as JSON)."""
    from ..models import GPT2, GPT2_PRESETS, LLAMA3_PRESETS, LLaMA3
    from ..models.gpt2 import LLMC_GPT2_MAGIC
    from ..models.llama3 import LLMC_LLAMA3_MAGIC
    families = {"gpt2": (GPT2, GPT2_PRESETS), "llama3": (LLaMA3, LLAMA3_PRESETS)}
    if example is not None and example not in families:
        raise ValueError(f"--example must be gpt2 or llama3, got {example!r}")
    if Path(name).exists():  # a checkpoint: its header or config.json says the model, no weights read
        from ..checkpoint import config_from_pretrained
        from ..io import DataFormatError
        try:
            if Path(name).is_dir():
                cls, config = config_from_pretrained(name, GPT2, LLaMA3)
            else:
                magic = int(np.fromfile(name, dtype="<i4", count=1)[0]) if Path(name).stat().st_size >= 4 else None
                cls = {LLMC_GPT2_MAGIC: GPT2, LLMC_LLAMA3_MAGIC: LLaMA3}.get(magic)
                if cls is None:
                    raise DataFormatError(f"{name}: magic number {magic} is neither an llm.c GPT-2 checkpoint's "
                                          f"({LLMC_GPT2_MAGIC}) nor a LLaMA-3 one's ({LLMC_LLAMA3_MAGIC})")
                config = cls.config_from_llmc(name)
        except DataFormatError as e:
            raise ValueError(f"--model {name}: {e}") from None
        return config, cls, "gpt2" if cls is GPT2 else "llama3"
    if config_file:
        fam = example or "gpt2"
        cls = families[fam][0]
        try:
            fields = json.loads(Path(config_file).read_text())
            return cls.config_class(**fields), cls, fam
        except (OSError, json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"--config {config_file}: not a {cls.config_class.__name__} as JSON ({e})") from None
    for fam in ([example] if example else ["gpt2", "llama3"]):
        cls, presets = families[fam]
        if name in presets:
            return presets[name], cls, fam
    known = sorted(set(GPT2_PRESETS) | set(LLAMA3_PRESETS))
    raise ValueError(f"--model {name!r} is no preset of {example or 'gpt2 or llama3'}; choose from {', '.join(known)}")


_FACTS = {}


def model_facts(model_class, config) -> tuple:
    """(the first stage's and the last stage's parameters, the active parameters, the head's
    work in blocks' worth) of a model: the models' own counts, kept per configuration (the
    planner asks them for thousands of candidates)."""
    key = (model_class, repr(config))
    if key not in _FACTS:
        first, _, last = model_class.parameter_parts(config)
        _FACTS[key] = (first, last, model_class.active_parameters(config), model_class.head_work(config))
    return _FACTS[key]


def _stand_in(size: int):
    """What TensorParallel, ContextParallel and ExpertParallel read of a group to check sizes."""
    return SimpleNamespace(size=size, rank=0)


def refusal(c: Candidate, config, model_class, global_batch: int, seq_len: int) -> str | None:
    """Why the examples would refuse this candidate for model_class(config) on a global batch of
    `global_batch` sequences of seq_len tokens, or None where they would run it."""
    try:
        plan = c.plan()
        if seq_len > config.block_size:
            raise ValueError(f"--sequence_length {seq_len} exceeds the model's block size {config.block_size}")
        if global_batch % (c.batch_size * c.dp):
            raise ValueError(f"a global batch of {global_batch} is not a multiple of batch_size {c.batch_size} x "
                             f"data-parallel {c.dp}")
        micro = global_batch // (c.batch_size * c.dp)
        _check_widths(config, model_class, c)
        if c.pp > 1:
            chunk_layers(config.n_layer, c.pp, c.virtual_pipeline_parallel, model_facts(model_class, config)[3])
            schedule(plan.pipeline_schedule, c.pp, c.virtual_pipeline_parallel, micro, 0)
        tp = TensorParallel(_stand_in(c.tp), c.sequence_parallel) if c.tp > 1 else None
        sp = tp.sequence_split if tp else 1
        if c.cp > 1:
            ContextParallel(_stand_in(c.cp), c.cp_comm).check_sequence(seq_len, sp)
            if c.cp_comm == "a2a":
                head_ranges(config.n_head // c.tp, getattr(config, "n_kv_head", config.n_head) // c.tp, c.cp)
        elif seq_len % sp:
            raise ValueError(f"sequence parallelism splits the sequence over tensor parallel {sp}, which does not "
                             f"divide the sequence length {seq_len}")
    except ValueError as e:
        return str(e)
    return None


def _check_widths(config, model_class, c: Candidate) -> None:
    """The widths the model's constructor splits over TP (and its experts over EP)."""
    experts = getattr(config, "num_experts", 0)
    if c.ep > 1 and not experts:
        raise ValueError(f"--expert_parallel {c.ep} splits a mixture of experts' experts, and this model has none")
    if experts and c.ep > 1:
        ExpertParallel(_stand_in(c.ep)).num_local_experts(experts)
    split = c.plan().sequence_divisor
    if experts and c.tp > 1 and not c.sequence_parallel:  # nn.moe.layer.MoELayer's own two checks
        raise ValueError(f"mixture-of-experts layers under tensor parallelism ({c.tp}) need sequence "
                         "parallelism (--sequence_parallel): each TP rank routes its own part of the sequence")
    if experts and config.moe_capacity_factor is not None and split > 1:
        raise ValueError(f"--moe_capacity_factor {config.moe_capacity_factor} counts capacity per whole sequence, "
                         f"but this layout splits each sequence over {split} ranks: train dropless or without it")
    if c.tp == 1:
        return
    tp = TensorParallel(_stand_in(c.tp))
    tp.check_divisible("n_head", config.n_head)
    if hasattr(config, "n_kv_head"):  # LLaMA-3: its vocabulary is padded to a multiple of TP
        tp.check_divisible("n_kv_head (grouped-query KV heads are split, not replicated)", config.n_kv_head)
        if not experts or any(not config.is_moe_layer(i) for i in range(config.n_layer)):
            tp.check_divisible("the MLP width (ffn_hidden)", config.ffn_hidden)
        if experts and config.moe_shared_experts:
            tp.check_divisible("the shared experts' width (moe_shared_experts * moe_ffn_hidden)",
                               config.moe_shared_experts * config.expert_ffn_hidden)
    else:
        tp.check_divisible("the MLP width 4 * n_embd", 4 * config.n_embd)
        tp.check_divisible("the padded vocabulary", config.padded_vocab_size)


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_candidates(world: int, config, model_class, global_batch: int, seq_len: int, *,
                         zero_stages=(0, 1, 2, 3), recompute=RECOMPUTE, cp_comms=("p2p",),
                         micro_batches=None, max_tp=None, max_cp=None) -> tuple:
    """(every candidate the examples accept on `world` ranks, {refusal: count} of the others).
    micro_batches: the batch sizes per micro-batch to try (default: every divisor of the
    global batch over DP); max_tp, max_cp: the largest TP and CP tried (None: any)."""
    kept, refused = [], {}
    experts = getattr(config, "num_experts", 0)
    for tp in [d for d in _divisors(world) if max_tp is None or d <= max_tp]:
        for pp in [d for d in _divisors(world // tp) if d <= config.n_layer]:
            for cp in [d for d in _divisors(world // (tp * pp)) if max_cp is None or d <= max_cp]:
                dp = world // (tp * pp * cp)
                eps = _divisors(dp * cp) if experts else [1]
                for ep in eps:
                    for c in _options(dp, tp, pp, cp, ep, global_batch, zero_stages, recompute, cp_comms,
                                      micro_batches):
                        why = refusal(c, config, model_class, global_batch, seq_len)
                        if why is None:
                            kept.append(c)
                        else:
                            refused[why] = refused.get(why, 0) + 1
    return kept, refused


def _options(dp, tp, pp, cp, ep, global_batch, zero_stages, recompute, cp_comms, micro_batches):
    sps = (True, False) if tp > 1 else (False,)
    pipes = PIPELINE_SCHEDULES if pp > 1 else ((None, 1),)
    comms = cp_comms if cp > 1 else ("p2p",)
    sizes = micro_batches or (_divisors(global_batch // dp) if global_batch % dp == 0 else [1])
    zeros = [z for z in zero_stages if z == 0 or dp * cp > 1]  # ZeRO on one rank trains as without
    for sp in sps:
        for sched, vpp in pipes:
            for comm in comms:
                for zero in zeros:
                    for rc in recompute:
                        for mb in sizes:
                            yield Candidate(dp, tp, pp, cp, ep, sp, sched, vpp, comm, zero, rc, mb)


CANDIDATE_FIELDS = [f.name for f in fields(Candidate)]
