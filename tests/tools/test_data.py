"""llm.c token shards and tokenizer files (good and broken), and the loaders."""
import numpy as np
import pytest

import infinitrain as it
from infinitrain.data import (DataFormatError, DataLoader, LengthGroupedBatchSampler, TensorDataset, Tokenizer,
                              TokenLoader, read_shard, write_shard, write_tokenizer)


def test_shard_round_trip_uint16_and_uint32(tmp_path):
    small = np.arange(1000) % 50257
    write_shard(tmp_path / "a.bin", small)
    t = read_shard(tmp_path / "a.bin", vocab_size=50257)
    assert t.dtype == np.uint16 and np.array_equal(t, small)
    big = np.array([5, 70000, 128255])
    write_shard(tmp_path / "b.bin", big)
    header = np.fromfile(tmp_path / "b.bin", dtype="<i4", count=3)
    assert header.tolist() == [20240801, 7, 3]  # llm.c's LLaMA-3 shards
    assert np.array_equal(read_shard(tmp_path / "b.bin"), big)


def test_llama3_shards_are_llmcs_version_7_and_the_earlier_version_2_still_reads(tmp_path):
    few = np.array([1, 2, 3])  # ids that would fit 16 bits: llama-3 still means llm.c's uint32
    write_shard(tmp_path / "l.bin", few, model="llama-3")
    raw = (tmp_path / "l.bin").read_bytes()
    assert np.frombuffer(raw[:12], "<i4").tolist() == [20240801, 7, 3] and len(raw) == 1024 + 3 * 4
    old = np.frombuffer(raw[:1024], "<i4").copy()
    old[1] = 2  # this package's earlier uint32 shards
    (tmp_path / "old.bin").write_bytes(old.tobytes() + raw[1024:])
    assert read_shard(tmp_path / "old.bin").tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="does not fit"):
        write_shard(tmp_path / "g.bin", np.array([70000]), model="gpt-2")
    with pytest.raises(ValueError, match="not one of"):
        write_shard(tmp_path / "g.bin", few, model="llama3")


