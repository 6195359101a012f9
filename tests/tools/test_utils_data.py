"""infinitrain.utils.data, utils.checkpoint and multiprocessing against PyTorch's: batches,
orders and collation where they are deterministic, the samplers' laziness and seeding, the
DistributedSampler's partition and padding, and checkpointed gradients."""
import collections
import itertools

import numpy as np
import pytest

import infinitrain as it
import infinitrain.data
from infinitrain import nn
from infinitrain.utils import data as D
from infinitrain.utils.checkpoint import checkpoint, checkpoint_sequential

torch = pytest.importorskip("torch")
TD = torch.utils.data


def _plain(batch):
    """A batch as nested Python values with dtype names, comparable across the libraries."""
    if isinstance(batch, (it.Tensor, torch.Tensor)):
        return (str(batch.dtype).split(".")[-1], batch.tolist())
    if isinstance(batch, dict):
        return {k: _plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, [_plain(b) for b in batch])
    return batch


def _same_batches(ours, theirs):
    assert [_plain(b) for b in ours] == [_plain(b) for b in theirs]


def _datasets():
    x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10)
    return D.TensorDataset(it.from_numpy(x), it.from_numpy(y)), TD.TensorDataset(torch.from_numpy(x),
                                                                                 torch.from_numpy(y))


@pytest.mark.parametrize("kw", [dict(), dict(batch_size=4), dict(batch_size=4, drop_last=True),
                                dict(batch_size=None), dict(batch_size=3, sampler=[9, 0, 4, 4, 1])])
def test_sequential_batches_match_torch(kw):
    ours, theirs = _datasets()
    a, b = D.DataLoader(ours, **kw), TD.DataLoader(theirs, **kw)
    assert len(a) == len(b)
    _same_batches(a, b)


def test_batch_sampler_and_collate_of_dicts_tuples_numbers_match_torch():
    Point = collections.namedtuple("Point", "x y")
    items = [{"id": i, "w": i / 2, "flag": i % 2 == 0, "arr": np.full(3, i, np.float32), "name": f"n{i}",
              "pair": (i, np.int32(i)), "pt": Point(i, float(i)), "nested": [np.float64(i), {"k": i}]}
             for i in range(7)]
    batches = [[0, 1, 2], [6, 3], [5]]
    _same_batches(D.DataLoader(items, batch_sampler=batches), TD.DataLoader(items, batch_sampler=batches))
    assert _plain(D.default_convert((np.zeros(2), 1))) == _plain(TD.default_convert((np.zeros(2), 1)))
    with pytest.raises(TypeError, match="default_collate"):
        D.default_collate([np.array(["a"]), np.array(["b"])])
    with pytest.raises(RuntimeError, match="equal size"):
        D.default_collate([[1, 2], [3]])


def test_iterable_dataset_batches_match_torch():
    def stream(lib):
        class Stream(lib.IterableDataset):
            def __iter__(self):
                return iter(range(10))
        return Stream()
    for kw in (dict(batch_size=4), dict(batch_size=4, drop_last=True), dict(batch_size=None)):
        _same_batches(D.DataLoader(stream(D), **kw), TD.DataLoader(stream(TD), **kw))
    assert D.get_worker_info() is None


def test_bad_options_are_refused_as_torch_refuses_them():
    ours, theirs = _datasets()
    for kw in (dict(shuffle=True, sampler=[0]), dict(batch_sampler=[[0]], batch_size=2),
               dict(batch_sampler=[[0]], drop_last=True), dict(batch_size=None, drop_last=True),
               dict(num_workers=-1), dict(timeout=-1), dict(prefetch_factor=2), dict(persistent_workers=True),
               dict(multiprocessing_context="spawn")):
        with pytest.raises(ValueError) as want:
            TD.DataLoader(theirs, **kw)
        with pytest.raises(ValueError) as got:
            D.DataLoader(ours, **kw)
        assert str(got.value)[:20] == str(want.value)[:20], kw
    loader = D.DataLoader(ours, pin_memory=True, pin_memory_device="", timeout=0, worker_init_fn=None,
                          generator=it.Generator(1), in_order=True)
    with pytest.raises(ValueError, match="should not be set after"):
        loader.batch_size = 3


