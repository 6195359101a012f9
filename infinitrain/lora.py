"""LoRA adapters from the command line. `merge` is PEFT's merge_and_unload then
save_pretrained: a transformers folder (GPT-2 or LLaMA) plus adapters in PEFT's format
(what --lora_save_path writes, or PEFT itself) become one transformers folder whose weights
are W + (lora_alpha / r) B A, which transformers loads with no PEFT at all:

    python -m infinitrain.lora merge --adapter ADAPTERS --out MERGED [--base BASE]

--base defaults to the adapters' base_model_name_or_path (a local folder). The merged weights
are written in float32 whatever the base's dtype (PEFT keeps the base's: a bfloat16 model's
merged folder is twice its size here).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from .checkpoint import CheckpointError, load_lora, read_lora_config, save_pretrained
from .io import DataFormatError

# what a transformers folder holds besides its weights and config, copied to the merged one
# so that it is as usable as the base (AutoTokenizer.from_pretrained(out) included)
_BESIDE = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
           "vocab.json", "merges.txt", "tokenizer.model")


def merge(base, adapter, out) -> Path:
    """Writes base + adapters, merged, to `out` (a transformers folder); returns it."""
    import json
    from .models import GPT2, LLaMA3
    config = read_lora_config(adapter)
    if "peft_type" not in config:
        raise CheckpointError(f"{adapter} holds adapters in this package's earlier format: load them in a run "
                              "(--lora_load_path) and save them again (--lora_save_path) to get PEFT's")
    base = base or config.get("base_model_name_or_path")
    if not base:
        raise CheckpointError(f"{adapter}/adapter_config.json names no base model: give --base")
    base = Path(base)
    try:
        kind = json.loads((base / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"--base {base} is not a transformers folder ({e})") from None
    classes = {"gpt2": GPT2, "llama": LLaMA3}
    if kind not in classes:
        raise CheckpointError(f"--base {base} holds a {kind!r} model; infinitrain merges into GPT-2 and LLaMA")
    model = classes[kind].from_pretrained(base)
    load_lora(model, adapter)
    out = save_pretrained(model, out, merge_lora=True)
    for name in _BESIDE:
        if (base / name).is_file() and Path(out).resolve() != base.resolve():
            shutil.copyfile(base / name, Path(out) / name)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m infinitrain.lora", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="fold adapters into their base and write a transformers folder")
    m.add_argument("--base", default=None, metavar="DIR",
                   help="the base model's transformers folder (default: the adapters' base_model_name_or_path)")
    m.add_argument("--adapter", required=True, metavar="DIR", help="adapters in PEFT's format")
    m.add_argument("--out", required=True, metavar="DIR", help="where the merged transformers folder goes")
    args = p.parse_args(argv)
    try:
        out = merge(args.base, args.adapter, args.out)
    except (CheckpointError, DataFormatError) as e:
        sys.exit(f"infinitrain.lora merge: {e}")
    print(f"merged {args.adapter} into {out}")


if __name__ == "__main__":
    main()
