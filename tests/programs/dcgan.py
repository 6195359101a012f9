"""A DCGAN in the style of PyTorch's example, shrunk to 8x8 images: a generator of transposed
convolutions with BatchNorm2d and ReLU ending in Tanh, a discriminator of convolutions with
LeakyReLU ending in Sigmoid, weights initialised by netG.apply(weights_init), BCELoss, two Adam
optimizers with beta1 = 0.5, and the alternating updates (the discriminator on real and on
detached fake images, then the generator). The noise is drawn with numpy and handed in. The
example's ReLU(True) and LeakyReLU(0.2, inplace=True) are written out of place here, until
in-place activations under autograd land."""
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

nz, ngf, ndf, nc = 8, 8, 8, 1


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),  # 4x4
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(),
            nn.ConvTranspose2d(ngf * 2, nc, 4, 2, 1, bias=False),  # 8x8
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),  # 4x4
            nn.LeakyReLU(0.2),
            nn.Conv2d(ndf, 1, 4, 1, 0, bias=False),  # 1x1
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


def init_from_numpy(model, seed):
    """The same starting weights under any library: numpy draws them, not the library's generator."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if p.dim() == 1 and name.endswith("weight") else 0.0
            scale = 0.3 if p.dim() > 1 else 0.02
            p.copy_(torch.from_numpy((base + scale * rng.standard_normal(p.shape)).astype(np.float32)))


def main(steps=3):
    torch.manual_seed(999)
    batch_size = 8
    rng = np.random.default_rng(0)
    real_images = torch.tensor(np.tanh(rng.standard_normal((steps, batch_size, nc, 8, 8))), dtype=torch.float32)
    noises = torch.tensor(rng.standard_normal((steps, batch_size, nz, 1, 1)), dtype=torch.float32)

    netG, netD = Generator(), Discriminator()
    netG.apply(weights_init)
    netD.apply(weights_init)
    init_from_numpy(netG, 0)
    init_from_numpy(netD, 1)
    criterion = nn.BCELoss()
    real_label, fake_label = 1.0, 0.0
    optimizerD = optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))

    losses = []
    for i in range(steps):
        # (1) the discriminator: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real_cpu = real_images[i]
        label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype)
        output = netD(real_cpu)
        errD_real = criterion(output, label)
        errD_real.backward()
        fake = netG(noises[i])
        label.fill_(fake_label)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()
        # (2) the generator: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake)
        errG = criterion(output, label)
        errG.backward()
        optimizerG.step()
        losses += [errD.item(), errG.item()]
    return losses


if __name__ == "__main__":
    print(main())
