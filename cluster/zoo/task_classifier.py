"""The zoo's task classifier: its examples (corpora, users' labelled files), training, and the one a router uses.

Requests look like the zoo's prompts: the start of a document (``prompt_of``), or text pasted from
the middle of one. The classifier therefore trains on both kinds of slice of the *training*
documents, and is evaluated on the prompts of the held-out documents, which it never saw.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from specserve.workers.classifier import TaskClassifier

from .corpora import Corpus, prompt_of
from .presets import stage_seed
from .zoo import Zoo


STAGE = "classifier"  # the build stage, and the name its seed is derived from
# Training documents sampled per task: enough for every task's vocabulary (accuracy on the demo zoo's
# held-out prompts is flat from ~500 on), and balanced however large each corpus is.
DOCS_PER_TASK = 2000
SLICE_CHARS = (40, 600)  # length range of the slices a document is cut into
TASK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a task is a name in configs, stats and flags


def corpus_examples(corpus: Corpus, seed: int) -> list[tuple[str, str]]:
    """Per sampled training document, its prompt, then all of it in slices of whole lines."""
    rng = random.Random(seed)
    docs = corpus.train if len(corpus.train) <= DOCS_PER_TASK else rng.sample(corpus.train, DOCS_PER_TASK)
    examples = []
    for doc in docs:
        examples.append((prompt_of(doc, corpus.task), corpus.task))
        examples += [(piece, corpus.task) for piece in _line_slices(doc, rng)]
    return examples


def _line_slices(doc: str, rng: random.Random) -> list[str]:
    """``doc`` cut into consecutive runs of lines of random length: text pasted from a document's middle.

    All of it, not one slice per document: the tiny zoo has ~100 code documents, and one slice each
    left a third of its held-out code prompts misread as prose (13 of 15 right with every line used).
    """
    pieces, start = [], 0
    while start < len(doc):
        end = start + rng.randint(*SLICE_CHARS)
        line_end = doc.rfind("\n", start + 1, end)
        if end < len(doc) and line_end > start:  # a line longer than the slice is cut where it falls
            end = line_end
        if piece := doc[start:end].lstrip("\n").rstrip():  # keeps indentation: it is evidence
            pieces.append(piece)
        start = end
    return pieces


def held_out_examples(corpus: Corpus) -> list[tuple[str, str]]:
    """The prompt of every held-out document (the zoo's prompts.json holds the first few of these)."""
    return [(prompt_of(doc, corpus.task), corpus.task) for doc in corpus.held_out]


def train_from_corpora(corpora: Mapping[str, Corpus], seed: int,
                       labelled: Iterable[tuple[str, str]] = ()) -> TaskClassifier:
    """The classifier of these corpora (as the zoo's build stage trains it for ``seed``), plus ``labelled``."""
    examples = [example for task, corpus in corpora.items()
                for example in corpus_examples(corpus, stage_seed(seed, f"{STAGE}:{task}"))]
    return TaskClassifier.train([*examples, *labelled])


def zoo_corpora(zoo: Zoo) -> dict[str, Corpus]:
    try:
        return {task: zoo.corpus(task) for task in zoo.tasks}
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"zoo {zoo.root} has no corpora to train a task classifier from "
                                f"({exc.filename} is missing)") from None


def read_labelled(path: str | Path) -> list[tuple[str, str]]:
    """(text, task) pairs from a JSONL file of {"text": ..., "task": ...} objects; blank lines are skipped."""
    examples = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for number, line in enumerate(lines, 1):
        if line.strip():
            examples.append(_labelled_example(line, f"{path}:{number}"))
    if not examples:
        raise ValueError(f"{path} has no examples; write one JSON object per line: "
                         '{"text": "...", "task": "..."}')
    return examples


def _labelled_example(line: str, where: str) -> tuple[str, str]:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(item, dict) or not isinstance(item.get("text"), str) or not isinstance(item.get("task"), str):
        raise ValueError(f'{where}: expected an object with string fields "text" and "task", got {line.strip():.80}')
    if not item["text"].strip():
        raise ValueError(f"{where}: text is empty")
    if not TASK_NAME.fullmatch(item["task"]):
        raise ValueError(f"{where}: task must be 1-64 letters, digits, '_', '-' or '.' starting with a letter "
                         f"or digit, got {item['task']!r}")
    return item["text"], item["task"]
