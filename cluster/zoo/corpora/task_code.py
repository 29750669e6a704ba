"""The code task: the Python standard library's own source, cut at top-level ``def``/``class``
boundaries so a document is one definition or a chunk of ~1.5-3k characters; a document's source is
its stdlib file (held out of prose too)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from .documents import MAX_SOURCE_BYTES, pack, read_text, stdlib_files, stdlib_key

CODE_MERGE_BELOW, CODE_CHUNK_MAX = 200, 3_000  # one-line defs join their neighbour; long bodies split

_DEF_START = re.compile(r"(?:async def|def|class)\s|@")  # a top-level definition or its decorator


def code_docs(seed: int) -> Iterator[tuple[str, str]]:
    for path in stdlib_files(seed):
        source = read_text(path, MAX_SOURCE_BYTES)
        if source:
            for doc in pack(_top_level_pieces(source), CODE_MERGE_BELOW, CODE_CHUNK_MAX, "\n\n\n"):
                yield stdlib_key(path), doc


def _top_level_pieces(source: str) -> list[str]:
    """Split a module before each top-level def/class (keeping decorators with their definition)."""
    pieces: list[str] = []
    current: list[str] = []
    after_decorator = False
    for line in source.splitlines(keepends=True):
        if _DEF_START.match(line) and not after_decorator and current:
            pieces.append("".join(current))
            current = []
        current.append(line)
        if line.strip():
            after_decorator = line.startswith("@")
    return pieces + ["".join(current)]
