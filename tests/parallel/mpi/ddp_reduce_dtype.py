"""Run under mpiexec: DDP's reduce dtype (mixed_precision=_MixedPrecision(reduce_dtype=)). bf16
gradients averaged in float32 are the ranks' fp32 sum rounded once; fp32 gradients averaged in
bf16 are each rank's gradient rounded to bf16, their mean rounded again (and so differ from the
fp32 mean, by at most bf16's rounding); without a reduce dtype, the fp32 mean. Each against the
ranks' own gradients (computed without DDP and gathered), bit for bit."""
import numpy as np
from mpi4py import MPI

import infinitrain as it
from infinitrain import nn
from infinitrain.nn import parallel
from infinitrain.nn.parallel.ddp import _MixedPrecision


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x):
        return self.b(self.a(x).relu())


def bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (to nearest even, the library's own cast), as float32."""
    return it.tensor(x).to(it.bfloat16).float().numpy()


def grads(model) -> dict:
    return {k: p.grad.float().numpy().copy() for k, p in model.named_parameters()}


env = parallel.init()
r, n = env.rank, env.world_size
x_all = np.random.default_rng(0).standard_normal((n * 4, 16)).astype(np.float32)
for param_dtype, reduce_dtype in (("bfloat16", "float32"), ("float32", "bfloat16"), ("float32", None)):
    it.manual_seed(0)  # the same weights on every rank
    net = Net().to(getattr(it, param_dtype))
    x = it.tensor(x_all[r * 4:(r + 1) * 4]).to(getattr(it, param_dtype))
    (net(x).float() ** 2).mean().backward()
    mine = grads(net)
    everyone = MPI.COMM_WORLD.allgather(mine)
    net.zero_grad(set_to_none=True)
    # tiny buckets: several all-reduces, each through its own copy in the reduce dtype
    ddp = parallel.DistributedDataParallel(net, bucket_cap_mb=0.001, first_bucket_mb=0.0005,
                                           mixed_precision=_MixedPrecision(reduce_dtype=reduce_dtype))
    assert len(ddp.reducer.buckets) > 1
    (ddp(x).float() ** 2).mean().backward()
    got = grads(net)
    for k, g in got.items():
        parts = [e[k] for e in everyone]
        if reduce_dtype == "bfloat16":
            parts = [bf16(part) for part in parts]
        mean = parts[0]
        for part in parts[1:]:
            mean = mean + part  # float32 sums, in rank order
        mean = mean * np.float32(1.0 / n)
        want = bf16(mean) if "bfloat16" in (param_dtype, reduce_dtype) else mean
        assert np.array_equal(got[k], want), (param_dtype, reduce_dtype, k, np.abs(got[k] - want).max())
        if reduce_dtype == "bfloat16":  # the bytes were bf16: off the fp32 mean, within bf16's rounding
            exact = sum(e[k] for e in everyone) / n
            assert not np.array_equal(got[k], exact), k
            scale = sum(np.abs(e[k]) for e in everyone) / n  # (a sum that cancels is rounded at its parts' scale)
            assert np.all(np.abs(got[k] - exact) <= 2 ** -7 * scale), (k, np.abs(got[k] - exact).max())
    for p in net.parameters():  # still views into the buckets, in the parameters' dtype
        assert p.grad.dtype == p.dtype
        assert any(p.grad._storage is b.flat_grad._storage for b in ddp.reducer.buckets)
print(f"rank {r} OK", flush=True)
