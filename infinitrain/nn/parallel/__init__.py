"""Parallelism: the layout of ranks, process groups, data parallelism (DDP, ZeRO), tensor and
sequence parallelism (tensor_parallel), pipeline parallelism (pp)."""
from .ddp import DistributedDataParallel, Reducer
from .global_env import GlobalEnv, get_env, init
from .layout import Layout
from .mpi import MPIProcessGroup
from .process_group import ProcessGroup, ReduceOp, Work
from .zero import ZeroOptimizer

__all__ = ["Layout", "GlobalEnv", "init", "get_env", "ProcessGroup", "MPIProcessGroup", "ReduceOp",
           "Work", "DistributedDataParallel", "Reducer", "ZeroOptimizer"]
