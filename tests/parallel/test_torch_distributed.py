"""infinitrain.distributed as torch.distributed, and DistributedDataParallel with PyTorch's
signature: in process for a world of one (a plain process, as torchrun starts one rank) and the
refusals; under MPI, a PyTorch-style DDP script on 2 ranks against one process."""
import inspect
import re
from functools import lru_cache

import numpy as np
import pytest

import infinitrain as it
import infinitrain.distributed as dist
from infinitrain import nn
from infinitrain.nn.parallel import DistributedDataParallel as DDP

from helpers import MPI_SCRIPTS, mpirun

LAUNCHER_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS",
                 "HYDI_CONTROL_FD")


@pytest.fixture
def torchrun_env(monkeypatch):
    """A plain process with torchrun's variables for one rank; the default group is destroyed
    afterwards (MPI stays up: it ends with the process)."""
    for var in LAUNCHER_VARS + ("LOCAL_WORLD_SIZE",):
        monkeypatch.delenv(var, raising=False)
    for var, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(var, value)
    yield monkeypatch
    dist.destroy_process_group()


def test_the_names_and_defaults_are_pytorchs():
    pytest.importorskip("torch")
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel as TorchDDP
    for name in ("init_process_group", "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                 "reduce_scatter_tensor", "reduce_scatter", "gather", "scatter", "barrier", "new_group",
                 "destroy_process_group", "get_rank", "get_world_size", "get_backend", "get_process_group_ranks",
                 "send", "recv", "isend", "irecv", "all_gather_object", "broadcast_object_list"):
        ours = inspect.signature(getattr(dist, name)).parameters
        theirs = [p for p in inspect.signature(getattr(tdist, name)).parameters.values()
                  if not p.name.startswith("_") and p.name != "sort_ranks"]
        assert list(ours)[:len(theirs)] == [p.name for p in theirs], name
        for p in theirs:  # a default that is a torch object (ReduceOp.SUM) is compared by name
            mine = ours[p.name].default
            assert str(mine).split(".")[-1] == str(p.default).split(".")[-1].split(":")[0], (name, p.name)
    ours = inspect.signature(DDP).parameters
    theirs = list(inspect.signature(TorchDDP).parameters.values())
    assert list(ours)[:len(theirs)] == [p.name for p in theirs]
    assert all(ours[p.name].default == p.default for p in theirs if p.name != "module")
    for name in (n for n in dir(tdist.ReduceOp) if n.isupper()):  # each there, or refused by name
        if name in ("BAND", "BOR", "BXOR", "PREMUL_SUM"):
            with pytest.raises(AttributeError, match=f"ReduceOp.{name} is not supported"):
                getattr(dist.ReduceOp, name)
        else:
            assert getattr(dist.ReduceOp, name).name == name


def test_a_world_of_one_started_like_torchrun(torchrun_env):
    assert dist.is_available() and not dist.is_initialized() and dist.group.WORLD is None
    with pytest.warns(UserWarning, match="'gloo' runs on infinitrain's MPI backend"):
        dist.init_process_group("gloo", init_method="env://")
    assert dist.is_initialized() and dist.get_backend() == "mpi"
    assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
    assert dist.get_process_group_ranks(dist.group.WORLD) == [0] and dist.GroupMember.WORLD is dist.group.WORLD
    with pytest.raises(RuntimeError, match="already initialised"):
        dist.init_process_group("mpi")

    x = it.tensor([1.5, -2.0, 3.0])
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        t = x.clone()
        dist.all_reduce(t, op=op)
        assert t.tolist() == x.tolist(), op
    t = x.clone()
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert work.is_completed() and t.tolist() == x.tolist()
    dist.broadcast(t, src=0)
    dist.reduce(t, dst=0)
    gathered = [it.zeros(3)]
    dist.all_gather(gathered, x)
    dist.all_gather(gathered, x, async_op=True).wait()
    whole = it.zeros(1, 3)
    dist.all_gather_into_tensor(whole, x)
    mine = it.zeros(3)
    dist.reduce_scatter_tensor(mine, x.view(1, 3))
    assert gathered[0].tolist() == whole[0].tolist() == mine.tolist() == x.tolist()
    got = it.zeros(3)
    dist.scatter(got, [x], src=0)
    back = [it.zeros(3)]
    dist.gather(got, back, dst=0)
    assert back[0].tolist() == x.tolist()
    objects = [None]
    dist.all_gather_object(objects, {"step": 3})
    listed = ["a", 2]
    dist.broadcast_object_list(listed, src=0)
    assert objects == [{"step": 3}] and listed == ["a", 2]
    dist.barrier()
    sub = dist.new_group([0])
    assert dist.get_process_group_ranks(sub) == [0] and dist.get_rank(sub) == 0

    dist.destroy_process_group()
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.get_rank()
    # again, after destroy (backend None is mpi without a GPU; this process's groups are CPU ones)
    dist.init_process_group(None if not dist.is_nccl_available() else "mpi")
    assert dist.get_world_size() == 1


