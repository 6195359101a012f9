"""A mixed-precision training loop as nanoGPT and PyTorch's AMP recipe write it: the forward
pass under torch.autocast(device_type=..., dtype=...), the loss scaled by a torch.amp.GradScaler,
gradients unscaled before clipping, scaler.step and scaler.update. In float32 the context is
disabled and the scaler's power-of-two scale changes no value, so the losses are exact; in
bfloat16 the matrix products round to bfloat16."""
import math
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self, n_in, n_hidden, n_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, n_hidden), nn.GELU(), nn.LayerNorm(n_hidden),
                                 nn.Linear(n_hidden, n_classes))

    def forward(self, x):
        return self.net(x)


def init_from_numpy(model, seed):
    """The same starting weights under any library: numpy draws them, not the library's generator."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            bound = 1 / math.sqrt(p[0].numel()) if p.dim() > 1 else 0.1
            base = 1.0 if p.dim() == 1 and name.endswith("weight") else 0.0
            p.copy_(torch.from_numpy((base + rng.uniform(-bound, bound, p.shape)).astype(np.float32)))


def main(steps=5, dtype="float32"):
    torch.manual_seed(0)
    device_type = "cpu"
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if dtype == "float32" else torch.autocast(device_type=device_type, dtype=ptdtype)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((steps, 32, 24)), dtype=torch.float32)
    y = torch.tensor(rng.integers(0, 5, (steps, 32)))

    model = Classifier(24, 48, 5)
    init_from_numpy(model, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    scaler = torch.amp.GradScaler(device_type, init_scale=2.0 ** 10)
    losses = []
    for step in range(steps):
        with ctx:
            logits = model(x[step])
            loss = F.cross_entropy(logits.float(), y[step])
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert scaler.get_scale() == 2.0 ** 10  # no step overflowed
    return losses


if __name__ == "__main__":
    print(main())
