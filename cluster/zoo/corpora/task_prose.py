"""The prose task: English from stdlib docstrings (their source is their stdlib file, held out of code
too), ``pydoc_data`` help topics, and, when installed, the plain text files of
/usr/share/common-licenses and /usr/share/doc/*/, cut into paragraph-sized documents."""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Iterator
from pathlib import Path

from .documents import interleave, pack, paragraphs, read_text, stdlib_files, stdlib_key

PROSE_MERGE_BELOW, PROSE_CHUNK_MAX = 300, 2_000  # roughly a paragraph or two per document
MIN_DOCSTRING_CHARS = 200  # short docstrings are one-line summaries, not prose
MAX_TEXT_FILE_CHARS = 50_000  # some copyright files run to megabytes of repeated licence text
DOC_DIRS = (Path("/usr/share/common-licenses"), Path("/usr/share/doc"))

# Machine-readable Debian copyright stanzas (file lists, holders) are metadata, not English.
_DEP5_STANZA = re.compile(r"(?:Format|Upstream-[\w-]+|Source|Files|Copyright):")


def prose_docs(seed: int) -> Iterator[tuple[str, str]]:
    return interleave(_docstring_docs(seed), _topic_docs(seed), _text_file_docs(seed))


def _prose_pack(text: str) -> Iterator[str]:
    kept = [p for p in paragraphs(text) if not _DEP5_STANZA.match(p)]
    return pack(kept, PROSE_MERGE_BELOW, PROSE_CHUNK_MAX, "\n\n")


def _docstring_docs(seed: int) -> Iterator[tuple[str, str]]:
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for path in stdlib_files(seed):
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):  # ValueError: source with NUL bytes
            continue
        for node in ast.walk(tree):
            doc = ast.get_docstring(node) if isinstance(node, documented) else None
            if doc and len(doc) >= MIN_DOCSTRING_CHARS:
                yield from ((stdlib_key(path), paragraph) for paragraph in _prose_pack(doc))


def _topic_docs(seed: int) -> Iterator[tuple[str, str]]:
    from pydoc_data.topics import topics  # stdlib, but a 0.5 MB import only prose needs

    keys = sorted(topics)
    random.Random(seed).shuffle(keys)
    for key in keys:
        yield from ((f"topic:{key}", paragraph) for paragraph in _prose_pack(topics[key]))


def _text_file_docs(seed: int) -> Iterator[tuple[str, str]]:
    """Licences and package READMEs; silently nothing in slim containers that strip /usr/share/doc."""
    licences = sorted(DOC_DIRS[0].glob("*")) if DOC_DIRS[0].is_dir() else []
    readmes = sorted(
        path for path in (DOC_DIRS[1].glob("*/*") if DOC_DIRS[1].is_dir() else [])
        if path.name == "copyright" or path.name.startswith("README") or path.suffix == ".txt"
    )
    paths = [p for p in licences + readmes if p.suffix not in {".gz", ".bz2", ".xz", ".html"}]
    random.Random(seed).shuffle(paths)
    for path in paths:
        text = read_text(path, MAX_TEXT_FILE_CHARS) if path.is_file() else None
        if text:
            yield from ((f"file:{path}", paragraph) for paragraph in _prose_pack(text))