def test_ddp_of_one_rank_trains_as_the_module_with_pytorchs_arguments(torchrun_env):
    torch = pytest.importorskip("torch")
    dist.init_process_group("mpi")
    it.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    with torch.no_grad():
        for (_, p), q in zip(model.named_parameters(), ref.parameters()):
            q.copy_(torch.from_numpy(p.detach().numpy()))
    ddp = DDP(model, device_ids=None, output_device=None, broadcast_buffers=True, bucket_cap_mb=None,
              find_unused_parameters=True, gradient_as_bucket_view=False, static_graph=False)
    assert ddp.module is model and ddp.device_ids is None
    assert dist.get_process_group_ranks(ddp.process_group) == [0]  # the default group's
    assert list(ddp.state_dict()) == ["module." + k for k in model.state_dict()]
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    y = np.array([0, 2, 1, 2])
    ours, theirs = it.optim.SGD(ddp.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(2):
        ours.zero_grad()
        theirs.zero_grad()
        with ddp.no_sync():  # accumulated locally, then once more with the reduction
            nn.functional.cross_entropy(ddp(it.tensor(x)), it.tensor(y)).backward()
        nn.functional.cross_entropy(ddp(it.tensor(x)), it.tensor(y)).backward()
        for _ in range(2):
            torch.nn.functional.cross_entropy(ref(torch.tensor(x)), torch.tensor(y)).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-5)
        ours.step()
        theirs.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_refusals_say_what_was_wrong(torchrun_env):
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.all_reduce(it.ones(2))
    if not dist.is_nccl_available():
        with pytest.raises(RuntimeError, match="'nccl' needs a CUDA device"):
            dist.init_process_group("nccl")
    with pytest.raises(ValueError, match="unknown backend 'ucc'"):
        dist.init_process_group("ucc")
    with pytest.raises(ValueError, match="store= is not supported"):
        dist.init_process_group("mpi", store=object())
    with pytest.raises(ValueError, match="init_method must be"):
        dist.init_process_group("mpi", init_method="redis://x")
    torchrun_env.setenv("WORLD_SIZE", "2")  # torchrun's two ranks, each a world of one under MPI
    with pytest.raises(RuntimeError, match="not started by an MPI launcher.*mpi_launch"):
        dist.init_process_group("mpi")
    torchrun_env.setenv("WORLD_SIZE", "1")
    torchrun_env.setenv("RANK", "1")
    with pytest.raises(RuntimeError, match=r"\$RANK 1 disagrees with MPI, which started this process as rank 0 of 1"):
        dist.init_process_group("mpi")
    torchrun_env.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="rank= 3 disagrees with MPI"):
        dist.init_process_group("mpi", rank=3)
    assert not dist.is_initialized()

    dist.init_process_group("mpi")
    with pytest.raises(AttributeError, match="BAND is not supported"):
        dist.ReduceOp.BAND
    with pytest.raises(TypeError, match="op must be a ReduceOp"):
        dist.all_reduce(it.ones(2), op="sum")
    with pytest.raises(TypeError, match="must be an infinitrain Tensor"):
        dist.all_reduce(np.ones(2))
    with pytest.raises(ValueError, match="list of 1 tensors"):
        dist.all_gather([it.zeros(2), it.zeros(2)], it.ones(2))
    with pytest.raises(ValueError, match="src 1 is not in the group"):
        dist.broadcast(it.ones(2), src=1)
    with pytest.raises(ValueError, match="ranks in 0..0"):
        dist.new_group([0, 1])
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="must be None for a module on the CPU"):
        DDP(model, device_ids=[0])
    with pytest.raises(TypeError, match="second argument is device_ids"):
        DDP(model, dist.group.WORLD)
    with pytest.raises(ValueError, match="mixed_precision=.* is not supported: give a _MixedPrecision"):
        DDP(model, mixed_precision=object())
    from infinitrain.nn.parallel.nccl import _native_op
    with pytest.raises(ValueError, match="reduces with SUM, AVG, MAX, MIN, not PRODUCT"):
        _native_op(dist.ReduceOp.PRODUCT)


# ---- under MPI: a PyTorch-style DDP script on 2 ranks ---------------------------------------

TORCH_STYLE_DDP = MPI_SCRIPTS / "torch_style_ddp.py"


def _losses(out: str) -> list:
    losses = [float(v) for v in re.findall(r"loss \d+ (\S+)$", out, re.M)]
    assert len(losses) == 5, out
    return losses


@lru_cache(maxsize=None)
def _one_process() -> tuple:
    return tuple(_losses(mpirun(1, [TORCH_STYLE_DDP])))


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpirun", "mpi_launch"])
def test_a_pytorch_style_ddp_script_on_2_ranks_matches_one_process(launcher):
    """The same global batch split over 2 ranks: the losses of one process, to float32 rounding;
    mpi_launch gives the script torchrun's variables, plain mpirun only MPI's."""
    if launcher == "mpirun":
        out = mpirun(2, [TORCH_STYLE_DDP])
    else:
        out = mpirun(1, ["-m", "mpi_launch", "--nproc_per_node", "2", TORCH_STYLE_DDP])
    assert out.count("OK") == 2, out
    np.testing.assert_allclose(_losses(out), _one_process(), rtol=1e-5)
