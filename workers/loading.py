"""Loading Hugging Face causal LMs and their tokenizers onto the configured device.

Any causal LM directory or hub id works; on this project's machines nothing can be downloaded, so
directories (the model zoo, or a mounted volume in production) are the normal case.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says from where and why."""


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from and how it runs."""

    source: str  # a directory with config.json, or a hub id
    dtype: str = "auto"  # auto = bfloat16 on CUDA, float32 on CPU (CPU bf16 matmuls are slower per token)
    device: str = "auto"  # auto = cuda when present, else cpu
    threads: int | None = None  # torch intra-op threads for this process; None leaves torch's default

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {self.dtype!r}")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def load_model(spec: ModelSpec) -> PreTrainedModel:
    """Load a causal LM for inference (eval mode, no grad bookkeeping)."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    device = resolve_device(spec.device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            spec.source, dtype=resolve_dtype(spec.dtype, device), local_files_only=_is_local(spec.source)
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model from {spec.source!r}: {exc}") from exc
    return model.to(device).eval()


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=_is_local(source))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load tokenizer from {source!r}: {exc}") from exc


def _is_local(source: str) -> bool:
    # A path that exists never needs the hub; asking it anyway would hang on machines with no network.
    return Path(os.path.expanduser(source)).exists()
