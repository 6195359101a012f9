"""lr_scheduler.ReduceLROnPlateau against PyTorch's: the learning rates of two parameter groups
over a metric that improves, stalls and recovers, in both modes and threshold modes, with
patience, cooldown and per-group min_lr; its state_dict round trip; what it refuses."""
import pytest

import infinitrain as it

torch = pytest.importorskip("torch")

METRICS = [1.0, 0.9, 0.9, 0.95, 0.91, 0.9, 0.9, 0.5, 0.5, 0.5, 0.5, 0.49999, 0.5, 0.5, 0.5, 0.5]


def _optimizer(lib):
    a, b = lib.nn.Parameter(lib.zeros(2)), lib.nn.Parameter(lib.zeros(3))
    return lib.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=1.0, momentum=0.9)


@pytest.mark.parametrize("kwargs", [
    {}, {"patience": 1}, {"patience": 1, "cooldown": 2, "factor": 0.5, "min_lr": [0.1, 0.3]},
    {"mode": "max", "patience": 0, "threshold_mode": "abs", "threshold": 0.01},
    {"patience": 2, "threshold": 0.2, "min_lr": 0.05}])
def test_the_rates_follow_pytorchs(kwargs):
    ours, theirs = (lib.optim.lr_scheduler.ReduceLROnPlateau(_optimizer(lib), **kwargs) for lib in (it, torch))
    for metric in METRICS:
        ours.step(it.tensor(metric))
        theirs.step(torch.tensor(metric))  # a 0-d loss, as a program hands in
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12)
        assert (ours.best, ours.num_bad_epochs, ours.cooldown_counter, ours.last_epoch) == \
            (theirs.best, theirs.num_bad_epochs, theirs.cooldown_counter, theirs.last_epoch)


def test_state_dict_round_trip():
    first = it.optim.lr_scheduler.ReduceLROnPlateau(_optimizer(it), patience=1)
    for metric in METRICS[:6]:
        first.step(metric)
    second = it.optim.lr_scheduler.ReduceLROnPlateau(_optimizer(it), patience=1)
    second.load_state_dict(first.state_dict())
    assert "optimizer" not in first.state_dict() and second.best == first.best
    assert second.num_bad_epochs == first.num_bad_epochs and second.optimizer is not first.optimizer


def test_refusals():
    with pytest.raises(ValueError, match="factor"):
        it.optim.lr_scheduler.ReduceLROnPlateau(_optimizer(it), factor=1.0)
    with pytest.raises(ValueError, match="min_lrs"):
        it.optim.lr_scheduler.ReduceLROnPlateau(_optimizer(it), min_lr=[0.1])
