"""Deterministic text corpora for the draft-model zoo, built from text every machine has: no downloads.

Where each task's documents come from
- code:  the Python standard library's own source (``sysconfig`` stdlib path, tests and vendored trees
  skipped), cut at top-level ``def``/``class`` boundaries so a document is one definition or a chunk
  of ~1.5-3k characters.
- sql:   a seeded generator of commented queries over four small schemas (shop, hr, school, web):
  ``-- question`` then the query, upper-case keywords, one clause per line.
- math:  a seeded generator of arithmetic word problems worked step by step ("Question:", "Step n:",
  "Answer:"), every step an exact integer operation.
- prose: English from stdlib docstrings, ``pydoc_data`` help topics, and, when installed, the plain
  text files of /usr/share/common-licenses and /usr/share/doc/*/, cut into paragraph-sized documents.

Held-out documents are chosen by a hash of their source, not by position or by the seed: a source is
held out in every corpus that contains it, whatever the seed or size. The source of a generated SQL
or math document is its own text; the source of code and of docstring prose is the stdlib file they
come from, so a held-out file is held out of both tasks (its docstrings are inside its code: split
by document, a held-out prose paragraph would be trained on as part of a code document). A model
trained on one corpus is therefore never evaluated on text it saw, even against a corpus built with
other arguments.

Corpora are deterministic per machine: code and prose depend on the installed Python and packages.

Here is the framework: what a corpus is, how its documents are chosen and split, and a prompt cut from
one. ``documents.py`` holds what the tasks share (the held-out rule, reading and packing text, the
stdlib's files); ``task_code.py``, ``task_prose.py``, ``task_sql.py`` and ``task_math.py`` each
yield one task's (source key, document) pairs.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Iterator

from ..zoo import Corpus
from .documents import HELD_OUT_FRACTION, is_held_out, split_held_out, tidy
from .task_code import code_docs
from .task_math import math_docs
from .task_prose import prose_docs
from .task_sql import sql_docs

TASKS: tuple[str, ...] = ("code", "sql", "math", "prose")
HELD_OUT_CHAR_CAP = 2 * HELD_OUT_FRACTION  # share of a corpus's characters that may be held out
MIN_DOC_CHARS, MAX_DOC_CHARS = 100, 4_000  # shorter says nothing; longer overflows a small context
SOURCES: dict[str, Callable[[int], Iterator[tuple[str, str]]]] = {  # task -> its (source key, document) pairs
    "code": code_docs, "sql": sql_docs, "math": math_docs, "prose": prose_docs,
}

_SURROGATE = re.compile("[\ud800-\udfff]")  # the only str content that fails .encode("utf-8")
# A sentence ends after a word (or its closing bracket or quote), so that initials and
# abbreviations such as "L." or "e.g." do not end one.
_SENTENCE_END = re.compile(r"\w[\w)\"'’][.!?](?=\s)")


def build_corpus(task: str, seed: int, max_chars: int) -> Corpus:
    """Deterministic for (task, seed, max_chars); train + held_out hold at most max_chars characters."""
    _check_task(task)
    if max_chars <= 0:
        raise ValueError(f"max_chars must be > 0, got {max_chars}")
    items = _take(SOURCES[task](seed), max_chars)
    random.Random(seed).shuffle(items)  # code and prose arrive file by file; mix them
    train, held_out = split_held_out([doc for _, doc in items], HELD_OUT_FRACTION, keys=[key for key, _ in items])
    return Corpus(task, train, held_out)


def prompt_of(document: str, task: str, max_chars: int = 160) -> str:
    """The start of a document, cut at a natural boundary, at most max_chars, leaving text to generate."""
    _check_task(task)
    # Stop before the last visible character so the continuation is never empty or only whitespace.
    limit = min(max_chars, len(document.rstrip()) - 1)
    if limit < 1:
        raise ValueError(f"document too short for a prompt ({len(document)} chars) or max_chars < 1")
    sentence_ends = [m.end() for m in _SENTENCE_END.finditer(document)]
    line_ends = [m.end() for m in re.finditer(r"\n", document)]
    word_ends = [m.start() for m in re.finditer(r"\s", document)]
    preferred = {
        "code": line_ends,
        "sql": line_ends[:1],  # the "-- question" line
        "math": [document.find("\nStep 1:") + 1],  # the whole problem statement
        "prose": sentence_ends,
    }[task]
    for ends in (preferred, sentence_ends, line_ends, word_ends):
        fitting = [end for end in ends if 0 < end <= limit and document[:end].strip()]
        if fitting:
            return _without_trailing_space(document[:max(fitting)])
    return _without_trailing_space(document[:limit])


def _without_trailing_space(prompt: str) -> str:
    # Byte-level BPE merges whitespace with what follows it ("\n    return" is "\n   " + " return"),
    # so a prompt ending in whitespace stops at a token boundary the model rarely saw in training
    # and derails it (measured on the demo zoo: code prompts ending in "\n" made the target emit
    # only newlines). Ending on the visible text lets the model produce the whitespace itself.
    return prompt.rstrip()


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")


def _take(items: Iterable[tuple[str, str]], max_chars: int) -> list[tuple[str, str]]:
    """Clean, unique, well-sized (source key, document) pairs until the next would pass max_chars.

    Held-out documents past HELD_OUT_CHAR_CAP of the budget are skipped: code and prose hold out
    whole files, and one large held-out file read first must not crowd out the training text.
    """
    held_out_limit = int(max_chars * HELD_OUT_CHAR_CAP)
    taken: list[tuple[str, str]] = []
    seen: set[str] = set()
    total = held_out_total = 0
    for key, doc in items:
        doc = tidy(doc)
        if not MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS or doc in seen or _SURROGATE.search(doc):
            continue
        held_out = is_held_out(key, HELD_OUT_FRACTION)
        if held_out and held_out_total + len(doc) > held_out_limit:
            continue
        if total + len(doc) > max_chars:
            break
        taken.append((key, doc))
        seen.add(doc)
        total += len(doc)
        held_out_total += len(doc) if held_out else 0
    return taken
