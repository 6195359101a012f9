"""Run under mpiexec -n CP: context-parallel attention (ring, all-gather, all-to-all and, at CP 4,
the hybrid all-to-all + ring; head-tail and contiguous splits) against full causal attention on
the whole sequence, computed by every rank alone: this rank's outputs and dQ/dK/dV within 1e-5
(float32), or 1e-2 (bfloat16 products under autocast, against float32). Grouped-query heads
(under all-to-all at CP 4 each of the 2 KV heads goes to two ranks), a sequence length that is
not a power of two. Prints `rank N OK`."""

import numpy as np

import infinitrain as it
from infinitrain import amp
from infinitrain.nn import parallel
from infinitrain.nn.parallel.context_parallel import ContextParallel
from infinitrain.ops import layers

env = parallel.init()
P = env.world_size
rng = np.random.default_rng(7)
B, H, Hkv, D = 2, 4, 2, 8
T = 2 * P * 3  # three tokens per chunk
q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, D)])
g = rng.standard_normal((B, H, T, D)).astype(np.float32)


def run(attention, tensors, grad):
    leaves = [it.from_numpy(a.copy()).requires_grad_() for a in tensors]
    out = attention(*leaves)
    (out.float() * it.from_numpy(grad)).sum().backward()
    return [out.detach().float().numpy()] + [x.grad.numpy() for x in leaves]


whole = run(layers.attention, (q, k, v), g)
worst = 0.0
# a2a+p2p at CP 4: two all-to-all groups of 2, a ring of 2 across them
for comm in ("p2p", "all_gather", "a2a") + (("a2a+p2p",) if P == 4 else ()):
    for balanced in (True, False):
        for autocast in (False, True):
            cp = ContextParallel(env.world, comm, balanced, a2a_size=2 if comm == "a2a+p2p" else None)
            mine = lambda a: cp.shard(it.from_numpy(a), dim=2).numpy()  # noqa: E731
            context = amp.autocast("cpu", dtype=it.bfloat16) if autocast else amp.autocast("cpu", enabled=False)
            with context:
                got = run(cp.attention, (mine(q), mine(k), mine(v)), mine(g))
            for name, a, b in zip(("out", "dq", "dk", "dv"), got, whole):
                err = float(np.abs(a - mine(b)).max() / max(1.0, np.abs(b).max()))
                tol = 1e-2 if autocast else 1e-5
                assert err < tol, (comm, balanced, autocast, name, err)
                if not autocast:
                    worst = max(worst, err)
print(f"rank {env.rank} worst {worst:.2e}", flush=True)
print(f"rank {env.rank} OK", flush=True)
