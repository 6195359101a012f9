"""ParallelPlan: every fact of a job's parallel layout and of the training options that compose
with it, derived once, in one place (TorchTitan's ParallelDims is the model: each derived fact
one property). Built once from the layout (DP x TP x PP x CP, from the Layout or the job's
GlobalEnv) and the options (sequence parallelism, virtual stages and schedule, CP's
communication, the ZeRO stage, offload of the optimizer state and parameters,
recomputation); its constructor refuses every impossible combination, with the messages the
examples show. Everything else reads it: TrainStep picks the group that reduces gradients from
it, the examples and the tests' trainer build the model's TensorParallel, PipelineStage and
ContextParallel from it, the memory plan takes its sizes and options, the checkpoints ask it
who writes files.

The option names are the command line's (zero_stage, virtual_pipeline_parallel, ...), so the
refusals name the flags a user of the examples typed, and a user of the Python API the
keywords.

Expert parallelism: EP is the Layout's fifth size, carved out of DP x CP as Megatron-Core does
(layout.py says which ranks form its groups): `expert_group` exchanges the tokens (EP ranks,
each holding E/EP experts), `expert_gradient_group` (DP x CP / EP ranks holding the same
experts) reduces the experts' gradients, the rest reduces over `gradient_group` as before.
"""
from __future__ import annotations

from ...device import as_device
from ...optim.offload import offload_target
from .context_parallel.split import COMM_TYPES as CP_COMM_TYPES
from .layout import Layout
from .pp.schedules import SCHEDULES

SPLITS = ("balanced", "even")


def world_size_of(dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1) -> int:
    """The ranks a layout of these sizes takes (EP is carved out of DP x CP: it adds none)."""
    return dp * tp * pp * cp


def check_offload(zero_stage: int, offload_optimizer, offload_param) -> None:
    """The offload options that compose: the parameters are offloaded only as ZeRO-3's pieces,
    and only to where the optimizer state is (the step updates them together). Also called by
    ZeroOptimizer, which can be built without a plan."""
    param = offload_target(offload_param)
    if param is None:
        return
    if zero_stage != 3:
        raise ValueError(f"--offload_param {param} offloads ZeRO-3's pieces of the parameters: add --zero_stage 3 "
                         "(stages 1 and 2 keep every parameter whole on each rank)")
    if offload_target(offload_optimizer) != param:
        raise ValueError(f"--offload_param {param} keeps the parameters with the AdamW state, which the step "
                         f"updates together: add --offload_optimizer {param}")


def check_zero_stage(zero_stage) -> int:
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    return zero_stage