def _broken(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_broken_shards_are_named(tmp_path):
    write_shard(tmp_path / "good.bin", np.arange(100))
    good = (tmp_path / "good.bin").read_bytes()
    header = np.frombuffer(good[:1024], dtype="<i4").copy()
    with pytest.raises(DataFormatError, match=r"empty\.bin.*shorter than"):
        read_shard(_broken(tmp_path, "empty.bin", b""))
    bad_magic = header.copy()
    bad_magic[0] = 12345
    with pytest.raises(DataFormatError, match=r"magic\.bin: magic number 12345"):
        read_shard(_broken(tmp_path, "magic.bin", bad_magic.tobytes() + good[1024:]))
    bad_version = header.copy()
    bad_version[1] = 7
    with pytest.raises(DataFormatError, match="version 7, expected 1"):
        read_shard(_broken(tmp_path, "version.bin", bad_version.tobytes() + good[1024:]))
    with pytest.raises(DataFormatError, match="truncated"):
        read_shard(_broken(tmp_path, "trunc.bin", good[:-10]))
    with pytest.raises(DataFormatError, match="token id 99 at position 99 is not below the vocabulary size 99"):
        read_shard(tmp_path / "good.bin", vocab_size=99)
    with pytest.raises(FileNotFoundError):
        read_shard(tmp_path / "missing.bin")


def test_tokenizer_round_trip_and_errors(tmp_path):
    toks = [bytes([i]) for i in range(256)] + [b"hello", b" world"]
    write_tokenizer(tmp_path / "tok.bin", toks, eot_token=257)
    tk = Tokenizer(tmp_path / "tok.bin")
    assert tk.vocab_size == 258 and tk.eot_token == 257
    assert tk.decode([256, 257, 33]) == "hello world!"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tk.decode([300])
    data = (tmp_path / "tok.bin").read_bytes()
    with pytest.raises(DataFormatError, match="truncated"):
        Tokenizer(_broken(tmp_path, "t1.bin", data[:-3]))
    with pytest.raises(DataFormatError, match="magic"):
        Tokenizer(_broken(tmp_path, "t2.bin", b"\0" * 2048))


def test_token_loader_follows_llmc_order(tmp_path):
    write_shard(tmp_path / "s.bin", np.arange(100))
    ld = TokenLoader(tmp_path / "s.bin", 2, 4)  # 8 tokens per step
    x, y = ld.next_batch()
    assert x.numpy().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert y.numpy().tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    for _ in range(11):
        x, y = ld.next_batch()
    assert x.numpy()[0, 0] == 88  # step 12 starts at 11 * 8 = 88, the last window that fits
    x, _ = ld.next_batch()
    assert x.numpy()[0, 0] == 0  # wrapped around
    # two processes together read what one process with twice the batch would
    r0, r1 = TokenLoader(tmp_path / "s.bin", 2, 4, 0, 2), TokenLoader(tmp_path / "s.bin", 2, 4, 1, 2)
    one = TokenLoader(tmp_path / "s.bin", 4, 4)
    for _ in range(3):
        both = np.concatenate([r0.next_batch()[0].numpy(), r1.next_batch()[0].numpy()])
        assert np.array_equal(both, one.next_batch()[0].numpy())
    with pytest.raises(ValueError, match="fewer than one step needs"):
        TokenLoader(tmp_path / "s.bin", 8, 16)
    with pytest.raises(FileNotFoundError, match="no token shard"):
        TokenLoader(tmp_path / "nope_*.bin", 2, 4)


def test_dataloader_batches_and_shuffles():
    ds = TensorDataset(np.arange(10, dtype=np.float64), np.arange(10))
    batches = list(DataLoader(ds, batch_size=4))
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    assert batches[0][0].numpy().dtype == np.float64  # as PyTorch's: the data's own dtype
    assert len(list(DataLoader(ds, batch_size=4, drop_last=True))) == 2
    it.manual_seed(1)
    a = [b[1].numpy().tolist() for b in DataLoader(ds, batch_size=10, shuffle=True)]
    it.manual_seed(1)
    b = [b[1].numpy().tolist() for b in DataLoader(ds, batch_size=10, shuffle=True)]
    assert a == b and a[0] != list(range(10)) and sorted(a[0]) == list(range(10))
    loader = DataLoader(ds, batch_size=10, shuffle=True)
    e0, e1 = (next(iter(loader))[1].numpy().tolist() for _ in range(2))
    assert e0 != e1  # a new order each epoch


@pytest.mark.parametrize("dataset", ["shakespeare", "mnist", "translation"])
def test_prepare_into_a_place_it_cannot_write_is_one_line(tmp_path, dataset):
    """python -m infinitrain.data.prepare ended every failure in a traceback."""
    from infinitrain.data.prepare import main
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match=f"prepare {dataset}: cannot write into {tmp_path}/file/out: Not a directory"):
        main([dataset, "--out", str(tmp_path / "file" / "out")])


def test_length_grouped_batches_cover_every_item_once_and_follow_seed_and_epoch():
    lengths = np.random.default_rng(0).integers(1, 100, 230)
    grouped = LengthGroupedBatchSampler(lengths, 2, seed=4)
    batches = list(grouped)
    assert sorted(sum(batches, [])) == list(range(230)) and len(batches) == len(grouped) == 115
    assert list(LengthGroupedBatchSampler(lengths, 2, seed=4)) == batches
    grouped.set_epoch(1)
    assert list(grouped) != batches
    assert all(lengths[a] >= lengths[b] for a, b in batches)  # sorted within each mega-batch
    plain = LengthGroupedBatchSampler(lengths, 2, drop_last=True, sampler=range(7), shuffle=False)
    assert [len(b) for b in plain] == [2, 2, 2]
    loader = DataLoader(list(lengths), batch_sampler=grouped)
    assert [b.tolist() for b in loader] == [lengths[b].tolist() for b in grouped]
