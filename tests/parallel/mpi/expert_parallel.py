"""Run under mpiexec (2 or 4 ranks; argv[1]: EP, default the world): all_to_all_single against
its definition (uneven and empty splits, several dtypes, async), the EP groups, and
ExpertParallel's dispatch/combine values and gradients against one process, with a router that
sends every token to one expert too (the other ranks receive nothing and must not hang)."""
import sys

import ml_dtypes
import numpy as np

import infinitrain as it
from infinitrain.nn import parallel
from infinitrain.nn.parallel import ReduceOp
from infinitrain.nn.parallel.expert_parallel import ExpertParallel
from infinitrain.ops import moe

from mpi4py import MPI

world = MPI.COMM_WORLD.Get_size()
env = parallel.init(expert_parallel=int(sys.argv[1]) if len(sys.argv) > 1 else world)
g, r, n = env.world, env.rank, env.world_size

# ---- all_to_all_single: rank r sends rows(r, k) rows to rank k, some of them none ---------------
def rows(src, dst):
    return (src + 2 * dst) % 3  # 0, 1 or 2: uneven, with empty blocks


def block(src, dst, dtype):
    a = np.arange(rows(src, dst) * 3, dtype=np.float32).reshape(-1, 3) + 100 * src + 10 * dst
    return a.astype(dtype) if dtype != "bfloat16" else a.astype(ml_dtypes.bfloat16)


for dtype in ("float32", "bfloat16", "int64", "float64"):
    for async_op in (False, True):
        send = np.concatenate([block(r, k, dtype) for k in range(n)])
        want = np.concatenate([block(k, r, dtype) for k in range(n)])
        x = it.tensor(send.astype(np.float32), dtype=dtype) if dtype == "bfloat16" else it.from_numpy(send)
        out = it.empty(want.shape[0], 3, dtype=dtype)
        work = g.all_to_all_single(out, x, [rows(k, r) for k in range(n)], [rows(r, k) for k in range(n)],
                                   async_op=async_op)
        if async_op:
            work.wait()
        assert np.array_equal(np.asarray(out.numpy(), np.float64), want.astype(np.float64)), (dtype, async_op)
# equal splits (None) and a 1-D tensor, as torch.distributed's
x = it.tensor([float(r * n + k) for k in range(n)])
out = it.empty(n)
it.distributed.all_to_all_single(out, x)
assert out.numpy().tolist() == [float(k * n + r) for k in range(n)]
for bad in ([1] * (n + 1), [-1] + [1] * (n - 1)):
    try:
        g.all_to_all_single(out, x, None, bad)
        raise AssertionError("bad splits accepted")
    except ValueError as e:
        assert "input_split_sizes" in str(e), e

# ---- the EP groups: neighbours in DP x CP -------------------------------------------------------
L = env.layout
ep_size = L.ep
assert env.ep_group.ranks == L.ep_group(r) and env.expert_dp_group.ranks == L.expert_dp_group(r)
t = it.tensor([float(r)])
env.ep_group.all_reduce(t)
assert t.item() == sum(L.ep_group(r))

# ---- dispatch and combine against one process -------------------------------------------------
ep = ExpertParallel(env.ep_group)
E, C, H, N, K = 2 * ep_size, 4, 3, 6, 2
rng = np.random.default_rng(7)
W = [rng.standard_normal((H, C)).astype(np.float32) for _ in range(E)]
members = env.ep_group.ranks


def case(src, forced):
    """The tokens, routing and upstream gradient of rank src."""
    q = np.random.default_rng(100 + src + (1000 if forced else 0))
    x = q.standard_normal((N, C)).astype(np.float32)
    ids = np.zeros((N, K), np.int64) if forced else np.stack([q.permutation(E)[:K] for _ in range(N)])
    weights = q.random((N, K)).astype(np.float32)
    up = q.standard_normal((N, H)).astype(np.float32)
    return x, ids, weights, up


def run(src, forced, ep):
    x_np, ids_np, w_np, up_np = case(src, forced)
    x = it.tensor(x_np, requires_grad=True)
    weights = [it.tensor(w, requires_grad=True) for w in W]
    order = moe.sort_by_expert(it.from_numpy(ids_np), E)
    xs = moe.permute(x, order.rows)
    if ep is None:
        h = moe.grouped_linear(xs, weights, order.counts)
    else:
        xs, local_counts, handle = ep.dispatch(xs, order.counts)
        assert sum(local_counts) == xs.shape[0]
        h = ep.combine(moe.grouped_linear(xs, [weights[e] for e in ep.local_experts(E)], local_counts), handle)
    w_flat = it.from_numpy(w_np.reshape(-1)[order.slots.numpy()])
    y = moe.unpermute(h, order.rows, w_flat, N)
    (y * it.from_numpy(up_np)).sum().backward()
    grads = [w.grad.numpy() if w.grad is not None else np.zeros_like(W[0]) for w in weights]
    return y.detach().numpy(), x.grad.numpy(), grads


for forced in (False, True):
    y, gx, gw = run(r, forced, ep)
    y1, gx1, _ = run(r, forced, None)
    assert np.allclose(y, y1, rtol=1e-5, atol=1e-5), np.abs(y - y1).max()
    assert np.allclose(gx, gx1, rtol=1e-5, atol=1e-5), np.abs(gx - gx1).max()
    # an expert's gradient sums the tokens of every rank of the EP group
    for e in ep.local_experts(E):
        want = sum(run(src, forced, None)[2][e] for src in members)
        assert np.allclose(gw[e], want, rtol=1e-5, atol=1e-5), (e, np.abs(gw[e] - want).max())
    t = it.tensor([1.0])
    env.world.all_reduce(t, ReduceOp.SUM)  # every rank came through: no hang
print(f"rank {r} OK", flush=True)
