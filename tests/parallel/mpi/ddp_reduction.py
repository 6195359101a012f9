"""Run under mpiexec: how DDP reduces.
1. The reduce dtype (mixed_precision=_MixedPrecision(reduce_dtype=)). bf16 gradients averaged in
   float32 are the ranks' fp32 sum rounded once; fp32 gradients averaged in bf16 are each rank's
   gradient rounded to bf16, their mean rounded again (and so differ from the fp32 mean, by at
   most bf16's rounding); without a reduce dtype, the fp32 mean. Each against the ranks' own
   gradients (computed without DDP and gathered), bit for bit.
2. The buckets in the order backward produces the gradients: a layer registered first but used
   first (its gradient arrives last) shares the first blocks' bucket until the first backward
   has run, then has one of the last; the gradients stay those of one process.
3. A tied embedding's gradient in two parts: the head's share leaves in its bucket before the
   lookup's share has arrived, the lookup's rows are added after; the gradients those of one
   process, also after accumulation under no_sync."""
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


class UsedFirst(nn.Module):
    """GPT-2's order: `pos` is registered before the blocks and `tok` first, but backward reaches
    `tok` before `pos` (GPT-2's wte, then wpe), so reverse registration order packs pos beside the
    blocks and their bucket waits for the very last gradient."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Linear(16, 16)
        self.pos = nn.Linear(16, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        x = self.tok(self.pos(x))
        for layer in self.layers:
            x = layer(x).relu()
        return x


it.manual_seed(1)
linear = 1088 / 2**20  # a 16 x 16 Linear's weight and bias: the first and last buckets; five in the others
ddp = parallel.DistributedDataParallel(UsedFirst(), bucket_cap_mb=5 * linear, first_bucket_mb=linear)
ref = UsedFirst()
ref.load_state_dict(ddp.module.state_dict())
model, reducer = ddp.module, ddp.reducer


def where(p):
    """(bucket, index in it) of a parameter (in the buffer of the moment: repacking replaces it)."""
    return reducer.buffer.locate(p)


# reverse registration order: [layers 3], [layers 2, 1, 0, pos], [tok]
assert [where(p)[0] for p in model.pos.parameters()] == [1, 1] and where(model.tok.weight)[0] == 2
ready_at_launch = []
reducer.on_reduced = lambda params, work: ready_at_launch.append(id(model.pos.weight) in reducer.ready)
x16 = it.tensor(x_all[r * 4:(r + 1) * 4])
for step in range(3):
    for net in (model, ref):
        net.zero_grad(set_to_none=step != 1)  # step 1: the old gradients carried into the new buckets
    ready_at_launch.clear()
    (ddp(x16) ** 2).mean().backward()
    (ref(it.tensor(x_all)) ** 2).mean().backward()  # one process, the whole batch
    for (k, p), q in zip(model.named_parameters(), ref.parameters()):
        assert np.allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-7), (step, k)
    # before the repack the blocks' bucket leaves only once pos's gradient is in; after it, before
    assert ready_at_launch[1] == (step == 0), (step, ready_at_launch)
    if step >= 1:  # backward's order: [layers 3], [layers 2, 1, 0, tok], [pos]
        assert [where(p)[0] for p in model.pos.parameters()] == [2, 2] and where(model.tok.weight)[0] == 1, step
        assert all(p.grad._storage is reducer.buckets[where(p)[0]].flat_grad._storage for p in model.parameters())


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(64, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 64, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx):
        return self.head(self.mid(self.wte(idx)).relu())


it.manual_seed(2)
ddp = parallel.DistributedDataParallel(Tied(), bucket_cap_mb=0.001, first_bucket_mb=0.001)
ref = Tied()
ref.load_state_dict(ddp.module.state_dict())
model, reducer = ddp.module, ddp.reducer
wte = model.wte.weight
launched_early = []  # at wte's launch, had backward not yet reached mid (let alone the lookup)?
reducer.on_reduced = lambda params, work: launched_early.extend(
    id(model.mid.weight) not in reducer.ready for p in params if p is wte)
tokens = np.random.default_rng(1).integers(0, 40, (n * 2, 3, 5))  # rows 40..63 never looked up
for step, micro in enumerate((1, 2, 1)):  # step 1: two micro-batches, the first under no_sync
    for net in (model, ref):
        net.zero_grad(set_to_none=True)
    launched_early.clear()
    for i in range(micro):
        mine = it.tensor(tokens[r * 2 + i % 2])
        if i < micro - 1:
            with ddp.no_sync():
                (ddp(mine) ** 2).mean().backward()
        else:
            (ddp(mine) ** 2).mean().backward()
        for k in range(n):  # the same micro-batches in one process, each rank's loss a 1/n of the mean
            ((ref(it.tensor(tokens[k * 2 + i % 2])) ** 2).mean() / n).backward()
    for (k, p), q in zip(model.named_parameters(), ref.parameters()):
        assert np.allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-7), (step, k, np.abs(
            p.grad.numpy() - q.grad.numpy()).max())
    # wte's bucket first once repacked: the head's share leaves as soon as it is computed
    assert launched_early == [step > 0], (step, launched_early)
assert model.wte(it.tensor(tokens[0])).requires_grad  # outside DDP's forward: the weight itself
print(f"rank {r} OK", flush=True)
