"""A PyTorch DDP program with only its imports changed, run under `mpirun -n N`, under
`mpi_launch --nproc_per_node N` (torchrun's variables) or as one plain process (the reference):
collectives checked, then a few SGD steps of a small model on a fixed global batch split
across the ranks. Rank 0 prints each step's global loss ("loss STEP VALUE"); every rank "OK"."""
import os

import numpy as np

import infinitrain as torch
import infinitrain.distributed as dist
import infinitrain.nn as nn
import infinitrain.nn.functional as F
from infinitrain.nn.parallel import DistributedDataParallel as DDP
from infinitrain.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert dist.is_initialized() and dist.get_backend() == "mpi"
assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(world))

t = torch.full((3,), float(rank + 1))
dist.all_reduce(t)
assert t.tolist() == [world * (world + 1) / 2] * 3, t
t = torch.full((2,), float(rank))
dist.broadcast(t, src=world - 1)
assert t.tolist() == [world - 1.0] * 2, t
gathered = [torch.zeros(2) for _ in range(world)]
dist.all_gather(gathered, torch.full((2,), float(rank)))
assert [g.tolist() for g in gathered] == [[float(r)] * 2 for r in range(world)], gathered
t = torch.full((1,), float(rank))
dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait()
assert t.item() == world - 1
t = torch.full((2,), float(rank + 2))
dist.reduce(t, dst=world - 1, op=dist.ReduceOp.PRODUCT)  # the others' tensors stay as they were
want = float(np.prod(np.arange(2, world + 2))) if rank == world - 1 else float(rank + 2)
assert t.tolist() == [want] * 2, t
whole = torch.zeros(world, 2)
dist.all_gather_into_tensor(whole, torch.full((2,), float(rank)))
assert whole[:, 0].tolist() == [float(r) for r in range(world)], whole
mine = torch.zeros(2)
dist.reduce_scatter_tensor(mine, torch.arange(2 * world, dtype=torch.float32))
assert mine.tolist() == [float(world * (2 * rank + i)) for i in range(2)], mine
back = [torch.zeros(1) for _ in range(world)] if rank == 0 else None
dist.gather(torch.full((1,), float(10 + rank)), back, dst=0)
assert rank != 0 or [b.item() for b in back] == [10.0 + r for r in range(world)], back
got = torch.zeros(3)
dist.scatter(got, [torch.full((3,), float(r)) for r in range(world)] if rank == 0 else None, src=0)
assert got.tolist() == [float(rank)] * 3, got
last = dist.new_group([world - 1])
assert (dist.get_rank(last), dist.get_world_size(last)) == ((0, 1) if rank == world - 1 else (-1, -1))
objects = [None] * world
dist.all_gather_object(objects, {"rank": rank})
settings = [{"lr": 0.5}] if rank == 0 else [None]
dist.broadcast_object_list(settings, src=0)
assert objects == [{"rank": r} for r in range(world)] and settings == [{"lr": 0.5}], (objects, settings)
if world > 1 and rank < 2:  # a message from rank 0 to rank 1
    msg = torch.full((2,), 7.0) if rank == 0 else torch.zeros(2)
    if rank == 0:
        dist.send(msg, dst=1)
    else:
        assert dist.recv(msg, src=0) == 0 and msg.tolist() == [7.0, 7.0], msg
dist.barrier()

# DistributedSampler(dataset) takes its rank and size from the default group, as PyTorch's
assert list(DistributedSampler(range(16), shuffle=False)) == list(range(rank, 16, world))
shuffled = DistributedSampler(range(16), seed=3)
everyone = [None] * world
dist.all_gather_object(everyone, list(shuffled))
assert sorted(sum(everyone, [])) == list(range(16)), everyone

# the global batch, the same on every rank; each rank trains on its rows
data = np.random.default_rng(0)
X, Y = data.standard_normal((16, 8)).astype(np.float32), data.integers(0, 4, 16)
rows = slice(rank * 16 // world, (rank + 1) * 16 // world)
x, y = torch.tensor(X[rows]), torch.tensor(Y[rows])

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
ddp = DDP(model, device_ids=None)
opt = torch.optim.SGD(ddp.parameters(), lr=0.5, momentum=0.9)
for step in range(5):
    opt.zero_grad()
    loss = F.cross_entropy(ddp(x), y)
    loss.backward()
    opt.step()
    reported = loss.detach().clone()
    dist.all_reduce(reported, op=dist.ReduceOp.AVG)  # the mean of equal shards' means: the global mean
    if rank == 0:
        print(f"loss {step} {reported.item()!r}")
dist.destroy_process_group()
print("OK")
