"""Fixtures and the test groups. Shared helpers are in helpers.py; the markers (registered in
pyproject.toml) let a fast tier run alone: `pytest -m "not mpi and not slow"`."""
import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)
