"""Train, save a checkpoint, start again from it: an MLP regressor (MSELoss, AdamW, a
CosineAnnealingLR schedule) wrapped in torch.compile, whose model, optimizer and scheduler
state go through torch.save and torch.load half way; a fresh model, optimizer and scheduler
take them up with load_state_dict and carry on, then an evaluation under torch.inference_mode.
The losses are those of one uninterrupted run when the round trip loses nothing."""
import math
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
from torch.optim.lr_scheduler import CosineAnnealingLR


def make_model():
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 1))


def init_from_numpy(model, seed):
    """The same starting weights under any library: numpy draws them, not the library's generator."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            bound = 1 / math.sqrt(p[0].numel()) if p.dim() > 1 else 0.1
            p.copy_(torch.from_numpy(rng.uniform(-bound, bound, p.shape).astype(np.float32)))


def build(steps, compile):
    model = make_model()
    init_from_numpy(model, 0)
    if compile:
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=1e-2)
    scheduler = CosineAnnealingLR(optimizer, T_max=steps)
    return model, optimizer, scheduler


def train_steps(model, optimizer, scheduler, x, y, first, last, losses):
    loss_fn = nn.MSELoss()
    model.train()
    for step in range(first, last):
        optimizer.zero_grad()
        loss = loss_fn(model(x[step]), y[step])
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())


def main(steps=6, compile=True, resume=True):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.standard_normal((steps + 1, 16, 10)), dtype=torch.float32)
    y = (x[..., :3].sum(-1, keepdim=True) * 0.5).sin()

    model, optimizer, scheduler = build(steps, compile)
    losses = []
    if not resume:  # the same run without the round trip, to hold the resumed one against
        train_steps(model, optimizer, scheduler, x, y, 0, steps, losses)
        return losses + [validate(model, x[steps], y[steps])]
    train_steps(model, optimizer, scheduler, x, y, 0, steps // 2, losses)
    with tempfile.TemporaryDirectory() as out_dir:
        path = os.path.join(out_dir, "ckpt.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": steps // 2}, path)
        del model, optimizer, scheduler
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    # a compiled model's names carry a prefix in PyTorch (nanoGPT strips it the same way)
    unwanted_prefix = "_orig_mod."
    state_dict = checkpoint["model"]
    for k in list(state_dict):
        if k.startswith(unwanted_prefix):
            state_dict[k[len(unwanted_prefix):]] = state_dict.pop(k)

    model, optimizer, scheduler = build(steps, compile)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # so that nothing below passes unless the checkpoint restores it
    getattr(model, "_orig_mod", model).load_state_dict(state_dict)
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    train_steps(model, optimizer, scheduler, x, y, checkpoint["step"], steps, losses)

    return losses + [validate(model, x[steps], y[steps])]


def validate(model, x, y):
    model.eval()
    with torch.inference_mode():
        return nn.functional.mse_loss(model(x), y).item()


if __name__ == "__main__":
    print(main())
