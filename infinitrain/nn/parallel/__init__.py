"""Parallelism: the layout of ranks, the plan of a job (every fact of its layout: plan.py),
process groups, data parallelism (DDP, ZeRO), tensor and sequence parallelism
(tensor_parallel), pipeline parallelism (pp), context parallelism (context_parallel), expert
parallelism (expert_parallel)."""
from .ddp import DistributedDataParallel, Reducer
from .expert_parallel import ExpertParallel
from .global_env import GlobalEnv, MPIEnvironmentError, get_env, init
from .layout import Layout
from .mpi import MPIProcessGroup
from .plan import ParallelPlan
from .process_group import ProcessGroup, ReduceOp, Work
from .zero import ZeroOptimizer

__all__ = ["Layout", "ParallelPlan", "GlobalEnv", "MPIEnvironmentError", "init", "get_env", "ProcessGroup",
           "MPIProcessGroup", "ReduceOp", "Work", "DistributedDataParallel", "Reducer", "ZeroOptimizer",
           "ExpertParallel"]
