"""The process's place in the job: MPI initialisation, the Layout, and the DP/TP/PP/CP process
groups and the DP x CP group that reduces gradients (created once). `init()` is what a training
script calls; under a single process it works too (a world of one)."""
from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from ...device import as_device
from .layout import Layout
from .mpi import MPIProcessGroup
from .process_group import CollectiveError, set_default_data_parallel_group

_ENV = None

# Variables that launchers set to the number of processes they started. Slurm's is the job
# step's (set inside `srun` only; SLURM_NTASKS also exists in a plain batch script).
_LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE",
                       "WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


class GlobalEnv:
    """gpu: this rank's CUDA device (its groups are NCCL groups), or None (MPI groups, CPU)."""

    watchdog = None  # the Watchdog of a multi-rank job (init's collective_timeout)

    def __init__(self, comm, layout: Layout, local_size: int = 1, gpu=None, local_rank: int = 0):
        self.comm = comm
        self.device = gpu if gpu is not None else as_device("cpu")
        if gpu is not None:
            from .nccl import NCCLProcessGroup
            make = lambda sub, members: NCCLProcessGroup(sub, members, gpu)  # noqa: E731
        else:
            make = MPIProcessGroup
        self.layout = layout
        self.rank = comm.Get_rank()
        self.world_size = comm.Get_size()
        self.coords = layout.coords(self.rank)
        groups = {}
        for kind in ("dp", "tp", "pp", "cp", "dp_cp", "ep", "expert_dp"):
            if kind == "dp_cp" and layout.cp == 1:
                groups[kind] = groups["dp"]
                continue
            if kind == "expert_dp" and layout.ep == 1:  # every DP x CP rank holds every expert
                groups[kind] = groups["dp_cp"]
                continue
            members = getattr(layout, f"{kind}_group")(self.rank)
            color = layout.all_groups(kind).index(tuple(members))
            sub = comm.Split(color, members.index(self.rank))  # collective over the world
            groups[kind] = make(sub, members)
        self.dp_group, self.tp_group, self.pp_group = groups["dp"], groups["tp"], groups["pp"]
        # cp_group: the ring that splits each sequence; dp_cp_group: DP and CP together, the
        # group that reduces gradients and means the loss (the DP group when CP is 1)
        self.cp_group, self.dp_cp_group = groups["cp"], groups["dp_cp"]
        # ep_group: the ranks that exchange tokens with their experts (one rank when EP is 1);
        # expert_dp_group: the ranks holding the same experts, which reduce their gradients
        self.ep_group, self.expert_dp_group = groups["ep"], groups["expert_dp"]
        for kind, group in groups.items():  # names for messages and flight records
            # (with CP 1, dp_cp is the DP group itself; with EP 1, expert_dp is dp_cp)
            if (kind != "dp_cp" or layout.cp > 1) and (kind != "expert_dp" or layout.ep > 1):
                group.name = kind
        self.world = make(comm, list(range(self.world_size)))
        self.world.name = "world"
        self.local_size = local_size  # ranks on this node, sharing its memory and cores
        self.local_rank = local_rank  # this rank's index among them
        # the first and last stage of each pipeline: a tied embedding's gradient is summed there
        self.embedding_group = None
        if layout.pp > 1:
            from mpi4py import MPI
            members = [self.layout.pp_group(self.rank)[0], self.layout.pp_group(self.rank)[-1]]
            inside = self.rank in members
            color = layout.all_groups("pp").index(tuple(layout.pp_group(self.rank))) if inside else MPI.UNDEFINED
            sub = comm.Split(color, members.index(self.rank) if inside else 0)
            if inside:
                self.embedding_group = make(sub, members)
                self.embedding_group.name = "embedding"

    @property
    def dp_rank(self) -> int:
        return self.coords.dp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def __repr__(self) -> str:
        return f"GlobalEnv(rank={self.rank}, {self.layout})"


