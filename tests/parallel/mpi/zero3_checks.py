"""ZeRO-3's mechanics on 2 ranks: a parameter outside its module's run raises a clear error
(no garbage, no crash); gathered_parameters() gives the whole tensor and, with write=True,
makes what was written the shards; a unit's parameters are whole during its forward and freed
after it. With --diverge, rank 1 runs its blocks in another order: every rank gets an error
naming the buckets, not a hang.

    mpiexec -n 2 python zero3_checks.py [--diverge]
"""
import sys

import numpy as np

import infinitrain as it
from infinitrain.models import GPT2Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.nn import parallel
from infinitrain.nn.parallel.zero import ZeroOptimizer
from infinitrain.optim import AdamW

env = parallel.init()
cfg = GPT2Config(block_size=32, vocab_size=200, n_layer=3, n_head=2, n_embd=16)
model = GPT2(cfg, seed=1)
reference = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
opt = ZeroOptimizer(list(model.parameters()), AdamW, env.dp_group, stage=3, module=model, lr=1e-2)
x = it.from_numpy(np.random.default_rng(env.rank).integers(0, 200, (2, 8)))

if "--diverge" in sys.argv:
    if env.rank == 1:  # this rank's blocks run last to first
        blocks = model.transformer.h  # (the model runs block i as h[i]: swap what each index names)
        names = list(blocks._modules)
        blocks._modules.update(zip(names, reversed([blocks._modules[n] for n in names])))
    model(x, x)
    raise SystemExit("no error although the ranks ran different modules")

w = model.transformer.h[0].mlp.c_fc.weight
try:
    w.sum()
    raise SystemExit("a released parameter was read without an error")
except RuntimeError as e:
    assert "sharded by ZeRO-3" in str(e) and "gathered_parameters" in str(e), e

seen = {}


def look(module, args, out):  # the unit's weight is whole while the unit runs
    seen["sum"] = float(module.weight.detach().sum())


handle = model.transformer.h[0].mlp.c_fc.register_forward_hook(look)
_, loss = model(x, x)
handle.remove()
assert np.isclose(seen["sum"], reference["transformer.h.0.mlp.c_fc.weight"].sum(), rtol=1e-5), seen
assert all(b.flat_param._storage.is_released for b in opt.buckets), "forward left parameters gathered"
loss.backward()
assert all(b.flat_param._storage.is_released for b in opt.buckets), "backward left parameters gathered"

with opt.gathered_parameters():
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), reference[k], err_msg=k)
with opt.gathered_parameters(write=True):
    w.detach().fill_(0.5)
with opt.gathered_parameters():
    assert float(w.detach().min()) == float(w.detach().max()) == 0.5
print(f"rank {env.rank} OK", flush=True)
