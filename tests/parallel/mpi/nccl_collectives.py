"""Run under mpiexec -n N on a node with N GPUs: every collective of the NCCL process group on
integer-valued float32 tensors (exact in any summation order) against the known answer, then
bf16 sums natively. Prints 'rank R OK'."""
import numpy as np

import infinitrain as it
from infinitrain.nn import parallel
from infinitrain.nn.parallel import ReduceOp

env = parallel.init(device="cuda")
g, r, n, dev = env.world, env.rank, env.world_size, env.device


def on(a, dtype="float32"):
    return it.from_numpy(np.asarray(a, dtype=np.float32)).to(dtype).to(dev)


def host(t):
    return t.cpu().float().numpy()


base = np.arange(6, dtype=np.float32) + 10 * r
t = on(base)
g.all_reduce(t)
assert np.array_equal(host(t), sum(np.arange(6, dtype=np.float32) + 10 * k for k in range(n)))
t = on(base)
g.all_reduce(t, ReduceOp.MAX)
assert np.array_equal(host(t), np.arange(6, dtype=np.float32) + 10 * (n - 1))
out = on(np.zeros(6 * n))
g.all_gather(out, on(base))
assert np.array_equal(host(out), np.concatenate([np.arange(6, dtype=np.float32) + 10 * k for k in range(n)]))
piece = on(np.zeros(2))
g.reduce_scatter(piece, on(np.arange(2 * n, dtype=np.float32)))
assert np.array_equal(host(piece), n * np.arange(2 * n, dtype=np.float32)[2 * r:2 * r + 2])
t = on(base)
g.broadcast(t, 0)
assert np.array_equal(host(t), np.arange(6, dtype=np.float32))
if n > 1:
    msg = on(np.full(4, 7.0 + r))
    if r == 0:
        g.send(msg, 1)
    elif r == 1:
        g.recv(msg, 0)
        assert np.array_equal(host(msg), np.full(4, 7.0))
work = g.all_reduce(on(np.ones(3), "bfloat16"), ReduceOp.SUM, async_op=True)
work.wait()
g.barrier()
print(f"rank {r} OK", flush=True)
