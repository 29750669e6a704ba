"""Running the models in this process: a zoo by name or path, and an engine over it."""

from __future__ import annotations

from pathlib import Path

from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec
from specserve.cluster.zoo.presets import PRESETS
from specserve.cluster.zoo.zoo import MANIFEST, Zoo, ZooNotBuilt, default_zoo_dir


def zoo_location(name_or_dir: str) -> Path:
    """A preset name means its default directory; anything else is a directory path."""
    if name_or_dir in PRESETS and not (Path(name_or_dir) / MANIFEST).exists():
        return default_zoo_dir(name_or_dir)
    return Path(name_or_dir).expanduser()


def open_zoo(name_or_dir: str) -> Zoo:
    location = zoo_location(name_or_dir)
    try:
        return Zoo.open(location)
    except ZooNotBuilt:
        hint = f"--preset {name_or_dir}" if name_or_dir in PRESETS else f"--out {location}"
        raise ZooNotBuilt(f"zoo {name_or_dir!r} is not built at {location}: run `specserve zoo build {hint}`") from None


def open_or_build_zoo(name_or_dir: str) -> Zoo:
    """A zoo; a preset's is built first where it is missing (the benches: minutes, once)."""
    from specserve.cluster.zoo.build import build_zoo
    from specserve.cluster.zoo.presets import get_preset

    try:
        return open_zoo(name_or_dir)
    except ZooNotBuilt:
        if name_or_dir not in PRESETS:
            raise
        return build_zoo(get_preset(name_or_dir), zoo_location(name_or_dir))


def zoo_engine(zoo: Zoo, drafts: list[str], threads: int | None = None, device: str = "auto",
               extra: dict[str, ModelSpec] | None = None) -> SpecEngine:
    """The zoo's target and the named drafts in this process (tokenizers checked at load), and
    ``extra`` drafts from elsewhere."""
    return SpecEngine.load(
        ModelSpec(str(zoo.target_dir), threads=threads, device=device),
        {name: ModelSpec(str(zoo.draft_dir(name)), threads=threads, device=device) for name in drafts} | (extra or {}),
    )
