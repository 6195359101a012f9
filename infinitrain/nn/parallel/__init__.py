"""Parallelism: the layout of ranks, process groups, data parallelism (and, next, tensor,
sequence and pipeline parallelism)."""
from .comm_ops import copy_to_group, gather_from_group, reduce_from_group, scatter_to_group
from .ddp import DistributedDataParallel, Reducer
from .global_env import GlobalEnv, get_env, init
from .layout import Layout
from .process_group import MPIProcessGroup, ProcessGroup, ReduceOp, Work

__all__ = ["Layout", "GlobalEnv", "init", "get_env", "ProcessGroup", "MPIProcessGroup", "ReduceOp",
           "Work", "DistributedDataParallel", "Reducer", "copy_to_group", "reduce_from_group",
           "gather_from_group", "scatter_to_group"]
