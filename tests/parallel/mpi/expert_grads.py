"""Run under mpiexec (argv: EP [forced]): a toy mixture of experts (a dense projection, a router,
E experts of which this rank holds E/EP, moved with ExpertParallel) trained by TrainStep for a
few AdamW steps with clipping, against the same model on one process over every rank's batch:
the experts' gradients averaged over their own group with the right scale, the rest over DP,
the clipped norm summed over EP. forced: every token routed to expert 0 (the other ranks'
experts receive nothing and must not hang). Prints 'rank R OK'."""
import sys

import numpy as np

import infinitrain as it
from infinitrain import nn
from infinitrain.nn import parallel
from infinitrain.nn.parallel import ParallelPlan
from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
from infinitrain.nn.utils import clip_grad_norm_
from infinitrain.ops import moe
from infinitrain.optim import AdamW

EP, FORCED = int(sys.argv[1]), "forced" in sys.argv[2:]
env = parallel.init(expert_parallel=EP)
plan = ParallelPlan(env)
r, world = env.rank, env.world_size
C, E, K, N, STEPS, CLIP = 4, 2 * EP, 2, 6, 3, 0.05


class ToyMoE(nn.Module):
    def __init__(self, ep=None, like=None):
        super().__init__()
        it.manual_seed(0)
        self.proj, self.gate = nn.Linear(C, C), nn.Linear(C, E, bias=False)
        held = ep.local_experts(E) if ep is not None else range(E)
        every = [nn.Linear(C, C, bias=False) for _ in range(E)]  # the same experts as one process has
        self.experts = nn.ModuleDict({str(e): every[e] for e in held})  # this rank's only
        for m in self.experts.values():  # (as the MoE layer: marked only when split over EP ranks)
            m.weight.expert_parallel = ep is not None
        self.ep, self.held, self.pp = ep, held, None

    def forward(self, x, y, return_logits=False):
        h = self.proj(x)
        weights, ids = it.topk(it.softmax(self.gate(h), -1), K)
        if FORCED:
            ids = it.zeros(*ids.shape, dtype="int64")
        order = moe.sort_by_expert(ids, E)
        xs, counts = moe.permute(h, order.rows), order.counts
        if self.ep is not None:
            xs, counts, handle = self.ep.dispatch(xs, counts)
        ys = moe.grouped_linear(xs, [self.experts[str(e)].weight for e in self.held], counts)
        if self.ep is not None:
            ys = self.ep.combine(ys, handle)
        out = moe.unpermute(ys, order.rows, it.index_select(weights.reshape(-1), 0, order.slots), x.shape[0])
        return None, ((out - y) ** 2).mean()


def batch(rank, step):
    q = np.random.default_rng(1000 * step + rank)
    x, y = q.standard_normal((2, N, C)).astype(np.float32)
    return it.tensor(x), it.tensor(y)


model = ToyMoE(plan.expert_parallel())
trainer = TrainStep(model, plan, decay_groups(model, 0.1), AdamW, lr=1e-2)
one = ToyMoE()
opt = AdamW(decay_groups(one, 0.1), lr=1e-2)
for step in range(STEPS):
    loss, norm = trainer.step([batch(env.coords.dp, step)], grad_clip=CLIP)
    batches = [batch(k, step) for k in range(plan.dp)]
    _, want = one(it.cat([b[0] for b in batches]), it.cat([b[1] for b in batches]))
    want.backward()
    want_norm = clip_grad_norm_(one.parameters(), CLIP)
    opt.step()
    opt.zero_grad()
    assert abs(loss - want.item()) < 1e-5 * max(1, abs(want.item())), (step, loss, want.item())
    assert abs(norm - want_norm) < 1e-5 * max(1, want_norm), (step, norm, want_norm)
mine = dict(model.named_parameters())
for name, p in one.named_parameters():
    if name.startswith("experts.") and name not in mine:
        continue
    assert np.allclose(mine[name].detach().numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-6), \
        (name, np.abs(mine[name].detach().numpy() - p.detach().numpy()).max())
print(f"rank {r} OK", flush=True)
