"""Models: GPT-2 (and, next, LLaMA-3 and an MLP)."""
from .gpt2 import GPT2, PRESETS as GPT2_PRESETS, GPT2Config, gpt2

__all__ = ["GPT2", "GPT2Config", "GPT2_PRESETS", "gpt2"]
