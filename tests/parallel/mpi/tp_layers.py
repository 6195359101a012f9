"""Each tensor-parallel layer against its unsharded twin built from the same full weights:
outputs, input gradients and weight gradients (the sharded gradient equals the matching block
of the full one). Run under mpiexec -n TP; every rank checks its own part."""
import numpy as np

import infinitrain as it
from infinitrain.nn import Embedding, Linear
from infinitrain.nn import parallel
from infinitrain.nn.parallel import tensor_parallel as tpm
from infinitrain.nn.parallel.finalize import reduce_partial_grads
from infinitrain.ops import layers as ops_layers

env = parallel.init(tensor_parallel=int(__import__("mpi4py.MPI").MPI.COMM_WORLD.Get_size()))
tp = tpm.TensorParallel(env.tp_group)
tp_sp = tpm.TensorParallel(env.tp_group, sequence_parallel=True)
R, N = tp.rank, tp.size
rng = np.random.default_rng(7)  # the same on every rank


def close(a, b, what, rtol=1e-5, atol=1e-6):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, f"{what}: shapes {a.shape} vs {b.shape}"
    err = np.abs(a - b).max() if a.size else 0.0
    assert np.allclose(a, b, rtol=rtol, atol=atol), f"{what}: max abs error {err}"


def load(layer_param, full):
    with it.no_grad():
        layer_param.copy_(layer_param.tp_shard.take(it.from_numpy(full)))


def seq_slice(a):
    t = a.shape[1] // N
    return a[:, R * t:(R + 1) * t]


B, T, C, OUT = 2, 8, 12, 3 * 8
x_np = rng.standard_normal((B, T, C)).astype(np.float32)
gy_big = rng.standard_normal((B, T, OUT)).astype(np.float32)

# -- ColumnParallelLinear over a fused q|k|v output (blocks), with and without gather / SP
ref = Linear(C, OUT)
w_full, b_full = ref.weight.detach().numpy().copy(), ref.bias.detach().numpy().copy()
xr = it.from_numpy(x_np).requires_grad_()
yr = ref(xr)
(yr * it.from_numpy(gy_big)).sum().backward()
for sp in (False, True):
    for gather in (False, True) if not sp else (False,):
        # a fused q|k|v output is split block by block (each rank holds whole heads of each)
        blocks = None if gather else (8, 8, 8)
        layer = tpm.ColumnParallelLinear(C, OUT, tp_sp if sp else tp, gather_output=gather, blocks=blocks)
        load(layer.weight, w_full)
        load(layer.bias, b_full)
        xin = it.from_numpy(seq_slice(x_np).copy() if sp else x_np).requires_grad_()
        y = layer(xin)
        mine = layer.weight.tp_shard.take(it.from_numpy(gy_big.transpose(2, 0, 1).copy()))
        gy_local = gy_big if gather else mine.detach().numpy().transpose(1, 2, 0)
        (y * it.from_numpy(np.ascontiguousarray(gy_local))).sum().backward()
        expect = yr.detach().numpy()
        if not gather:
            expect = layer.weight.tp_shard.take(it.from_numpy(expect.transpose(2, 0, 1).copy())).detach().numpy().transpose(1, 2, 0)
        close(y.detach().numpy(), expect, f"column y sp={sp} gather={gather}")
        gx = xr.grad.detach().numpy()
        close(xin.grad.detach().numpy(), seq_slice(gx) if sp else gx, f"column dx sp={sp} gather={gather}")
        close(layer.weight.grad.detach().numpy(), layer.weight.tp_shard.take(ref.weight.grad).detach().numpy(), "column dW")
        close(layer.bias.grad.detach().numpy(), layer.bias.tp_shard.take(ref.bias.grad).detach().numpy(), "column db")

