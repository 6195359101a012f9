"""Text from a trained or imported language model (GPT-2 or LLaMA-3): prints the prompt and its
continuation.

    python -m infinitrain.generate --load CHECKPOINT --prompt "To be or not" --max_new_tokens 50
    python -m infinitrain.generate --from_pretrained HF_FOLDER --prompt "..." --temperature 0
    python -m infinitrain.generate --llmc_filepath gpt2_124M.bin --prompt "..." --top_k 40 --seed 1

The model: --load a checkpoint of the training examples (--save; the model it records is
rebuilt), --from_pretrained a transformers folder (GPT2LMHeadModel, LlamaForCausalLM), or
--llmc_filepath an llm.c checkpoint. The tokenizer: --tokenizer gpt2 (the default for a model
with GPT-2's 50,257 tokens), a tokenizer.model / tokenizer.json (LLaMA-3's: data/text.py), or an
llm.c tokenizer.bin, which only decodes (generation then starts from its end-of-text token, with
no prompt). The prompt is encoded after the document delimiter, as the training shards start
each document (data/text.py). --temperature 0 is greedy decoding; the model's own sampler
(CausalLM.generate) draws the tokens.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import infinitrain as it
from infinitrain.checkpoint import CheckpointError, load_checkpoint, read_meta
from infinitrain.data.llmc import TOKENIZER_MAGIC, Tokenizer
from infinitrain.data.text import open_tokenizer
from infinitrain.io import DataFormatError, input_file
from infinitrain.models import GPT2, LLaMA3
from infinitrain.models.gpt2 import LLMC_GPT2_MAGIC
from infinitrain.models.llama3 import LLMC_LLAMA3_MAGIC

CLASSES = {"GPT2": GPT2, "LLaMA3": LLaMA3}
HF_TYPES = {"gpt2": GPT2, "GPT2": GPT2, "llama": LLaMA3, "LLaMA3": LLaMA3}  # (and the earlier format's names)
GPT2_VOCAB = 50257


class GenerateError(Exception):
    """A one-line reason the command cannot run."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m infinitrain.generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--load", metavar="DIR", help="a training checkpoint (or the --save folder holding 'latest')")
    src.add_argument("--from_pretrained", metavar="DIR", help="a transformers folder (config.json, *.safetensors)")
    src.add_argument("--llmc_filepath", metavar="FILE", help="an llm.c GPT-2 or LLaMA-3 checkpoint")
    p.add_argument("--prompt", default="", help="the text to continue (default: none, a document's start)")
    p.add_argument("--tokenizer", default=None,
                   help="gpt2, a tokenizer.model / tokenizer.json, or an llm.c tokenizer.bin (decodes only) "
                        "(default: gpt2 for a model with GPT-2's vocabulary)")
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (the most likely token each time)")
    p.add_argument("--top_k", type=int, default=None, help="sample from the k most likely tokens only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num_samples", type=int, default=1, help="continuations of the prompt, drawn together")
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    if not (a.load or a.from_pretrained or a.llmc_filepath):
        p.error("name the model: --load DIR, --from_pretrained DIR or --llmc_filepath FILE")
    for flag, v, low in (("--max_new_tokens", a.max_new_tokens, 1), ("--num_samples", a.num_samples, 1),
                         ("--top_k", a.top_k, 1)):
        if v is not None and v < low:
            p.error(f"{flag} {v} must be at least {low}")
    if not a.temperature >= 0 or a.temperature == float("inf"):
        p.error(f"--temperature {a.temperature} must be a finite number >= 0 (0 = greedy)")
    return a


