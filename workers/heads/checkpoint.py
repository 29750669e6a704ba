"""What every head's directory shares: its file names, its error, what distill measured beside it."""

from __future__ import annotations

import json
from pathlib import Path

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
FACTS = "specserve_head.json"  # what distill measured, beside the head (read by the zoo and the policy's priors)
LAYER_TYPES = ("llama", "mistral")  # decoder layers of Llama's shape (Qwen3's adds q/k norms: not here)


class HeadFormatError(ValueError):
    """A directory that is not a head specserve can run, or a head for another target."""


def read_facts(directory: str | Path) -> dict:
    """What distill measured of the head in ``directory`` ({} for a head it did not write)."""
    try:
        return json.loads((Path(directory) / FACTS).read_text())
    except (OSError, ValueError):
        return {}


def read_json(path: Path) -> dict:
    """A config file, or a HeadFormatError that names it."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise HeadFormatError(f"{path.parent}: no readable {path.name} ({exc})") from None
    if not isinstance(doc, dict):
        raise HeadFormatError(f"{path}: not a JSON object")
    return doc


def rope_type(layer: dict) -> str:
    scaling = layer.get("rope_scaling") or layer.get("rope_parameters") or {}
    return scaling.get("rope_type") or scaling.get("type") or "default"
