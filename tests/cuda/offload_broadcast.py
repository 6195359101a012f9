"""Two ranks, each with its own model and optimizer (no DDP): after the first step every rank
takes rank 0's weights by broadcast (the "load on rank 0, broadcast to the others" idiom), then
steps again. The offloaded AdamW (state in host memory) must give the GPU AdamW's weights on every
rank. Prints "OK" or the mismatch.

    mpiexec -n 2 python offload_broadcast.py      (INFINITRAIN_EMULATED_GPUS=2 on the emulator)
"""
import numpy as np

import infinitrain as it
from infinitrain import nn
from infinitrain.nn import parallel
from infinitrain.optim import AdamW, OffloadOptimizer

env = parallel.init(device="cuda")
runs = {}
for offload in (False, True):
    it.manual_seed(1 + env.rank)  # each rank starts from other weights
    model = nn.Linear(8, 4).to(env.device)
    opt = AdamW(model.parameters(), lr=1e-2)
    opt = OffloadOptimizer(opt, "cpu") if offload else opt
    x = it.randn(3, 8).to(env.device)
    for step in range(3):
        model(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
        if step == 0:
            with it.no_grad():
                for p in model.parameters():
                    env.world.broadcast(p.detach(), 0)
    runs[offload] = [p.detach().cpu().numpy().copy() for p in model.parameters()]
bad = [i for i, (a, b) in enumerate(zip(runs[False], runs[True])) if not np.array_equal(a, b)]
print(f"rank {env.rank}: " + ("OK" if not bad else f"parameters {bad} differ from the GPU AdamW's"), flush=True)
