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


default_generator = Generator(0)


def manual_seed(seed: int) -> Generator:
    """Seeds the default generator, as torch.manual_seed does."""
    return default_generator.manual_seed(seed)


def initial_seed() -> int:
    return default_generator.initial_seed()
