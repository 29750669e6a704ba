"""The error a model or tokenizer that cannot be loaded raises, apart from the loading itself so that
what only catches it (the command line) need not import torch and transformers."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says from where and why."""
