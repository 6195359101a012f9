"""The default process group and the groups made from it, under torch.distributed's names.

init_process_group starts the job through nn.parallel.init (MPI underneath every backend: it is
how the ranks meet, and it bootstraps the NCCL communicators) and takes that job's world group
as the default. A group here is the backend's own ProcessGroup (MPIProcessGroup for CPU
tensors, NCCLProcessGroup for CUDA tensors): the same objects the rest of nn.parallel uses, so
one can be handed to DistributedDataParallel(process_group=) as it is.

Ranks come from MPI. torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK) are read to check that
they agree with it: mpi_launch sets them from MPI's own, and a launcher that set them without
starting the ranks under MPI (torchrun itself) is told how to start the job instead.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from datetime import timedelta

from ..nn import parallel
from ..nn.parallel.process_group import set_default_data_parallel_group

# the launchers' own counts of the processes they started: set means the ranks run under MPI
_MPI_LAUNCHER_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE",
                      "SLURM_STEP_NUM_TASKS", "HYDI_CONTROL_FD")


class Backend(str):
    """The backends' names (torch.distributed.Backend): "gloo" runs on the MPI backend."""

    MPI = "mpi"
    NCCL = "nccl"
    GLOO = "gloo"
    UNDEFINED = "undefined"

    def __new__(cls, name: str):
        name = str(name).lower()
        if name not in (cls.MPI, cls.NCCL, cls.GLOO):
            raise ValueError(f"unknown backend {name!r}: infinitrain runs 'mpi' (CPU tensors; 'gloo' is taken "
                             "as 'mpi') and 'nccl' (CUDA tensors)")
        return super().__new__(cls, name)


class _WorldMeta(type):
    @property
    def WORLD(cls):  # noqa: N802  (PyTorch's name)
        return _adopted()


class GroupMember(metaclass=_WorldMeta):
    """GroupMember.WORLD: the default group (None before init_process_group);
    NON_GROUP_MEMBER: what new_group returns on a rank it leaves out."""

    NON_GROUP_MEMBER = -100


class group(metaclass=_WorldMeta):  # noqa: N801  (torch.distributed.group.WORLD)
    pass


# world: the default group; explicit: init_process_group made it (not adopted from a job that
# nn.parallel.init started); destroyed: destroy_process_group ran since
_state = {"world": None, "backend": None, "env": None, "groups": [], "explicit": False, "destroyed": False}


def _adopted():
    """The default group: init_process_group's, or else the world of a job nn.parallel.init()
    started (its ranks are the same), so that code asking torch.distributed's questions
    (DistributedSampler) sees the job either way."""
    if _state["world"] is None and not _state["destroyed"]:
        from ..nn.parallel import global_env
        env = global_env._ENV
        if env is not None:
            _state.update(world=env.world, env=env,
                          backend=Backend.NCCL if env.device.type == "cuda" else Backend.MPI)
    return _state["world"]


def is_available() -> bool:
    """Whether collectives can run here: mpi4py is installed (it carries every backend's
    rendezvous). MPI itself starts only at init_process_group."""
    return is_mpi_available()


def is_mpi_available() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def is_gloo_available() -> bool:
    """"gloo" runs on the MPI backend, so it is there when MPI is."""
    return is_mpi_available()


def is_nccl_available() -> bool:
    """Whether this process sees a CUDA device for the NCCL backend (NCCL's own library is
    opened when the first communicator is made, and a missing one is named then)."""
    from .. import cuda
    try:
        return cuda.is_available()
    except Exception:  # a library without its CUDA half: no device
        return False


def is_initialized() -> bool:
    """Whether there is a default group (init_process_group, or a job nn.parallel.init() started)."""
    return _adopted() is not None


def is_torchelastic_launched() -> bool:
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def _seconds(timeout) -> float | None:
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not seconds > 0:
        raise ValueError(f"timeout must be a positive timedelta, got {timeout!r}")
    return seconds


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {value!r}") from None


def _check_launched_under_mpi(world_size: int, rank: int) -> None:
    """Before MPI starts: a world of several ranks must have been started by an MPI launcher
    (mpirun, mpiexec, srun, mpi_launch); a torchrun-style WORLD_SIZE alone means each process
    would be a world of one."""
    asked = world_size if world_size != -1 else _env_int("WORLD_SIZE")
    if asked is not None and asked > 1 and not any(v in os.environ for v in _MPI_LAUNCHER_VARS):
        raise RuntimeError(
            f"init_process_group: a world of {asked} ranks was asked for (WORLD_SIZE or world_size=), but this "
            "process was not started by an MPI launcher: infinitrain's process groups run over MPI, so its ranks "
            "must be started together by one. Start the job with `python -m mpi_launch --nproc_per_node N "
            "script.py` (torchrun's flags and variables) or `mpirun -n N python script.py`, not torchrun.")


