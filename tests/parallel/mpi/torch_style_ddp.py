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
dist.barrier()

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
