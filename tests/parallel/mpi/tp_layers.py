"""Each tensor-parallel layer against its unsharded twin built from the same full weights:
outputs, input gradients and weight gradients (the sharded gradient equals the matching block
of the full one). Run under mpiexec -n TP; every rank checks its own part."""
import copy

import numpy as np
from mpi4py import MPI

import infinitrain as it
from infinitrain.nn import Embedding, Linear
from infinitrain.nn import functional as F
from infinitrain.nn import parallel
from infinitrain.nn.parallel import tensor_parallel as tpm
from infinitrain.nn.parallel.finalize import reduce_partial_grads
from infinitrain.ops import layers as ops_layers

env = parallel.init(tensor_parallel=MPI.COMM_WORLD.Get_size())
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
            expect = layer.weight.tp_shard.take(it.from_numpy(expect.transpose(2, 0, 1).copy())).detach().numpy() \
                .transpose(1, 2, 0)
        close(y.detach().numpy(), expect, f"column y sp={sp} gather={gather}")
        gx = xr.grad.detach().numpy()
        close(xin.grad.detach().numpy(), seq_slice(gx) if sp else gx, f"column dx sp={sp} gather={gather}")
        close(layer.weight.grad.detach().numpy(), layer.weight.tp_shard.take(ref.weight.grad).detach().numpy(),
              "column dW")
        close(layer.bias.grad.detach().numpy(), layer.bias.tp_shard.take(ref.bias.grad).detach().numpy(), "column db")

# -- ... whose backward overlaps its collectives with its products (async_comm, the default)
# gives the same bits as the plain composition gather_from_sp / copy_to_tp + F.linear, in
# float32 and under bf16 autocast, and issues backward's collectives asynchronously
from infinitrain import profiler  # noqa: E402

