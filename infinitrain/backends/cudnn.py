"""torch.backends.cudnn: infinitrain calls no cuDNN, so is_available() is False; the flags
programs set (`cudnn.benchmark = True`, `deterministic`, `allow_tf32`, `enabled`) are accepted and
kept."""
from __future__ import annotations

enabled = True
benchmark = False
deterministic = False
allow_tf32 = True


def is_available() -> bool:
    return False


def version():
    return None
