"""A variational autoencoder in the style of PyTorch's VAE example: Linear encoder to a mean and
a log-variance, the reparameterisation trick, a sigmoid decoder, the loss as binary cross-entropy
summed over pixels plus the KL divergence from the unit Gaussian, Adam; a test pass under
torch.no_grad. The noise of the reparameterisation is drawn with numpy and handed in, so any
library sees the same draws; without it the model draws with torch.randn_like."""
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim


class VAE(nn.Module):
    def __init__(self, n_pixels, n_hidden, n_latent):
        super().__init__()
        self.fc1 = nn.Linear(n_pixels, n_hidden)
        self.fc21 = nn.Linear(n_hidden, n_latent)
        self.fc22 = nn.Linear(n_hidden, n_latent)
        self.fc3 = nn.Linear(n_latent, n_hidden)
        self.fc4 = nn.Linear(n_hidden, n_pixels)
        self.n_pixels = n_pixels

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar, noise=None):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std) if noise is None else noise
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x, noise=None):
        mu, logvar = self.encode(x.view(-1, self.n_pixels))
        z = self.reparameterize(mu, logvar, noise)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar, n_pixels):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, n_pixels), reduction="sum")
    # KL(N(mu, sigma) || N(0, 1)), in closed form (Kingma and Welling, appendix B)
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


def init_from_numpy(model, seed):
    """The same starting weights under any library: numpy draws them, not the library's generator."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            bound = 1 / math.sqrt(p[0].numel()) if p.dim() > 1 else 0.1
            p.copy_(torch.from_numpy(rng.uniform(-bound, bound, p.shape).astype(np.float32)))


def main(steps=5, fixed_noise=True):
    torch.manual_seed(1)
    n_pixels, n_latent, batch_size = 64, 8, 16
    rng = np.random.default_rng(0)
    images = torch.tensor(rng.uniform(0, 1, (steps + 1, batch_size, 1, 8, 8)), dtype=torch.float32)
    noise = torch.tensor(rng.standard_normal((steps + 1, batch_size, n_latent)), dtype=torch.float32)
    model = VAE(n_pixels, 32, n_latent)
    init_from_numpy(model, 0)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)

    model.train()
    losses = []
    for step in range(steps):
        data = images[step]
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data, noise[step] if fixed_noise else None)
        loss = loss_function(recon_batch, data, mu, logvar, n_pixels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item() / len(data))

    model.eval()
    with torch.no_grad():
        data = images[steps]
        recon, mu, logvar = model(data, noise[steps] if fixed_noise else None)
        test_loss = loss_function(recon, data, mu, logvar, n_pixels).item() / len(data)
        sample = model.decode(torch.zeros(4, n_latent))
    assert sample.shape == (4, n_pixels) and bool(((sample >= 0) & (sample <= 1)).all())
    return losses + [test_loss]


if __name__ == "__main__":
    print(main())
