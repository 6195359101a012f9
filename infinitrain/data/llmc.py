"""llm.c's file formats: token shards and tokenizer files.

Token shard: a header of 256 int32 (magic, version, number of tokens, unused...), then the
tokens: magic 20240520 / version 1 for GPT-2's uint16 tokens, magic 20240801 / version 7 for
LLaMA-3's uint32 (llm.c's dev/data/data_common.py; version 2 is this package's earlier uint32
shards, still read).
Tokenizer: 256 int32 (magic 20240328, version 1 or 2, vocabulary size, end-of-text token in
version 2), then per token a uint8 length and that many bytes.
"""
from __future__ import annotations


import numpy as np

from ..io import DataFormatError, atomic_write, input_file

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
# magic: (the version written, the versions read, the token type)
SHARD_FORMATS = {20240520: (1, (1,), np.uint16), 20240801: (7, (7, 2), np.uint32)}
SHARD_MODELS = {"gpt-2": 20240520, "llama-3": 20240801}  # llm.c's names (write_datafile's model_desc)
TOKENIZER_MAGIC = 20240328


def read_shard(path, vocab_size: int | None = None, check_tokens: bool = True) -> np.ndarray:
    """The tokens of an llm.c shard, memory-mapped (no copy). Checks magic, version and length,
    and, given vocab_size, that every token id is below it."""
    path = input_file(path, "token shard")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise DataFormatError(f"{path}: {size} bytes is shorter than the {HEADER_BYTES}-byte llm.c "
                              "header (empty or truncated file)")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, ntok = int(header[0]), int(header[1]), int(header[2])
    if magic not in SHARD_FORMATS:
        raise DataFormatError(f"{path}: magic number {magic} is not an llm.c token shard's "
                              f"({' or '.join(map(str, SHARD_FORMATS))}); is this the right file?")
    _, versions, dtype = SHARD_FORMATS[magic]
    if version not in versions:
        raise DataFormatError(f"{path}: version {version}, expected {' or '.join(map(str, versions))} "
                              f"for magic {magic}")
    itemsize = np.dtype(dtype).itemsize
    expected = HEADER_BYTES + ntok * itemsize
    if ntok <= 0:
        raise DataFormatError(f"{path}: the header says it holds {ntok} tokens")
    if size != expected:
        raise DataFormatError(f"{path}: the header says {ntok} tokens ({expected} bytes) but the "
                              f"file has {size} bytes ({'truncated' if size < expected else 'trailing data'})")
    tokens = np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r",
                       offset=HEADER_BYTES, shape=(ntok,))
    if vocab_size is not None and check_tokens:
        top = int(tokens.max())
        if top >= vocab_size:
            at = int(np.argmax(tokens >= vocab_size))
            raise DataFormatError(f"{path}: token id {int(tokens[at])} at position {at} is not "
                                  f"below the vocabulary size {vocab_size}")
    return tokens


def write_shard(path, tokens, model: str | None = None) -> None:
    """Writes tokens as an llm.c shard, atomically, in llm.c's format for `model`: "gpt-2"
    (uint16) or "llama-3" (uint32, what llm.c's train_llama3 reads); by default uint16 when
    every id fits, else uint32."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"write_shard: need a non-empty 1-D token array, got shape {tokens.shape}")
    if tokens.min() < 0:
        raise ValueError("write_shard: token ids must be >= 0")
    if model is not None and model not in SHARD_MODELS:
        raise ValueError(f"write_shard: model {model!r} is not one of {sorted(SHARD_MODELS)}")
    magic = SHARD_MODELS[model] if model else (20240520 if tokens.max() < 2 ** 16 else 20240801)
    version, _, dtype = SHARD_FORMATS[magic]
    if tokens.max() >= np.iinfo(dtype).max + 1:
        raise ValueError(f"write_shard: token id {int(tokens.max())} does not fit the {model} format's "
                         f"{np.dtype(dtype).name}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (magic, version, tokens.size)
    atomic_write(path, header.tobytes() + tokens.astype(np.dtype(dtype).newbyteorder("<")).tobytes())


class Tokenizer:
    """An llm.c tokenizer file: decodes token ids to text (encoding is the data tools' job)."""

    def __init__(self, path):
        path = input_file(path, "tokenizer file")
        data = path.read_bytes()
        if len(data) < HEADER_BYTES:
            raise DataFormatError(f"{path}: {len(data)} bytes is shorter than the llm.c header")
        header = np.frombuffer(data[:HEADER_BYTES], dtype="<i4")
        if int(header[0]) != TOKENIZER_MAGIC:
            raise DataFormatError(f"{path}: magic number {int(header[0])} is not an llm.c "
                                  f"tokenizer's ({TOKENIZER_MAGIC})")
        version, vocab = int(header[1]), int(header[2])
        if version not in (1, 2):
            raise DataFormatError(f"{path}: tokenizer version {version} is not 1 or 2")
        self.vocab_size = vocab
        self.eot_token = int(header[3]) if version == 2 else 50256
        self.tokens = []
        at = HEADER_BYTES
        for i in range(vocab):
            if at >= len(data):
                raise DataFormatError(f"{path}: truncated at token {i} of {vocab}")
            n = data[at]
            if at + 1 + n > len(data):
                raise DataFormatError(f"{path}: truncated inside token {i}")
            self.tokens.append(data[at + 1:at + 1 + n])
            at += 1 + n

    def decode_bytes(self, ids) -> bytes:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
            out.append(self.tokens[i])
        return b"".join(out)

    def decode(self, ids) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def write_tokenizer(path, token_bytes: list, eot_token: int) -> None:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:4] = (TOKENIZER_MAGIC, 2, len(token_bytes), eot_token)
    body = bytearray()
    for b in token_bytes:
        if len(b) > 255:
            raise ValueError("llm.c tokenizer files hold tokens of at most 255 bytes")
        body += bytes([len(b)]) + b
    atomic_write(path, header.tobytes() + bytes(body))