class ParallelPlan:
    """layout: the job's Layout, or a GlobalEnv (parallel.init's), which also gives the plan this
    rank's coordinates and process groups. A plan built from a bare Layout answers every fact
    but the groups (rank: whose coordinates it is about) — the memory plan and the tests use
    one so. A model without experts refuses EP > 1 itself (the plan does not know the model).

    Options: sequence_parallel; virtual_pipeline_parallel (chunks per stage) and
    pipeline_schedule (None: interleaved with virtual stages, else 1f1b), pipeline_split
    ("balanced" or "even"); cp_comm ("p2p", "all_gather", "a2a" or "a2a+p2p") and cp_a2a_size
    (a2a+p2p's all-to-all groups; None: the CP ranks of one node); zero_stage (0-3);
    offload_optimizer and offload_param (None or "none", "cpu", "nvme") with offload_path;
    recompute ("none", "full", "selective": the model's set_recompute checks it);
    async_tensor_parallel (TP's column-parallel layers overlap backward's all-reduce with their
    products); device (where the model runs, the GlobalEnv's by default: offloading to "cpu"
    moves state off a GPU)."""

    def __init__(self, layout, rank: int = 0, *, sequence_parallel: bool = False,
                 virtual_pipeline_parallel: int = 1, pipeline_schedule: str | None = None,
                 pipeline_split: str = "balanced", cp_comm: str = "p2p", cp_a2a_size: int | None = None,
                 zero_stage: int = 0,
                 offload_optimizer: str | None = None, offload_param: str | None = None, offload_path=None,
                 recompute: str = "none", async_tensor_parallel: bool = True, device=None):
        self.env = None if isinstance(layout, Layout) else layout
        self.layout = layout if isinstance(layout, Layout) else layout.layout
        self.rank = rank if self.env is None else self.env.rank
        self.device = as_device(device) if device is not None else self.env.device if self.env is not None else None
        self.coords = self.layout.coords(self.rank)
        self.sequence_parallel = bool(sequence_parallel)
        self.virtual_pipeline_parallel = virtual_pipeline_parallel
        self.pipeline_split = pipeline_split
        self.cp_comm = cp_comm
        self.cp_a2a_size = cp_a2a_size
        self.zero_stage = check_zero_stage(zero_stage)
        self.offload_optimizer = offload_target(offload_optimizer)
        self.offload_param = offload_target(offload_param)
        self.offload_path = offload_path
        self.recompute = recompute
        self.async_tensor_parallel = async_tensor_parallel
        self._asked_schedule = pipeline_schedule
        self._refuse_impossible()

    def _options(self) -> dict:
        return dict(sequence_parallel=self.sequence_parallel, virtual_pipeline_parallel=self.virtual_pipeline_parallel,
                    pipeline_schedule=self._asked_schedule, pipeline_split=self.pipeline_split, cp_comm=self.cp_comm,
                    cp_a2a_size=self.cp_a2a_size,
                    zero_stage=self.zero_stage, offload_optimizer=self.offload_optimizer,
                    offload_param=self.offload_param, offload_path=self.offload_path, recompute=self.recompute,
                    async_tensor_parallel=self.async_tensor_parallel, device=self.device)

    def with_options(self, **changes) -> "ParallelPlan":
        """The same layout with some options changed (checked as any plan is: ValueError if the
        combination is impossible) — what the memory plan weighs when it suggests another."""
        return ParallelPlan(self.env if self.env is not None else self.layout, self.rank,
                            **{**self._options(), **changes})

    def _refuse_impossible(self) -> None:
        V, schedule = self.virtual_pipeline_parallel, self._asked_schedule
        if not isinstance(V, int) or V < 1:
            raise ValueError(f"--virtual_pipeline_parallel must be a positive integer, got {V!r}")
        if V > 1 and self.pp < 2:
            raise ValueError(f"--virtual_pipeline_parallel {V} splits each pipeline stage into chunks: it needs "
                             "--pipeline_parallel 2 or more")
        if schedule is not None and schedule not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
        if schedule == "zbv" and V != 2:
            raise ValueError(f"--pipeline_schedule zbv places two chunks per stage in a V: it needs "
                             f"--virtual_pipeline_parallel 2, got {V}")
        if schedule == "interleaved" and V < 2:
            raise ValueError("--pipeline_schedule interleaved needs --virtual_pipeline_parallel 2 or more")
        if schedule in ("1f1b", "zb-h1") and V > 1:
            raise ValueError(f"--pipeline_schedule {schedule} runs one chunk per stage; with "
                             f"--virtual_pipeline_parallel {V} use interleaved (the default) or gpipe")
        if self.pipeline_split not in SPLITS:
            raise ValueError(f"pipeline split must be 'balanced' or 'even', got {self.pipeline_split!r}")
        if self.cp_comm not in CP_COMM_TYPES:
            raise ValueError(f"context parallel communication must be one of {CP_COMM_TYPES}, got {self.cp_comm!r}")
        A = self.cp_a2a_size
        if A is not None and self.cp_comm != "a2a+p2p":
            raise ValueError(f"--cp_a2a_size sizes the all-to-all groups of --cp_comm a2a+p2p (this job has "
                             f"--cp_comm {self.cp_comm})")
        if A is not None and (not isinstance(A, int) or A < 1 or self.cp % A):
            raise ValueError(f"--cp_a2a_size {A} must divide --context_parallel {self.cp}")
        if self.zero_stage == 3 and self.pipelined:
            raise ValueError("--zero_stage 3 does not compose with --pipeline_parallel yet (stages 1 and 2 do)")
        check_offload(self.zero_stage, self.offload_optimizer, self.offload_param)
        if self.offload_optimizer == "cpu" and self.device is not None and self.device.type == "cpu":
            raise ValueError("--offload_optimizer cpu moves the AdamW state off the GPU; with --device cpu it is in "
                             "host memory already: use --offload_optimizer nvme --offload_path DIR to move it to disk")
        if self.offload_optimizer == "nvme" and not self.offload_path:
            raise ValueError("--offload_optimizer nvme needs --offload_path DIR, a folder on a local disk")
        if self.offload_path and self.offload_optimizer != "nvme":
            raise ValueError("--offload_path is for --offload_optimizer nvme")
        if self.ep > 1 and self.offload_param is not None:
            raise ValueError(f"--offload_param does not compose with --expert_parallel {self.ep} yet")
        if self.ep > 1 and self.tp > 1 and not self.sequence_parallel:
            raise ValueError(f"--expert_parallel {self.ep} with --tensor_parallel {self.tp} needs "
                             "--sequence_parallel: each TP rank routes its own part of the sequence to the experts")

    # ---- the sizes -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def cp(self) -> int:
        return self.layout.cp

    @property
    def ep(self) -> int:
        """The expert-parallel size: the ranks of DP x CP that split the experts between them."""
        return self.layout.ep

    @property
    def expert_dp(self) -> int:
        """The ranks holding the same experts (DP x CP / EP): they reduce the experts' gradients."""
        return self.dp_cp // self.ep

    @property
    def dp_cp(self) -> int:
        """The ranks holding the same model shard (DP x CP): they reduce gradients and ZeRO
        shards over them."""
        return self.layout.dp * self.layout.cp

    # ---- sequence: how a sample's tokens are split ------------------------------------------
    @property
    def sp(self) -> bool:
        """Whether sequence parallelism is on (it needs TP > 1 to split anything)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def sequence_divisor(self) -> int:
        """What divides a sequence between the ranks that share it: CP, times TP under SP."""
        return self.cp * (self.tp if self.sp else 1)

    def tokens_per_rank(self, seq_len: int) -> int:
        """The tokens of a seq_len sequence one rank's activations hold between TP regions."""
        return seq_len // self.sequence_divisor

    # ---- pipeline ---------------------------------------------------------------------------
    @property
    def pipelined(self) -> bool:
        return self.pp > 1

    @property
    def pipeline_schedule(self) -> str | None:
        """The schedule a pipeline runs (None without one): as asked, else interleaved with
        virtual stages and 1F1B without."""
        if not self.pipelined:
            return None
        return self._asked_schedule or ("interleaved" if self.virtual_pipeline_parallel > 1 else "1f1b")

    # ---- data parallelism and ZeRO ------------------------------------------------------------
    @property
    def zero(self) -> bool:
        """Whether ZeRO shards anything: over more than one DP x CP rank, or on one rank when
        stage 3 offloads its parameters (ZeRO-Infinity on one GPU or one node's disk)."""
        return self.zero_stage > 0 and (self.dp_cp > 1 or (self.zero_stage == 3 and self.offload_param is not None))

    @property
    def active_zero_stage(self) -> int:
        """The ZeRO stage that runs: zero_stage when `zero`, else 0."""
        return self.zero_stage if self.zero else 0

    @property
    def shards_parameters(self) -> bool:
        """ZeRO-3 runs: the model runs only with every DP x CP rank along (they gather its parameters)."""
        return self.active_zero_stage == 3

    @property
    def zero_has_no_effect(self) -> bool:
        """--zero_stage asked for on one DP x CP rank with nothing offloaded: it trains as without."""
        return self.zero_stage > 0 and not self.zero

    @property
    def data_parallel_wrapper(self) -> str | None:
        """What averages the gradients over DP x CP: "zero" (its reduce-scatter), "pipeline"
        (a DDP Reducer per model chunk), "ddp" (DistributedDataParallel), or None (one replica)."""
        if self.zero:
            return "zero"
        if self.dp_cp == 1:
            return None
        return "pipeline" if self.pipelined else "ddp"

    # ---- who does what -----------------------------------------------------------------------
    @property
    def first_replica(self) -> bool:
        """This rank belongs to the model copy that writes files: DP rank 0 and CP rank 0 (the
        other DP and CP ranks hold the same parameters)."""
        return self.coords.dp == 0 and self.coords.cp == 0

    @property
    def writes_files(self) -> bool:
        """This rank writes its part of a checkpoint's files: the first replica's TP rank 0 (its
        pipeline stage's layers, the TP shards gathered)."""
        return self.first_replica and self.coords.tp == 0

    @property
    def runs_generation(self) -> bool:
        """This rank runs the model when the first replica samples text: the first DP replica's
        ranks (its TP group, pipeline stages and CP ring), and under ZeRO-3 every rank (they
        gather the parameters together), under EP every rank (each EP group runs the model
        together, its experts apart)."""
        return self.coords.dp == 0 or self.shards_parameters or self.ep > 1

    @property
    def saves_checkpoint(self) -> bool:
        """This rank takes part in saving: the first replica, under ZeRO every DP x CP rank
        (each holds a shard of the optimizer state), under EP the first replica's EP groups (they
        hold the other experts: the first EP block of DP x CP)."""
        return self.first_replica or self.zero or self.coords.dp * self.cp + self.coords.cp < self.ep

    # ---- what a model and a trainer are built with -------------------------------------------
    def _groups(self):
        if self.env is None:
            raise RuntimeError("this ParallelPlan was built from a Layout, without process groups: build it from "
                               "parallel.init()'s GlobalEnv to run a job")
        return self.env

    @property
    def gradient_group(self):
        """The group that reduces gradients (Megatron's dp_cp group: the DP group when CP is 1)."""
        return self._groups().dp_cp_group

    @property
    def expert_group(self):
        """The EP ranks that exchange tokens (an all-to-all), or None when EP is 1."""
        return self._groups().ep_group if self.ep > 1 else None

    @property
    def expert_gradient_group(self):
        """The group that reduces the experts' gradients (DP x CP / EP ranks holding the same
        experts): the gradient group itself when EP is 1."""
        return self._groups().expert_dp_group if self.ep > 1 else self.gradient_group

    @property
    def pipeline_group(self):
        return self._groups().pp_group

    def tensor_parallel(self):
        """This rank's TensorParallel (what a model is built with under TP), or None when TP is 1."""
        if self.tp == 1:
            return None
        from .tensor_parallel import TensorParallel
        return TensorParallel(self._groups().tp_group, self.sequence_parallel, self.async_tensor_parallel)

    def pipeline_stage(self):
        """This rank's PipelineStage (what a model is built with under PP), or None when PP is 1."""
        if not self.pipelined:
            return None
        from .pp.schedules import placement
        from .pp.stage import PipelineStage
        env = self._groups()
        return PipelineStage(env.pp_group, self.virtual_pipeline_parallel, env.embedding_group, self.pipeline_split,
                             placement(self.pipeline_schedule))

    def context_parallel(self):
        """This rank's ContextParallel (what a model is built with under CP), or None when CP is 1."""
        if self.cp == 1:
            return None
        from .context_parallel import ContextParallel
        return ContextParallel(self._groups().cp_group, self.cp_comm, a2a_size=self.a2a_size)

    @property
    def a2a_size(self) -> int | None:
        """a2a+p2p's all-to-all group size: as asked, else the CP ranks one node holds (the
        largest divisor of CP that fits the node's ranks / TP; the CP ranks of a TP group's
        neighbours are next to each other, layout.py), with the fewest ranks any node has, so
        that every rank counts the same (collective over the job when it has a communicator:
        context_parallel() asks it on every rank)."""
        if self.cp_comm != "a2a+p2p":
            return None
        if self.cp_a2a_size is not None:
            return self.cp_a2a_size
        local = getattr(self.env, "local_size", self.world_size)
        comm = getattr(self.env, "comm", None)
        if comm is not None:
            from mpi4py import MPI
            local = comm.allreduce(local, op=MPI.MIN)
        per_node = max(1, local // self.tp)
        return max(d for d in range(1, self.cp + 1) if self.cp % d == 0 and d <= per_node)

    def expert_parallel(self):
        """This rank's ExpertParallel (what an MoE model is built with under EP), or None when EP is 1."""
        if self.ep == 1:
            return None
        from .expert_parallel import ExpertParallel
        return ExpertParallel(self._groups().ep_group)

    # ---- the log line ------------------------------------------------------------------------
    def describe(self) -> str:
        """DP=2, TP=2, SP=2, PP=2, CP=1[, EP=2][, VPP=2]: what the per-step log line shows."""
        text = self.layout.describe(sp=self.tp if self.sp else 0)
        if self.virtual_pipeline_parallel > 1:
            text += f", VPP={self.virtual_pipeline_parallel}"
        return text

    def __repr__(self) -> str:
        zero = f", ZeRO-{self.zero_stage}" if self.zero_stage else ""
        offload = f", offload {self.offload_optimizer}" if self.offload_optimizer else ""
        return f"ParallelPlan({self.describe()}{zero}{offload}, rank {self.rank})"
