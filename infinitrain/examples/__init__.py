"""Runnable examples: `python -m infinitrain.examples.<name>`."""
