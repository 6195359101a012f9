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
# all_to_all_single: rank r sends (r + 2k) % 3 rows (some none) of 2 to rank k, bf16 too
def rows(src, dst):
    return (src + 2 * dst) % 3


def block(src, dst):
    return np.arange(2 * rows(src, dst), dtype=np.float32).reshape(-1, 2) + 100 * src + 10 * dst


for dtype in ("float32", "bfloat16"):
    want = np.concatenate([block(k, r) for k in range(n)])
    out = on(np.zeros_like(want), dtype)
    g.all_to_all_single(out, on(np.concatenate([block(r, k) for k in range(n)]), dtype),
                        [rows(k, r) for k in range(n)], [rows(r, k) for k in range(n)])
    assert np.array_equal(host(out), host(on(want, dtype))), dtype
work = g.all_reduce(on(np.ones(3), "bfloat16"), ReduceOp.SUM, async_op=True)
work.wait()
g.barrier()
print(f"rank {r} OK", flush=True)
