"""What every task's corpus shares: the held-out rule (by a hash of a document's source), reading,
tidying, cutting and packing text, and the standard library's files that code and prose both read."""

from __future__ import annotations

import hashlib
import os
import random
import re
import sysconfig
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path

HELD_OUT_FRACTION = 0.05
MAX_SOURCE_BYTES = 200_000  # the few larger stdlib files are mostly generated tables (pydoc topics)
SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"})


def split_held_out(
    docs: list[str], fraction: float, keys: list[str] | None = None
) -> tuple[list[str], list[str]]:
    """(train, held_out), each document's side fixed by a hash of its key (default: its text), so
    documents with one key, and duplicates, share a side."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    train: list[str] = []
    held_out: list[str] = []
    for doc, key in zip(docs, keys if keys is not None else docs, strict=True):
        (held_out if is_held_out(key, fraction) else train).append(doc)
    return train, held_out


def is_held_out(key: str, fraction: float) -> bool:
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


# ----------------------------------------------------------------------------- text


def tidy(text: str) -> str:
    """No NULs, no leading blank lines, no trailing whitespace; leading indentation is kept (code)."""
    return re.sub(r"^(?:[ \t]*\n)+", "", text.replace("\0", "")).rstrip()


def pack(pieces: Iterable[str], merge_below: int, chunk_max: int, sep: str) -> Iterator[str]:
    """Documents from pieces: short pieces join the next one, long ones are cut to chunk_max."""
    buffer = ""
    for piece in pieces:
        for part in split_long(piece, chunk_max):
            part = tidy(part)
            if part:
                buffer = f"{buffer}{sep}{part}" if buffer else part
            if len(buffer) >= merge_below:
                yield buffer
                buffer = ""
    if buffer:
        yield buffer


def split_long(text: str, chunk_max: int) -> list[str]:
    """Cut text at line ends (sentence ends inside over-long lines), preferring blank lines."""
    if len(text) <= chunk_max:
        return [text]
    chunks, current = [], ""
    for line in text.splitlines(keepends=True):
        units = [line] if len(line) <= chunk_max else re.findall(r".*?[.!?]\s+|.+", line, re.S)
        for unit in units:
            full = len(current) + len(unit) > chunk_max
            if current and (full or (len(current) >= chunk_max // 2 and not unit.strip())):
                chunks.append(current)
                current = ""
            current += unit
    return chunks + [current]


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each dedented with tabs expanded and line ends trimmed."""
    text = text.replace("\r\n", "\n").expandtabs(4)
    text = re.sub(r"(?m)^ \.$", "", text)  # Debian copyright files write blank lines as " ."
    dedented = (textwrap.dedent(p) for p in re.split(r"\n[ \t]*\n", text))
    return [re.sub(r"[ \t]+\n", "\n", p).strip("\n") for p in dedented if p.strip()]


def read_text(path: Path, max_chars: int) -> str | None:
    """A UTF-8 text file's start (ending at a paragraph break if cut), or None for binary/non-UTF-8."""
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\0" in text:
        return None
    if len(text) > max_chars:
        cut = text.rfind("\n\n", 0, max_chars)
        text = text[: cut if cut > 0 else max_chars]
    return text


def interleave(*sources: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """Round-robin over sources, so a small corpus still samples every one of them."""
    iterators = [iter(source) for source in sources]
    while iterators:
        for iterator in list(iterators):
            try:
                yield next(iterator)
            except StopIteration:
                iterators.remove(iterator)


# ----------------------------------------------------------------------------- the standard library's files


def stdlib_files(seed: int) -> list[Path]:
    """Stdlib .py files in a seeded order, so a small corpus reads few files yet varies by seed."""
    files = []
    for folder, subfolders, names in os.walk(sysconfig.get_paths()["stdlib"]):
        subfolders[:] = [d for d in subfolders if d not in SKIPPED_DIRS]  # prune: site-packages is huge
        paths = (Path(folder, name) for name in names if name.endswith(".py"))
        files += [path for path in paths if path.stat().st_size <= MAX_SOURCE_BYTES]
    files.sort()
    random.Random(seed).shuffle(files)
    # A small corpus reads only the first files; spread the held-out ones evenly through the order so
    # that it still holds some out (which files are held out does not change: that is by path).
    held = [f for f in files if is_held_out(stdlib_key(f), HELD_OUT_FRACTION)]
    kept = [f for f in files if not is_held_out(stdlib_key(f), HELD_OUT_FRACTION)]
    every = max(1, round(1 / HELD_OUT_FRACTION) - 1)  # train files between two held-out ones
    ordered: list[Path] = []
    for i, path in enumerate(kept):
        if i % every == 0 and held:
            ordered.append(held.pop())
        ordered.append(path)
    return ordered + held


def stdlib_key(path: Path) -> str:
    """The held-out unit of code and docstring prose: the stdlib file, whichever task reads it."""
    return f"stdlib:{path.relative_to(sysconfig.get_paths()['stdlib'])}"
