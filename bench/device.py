"""Which device a benchmark runs on, and what it says about that device in its report."""

from __future__ import annotations

import platform
import subprocess

import torch
import transformers

from .settings import DEVICES


def resolve(device: str) -> str:
    """``auto``: cuda where this machine has a CUDA device, else cpu."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this machine has no CUDA device torch can use (torch "
                         f"{torch.__version__}); run on a GPU machine, or with --device cpu")
    return device


def facts(device: str, dtype: str) -> dict:
    """The device, dtype, driver and library versions a report names."""
    described = {"device": "cpu", "dtype": dtype, "torch": torch.__version__, "transformers": transformers.__version__,
                 "python": platform.python_version(), "cuda": torch.version.cuda}
    if device == "cuda":
        described["device"] = torch.cuda.get_device_name(0)
        try:
            described["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            described["driver"] = f"unknown ({exc})"
    return described


def placement(device: str, draft_workers: int) -> dict:
    """Service config overrides that put the target replica and the draft workers on ``device``:
    on cuda, sharing this machine's one GPU as separate processes (half for the target, the other
    half split between the draft workers); on cpu, on the custom resources that stand for devices."""
    if device == "cuda":
        return {"target": {"device": "gpu", "gpus": 0.5},
                "draft_pool": {"device": "gpu", "gpus": 0.5 / max(draft_workers, 1)}}
    return {"target": {"device": "resource"}, "draft_pool": {"device": "resource"}}
