"""Run under mpiexec -n 8: a 2x2x2 layout's DP/TP/PP sub-groups reduce over their members."""
import infinitrain as it
from infinitrain.nn import parallel

env = parallel.init(tensor_parallel=2, pipeline_parallel=2)
L, r = env.layout, env.rank
assert (L.dp, L.tp, L.pp) == (2, 2, 2)
c = env.coords
assert r == c.tp + c.dp * 2 + c.pp * 4
for kind in ("dp", "tp", "pp"):
    group = getattr(env, f"{kind}_group")
    t = it.tensor([float(r)])
    group.all_reduce(t)
    assert t.item() == sum(group.ranks), (kind, group.ranks, t.item())
    assert r in group.ranks and group.size == 2
assert env.tp_group.ranks == [r - r % 2, r - r % 2 + 1]
print(f"rank {r} OK", flush=True)