def mpi_library() -> tuple:
    """(the MPI library mpi4py loaded, as its first version line, the launcher that goes with it)."""
    from mpi4py import MPI
    library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0].strip()
    if "Open MPI" in library:
        return library, "Open MPI's `mpirun` (or `srun --mpi=pmix` under Slurm)"
    if "Intel" in library:
        return library, "Intel MPI's `mpiexec.hydra` (or `srun --mpi=pmi2`)"
    if "MPICH" in library:
        wheel = Path(sys.executable).parent / "mpiexec"
        mine = f" ({wheel}, the mpich extra's)" if wheel.is_file() else ""
        return library, f"this MPICH's `mpiexec`{mine} (or `srun --mpi=pmi2` under Slurm)"
    return library, "the `mpiexec` of that MPI"


class MPIEnvironmentError(RuntimeError):
    """The MPI library mpi4py would load cannot run under the launcher that started the job."""


def _library_abi() -> str | None:
    """The MPI family ("mpich", "openmpi", ...) of the library mpi4py will load, found by opening
    it without initialising MPI (mpi4py's own ABI probe), or None where that cannot be told."""
    try:
        from mpi4py import _mpiabi
        return _mpiabi._get_mpiabi()
    except Exception:  # an mpi4py without the probe, or no library: _load_mpi says so
        return None


def _check_launcher_against_library() -> None:
    """Before MPI starts: a job started by Open MPI's mpirun (PMIx) cannot initialise an MPICH
    library such as the mpich extra's (MPICH aborts inside MPI_Init: "unsupported PMI version
    PMIx"), nor MPICH's Hydra mpiexec an Open MPI one (each rank a world of one): say which
    launcher goes with which install instead."""
    env = os.environ
    openmpi_launcher = "OMPI_COMM_WORLD_SIZE" in env
    hydra_launcher = "HYDI_CONTROL_FD" in env and not openmpi_launcher  # MPICH's (and Intel MPI's) Hydra
    if not (openmpi_launcher or hydra_launcher):
        return
    abi = _library_abi()
    wheel = Path(sys.executable).parent / "mpiexec"
    if abi == "mpich" and openmpi_launcher:
        raise MPIEnvironmentError(
            "this job was started by Open MPI's mpirun, but mpi4py loads an MPICH library (the mpich extra's, "
            "or the one MPI4PY_LIBMPI names), which cannot start under it. Either start it with MPICH's "
            f"launcher: {wheel if wheel.is_file() else 'mpiexec'} -n N ... (or `srun --mpi=pmi2` under Slurm), or "
            "use Open MPI throughout: pip uninstall mpich (so that mpi4py loads the system's Open MPI; "
            "`module load openmpi` on a cluster)")
    if abi == "openmpi" and hydra_launcher:
        raise MPIEnvironmentError(
            "this job was started by MPICH's mpiexec (Hydra), but mpi4py loads Open MPI's library, whose ranks "
            "would each see a world of one. Start it with Open MPI's mpirun (or `srun --mpi=pmix`), or "
            "use MPICH throughout: pip install 'infinitrain[mpich]' (or `module load mpich`)")


def _load_mpi():
    """mpi4py's MPI module, or an error that says how to get an MPI library: mpi4py's wheel
    brings none and loads the one it finds (the cluster's, or the mpich extra's)."""
    _check_launcher_against_library()
    try:
        from mpi4py import MPI
    except RuntimeError as e:
        if "cannot load MPI library" not in str(e):
            raise
        first = str(e).splitlines()[1:2]
        raise RuntimeError(
            "no MPI library found (mpi4py: " + (first[0] if first else str(e)) + "). Load your cluster's "
            "MPI (`module load openmpi`, or the path of its libmpi.so in MPI4PY_LIBMPI), or install "
            "the MPICH runtime from PyPI: pip install 'infinitrain[mpich]'") from None
    return MPI


