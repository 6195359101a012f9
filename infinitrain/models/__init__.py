"""Models: GPT-2 and LLaMA-3."""
from .gpt2 import GPT2, PRESETS as GPT2_PRESETS, GPT2Config, gpt2
from .llama3 import LLaMA3, PRESETS as LLAMA3_PRESETS, LLaMA3Config, llama3

__all__ = ["GPT2", "GPT2Config", "GPT2_PRESETS", "gpt2", "LLaMA3", "LLaMA3Config",
           "LLAMA3_PRESETS", "llama3"]