def test_samplers_are_lazy_so_an_endless_one_works():
    class Endless(D.Sampler):
        def __iter__(self):
            return itertools.count()
    ds = list(range(1000))
    batches = iter(D.DataLoader(ds, batch_size=4, sampler=Endless()))
    assert [next(batches).tolist() for _ in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    huge = D.RandomSampler(ds, replacement=True, num_samples=10 ** 15)
    first = list(itertools.islice(D.DataLoader(ds, batch_size=8, sampler=huge), 2))
    assert len(huge) == 10 ** 15 and all(0 <= v < 1000 for b in first for v in b.tolist())


def _order(**kw):
    return [b.tolist() for b in D.DataLoader(list(range(50)), batch_size=50, shuffle=True, **kw)][0]


def test_shuffling_draws_from_infinitrains_generators():
    it.manual_seed(7)
    a, a2 = _order(), _order()
    it.manual_seed(7)
    assert _order() == a and _order() == a2 and a != a2 and sorted(a) == list(range(50))
    g = it.Generator(3)
    b = _order(generator=g)
    assert _order(generator=it.Generator(3)) == b and _order(generator=g) != b
    it.manual_seed(7)
    s1 = [list(ss) for ss in D.random_split(range(10), [0.5, 0.3, 0.2])]
    it.manual_seed(7)
    s2 = [list(ss) for ss in D.random_split(range(10), [0.5, 0.3, 0.2])]
    assert s1 == s2 and [len(s) for s in s1] == [len(s) for s in TD.random_split(range(10), [0.5, 0.3, 0.2])]
    assert sorted(sum(s1, [])) == list(range(10))
    with pytest.raises(ValueError, match="Sum of input lengths"):
        D.random_split(range(10), [3, 3])


def test_random_samplers_cover_what_they_should():
    ds = list(range(10))
    assert sorted(D.RandomSampler(ds, generator=it.Generator(0))) == ds
    twice = list(D.RandomSampler(ds, num_samples=25))
    assert len(twice) == 25 and sorted(twice[:20]) == sorted(ds * 2)
    assert sorted(D.SubsetRandomSampler([3, 5, 7])) == [3, 5, 7]
    w = list(D.WeightedRandomSampler([0.0, 1.0, 0.0, 3.0], 200, generator=it.Generator(2)))
    assert set(w) == {1, 3} and w.count(3) > w.count(1)
    assert sorted(D.WeightedRandomSampler([1, 1, 1, 0], 3, replacement=False)) == [0, 1, 2]
    with pytest.raises(ValueError, match="num_samples"):
        D.RandomSampler(ds, num_samples=0)
    assert list(D.BatchSampler(range(7), 3, False)) == list(TD.BatchSampler(range(7), 3, False))
    assert len(D.BatchSampler(range(7), 3, True)) == len(TD.BatchSampler(range(7), 3, True))


def test_datasets_compose_as_torchs():
    a, b = list(range(3)), list(range(10, 15))
    assert [D.ConcatDataset([a, b])[i] for i in (0, 4, -1)] == [TD.ConcatDataset([a, b])[i] for i in (0, 4, -1)]
    assert list(D.Subset(b, [4, 0])) == [14, 10]
    assert D.StackDataset(x=a, y=a)[1] == {"x": 1, "y": 1}
    with pytest.raises(ValueError, match="Size mismatch"):
        D.TensorDataset(np.zeros(3), np.zeros(4))


@pytest.mark.parametrize("n,replicas,drop_last", [(10, 3, False), (10, 3, True), (2, 4, False), (12, 4, False),
                                                  (13, 4, True)])
def test_distributed_sampler_partition_and_padding_match_torch(n, replicas, drop_last):
    ds = list(range(n))
    for rank in range(replicas):
        ours = D.DistributedSampler(ds, replicas, rank, shuffle=False, drop_last=drop_last)
        theirs = TD.DistributedSampler(ds, replicas, rank, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_distributed_sampler_shuffles_per_epoch_alike_on_every_rank():
    ds = list(range(11))

    def shares(epoch, seed=0):
        samplers = [D.DistributedSampler(ds, 3, r, seed=seed) for r in range(3)]
        for s in samplers:
            s.set_epoch(epoch)
        return [list(s) for s in samplers]
    e0 = shares(0)
    assert shares(0) == e0 and shares(1) != e0 and shares(0, seed=1) != e0
    together = sum(e0, [])
    assert len(together) == 12 and set(together) == set(ds)  # one index repeated as padding
    with pytest.raises(ValueError, match="Invalid rank 3"):
        D.DistributedSampler(ds, 3, 3)
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        D.DistributedSampler(ds)


def _net():
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Dropout(0.3), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


def test_checkpoint_gradients_equal_running_without_it():
    it.manual_seed(0)
    net, x = _net(), it.randn(3, 4, requires_grad=True)

    def grads(forward):
        for t in [x, *net.parameters()]:
            t.grad = None
        it.manual_seed(5)  # the same dropout masks in every run
        forward().sum().backward()
        return [t.grad.numpy().copy() for t in [x, *net.parameters()]]
    want = grads(lambda: net(x))
    for forward in (lambda: checkpoint(net, x, use_reentrant=False),
                lambda: checkpoint(lambda a, scale: net(a) * scale, x, use_reentrant=False, scale=1.0),
                lambda: checkpoint_sequential(net, 3, x, use_reentrant=False),
                lambda: checkpoint_sequential(list(net), 6, x, use_reentrant=True, preserve_rng_state=False)):
        assert all(np.array_equal(a, b) for a, b in zip(want, grads(forward)))
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        checkpoint(net, x, use_reentrant=True, scale=1.0)


def test_checkpoint_matches_torch_without_it():  # (torch's own checkpoint's first call imports dynamo: seconds)
    w1, w2 = np.random.default_rng(0).standard_normal((2, 5, 5)).astype(np.float32)
    xs = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)

    def gradients(lib, ck=None):
        a, b = (lib.tensor(w, requires_grad=True) for w in (w1, w2))
        x = lib.tensor(xs, requires_grad=True)
        piece = lambda v: lib.tanh(v @ a) @ b  # noqa: E731
        out = ck(piece, x, use_reentrant=False) if ck else piece(x)
        (out * out).sum().backward()
        return [t.grad.numpy() for t in (x, a, b)] + [out.detach().numpy()]
    for got, want in zip(gradients(it, checkpoint), gradients(torch)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_multiprocessing_has_torchs_names():
    import infinitrain.multiprocessing as mp
    for name in ("spawn", "start_processes", "Process", "Queue", "SimpleQueue", "Pool", "get_context",
                 "set_start_method", "get_start_method", "cpu_count", "ProcessContext", "ProcessRaisedException",
                 "ProcessExitedException", "get_sharing_strategy", "set_sharing_strategy"):
        assert hasattr(mp, name) and hasattr(torch.multiprocessing, name), name
    assert it.utils.data.DataLoader is D.DataLoader and it.data.DataLoader is D.DataLoader


class _Shards(D.IterableDataset):
    def __iter__(self):
        info = D.get_worker_info()
        return iter(range(info.id, 10, info.num_workers))


class _Fails(D.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 4:
            raise KeyError("item 4 is broken")
        return {"x": np.full(2, i, np.float32), "i": i}


@pytest.mark.slow  # starts DataLoader worker processes
def test_workers_keep_order_split_iterable_datasets_and_pass_errors_back():
    ours, theirs = _datasets()
    _same_batches(D.DataLoader(ours, batch_size=3, num_workers=2), TD.DataLoader(theirs, batch_size=3))
    for persistent in (False, True):
        loader = D.DataLoader(_Shards(), batch_size=3, num_workers=2, persistent_workers=persistent)
        for _ in range(2):  # a second epoch, on the same workers when persistent
            assert [b.tolist() for b in loader] == [[0, 2, 4], [1, 3, 5], [6, 8], [7, 9]]
    batches = iter(D.DataLoader(_Fails(), batch_size=2, num_workers=2))
    assert next(batches)["x"].tolist() == [[0, 0], [1, 1]]
    next(batches)
    with pytest.raises(KeyError, match="in DataLoader worker process 0"):
        next(batches)