# -- RowParallelLinear: input split along features (or scattered by the layer)
IN = 4 * N
xrow = rng.standard_normal((B, T, IN)).astype(np.float32)
gyr = rng.standard_normal((B, T, C)).astype(np.float32)
ref = Linear(IN, C)
xr = it.from_numpy(xrow).requires_grad_()
yr = ref(xr)
(yr * it.from_numpy(gyr)).sum().backward()
for sp in (False, True):
    for parallel_in in (True, False) if not sp else (True,):
        layer = tpm.RowParallelLinear(IN, C, tp_sp if sp else tp, input_is_parallel=parallel_in)
        load(layer.weight, ref.weight.detach().numpy())
        with it.no_grad():
            layer.bias.copy_(ref.bias)
        k = IN // N
        xin = it.from_numpy(xrow[..., R * k:(R + 1) * k].copy() if parallel_in else xrow).requires_grad_()
        y = layer(xin)
        (y * it.from_numpy(seq_slice(gyr).copy() if sp else gyr)).sum().backward()
        expect = yr.detach().numpy()
        close(y.detach().numpy(), seq_slice(expect) if sp else expect, f"row y sp={sp}")
        gx = xr.grad.detach().numpy()
        close(xin.grad.detach().numpy(), gx[..., R * k:(R + 1) * k] if parallel_in else gx, f"row dx sp={sp}")
        close(layer.weight.grad.detach().numpy(), layer.weight.tp_shard.take(ref.weight.grad).detach().numpy(), "row dW")
        db = layer.bias.grad.detach().numpy()
        if sp:  # each rank saw its part of the sequence: the sum over ranks is the full gradient
            assert layer.bias.partial_grad_group is env.tp_group
            reduce_partial_grads(layer.parameters())
            db = layer.bias.grad.detach().numpy()
        close(db, ref.bias.grad.detach().numpy(), f"row db sp={sp}")

# -- VocabParallelEmbedding, a vocabulary that TP does not divide (padded)
V = 4 * N + 1
ids = rng.integers(0, V, (B, T))
ref = Embedding(V, C)
yr = ref(it.from_numpy(ids))
gE = rng.standard_normal((B, T, C)).astype(np.float32)
(yr * it.from_numpy(gE)).sum().backward()
for sp in (False, True):
    layer = tpm.VocabParallelEmbedding(V, C, tp_sp if sp else tp)
    load(layer.weight, ref.weight.detach().numpy())
    y = layer(it.from_numpy(ids))
    (y * it.from_numpy(seq_slice(gE).copy() if sp else gE)).sum().backward()
    close(y.detach().numpy(), seq_slice(yr.detach().numpy()) if sp else yr.detach().numpy(), f"embedding y sp={sp}")
    close(layer.weight.grad.detach().numpy(), layer.weight.tp_shard.take(ref.weight.grad).detach().numpy(), f"embedding dW sp={sp}")
    assert np.array_equal(layer.weight.tp_shard.gather(layer.weight).detach().numpy(), ref.weight.detach().numpy())

# -- vocab-parallel cross-entropy against the fused one, padded columns included
Vreal, Vpad = 10 * N - 3, 10 * N
rows = 6
logits_np = (3 * rng.standard_normal((rows, Vpad))).astype(np.float32)
logits_np[:, Vreal:] = 1e4  # padding must never enter the softmax
targets = rng.integers(0, Vreal, rows)
targets[2] = -100
lr = it.from_numpy(logits_np).requires_grad_()
loss_ref = ops_layers.cross_entropy(lr, it.from_numpy(targets), Vreal)
loss_ref.backward()
vl = Vpad // N
ll = it.from_numpy(logits_np[:, R * vl:(R + 1) * vl].copy()).requires_grad_()
loss = tpm.vocab_parallel_cross_entropy(ll, it.from_numpy(targets), Vreal, tp)
(loss * 2.0).backward()

close(loss.item(), loss_ref.item(), "vocab-parallel CE loss", rtol=1e-6)
close(ll.grad.detach().numpy(), 2 * lr.grad.detach().numpy()[:, R * vl:(R + 1) * vl], "vocab-parallel CE grad", rtol=1e-5, atol=1e-7)

# -- the collectives along the last dim round-trip
z = it.from_numpy(rng.standard_normal((B, T, 2 * N)).astype(np.float32)).requires_grad_()
back = tpm.gather_from_tp(tpm.scatter_to_tp(z, env.tp_group), env.tp_group)
close(back.detach().numpy(), z.detach().numpy(), "scatter/gather round trip")
print(f"rank {env.rank} OK", flush=True)
