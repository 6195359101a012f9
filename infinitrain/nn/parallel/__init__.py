"""Parallelism: the layout of ranks, process groups, data parallelism (and, next, tensor,
sequence and pipeline parallelism)."""
from .ddp import DistributedDataParallel, Reducer
from .global_env import GlobalEnv, get_env, init
from .layout import Layout
from .mpi import MPIProcessGroup
from .process_group import ProcessGroup, ReduceOp, Work

__all__ = ["Layout", "GlobalEnv", "init", "get_env", "ProcessGroup", "MPIProcessGroup", "ReduceOp",
           "Work", "DistributedDataParallel", "Reducer"]
