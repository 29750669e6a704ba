"""A built model zoo on disk: where it lives and what its manifest says."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from specserve.workers.request import GENERAL_TASK

MANIFEST = "manifest.json"
MANIFEST_KEYS = ("tasks", "target", "drafts", "task_drafts", "acceptance")  # what serving a zoo reads
CLASSIFIER = "classifier.npz"  # the task classifier (specserve.workers.classifier)
DEFAULT_HOME = "~/.cache/specserve"  # overridden by the SPECSERVE_HOME environment variable
# The built-in presets' names (presets.py defines them; a serving process reads only the names, so
# it imports none of the zoo's building).
PRESET_NAMES = ("tiny", "demo", "bench")
GENERAL_DRAFT = GENERAL_TASK  # the draft distilled on every task's data, the fallback for unknown tasks


@dataclass(frozen=True)
class Corpus:
    task: str
    train: list[str]  # documents used for training
    held_out: list[str]  # documents never used for training (evaluation prompts come from here)


def specserve_home() -> Path:
    return Path(os.environ.get("SPECSERVE_HOME") or DEFAULT_HOME).expanduser()


def default_zoo_dir(preset: str) -> Path:
    return specserve_home() / "zoo" / preset


def corpus_file(root: Path, task: str) -> Path:
    return Path(root) / "corpora" / f"{task}.json"


def read_corpus(root: Path, task: str) -> Corpus:
    saved = json.loads(corpus_file(root, task).read_text())
    return Corpus(task, saved["train"], saved["held_out"])


class ZooNotBuilt(FileNotFoundError):
    """No complete zoo at the given directory."""


@dataclass(frozen=True)
class Zoo:
    root: Path
    manifest: dict

    @classmethod
    def open(cls, root: Path) -> Zoo:
        path = Path(root) / MANIFEST
        try:
            if not path.exists():
                raise ZooNotBuilt(f"no complete zoo at {root}: build it with `specserve zoo build --out {root}`")
            manifest = json.loads(path.read_text())
            missing = [key for key in MANIFEST_KEYS if key not in manifest] if isinstance(manifest, dict) else MANIFEST_KEYS
            if missing:
                raise ValueError(f"the zoo at {root} has a broken {MANIFEST} (no {', '.join(missing)}): not a zoo's, "
                                 f"or from an interrupted build; rebuild it with `specserve zoo build --out {root}`")
            return cls(Path(root), manifest)
        except PermissionError as exc:
            raise PermissionError(f"cannot read the zoo at {root} ({exc.strerror}: {exc.filename}): give the user "
                                  f"running specserve read access to it, or build one of its own with "
                                  f"`specserve zoo build --out DIR`") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"the zoo at {root} has a broken {MANIFEST} ({exc}): an interrupted build or copy; "
                             f"rebuild it with `specserve zoo build --out {root}`") from None

    @property
    def tasks(self) -> list[str]:
        return list(self.manifest["tasks"])

    @property
    def draft_names(self) -> list[str]:
        return list(self.manifest["drafts"])

    @property
    def target_dir(self) -> Path:
        return self.root / self.manifest["target"]["path"]

    @property
    def classifier_path(self) -> Path:
        """The task classifier; absent in zoos built before it was a build stage, until rebuilt."""
        return self.root / CLASSIFIER

    def corpus(self, task: str) -> Corpus:
        """The documents of ``task`` the zoo was built from, train and held out."""
        return read_corpus(self.root, task)

    def draft_dir(self, name: str) -> Path:
        if name not in self.manifest["drafts"]:
            raise ValueError(f"unknown draft {name!r}; this zoo has: {', '.join(self.draft_names)}")
        return self.root / self.manifest["drafts"][name]["path"]

    def default_draft(self, task: str) -> str:
        """The draft the zoo built for ``task`` (its preferred one)."""
        if task not in self.manifest["task_drafts"]:
            raise ValueError(f"unknown task {task!r}; this zoo knows: {', '.join(self.tasks)}")
        return self.manifest["task_drafts"][task][0]

    def prompts(self, task: str) -> list[str]:
        """Held-out prompts of ``task`` (never trained on), for demos and benchmarks."""
        return json.loads((self.root / "prompts.json").read_text())[task]
