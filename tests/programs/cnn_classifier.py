"""A small CNN classifier in the style of PyTorch's MNIST example, on random 1x28x28 images:
Conv2d, BatchNorm2d, ReLU, MaxPool2d, Dropout2d, Dropout, Flatten and Linear; CrossEntropyLoss, SGD with
momentum and a StepLR schedule, a DataLoader over a TensorDataset, and an evaluation loop under
torch.no_grad that counts correct predictions."""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, p_drop):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, kernel_size=3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout2d(p_drop / 2),
            nn.Conv2d(8, 16, kernel_size=3, stride=1, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Dropout(p_drop),
            nn.Linear(16 * 7 * 7, 32),
            nn.ReLU(),
            nn.Linear(32, 10),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


def init_from_numpy(model, seed):
    """The same starting weights under any library: numpy draws them, not the library's generator."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            bound = 1 / math.sqrt(p[0].numel()) if p.dim() > 1 else 0.1
            base = 1.0 if p.dim() == 1 and name.endswith("weight") else 0.0
            p.copy_(torch.from_numpy((base + rng.uniform(-bound, bound, p.shape)).astype(np.float32)))


def train(model, device, train_loader, optimizer, steps, losses):
    model.train()
    criterion = nn.CrossEntropyLoss()
    for batch_idx, (data, target) in enumerate(train_loader):
        if batch_idx == steps:
            break
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = criterion(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())


def test(model, device, test_loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += nn.functional.cross_entropy(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    return test_loss, correct


def main(steps=4, p_drop=0.0):
    torch.manual_seed(1)
    device = torch.device("cpu")
    rng = np.random.default_rng(0)
    images = torch.tensor(rng.standard_normal((64, 1, 28, 28)), dtype=torch.float32)
    labels = torch.tensor(rng.integers(0, 10, 64))
    train_loader = DataLoader(TensorDataset(images[:48], labels[:48]), batch_size=16, shuffle=False)
    test_loader = DataLoader(TensorDataset(images[48:], labels[48:]), batch_size=8)

    model = Net(p_drop).to(device)
    init_from_numpy(model, 0)
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    losses = []
    while len(losses) < steps:
        train(model, device, train_loader, optimizer, steps - len(losses), losses)
        scheduler.step()
    test_loss, correct = test(model, device, test_loader)
    assert 0 <= correct <= 16
    return losses + [test_loss]


if __name__ == "__main__":
    print(main())
