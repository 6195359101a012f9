"""--layout auto in the language-model examples: the plan picks the layout for the ranks the job
has (the best predicted step time among the layouts that fit this node's available memory),
and the examples' memory refusal names the plan's best fitting layouts. The flags a user typed
stay: --batch_size, --zero_stage and --recompute narrow the choice; the sizes the plan chooses
(--tensor_parallel, ...) are refused beside --layout auto."""
from __future__ import annotations

import os

from ..runtime import available_memory
from . import Cluster, Profile, best_layouts

CHOSEN = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel", "sequence_parallel",
          "pipeline_schedule", "virtual_pipeline_parallel", "cp_comm")


def job_cluster(comm) -> Cluster:
    """The job's ranks as a Cluster: its nodes' ranks and cores, the least available memory of any."""
    from mpi4py import MPI
    local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    memory = comm.allreduce(available_memory() or 2 ** 50, op=MPI.MIN)
    return Cluster(comm.Get_size() // local, local, os.cpu_count() or 1, memory)


def choose(args, typed: set, config, model_class, comm) -> str:
    """Sets the layout flags of args to the plan's choice; returns the line that says which (a
    ValueError where none fits or a flag the plan chooses was typed)."""
    clash = sorted(typed & set(CHOSEN))
    if clash:
        raise ValueError(f"--layout auto chooses --{', --'.join(clash)}: leave {'it' if len(clash) == 1 else 'them'} "
                         "out, or give the whole layout without --layout auto")
    T, world = args.sequence_length, comm.Get_size()
    if args.total_batch_size:
        if args.total_batch_size % T:
            raise ValueError(f"--layout auto: --total_batch_size {args.total_batch_size} is not a multiple of "
                             f"--sequence_length {T}")
        G = args.total_batch_size // T
    else:
        G = args.batch_size * world  # what the flags would train as data-parallel
    profile = Profile.load(args.plan_profile) if args.plan_profile else Profile({})
    cluster = job_cluster(comm)
    options = {}
    if "batch_size" in typed:
        options["micro_batches"] = [args.batch_size]
    if "zero_stage" in typed:
        options["zero_stages"] = (args.zero_stage,)
    if "recompute" in typed:
        options["recompute"] = (args.recompute,)
    ranked = best_layouts(world, config, model_class, cluster, profile, G, T, args.dtype, **options)
    if not ranked:
        raise ValueError(f"--layout auto: no layout of {world} ranks that the examples accept trains this model on "
                         f"{G} x {T} tokens per step (python -m infinitrain.plan says why)")
    best = ranked[0]
    if not best.fits:
        raise ValueError(f"--layout auto: no layout of {world} ranks fits {cluster.memory_per_node / 2**30:.1f} GB "
                         f"per node; the least memory: {min(ranked, key=lambda p: p.memory_per_rank).candidate.name}")
    c = best.candidate
    args.tensor_parallel, args.pipeline_parallel, args.context_parallel = c.tp, c.pp, c.cp
    args.expert_parallel, args.sequence_parallel, args.cp_comm = c.ep, c.sequence_parallel, c.cp_comm
    args.pipeline_schedule, args.virtual_pipeline_parallel = c.pipeline_schedule, c.virtual_pipeline_parallel
    args.zero_stage, args.recompute, args.batch_size, args.total_batch_size = c.zero_stage, c.recompute, \
        c.batch_size, G * T
    fitting = sum(p.fits for p in ranked)
    why = (f"python -m infinitrain.plan --example {'gpt2' if model_class.__name__ == 'GPT2' else 'llama3'} "
           f"--model {args.model} --global_batch {G} --sequence_length {T} --dtype {args.dtype} --nodes "
           f"{cluster.nodes} --cores_per_node {cluster.cores_per_node} --ranks_per_node {cluster.ranks_per_node} "
           f"--memory_per_node {cluster.memory_per_node / 2**30:.1f}"
           + (f" --profile {args.plan_profile}" if args.plan_profile else "") + f" --explain {c.name}")
    return (f"layout auto: {c.name} (of {fitting} fitting layouts; predicted {best.step_time * 1e3:.0f} ms per step, "
            f"{best.memory_per_rank / 2**20:.0f} MB per rank{'' if args.plan_profile else ', placeholder rates'}); "
            f"why: {why}")


def fitting_layouts(plan, config, model_class, batch_size: int, seq_len: int, micro: int, dtype: str,
                    local_size: int, available: float, count: int = 3) -> list:
    """The names of the plan's best layouts of this job's ranks that fit `available` bytes per
    node (placeholder rates: the ranking is by predicted time, the fit by the memory plan); none
    for a model whose class is not known (model_class None)."""
    if model_class is None:
        return []
    world = plan.world_size
    cluster = Cluster(max(1, world // local_size), min(local_size, world), os.cpu_count() or 1, available)
    ranked = best_layouts(world, config, model_class, cluster, Profile({}), batch_size * micro * plan.dp, seq_len,
                          dtype)
    return [p.candidate.name for p in ranked if p.fits][:count]
