"""autograd.defer_weight_grads under tensor parallelism: a vocabulary-parallel embedding, a
sequence-parallel LayerNorm, a column-parallel linear layer (with backward's collectives beside
its products, and without) and a row-parallel one, with and without sequence parallelism.
The input gradient after B and every weight gradient after W must be the bits of a plain
backward, and no weight gradient may appear before W; in float32 and under bf16 autocast (the
weights reach the products through casts). Run under mpiexec -n TP."""
import numpy as np
from mpi4py import MPI

import infinitrain as it
from infinitrain.amp import autocast
from infinitrain.autograd import defer_weight_grads
from infinitrain.nn import LayerNorm, Module
from infinitrain.nn import functional as F
from infinitrain.nn import parallel
from infinitrain.nn.parallel import tensor_parallel as tpm

env = parallel.init(tensor_parallel=MPI.COMM_WORLD.Get_size())
B, T, C, V = 2, 8, 16, 32


class Net(Module):
    def __init__(self, tp):
        super().__init__()
        self.wte = tpm.VocabParallelEmbedding(V, C, tp)
        self.ln = LayerNorm(C)
        self.fc = tpm.ColumnParallelLinear(C, 4 * C, tp)
        self.proj = tpm.RowParallelLinear(4 * C, C, tp)
        tpm.mark_sequence_parallel(self.ln, tp)  # its gradients summed over TP after backward under SP

    def forward(self, idx, x):
        h = self.wte(idx) + x  # under SP the embedding arrives reduce-scattered along the sequence
        return h + self.proj(F.gelu(self.fc(self.ln(h))))


def loss(net, idx, x, dtype):
    with autocast("cpu", dtype=dtype, enabled=dtype != "float32"):
        return (net(idx, x).float() ** 2).sum()


for sp, async_comm, dtype in [(sp, a, d) for sp in (False, True) for a in (True, False)
                              for d in ("float32", "bfloat16")]:
    tp = tpm.TensorParallel(env.tp_group, sequence_parallel=sp, async_comm=async_comm)
    it.manual_seed(3)
    net = Net(tp)
    rng = np.random.default_rng(1)
    idx = it.from_numpy(rng.integers(0, V, (B, T)))
    whole = rng.standard_normal((B, T, C)).astype(np.float32)
    t = T // tp.size if sp else T  # under SP each rank holds its block of the sequence
    x = it.from_numpy(whole[:, tp.rank * t:(tp.rank + 1) * t].copy() if sp else whole).requires_grad_()
    results = []
    for defer in (False, True):
        net.zero_grad()
        x.grad = None
        if defer:
            with defer_weight_grads() as w:
                loss(net, idx, x, dtype).backward()
            assert all(p.grad is None for p in net.parameters()), "a weight gradient before W"
            gx = x.grad.numpy().copy()
            w.backward_weight()
        else:
            loss(net, idx, x, dtype).backward()
            gx = x.grad.numpy().copy()
        results.append([gx] + [p.grad.numpy().copy() for p in net.parameters()])
    for i, (a, b) in enumerate(zip(*results)):
        assert np.array_equal(a, b), f"sp={sp} async={async_comm} {dtype}: gradient {i} differs"
print(f"rank {env.rank} OK", flush=True)
