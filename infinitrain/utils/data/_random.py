"""The samplers' random draws, from infinitrain's generators: a draw takes one counter of the
generator (the default one unless given), so manual_seed fixes every order, and the order is
a pure function of the generator's (seed, offset), as its other draws are."""
from __future__ import annotations

import numpy as np

from ...random import default_generator


def stream(generator) -> np.random.Generator:
    g = generator if generator is not None else default_generator
    return np.random.default_rng((g.seed, g._take(1)))


def randperm(n: int, generator=None) -> np.ndarray:
    """A uniformly random order of range(n), as int64."""
    return stream(generator).permutation(int(n))


def randint(high: int, size: int, generator=None) -> np.ndarray:
    """`size` integers uniform in [0, high)."""
    return stream(generator).integers(0, int(high), int(size), dtype=np.int64)


def seed(generator=None) -> int:
    """A fresh 63-bit seed (what a sampler without a generator seeds its own one with)."""
    return int(stream(generator).integers(0, 2 ** 63 - 1))
