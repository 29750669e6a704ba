"""Running the models in this process: a zoo by name or path, and an engine over it."""

from __future__ import annotations

import logging
from pathlib import Path

from specserve.workers.classifier import TaskClassifier
from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec
from specserve.cluster.zoo.zoo import MANIFEST, PRESET_NAMES, Zoo, ZooNotBuilt, default_zoo_dir

log = logging.getLogger("specserve.zoo")


def zoo_location(name_or_dir: str) -> Path:
    """A preset name means its default directory; anything else is a directory path."""
    if name_or_dir in PRESET_NAMES and not (Path(name_or_dir) / MANIFEST).exists():
        return default_zoo_dir(name_or_dir)
    return Path(name_or_dir).expanduser()


def open_zoo(name_or_dir: str) -> Zoo:
    location = zoo_location(name_or_dir)
    try:
        return Zoo.open(location)
    except ZooNotBuilt:
        hint = f"--preset {name_or_dir}" if name_or_dir in PRESET_NAMES else f"--out {location}"
        raise ZooNotBuilt(f"zoo {name_or_dir!r} is not built at {location}: run `specserve zoo build {hint}`") from None


def open_or_build_zoo(name_or_dir: str) -> Zoo:
    """A zoo; a preset's is built first where it is missing (the benches: minutes, once)."""
    from specserve.cluster.zoo.build import build_zoo
    from specserve.cluster.zoo.presets import get_preset

    try:
        return open_zoo(name_or_dir)
    except ZooNotBuilt:
        if name_or_dir not in PRESET_NAMES:
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



def load_task_classifier(path: str | Path | None, zoo: Zoo | None) -> TaskClassifier | None:
    """The classifier a router resolves task-less requests with: ``path`` if given, else the zoo's.

    A zoo built before the classifier was a build stage has none: one is trained from its corpora
    here (a few seconds; `specserve zoo build` adds it to the zoo for good). None without either,
    or when the zoo has no corpora either: requests without a task then get the default task.
    """
    if path is not None:
        return TaskClassifier.load(path)
    if zoo is None:
        return None
    if zoo.classifier_path.exists():
        return TaskClassifier.load(zoo.classifier_path)
    # Training: only for a zoo that lacks one (a serving process imports none of the zoo's building).
    from specserve.cluster.zoo.task_classifier import train_from_corpora, zoo_corpora

    try:
        corpora = zoo_corpora(zoo)
    except FileNotFoundError as exc:
        log.warning("%s; requests without a task get the default task", exc)
        return None
    log.warning("zoo %s has no %s (built before that stage): training the task classifier from its corpora "
                "now; `specserve zoo build` saves it in the zoo", zoo.root, zoo.classifier_path.name)
    return train_from_corpora(corpora, zoo.manifest["seed"])
