"""Run under mpiexec: every collective against numpy, in several dtypes; prints OK per rank."""
import ml_dtypes
import numpy as np

import infinitrain as it
from infinitrain.nn import parallel
from infinitrain.nn.parallel import ReduceOp

env = parallel.init()
g, r, n = env.world, env.rank, env.world_size


def data(rank, dtype, shape=(5, 7)):
    rng = np.random.default_rng(rank)
    if dtype in ("int32", "int64"):
        return rng.integers(-50, 50, shape).astype(dtype)
    a = rng.standard_normal(shape).astype(np.float32)
    return a.astype(ml_dtypes.bfloat16).astype(np.float32) if dtype == "bfloat16" else a


for dtype in ("float32", "bfloat16", "int32", "int64"):
    everyone = np.stack([data(k, dtype) for k in range(n)])
    ops = [("sum", ReduceOp.SUM, everyone.sum(0)), ("max", ReduceOp.MAX, everyone.max(0)),
           ("min", ReduceOp.MIN, everyone.min(0))]
    if dtype != "int32" and dtype != "int64":
        ops.append(("avg", ReduceOp.AVG, everyone.astype(np.float64).mean(0)))
    for name, op, ref in ops:
        t = it.tensor(data(r, dtype), dtype=dtype)
        g.all_reduce(t, op)
        got = np.asarray(t.numpy(), np.float64)
        tol = 2e-2 * max(1, n) if dtype == "bfloat16" else 1e-5
        assert np.allclose(got, ref, rtol=tol, atol=tol), (dtype, name, np.abs(got - ref).max())
    mine = it.tensor(data(r, dtype), dtype=dtype)
    out = it.empty(n * 5, 7, dtype=dtype)
    g.all_gather(out, mine)
    assert np.array_equal(np.asarray(out.numpy(), np.float64).reshape(n, 5, 7), everyone.astype(np.float64)), dtype
    big = it.tensor(np.concatenate([data(r * 100 + k, dtype) for k in range(n)]), dtype=dtype)
    part = it.empty(5, 7, dtype=dtype)
    g.reduce_scatter(part, big, ReduceOp.SUM)
    ref = sum(data(k * 100 + r, dtype).astype(np.float64) for k in range(n))
    tol = 2e-2 * n if dtype == "bfloat16" else 1e-5
    assert np.allclose(np.asarray(part.numpy(), np.float64), ref, rtol=tol, atol=tol), dtype
    b = it.tensor(data(r, dtype), dtype=dtype)
    g.broadcast(b, src=n - 1)
    assert np.array_equal(np.asarray(b.numpy(), np.float64), data(n - 1, dtype).astype(np.float64)), dtype

# reduce_scatter in place (out is this rank's block of the input, as ZeRO-1 reduces its buckets):
# what a separate output gets, synchronous and not, SUM and AVG (within round-off: Open MPI's
# non-blocking collectives may add in another order than its blocking ones)
for op in (ReduceOp.SUM, ReduceOp.AVG):
    for async_op in (False, True):
        whole = it.tensor(np.concatenate([data(r * 100 + k, "float32") for k in range(n)]))
        want = it.empty(5, 7)
        g.reduce_scatter(want, whole.clone(), op)
        mine = whole[r * 5:(r + 1) * 5]
        work = g.reduce_scatter(mine, whole, op, async_op=async_op)
        if async_op:
            work.wait()
        assert np.allclose(mine.numpy(), want.numpy(), rtol=1e-5, atol=1e-6), (op, async_op)
try:
    g.reduce_scatter(whole[((r + 1) % n) * 5:((r + 1) % n + 1) * 5], whole, ReduceOp.SUM)
    assert n == 1, "another rank's block was taken for this rank's"
except ValueError as e:
    assert "must be this rank's block" in str(e)

# async Works completing out of order
ts = [it.full((1000,), float(r + i)) for i in range(4)]
works = [g.all_reduce(t, ReduceOp.SUM, async_op=True) for t in ts]
for i in reversed(range(4)):
    works[i].wait()
    assert works[i].is_completed()
    assert np.all(ts[i].numpy() == sum(k + i for k in range(n)))

# a send/recv ring with non-blocking calls
send = it.full((3,), float(r))
recv = it.empty(3)
w_recv = g.irecv(recv, (r - 1) % n)
w_send = g.isend(send, (r + 1) % n)
w_send.wait()
w_recv.wait()
assert np.all(recv.numpy() == (r - 1) % n)
g.barrier()
print(f"rank {r} OK", flush=True)