for sp in (False, True):
    for low in (None, it.bfloat16):
        got = []
        for overlap in (True, False):
            layer = tpm.ColumnParallelLinear(C, OUT, tpm.TensorParallel(env.tp_group, sp, async_comm=overlap),
                                             blocks=(8, 8, 8))
            load(layer.weight, w_full)
            load(layer.bias, b_full)
            xin = it.from_numpy(seq_slice(x_np).copy() if sp else x_np).requires_grad_()
            with it.autocast("cpu", dtype=low, enabled=low is not None):
                y = layer(xin)
            with profiler.profile() as prof:
                (y.float() * it.from_numpy(gy_big[..., :OUT // N].copy())).sum().backward()
            issued = {(e[0], e[5]["async"]) for e in prof.events if e[1] == "comm" and e[5] and "async" in e[5]}
            if overlap:  # under SP x is gathered again, beside grad_x's product
                expected = {("all_gather", True), ("reduce_scatter", True)} if sp else {("all_reduce", True)}
            else:  # the plain composition keeps the gathered x
                expected = {("reduce_scatter", False)} if sp else {("all_reduce", False)}
            assert issued == expected, (sp, overlap, issued)
            got.append([t.detach().float().numpy() for t in (y, xin.grad, layer.weight.grad, layer.bias.grad)])
        for name, a, b in zip(("y", "dx", "dW", "db"), *got):
            assert np.array_equal(a, b), f"column {name} sp={sp} autocast={low}: async_comm changed the bits"

# -- an asynchronous collective keeps the tensors it reads alive until it is done: the
# reduce-scatter's send buffer is a temporary the caller drops at once, and a new tensor of its
# size (which the allocator would hand the same memory) must not change the sum
from infinitrain.nn.parallel.tensor_parallel.mappings import _reduce_scatter_dim  # noqa: E402

for trial in range(5):
    xs = np.random.default_rng(trial).standard_normal((4, 64 * N, 512)).astype(np.float32)
    work, block = _reduce_scatter_dim(it.from_numpy(xs), env.tp_group, 1, async_op=True)
    junk = it.full((N, 4, 64, 512), 7.0)
    work.wait()
    del junk
    assert np.allclose(block.numpy(), N * xs[:, R * 64:(R + 1) * 64], rtol=1e-6, atol=1e-6), \
        "a reduce-scatter read freed memory"

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
        close(layer.weight.grad.detach().numpy(), layer.weight.tp_shard.take(ref.weight.grad).detach().numpy(),
              "row dW")
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
    close(layer.weight.grad.detach().numpy(), layer.weight.tp_shard.take(ref.weight.grad).detach().numpy(),
          f"embedding dW sp={sp}")
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
close(ll.grad.detach().numpy(), 2 * lr.grad.detach().numpy()[:, R * vl:(R + 1) * vl], "vocab-parallel CE grad",
      rtol=1e-5, atol=1e-7)

# -- ... with label smoothing (PyTorch's, as F.cross_entropy's)
lr = it.from_numpy(logits_np[:, :Vreal].copy()).requires_grad_()
loss_ref = F.cross_entropy(lr, it.from_numpy(targets), label_smoothing=0.1)
loss_ref.backward()
ll = it.from_numpy(logits_np[:, R * vl:(R + 1) * vl].copy()).requires_grad_()
loss = tpm.vocab_parallel_cross_entropy(ll, it.from_numpy(targets), Vreal, tp, label_smoothing=0.1)
loss.backward()
close(loss.item(), loss_ref.item(), "vocab-parallel CE loss, smoothed", rtol=1e-6)
full_grad = np.zeros((rows, Vpad), np.float32)
full_grad[:, :Vreal] = lr.grad.detach().numpy()
close(ll.grad.detach().numpy(), full_grad[:, R * vl:(R + 1) * vl], "vocab-parallel CE grad, smoothed",
      rtol=1e-5, atol=1e-7)


def sharded_grads_match(whole, part, what):
    """Every parameter of the parallel module has the matching part of the whole one's gradient."""
    grads = dict(whole.named_parameters())
    for name, p in part.named_parameters():
        g = grads[name].grad
        shard = getattr(p, "tp_shard", None)
        expect = (shard.take(g) if shard is not None else g).detach().numpy()
        # sums in another order: round-off relative to the gradient's scale
        close(p.grad.detach().numpy(), expect, f"{what}: d{name}", rtol=1e-4, atol=1e-5 * np.abs(expect).max())


# -- nn.MultiheadAttention with its heads split: self-attention (bias_kv, padding and per-head
# masks) and cross-attention (kdim/vdim), the weights averaged or per head
E, HEADS, L, S = 16, 4, 5, 7
q_np = rng.standard_normal((B, L, E)).astype(np.float32)
src_np = rng.standard_normal((B, S, E)).astype(np.float32)
gq_np = rng.standard_normal((B, L, E)).astype(np.float32)  # not y * y: LayerNorm makes its sum constant
m_np = rng.standard_normal((B, S, 12)).astype(np.float32)
pad_np = np.zeros((B, S), bool)
pad_np[1, -2:] = True
head_mask = rng.random((B * HEADS, L, L)) < 0.3
for i in range(L):
    head_mask[:, i, i] = False
for kw, cross in ((dict(add_bias_kv=True), None), (dict(kdim=12, vdim=12, add_zero_attn=True), "shared"),
                  (dict(kdim=12, vdim=12), "distinct")):
    it.manual_seed(5)
    whole = it.nn.MultiheadAttention(E, HEADS, batch_first=True, **kw)
    part = tpm.ParallelMultiheadAttention.from_module(whole, tp)
    # the same with backward's all-reduces after the products: the same bits
    plain = tpm.ParallelMultiheadAttention.from_module(whole, tpm.TensorParallel(env.tp_group, async_comm=False))
    outs = []
    for mha in (whole, part, plain):
        xq = it.from_numpy(q_np).requires_grad_()
        if cross:
            mem = it.from_numpy(m_np).requires_grad_()
            val = mem if cross == "shared" else it.from_numpy(m_np[:, ::-1].copy())
            y, w = mha(xq, mem, val, key_padding_mask=it.from_numpy(pad_np), average_attn_weights=False)
        else:
            mem = None
            y, w = mha(xq, xq, xq, attn_mask=it.from_numpy(head_mask))
        (y * y).sum().backward()
        outs.append((y, w, xq.grad, mem.grad if cross else None))
    what = f"{cross or 'self'} attention"
    for a, b, c, name in zip(*outs, ("y", "weights", "dq", "dmemory")):
        if a is not None:
            close(b.detach().numpy(), a.detach().numpy(), f"{what} {name}", rtol=1e-4, atol=1e-6)
            assert np.array_equal(b.detach().numpy(), c.detach().numpy()), f"{what} {name}: async_comm changed the bits"
    sharded_grads_match(whole, part, what)
    for (name, p), q in zip(part.named_parameters(), plain.parameters()):
        assert np.array_equal(p.grad.numpy(), q.grad.numpy()), f"{what} d{name}: async_comm changed the bits"

# -- a whole encoder-decoder nn.Transformer made tensor-parallel (post- and pre-LayerNorm)
for norm_first in (False, True):
    it.manual_seed(9)
    whole = it.nn.Transformer(E, HEADS, 1, 1, 8 * N, dropout=0.0, batch_first=True, norm_first=norm_first)
    part = tpm.parallelize_transformer(copy.deepcopy(whole), tp)
    causal = it.ones(L, L, dtype=it.bool).triu(1)
    outs = []
    for net in (whole, part):
        src = it.from_numpy(src_np).requires_grad_()
        tgt = it.from_numpy(q_np).requires_grad_()
        y = net(src, tgt, tgt_mask=causal, src_key_padding_mask=it.from_numpy(pad_np),
                memory_key_padding_mask=it.from_numpy(pad_np))
        (y * it.from_numpy(gq_np)).sum().backward()
        outs.append((y, src.grad, tgt.grad))
    for a, b, name in zip(outs[0], outs[1], ("y", "dsrc", "dtgt")):
        close(b.detach().numpy(), a.detach().numpy(), f"Transformer norm_first={norm_first} {name}",
              rtol=1e-4, atol=1e-6)
    sharded_grads_match(whole, part, f"Transformer norm_first={norm_first}")
    assert isinstance(part.decoder.layers[0].multihead_attn, tpm.ParallelMultiheadAttention)

# -- dropout under TP: split activations draw each rank's own mask, replicated ones the same
# mask everywhere, so a parallelized model's whole activations stay equal on every rank
def on_every_rank(a):
    """[a of rank 0, a of rank 1, ...] (the TP group is the whole job here)."""
    return np.stack(MPI.COMM_WORLD.allgather(a))


it.manual_seed(11)
ones = it.ones(64, 64)
split = on_every_rank(F.dropout(ones, 0.5, generator=tp.generator).numpy())
whole = on_every_rank(F.dropout(ones, 0.5).numpy())
assert all(not np.array_equal(split[0], split[r]) for r in range(1, N)), "every TP rank drew the same split mask"
assert all(np.array_equal(whole[0], whole[r]) for r in range(1, N)), "replicated dropout differs across ranks"
it.manual_seed(9)
net = tpm.parallelize_transformer(it.nn.Transformer(E, HEADS, 1, 1, 8 * N, dropout=0.3, batch_first=True), tp)
ys = on_every_rank(net(it.from_numpy(src_np), it.from_numpy(q_np)).detach().numpy())
assert all(np.array_equal(ys[0], y) for y in ys), "the output differs across TP ranks"

# -- the collectives along the last dim round-trip
z = it.from_numpy(rng.standard_normal((B, T, 2 * N)).astype(np.float32)).requires_grad_()
back = tpm.gather_from_tp(tpm.scatter_to_tp(z, env.tp_group), env.tp_group)
close(back.detach().numpy(), z.detach().numpy(), "scatter/gather round trip")
print(f"rank {env.rank} OK", flush=True)
