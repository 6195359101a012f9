"""Run under mpiexec: DDP averages gradients in buckets, gradients are views into the buckets,
a parameter without a gradient does not hang the job, no_sync accumulates, a parameter used
both inside and outside a recomputed piece is reduced once, with its whole gradient."""
import numpy as np

import infinitrain as it
from infinitrain import nn
from infinitrain.autograd import checkpoint
from infinitrain.nn import parallel


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 3)
        self.unused = nn.Linear(3, 3)

    def forward(self, x):
        return self.b(self.a(x).relu())


class Reused(Net):
    def forward(self, x):  # a's gradient comes from the recomputed piece and from outside it
        return self.b(self.a(checkpoint(self.a, x)).relu())


env = parallel.init()
r, n = env.rank, env.world_size
it.manual_seed(100 + r)  # different on purpose: DDP broadcasts rank 0's weights
model = parallel.DistributedDataParallel(Net(), bucket_cap_mb=0.0001, first_bucket_mb=0.00005)
assert len(model.reducer.buckets) > 1
x_all = np.random.default_rng(0).standard_normal((n * 4, 6)).astype(np.float32)
x = it.tensor(x_all[r * 4:(r + 1) * 4])
(model(x) ** 2).mean().backward()
grads = {k: p.grad.numpy().copy() for k, p in model.module.named_parameters()}

# the same computation in one process on the whole batch
it.manual_seed(100)
ref = Net()
ref.load_state_dict(model.module.state_dict())
(ref(it.tensor(x_all)) ** 2).mean().backward()
for k, p in ref.named_parameters():
    if k.startswith("unused"):
        assert np.all(grads[k] == 0)
    else:
        assert np.allclose(grads[k], p.grad.numpy(), rtol=1e-5, atol=1e-6), k
for p in model.module.parameters():
    b = model.reducer.buckets[model.reducer.buffer.locate(p)[0]]
    assert p.grad._storage is b.flat_grad._storage  # a view into the bucket, no copy

model.zero_grad()
with model.no_sync():
    (model(x) ** 2).mean().backward()
local = model.module.a.weight.grad.numpy().copy()
(model(x) ** 2).mean().backward()
total = it.tensor(local)
env.world.all_reduce(total, parallel.ReduceOp.AVG)
assert np.allclose(model.module.a.weight.grad.numpy(), 2 * total.numpy(), rtol=1e-5, atol=1e-6)

for net in (Net, Reused):
    model = parallel.DistributedDataParallel(net(), bucket_cap_mb=0.0001, first_bucket_mb=0.00005)
    (model(x) ** 2).mean().backward()
    ref = net()
    ref.load_state_dict(model.module.state_dict())
    (ref(it.tensor(x_all)) ** 2).mean().backward()
    for (k, p), q in zip(model.module.named_parameters(), ref.parameters()):
        want = q.grad.numpy() if q.grad is not None else 0  # `unused`: zeros
        assert np.allclose(p.grad.numpy(), want, rtol=1e-5, atol=1e-6), (net.__name__, k)

# a second backward through the same forward would reach buckets already reduced: an error
loss = (model(x) ** 2).mean()
loss.backward(retain_graph=True)
try:
    loss.backward()
    raise AssertionError("a second gradient for a reduced bucket was taken silently")
except RuntimeError as e:
    assert "got its gradient twice in one backward pass" in str(e), e
print(f"rank {r} OK", flush=True)
