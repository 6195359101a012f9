"""infinitrain.distributed: torch.distributed's API over the project's process groups (MPI for
CPU tensors, NCCL for CUDA tensors; nn.parallel). Start the ranks with `mpirun -n N` or
`python -m mpi_launch --nproc_per_node N` (torchrun's flags and variables), then
init_process_group() as a PyTorch program does. groups.py: the default group and new groups;
collectives.py: the collectives."""
from __future__ import annotations

from .collectives import (ReduceOp, all_gather, all_gather_into_tensor, all_gather_object, all_reduce,
                          all_to_all_single, barrier,
                          broadcast, broadcast_object_list, gather, irecv, isend, recv, reduce, reduce_scatter,
                          reduce_scatter_tensor, scatter, send)
from .groups import (Backend, GroupMember, destroy_process_group, get_backend, get_global_rank, get_group_rank,
                     get_process_group_ranks, get_rank, get_world_size, group, init_process_group, is_available,
                     is_gloo_available, is_initialized, is_mpi_available, is_nccl_available,
                     is_torchelastic_launched, new_group)
from ..nn.parallel.process_group import ProcessGroup, Work

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "is_available", "is_mpi_available",
           "is_nccl_available", "is_gloo_available", "is_torchelastic_launched", "get_rank", "get_world_size",
           "get_backend", "get_process_group_ranks", "get_global_rank", "get_group_rank", "new_group", "group",
           "GroupMember", "Backend", "ProcessGroup", "Work", "ReduceOp", "all_reduce", "broadcast", "reduce",
           "all_gather", "all_gather_into_tensor", "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor",
           "all_to_all_single", "barrier",
           "send", "recv", "isend", "irecv", "all_gather_object", "broadcast_object_list"]