def _check_against_mpi(env, world_size: int, rank: int) -> None:
    """MPI's rank and size are the truth; torchrun's variables and the arguments must agree."""
    for what, value, truth in (("WORLD_SIZE", _env_int("WORLD_SIZE"), env.world_size),
                               ("RANK", _env_int("RANK"), env.rank),
                               ("world_size=", world_size if world_size != -1 else None, env.world_size),
                               ("rank=", rank if rank != -1 else None, env.rank)):
        if value is not None and value != truth:
            name = what if what.endswith("=") else f"${what}"
            raise RuntimeError(
                f"init_process_group: {name} {value} disagrees with MPI, which started this process as rank "
                f"{env.rank} of {env.world_size}: MPI's ranks are the ones used. Start the job with one launcher "
                "(mpirun -n N, or mpi_launch, which sets RANK and WORLD_SIZE from MPI), or drop the stale values.")


def _pick_backend(backend) -> str:
    if isinstance(backend, str) and ":" in backend:  # "cpu:gloo,cuda:nccl": one backend per job here
        by_device = dict(pair.split(":", 1) for pair in backend.lower().replace(" ", "").split(","))
        picked = by_device["cuda"] if "cuda" in by_device and is_nccl_available() else by_device.get("cpu")
        if picked is None:
            raise ValueError(f"backend {backend!r} names no backend for the devices this process has")
        backend = picked
    if backend is None:  # PyTorch pairs cpu with gloo and cuda with nccl; one backend per job here
        return Backend.NCCL if is_nccl_available() else Backend.MPI
    name = Backend(backend)
    if name == Backend.GLOO:
        warnings.warn("init_process_group: backend 'gloo' runs on infinitrain's MPI backend (CPU tensors)",
                      stacklevel=3)
        return Backend.MPI
    if name == Backend.NCCL and not is_nccl_available():
        from ..runtime import build_info
        raise RuntimeError("init_process_group: backend 'nccl' needs a CUDA device, and this process sees none ("
                           + build_info().split("CUDA: ", 1)[-1].split(";")[0] + "). Use backend='mpi' "
                           "(or 'gloo') for CPU tensors.")
    return str(name)


def init_process_group(backend: str | None = None, init_method: str | None = None, timeout=None,
                       world_size: int = -1, rank: int = -1, store=None, group_name: str = "",
                       pg_options=None, device_id=None) -> None:
    """Joins this process to the job: MPI's world becomes the default group (see the module's
    note). backend: "mpi" (CPU tensors; "gloo" is taken as "mpi", with a note), "nccl" (CUDA
    tensors, each rank on the GPU of its local rank), or None (nccl where a GPU is seen, else
    mpi). The ranks meet through MPI, so init_method's address ("env://", "tcp://...") is not
    used; a Store is refused. timeout bounds both the meeting and every later collective (the
    job aborts past it, naming the stuck rank)."""
    if _state["explicit"]:
        raise RuntimeError("init_process_group: the default process group is already initialised; "
                           "call destroy_process_group() first")
    if store is not None:
        raise ValueError("init_process_group: store= is not supported: the ranks meet through MPI, which needs none")
    if pg_options is not None:
        raise ValueError("init_process_group: pg_options= is not supported by infinitrain's backends")
    if init_method is not None and str(init_method).split("://")[0] not in ("env", "tcp", "file"):
        raise ValueError(f"init_method must be 'env://', 'tcp://host:port' or 'file://path', got {init_method!r}")
    name = _pick_backend(backend)
    seconds = _seconds(timeout)
    _check_launched_under_mpi(world_size, rank)
    env = _state["env"]
    if env is None:
        try:
            env = parallel.get_env()  # a job that nn.parallel.init() already started
        except RuntimeError:
            env = parallel.init(device="cuda" if name == Backend.NCCL else "cpu", init_timeout=seconds,
                                collective_timeout=seconds)
    if (env.device.type == "cuda") != (name == Backend.NCCL):
        raise RuntimeError(f"init_process_group: this process's groups were made for {env.device}; backend "
                           f"{name!r} needs {'a CUDA device' if name == Backend.NCCL else 'CPU tensors'}")
    _check_against_mpi(env, world_size, rank)
    if device_id is not None:
        from ..device import as_device
        asked = as_device(f"cuda:{device_id}" if isinstance(device_id, int) else device_id)
        if asked != env.device:
            raise ValueError(f"init_process_group: device_id {asked}, but this rank's device is {env.device} "
                             "(each rank takes the GPU of its local rank)")
    for var, value in (("RANK", env.rank), ("WORLD_SIZE", env.world_size), ("LOCAL_RANK", env.local_rank),
                       ("LOCAL_WORLD_SIZE", env.local_size)):
        os.environ.setdefault(var, str(value))  # as torchrun would have set them
    _state.update(world=env.world, backend=name, env=env, explicit=True, destroyed=False)
    set_default_data_parallel_group(env.dp_group)