def _check_mpi_environment(comm) -> None:
    """mpi4py linked to one MPI and the job started by another's mpiexec gives N processes
    that each see a world of 1: catch that instead of training N copies side by side."""
    for var in _LAUNCHER_SIZE_VARS:
        n = os.environ.get(var)
        if n and n.isdigit() and int(n) > 1 and comm.Get_size() == 1:
            library, launcher = mpi_library()
            if var.startswith("SLURM"):  # srun without an MPI plugin (Slurm's MpiDefault=none)
                raise RuntimeError(
                    f"srun started {n} tasks ({var}={n}) but MPI sees a world of 1: srun did not "
                    f"connect them to MPI (mpi4py uses {library!r}). Start the job with "
                    "`srun --mpi=pmix` (or `--mpi=pmi2`, whichever your MPI and Slurm support; "
                    "`srun --mpi=list` shows them), or with mpirun inside the allocation.")
            raise RuntimeError(
                f"the launcher started {n} processes ({var}={n}) but MPI sees a world of 1: "
                f"mpi4py uses {library!r}, not the MPI whose launcher started this job. Start it "
                f"with {launcher}, or `mpi_launch --mpiexec PATH` naming that launcher, or rebuild "
                "mpi4py against the MPI whose launcher you use.")


def _whole_lines() -> None:
    """Each printed line reaches the launcher in one write. Unbuffered output (PYTHONUNBUFFERED,
    common on clusters and in containers) writes a line's text and its newline apart, and
    launchers that merge or tag the ranks' output by write (Open MPI's --tag-output) then split
    the lines of one rank with another's."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True, write_through=False)


def _abort_on_exception() -> None:
    """An exception on one rank ends the whole job (its traceback shown first) instead of
    leaving the other ranks waiting in a collective forever."""
    from mpi4py import MPI
    previous = sys.excepthook

    def hook(kind, value, tb):
        if kind is KeyboardInterrupt:
            previous(kind, value, tb)
        else:
            rank = MPI.COMM_WORLD.Get_rank()
            if issubclass(kind, CollectiveError):  # the message says all there is: where the program called it
                frames = traceback.extract_tb(tb) if tb is not None else []
                callers = [f for f in frames if f"{os.sep}nn{os.sep}parallel{os.sep}" not in f.filename]
                where = (callers or frames or [None])[-1]
                text = f"{kind.__name__}: {value}" + (f" (called at {where.filename}:{where.lineno})\n"
                                                      if where else "\n")
            else:
                text = "".join(traceback.format_exception(kind, value, tb))
            sys.stderr.write(f"[rank {rank}] uncaught exception, aborting the job:\n{text}")
            sys.stderr.flush()
            sys.stdout.flush()
            # let the launcher read the traceback from the pipe before the abort tears it down
            time.sleep(0.5)
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = hook


def exit_job(code) -> None:
    """Ends this process with `code` (as sys.exit). In a multi-rank job a rank that leaves with
    an error ends every rank within a second: alone it would leave the others waiting in their
    next collective until the watchdog's timeout (a save that failed on the writing rank only,
    Ctrl-C that reached one rank; a refusal every rank makes ends them all the sooner)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if code not in (0, None) and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() \
            and mpi.COMM_WORLD.Get_size() > 1:
        if not isinstance(code, int):
            print(code, file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        time.sleep(0.5)  # the launcher reads this rank's last lines before the abort tears its pipes down
        mpi.COMM_WORLD.Abort(code if isinstance(code, int) else 1)
    sys.exit(code)


def init(tensor_parallel: int = 1, pipeline_parallel: int = 1, device: str = "cpu",
         context_parallel: int = 1, expert_parallel: int = 1, init_timeout: float | None = None,
         collective_timeout: float | None = None, flight_recorder_dir=None) -> GlobalEnv:
    """Initialises MPI (through mpi4py) and the layout; returns the process's GlobalEnv. The
    device picks the collectives' backend: MPI for "cpu"; for "cuda" each rank takes one GPU
    of its node (by its rank on the node) and its groups are NCCL groups, bootstrapped through
    MPI (`mpi.nccl_unique_id`). expert_parallel: EP, carved out of DP x CP (layout.py).
    Every rank must arrive within init_timeout seconds (default
    300, or $INFINITRAIN_INIT_TIMEOUT; TorchTitan's comm.init_timeout_seconds): otherwise the
    job aborts, rank 0 naming the ranks that never came, instead of waiting forever. Then a
    watchdog (watchdog.py) aborts the job when any operation of a process group takes longer
    than collective_timeout seconds (default 600, $INFINITRAIN_COLLECTIVE_TIMEOUT; 0: off),
    writing every answering rank's flight record to flight_recorder_dir (default
    ./flight_recorder, $INFINITRAIN_FLIGHT_RECORDER_DIR) and naming the stuck rank."""
    global _ENV
    comm = _load_mpi().COMM_WORLD
    _check_mpi_environment(comm)
    if init_timeout is None:
        init_timeout = float(os.environ.get("INFINITRAIN_INIT_TIMEOUT", "300"))
    _rendezvous(comm, init_timeout)
    layout = Layout(comm.Get_size(), tp=tensor_parallel, pp=pipeline_parallel, cp=context_parallel,
                    ep=expert_parallel)
    if collective_timeout is None:
        collective_timeout = float(os.environ.get("INFINITRAIN_COLLECTIVE_TIMEOUT", "600"))
    if not collective_timeout >= 0 or collective_timeout == float("inf"):  # NaN, negative: not "off" by accident
        raise ValueError(f"collective timeout must be a number of seconds >= 0 (0: no watchdog), got "
                         f"{collective_timeout} (INFINITRAIN_COLLECTIVE_TIMEOUT or collective_timeout=)")
    folder = flight_recorder_dir or os.environ.get("INFINITRAIN_FLIGHT_RECORDER_DIR", "flight_recorder")
    if comm.Get_size() > 1 and collective_timeout > 0:  # where a hang is recorded: usable, known now
        from .watchdog import check_folder
        problem = None
        if comm.Get_rank() == 0:  # decided once, for every rank (one refusing alone would hang the rest)
            try:
                check_folder(folder)
            except ValueError as e:
                problem = str(e)
        problem = comm.bcast(problem, root=0)
        if problem:
            raise ValueError(problem)
    local_rank, local_size, cores = _local_cores(comm)
    if comm.Get_size() > 1:
        _whole_lines()
        _abort_on_exception()
        _share_cores(cores)  # before the groups: they choose a communication thread by it
    # "cuda" lets each rank take its local GPU; "cuda:N" names one (as_device turns "cuda" into
    # cuda:0, so the spelling tells them apart)
    dev = as_device(device)
    named = dev if (":" in device if isinstance(device, str) else dev.index) else None
    gpu = _pick_gpu(local_rank, local_size, named) if dev.type == "cuda" else None
    _ENV = GlobalEnv(comm, layout, local_size, gpu, local_rank)
    set_default_data_parallel_group(_ENV.dp_group)
    if comm.Get_size() > 1:
        from . import watchdog
        _ENV.watchdog = watchdog.start(comm, collective_timeout, folder)
    return _ENV


_ARRIVED_TAG = 0x4954  # "IT": each rank's arrival, to rank 0, before anything else is sent


def _rendezvous(comm, timeout: float) -> None:
    """Returns once every rank has called init(); past the timeout, aborts the job. Each rank
    tells rank 0 it arrived (point to point), so rank 0 can name the ranks that did not."""
    n = comm.Get_size()
    if n == 1:
        return
    from mpi4py import MPI
    rank = comm.Get_rank()
    me = bytearray(rank.to_bytes(4, "little"))
    sent = comm.Isend([me, MPI.BYTE], dest=0, tag=_ARRIVED_TAG)
    inbox = [bytearray(4) for _ in range(n)] if rank == 0 else []
    arrivals = [comm.Irecv([inbox[r], MPI.BYTE], source=r, tag=_ARRIVED_TAG) for r in range(n)] if rank == 0 else []
    everyone = comm.Ibarrier()
    deadline = time.monotonic() + timeout
    while not everyone.Test():
        if time.monotonic() > deadline:
            if rank == 0:
                missing = [r for r, req in enumerate(arrivals) if not req.Test()]
                sys.stderr.write(f"[rank 0] parallel.init: rank(s) {missing} of {n} did not reach init() within "
                                 f"{timeout:.0f} s (stuck or dead before it); aborting the job. "
                                 "INFINITRAIN_INIT_TIMEOUT sets the bound.\n")
            else:
                sys.stderr.write(f"[rank {rank}] parallel.init: not every rank reached init() within "
                                 f"{timeout:.0f} s; aborting the job (rank 0 names the missing ones).\n")
            sys.stderr.flush()
            time.sleep(0.5 if rank == 0 else 2.0)  # rank 0's message first
            comm.Abort(1)
        time.sleep(0.005)
    sent.Wait()
    MPI.Request.Waitall(arrivals)


def _pick_gpu(local_rank: int, local_size: int, asked=None):
    """One rank per GPU: the node's k-th rank takes cuda:k (as torchrun's LOCAL_RANK). A GPU
    named by index (cuda:1) is taken by a single rank on its node; the numbers are those that
    CUDA_VISIBLE_DEVICES leaves visible, as in PyTorch."""
    from ... import cuda
    from ...runtime import build_info
    n = cuda.device_count()
    if n == 0:
        raise RuntimeError("device 'cuda' was asked for, but this node has no usable CUDA device ("
                           + build_info().split("CUDA: ", 1)[-1] + ")")
    if local_size > n:
        raise RuntimeError(f"{local_size} ranks on this node but {n} GPU(s): NCCL takes one rank per GPU; "
                           f"start at most {n} ranks per node")
    if asked is not None:
        if local_size > 1:
            raise ValueError(f"device '{asked}' names one GPU, but {local_size} ranks run on this node and each "
                             "takes the GPU of its local rank: ask for 'cuda' (or choose the GPUs with "
                             "CUDA_VISIBLE_DEVICES)")
        if asked.index >= n:
            raise ValueError(f"device '{asked}' does not exist: this node has {n} GPU(s) (cuda:0 to cuda:{n - 1})")
        return asked
    return as_device(f"cuda:{local_rank}")


def _local_cores(comm) -> tuple:
    """(this rank's index on its node, ranks on this node, the cores each may use): a rank the
    launcher bound to cores of its own (Open MPI's binding, srun -c N with task/affinity) keeps
    them all; ranks that share a set (Hydra's default, cgroups alone) split it between them."""
    from mpi4py import MPI
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    index = local.Get_rank()
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    sets = [set(s) for s in local.allgather(mine)]
    local.Free()
    n = len(sets)
    disjoint = sum(len(s) for s in sets) == len(set().union(*sets))
    return index, n, (len(mine) if disjoint else max(1, len(set().union(*sets)) // n))


def _share_cores(cores: int) -> None:
    """Sets this rank's threads to its share of the node's cores (unless OMP_NUM_THREADS says
    otherwise), so that `mpirun -np N` on an N-core node does not start N x N threads."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    from ...runtime import set_num_threads
    set_num_threads(max(1, cores))


def share_node_cores(comm) -> int:
    """What init() does to the threads, for tools that time the engine on several ranks without a
    training job (the planner's calibration): this rank's threads set to its share of the node's
    cores, unless OMP_NUM_THREADS says otherwise; returns the threads it runs."""
    from ...runtime import get_num_threads
    _share_cores(_local_cores(comm)[2])
    return get_num_threads()


def get_env() -> GlobalEnv:
    if _ENV is None:
        raise RuntimeError("infinitrain.nn.parallel.init() has not been called")
    return _ENV
