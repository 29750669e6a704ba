"""The held-out benchmark prompts, and the check that the zoo being measured never trained on them."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from specserve.cluster.zoo.zoo import Zoo

PROMPTS_DIR = Path(__file__).parent / "prompts"
JSON_ASK = "\nAnswer in JSON: "  # what the JSON-schema bench appends to each prompt (bench/json_schema.py)
log = logging.getLogger(__name__)


@dataclass
class HeldOutPrompts:
    by_task: dict[str, list[str]]
    found_in_training: dict[str, int] = field(default_factory=dict)  # left out: the zoo trained on them
    checked: int = 0


def load_prompts(zoo: Zoo) -> HeldOutPrompts:
    """The prompts of each of the zoo's tasks, less any that occurs in the zoo's training split."""
    result = HeldOutPrompts({})
    for task in zoo.tasks:
        path = PROMPTS_DIR / f"{task}.json"
        if not path.exists():
            raise ValueError(f"no benchmark prompts for task {task!r}: expected {path}")
        prompts = json.loads(path.read_text())
        training = zoo.corpus(task).train
        kept = [p for p in prompts if not any(p in document for document in training)]
        result.by_task[task] = kept
        result.found_in_training[task] = len(prompts) - len(kept)
        result.checked += len(prompts)
        if len(kept) < len(prompts):
            log.warning("%s: %d of %d benchmark prompts occur in the zoo's training text; left out",
                        task, len(prompts) - len(kept), len(prompts))
        if not kept:
            raise ValueError(f"every benchmark prompt of {task!r} occurs in the zoo's training text")
    return result