def load_model(a):
    """The model the flags name, its weights loaded."""
    if a.load:
        meta = read_meta(a.load)
        recorded = meta.get("extra", {}).get("model")
        if not isinstance(recorded, dict) or recorded.get("class") not in CLASSES:
            raise GenerateError(f"--load {a.load}: the checkpoint records no GPT2 or LLaMA3 model (extra['model'] "
                                "is what the training examples' --save writes)")
        cls = CLASSES[recorded["class"]]
        try:
            model = cls(cls.config_class(**recorded["config"]), seed=0)
        except (KeyError, TypeError, ValueError) as e:
            raise GenerateError(f"--load {a.load}: its recorded model configuration cannot be read ({e})") from None
        load_checkpoint(a.load, model)
        return model
    if a.from_pretrained:
        where = input_file(Path(a.from_pretrained) / "config.json", "transformers config")
        try:
            kind = json.loads(where.read_text()).get("model_type")
        except (ValueError, UnicodeDecodeError, AttributeError):
            raise GenerateError(f"--from_pretrained {where} is not a JSON object") from None
        if kind not in HF_TYPES:
            raise GenerateError(f"--from_pretrained {a.from_pretrained}: model_type {kind!r} is neither GPT-2 ('gpt2') "
                                "nor LLaMA ('llama')")
        return HF_TYPES[kind].from_pretrained(a.from_pretrained)
    path = input_file(a.llmc_filepath, "checkpoint")
    magic = int(np.fromfile(path, dtype="<i4", count=1)[0]) if path.stat().st_size >= 4 else None
    cls = {LLMC_GPT2_MAGIC: GPT2, LLMC_LLAMA3_MAGIC: LLaMA3}.get(magic)
    if cls is None:
        raise GenerateError(f"--llmc_filepath {path}: magic number {magic} is neither an llm.c GPT-2 checkpoint's "
                            f"({LLMC_GPT2_MAGIC}) nor a LLaMA-3 one's ({LLMC_LLAMA3_MAGIC})")
    return cls.from_llmc(path)


def load_tokenizer(a, vocab_size: int):
    """(encode or None, decode, the delimiter id) for the model's vocabulary."""
    spec = a.tokenizer or ("gpt2" if vocab_size == GPT2_VOCAB else None)
    if spec is None:
        raise GenerateError(f"the model has {vocab_size:,} tokens, not GPT-2's: pass --tokenizer with its "
                            "tokenizer.model or tokenizer.json (or an llm.c tokenizer.bin)")
    path = Path(spec)
    if path.is_file() and path.stat().st_size >= 4 and \
            int(np.fromfile(path, dtype="<i4", count=1)[0]) == TOKENIZER_MAGIC:
        tok = Tokenizer(path)
        encode, decode, delimiter, n = None, tok.decode, tok.eot_token, tok.vocab_size
    else:
        tok = open_tokenizer(spec)
        encode, decode, delimiter, n = tok.encode, tok.decode, tok.delimiter, tok.vocab_size
    if n > vocab_size:
        raise GenerateError(f"--tokenizer {spec} has {n:,} tokens but the model only {vocab_size:,}: it is not this "
                            "model's tokenizer")
    return encode, decode, delimiter


def generate(a) -> list:
    """The num_samples texts: the prompt and each continuation."""
    try:
        device = it.device(a.device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise GenerateError(f"--device {a.device}: {e}") from None
    model = load_model(a)
    cfg = model.config
    encode, decode, delimiter = load_tokenizer(a, cfg.vocab_size)
    if a.prompt and encode is None:
        raise GenerateError(f"--tokenizer {a.tokenizer} (an llm.c tokenizer.bin) only decodes: give no --prompt, "
                            "or the tokenizer that encodes (gpt2, a tokenizer.model or tokenizer.json)")
    ids = [delimiter] + (list(encode(a.prompt)) if a.prompt else [])
    if len(ids) + a.max_new_tokens > cfg.block_size:
        raise GenerateError(f"the prompt's {len(ids)} tokens (with the delimiter) and --max_new_tokens "
                            f"{a.max_new_tokens} exceed the model's block size {cfg.block_size}")
    try:
        model.to(device)
    except (RuntimeError, it.NativeError) as e:
        raise GenerateError(f"--device {a.device}: {e}") from None
    model.eval()
    start = it.tensor(np.tile(np.array(ids, np.int64), (a.num_samples, 1)))
    out = model.generate(start, a.max_new_tokens, temperature=a.temperature, top_k=a.top_k, seed=a.seed)
    return [a.prompt + decode(row[len(ids):]) for row in out.numpy()]


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        texts = generate(a)
    except (GenerateError, CheckpointError, DataFormatError, FileNotFoundError, IsADirectoryError,
            PermissionError) as e:
        sys.exit(f"generate: {e}")
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"---- sample {i + 1} ----")
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
