"""Seeded random numbers. A Generator is (seed, offset): the native generator is counter-based,
so a draw of n numbers is a pure function of them and the stream is the same for any thread
count; `get_state`/`set_state` save and restore it exactly."""
from __future__ import annotations

from ._native import check, lib


class Generator:
    def __init__(self, seed: int = 0):
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> "Generator":
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.seed = seed & 0xFFFFFFFFFFFFFFFF
        self.offset = 0
        return self

    def initial_seed(self) -> int:
        return self.seed

    def get_state(self) -> tuple:
        return (self.seed, self.offset)

    def set_state(self, state) -> None:
        self.seed, self.offset = int(state[0]), int(state[1])

    def _take(self, n: int) -> int:
        """Reserves n counters and returns the first."""
        start = self.offset
        self.offset += n
        return start

    def advance(self, n: int) -> None:
        """Moves the stream on as a draw of n numbers would, without drawing them (a pipeline
        stage skips the parameters that other stages hold)."""
        self._take(int(n))

    def fill_uniform(self, t, low: float = 0.0, high: float = 1.0) -> None:
        check(lib.it_random_uniform(t.device.native, t.dtype.native, t._ptr(), t.numel(),
                                    low, high, self.seed, self._take(t.numel())))

    def fill_normal(self, t, mean: float = 0.0, std: float = 1.0) -> None:
        check(lib.it_random_normal(t.device.native, t.dtype.native, t._ptr(), t.numel(),
                                   mean, std, self.seed, self._take(t.numel())))


class ForkedGenerator(Generator):
    """A stream of its own that moves with its parent: it draws under a seed mixed from the
    parent's and `salt`, at the parent's counters, and advances the parent as a draw from it
    would. Ranks whose parents stay in step but who must draw different numbers fork it with
    different salts: each tensor-parallel rank's dropout over its own heads and hidden units
    (Megatron's model-parallel RNG), while dropout on replicated activations stays the same on
    every rank. Saving or restoring the parent (activation recomputation) covers the fork."""

    def __init__(self, parent: Generator, salt: int):
        self.parent, self.salt = parent, int(salt)

    @property
    def seed(self) -> int:
        return (self.parent.seed * 0x9E3779B97F4A7C15 + self.salt + 1) & 0xFFFFFFFFFFFFFFFF

    @property
    def offset(self) -> int:
        return self.parent.offset

    @offset.setter
    def offset(self, value: int) -> None:
        self.parent.offset = value

    def manual_seed(self, seed: int):
        raise TypeError("a ForkedGenerator follows its parent: seed the parent instead")

    def get_state(self) -> tuple:
        return self.parent.get_state()

    def set_state(self, state) -> None:
        self.parent.set_state(state)


default_generator = Generator(0)


def manual_seed(seed: int) -> Generator:
    """Seeds the default generator, as torch.manual_seed does."""
    return default_generator.manual_seed(seed)


def initial_seed() -> int:
    return default_generator.initial_seed()