def destroy_process_group(group=None) -> None:
    """Forgets the default group and every group made from it (group=None), or one group. MPI
    stays up (it ends with the process), so init_process_group may be called again."""
    if group is None or group is _state["world"]:
        _state.update(world=None, backend=None, groups=[], explicit=False, destroyed=True)
        set_default_data_parallel_group(None)
    elif group in _state["groups"]:
        _state["groups"].remove(group)


def _world():
    if _adopted() is None:
        raise RuntimeError("the default process group has not been initialised: call "
                           "infinitrain.distributed.init_process_group() first")
    return _state["world"]


def _resolve(group):
    """The backend group that group= names (None: the default), or None on a rank outside it."""
    if group is None or group is GroupMember.WORLD:
        return _world()
    if group is GroupMember.NON_GROUP_MEMBER:
        return None
    _world()
    if not isinstance(group, parallel.ProcessGroup):
        raise TypeError(f"group must be a process group from new_group() (or None), got {type(group).__name__}")
    return group


def _host_collective(g, fn):
    """fn(the group's MPI communicator) after whatever the group's communication thread still has
    queued, so that every rank sees the same order (the NCCL groups' communicator only bootstraps)."""
    result = []
    if isinstance(g, parallel.MPIProcessGroup):
        g._collective(lambda: result.append(fn(g.comm)), None, None, async_op=False)
    else:
        result.append(fn(g.comm))
    return result[0]


def get_rank(group=None) -> int:
    """This process's rank in group (the default: the global rank); -1 outside it."""
    g = _resolve(group)
    return -1 if g is None else g.rank


def get_world_size(group=None) -> int:
    g = _resolve(group)
    return -1 if g is None else g.size


def get_backend(group=None) -> str:
    g = _resolve(group)
    if g is None:
        raise ValueError("get_backend: this rank is not in the group")
    return _state["backend"]


def get_process_group_ranks(group) -> list:
    """The global ranks of group, in the group's rank order."""
    g = _resolve(group)
    if g is None:
        raise ValueError("get_process_group_ranks: this rank is not in the group")
    return list(g.ranks)


def get_global_rank(group, group_rank: int) -> int:
    return get_process_group_ranks(group)[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    ranks = get_process_group_ranks(group)
    if global_rank not in ranks:
        raise ValueError(f"global rank {global_rank} is not in the group (ranks {ranks})")
    return ranks.index(global_rank)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization: bool = False,
              group_desc=None, device_id=None):
    """A group of the given global ranks (None: all of them), on the default group's backend.
    Called by every rank of the job, as in PyTorch; a rank left out gets
    GroupMember.NON_GROUP_MEMBER, on which collectives do nothing."""
    world = _world()
    if backend is not None and _pick_backend(backend) != _state["backend"]:
        raise ValueError(f"new_group: backend {backend!r} differs from the default group's "
                         f"{_state['backend']!r}; one backend per job")
    if pg_options is not None:
        raise ValueError("new_group: pg_options= is not supported by infinitrain's backends")
    if use_local_synchronization:
        raise ValueError("new_group: use_local_synchronization=True is not supported: every rank of the job "
                         "calls new_group")
    n = world.size
    members = sorted(set(range(n) if ranks is None else (int(r) for r in ranks)))
    if not members or members[0] < 0 or members[-1] >= n:
        raise ValueError(f"new_group: ranks must be a non-empty list of ranks in 0..{n - 1}, got {ranks}")
    from mpi4py import MPI

    inside = world.rank in members
    sub = _host_collective(world, lambda comm: comm.Split(0 if inside else MPI.UNDEFINED,
                                                          members.index(world.rank) if inside else 0))
    if not inside:
        return GroupMember.NON_GROUP_MEMBER
    env = _state["env"]
    if env.device.type == "cuda":
        from ..nn.parallel.nccl import NCCLProcessGroup
        made = NCCLProcessGroup(sub, members, env.device)
    else:
        made = parallel.MPIProcessGroup(sub, members)
    made.name = group_desc or f"group{members}"
    _state["groups"].append(made)
    return made
