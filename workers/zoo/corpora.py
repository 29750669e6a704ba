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
"""

from __future__ import annotations

import ast
import calendar
import hashlib
import os
import random
import re
import sysconfig
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

TASKS: tuple[str, ...] = ("code", "sql", "math", "prose")
HELD_OUT_FRACTION = 0.05
HELD_OUT_CHAR_CAP = 2 * HELD_OUT_FRACTION  # share of a corpus's characters that may be held out
MIN_DOC_CHARS, MAX_DOC_CHARS = 100, 4_000  # shorter says nothing; longer overflows a small context
CODE_MERGE_BELOW, CODE_CHUNK_MAX = 200, 3_000  # one-line defs join their neighbour; long bodies split
PROSE_MERGE_BELOW, PROSE_CHUNK_MAX = 300, 2_000  # roughly a paragraph or two per document
MIN_DOCSTRING_CHARS = 200  # short docstrings are one-line summaries, not prose
MAX_SOURCE_BYTES = 200_000  # the few larger stdlib files are mostly generated tables (pydoc topics)
MAX_TEXT_FILE_CHARS = 50_000  # some copyright files run to megabytes of repeated licence text
SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"})
DOC_DIRS = (Path("/usr/share/common-licenses"), Path("/usr/share/doc"))

_DEF_START = re.compile(r"(?:async def|def|class)\s|@")  # a top-level definition or its decorator
_SURROGATE = re.compile("[\ud800-\udfff]")  # the only str content that fails .encode("utf-8")
# Machine-readable Debian copyright stanzas (file lists, holders) are metadata, not English.
_DEP5_STANZA = re.compile(r"(?:Format|Upstream-[\w-]+|Source|Files|Copyright):")
# A sentence ends after a word (or its closing bracket or quote), so that initials and
# abbreviations such as "L." or "e.g." do not end one.
_SENTENCE_END = re.compile(r"\w[\w)\"'’][.!?](?=\s)")


@dataclass(frozen=True)
class Corpus:
    task: str
    train: list[str]  # documents used for training
    held_out: list[str]  # documents never used for training (evaluation prompts come from here)


def build_corpus(task: str, seed: int, max_chars: int) -> Corpus:
    """Deterministic for (task, seed, max_chars); train + held_out hold at most max_chars characters."""
    _check_task(task)
    if max_chars <= 0:
        raise ValueError(f"max_chars must be > 0, got {max_chars}")
    sources: dict[str, Callable[[int], Iterable[tuple[str, str]]]] = {
        "code": _code_docs, "sql": _sql_docs, "math": _math_docs, "prose": _prose_docs,
    }
    items = _take(sources[task](seed), max_chars)
    random.Random(seed).shuffle(items)  # code and prose arrive file by file; mix them
    train, held_out = split_held_out([doc for _, doc in items], HELD_OUT_FRACTION, keys=[key for key, _ in items])
    return Corpus(task, train, held_out)


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
        (held_out if _is_held_out(key, fraction) else train).append(doc)
    return train, held_out


def _is_held_out(key: str, fraction: float) -> bool:
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


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


# ----------------------------------------------------------------------------- shared text handling


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
        doc = _tidy(doc)
        if not MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS or doc in seen or _SURROGATE.search(doc):
            continue
        held_out = _is_held_out(key, HELD_OUT_FRACTION)
        if held_out and held_out_total + len(doc) > held_out_limit:
            continue
        if total + len(doc) > max_chars:
            break
        taken.append((key, doc))
        seen.add(doc)
        total += len(doc)
        held_out_total += len(doc) if held_out else 0
    return taken


def _tidy(text: str) -> str:
    """No NULs, no leading blank lines, no trailing whitespace; leading indentation is kept (code)."""
    return re.sub(r"^(?:[ \t]*\n)+", "", text.replace("\0", "")).rstrip()


def _pack(pieces: Iterable[str], merge_below: int, chunk_max: int, sep: str) -> Iterator[str]:
    """Documents from pieces: short pieces join the next one, long ones are cut to chunk_max."""
    buffer = ""
    for piece in pieces:
        for part in _split_long(piece, chunk_max):
            part = _tidy(part)
            if part:
                buffer = f"{buffer}{sep}{part}" if buffer else part
            if len(buffer) >= merge_below:
                yield buffer
                buffer = ""
    if buffer:
        yield buffer


def _split_long(text: str, chunk_max: int) -> list[str]:
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


def _paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each dedented with tabs expanded and line ends trimmed."""
    text = text.replace("\r\n", "\n").expandtabs(4)
    text = re.sub(r"(?m)^ \.$", "", text)  # Debian copyright files write blank lines as " ."
    paragraphs = (textwrap.dedent(p) for p in re.split(r"\n[ \t]*\n", text))
    return [re.sub(r"[ \t]+\n", "\n", p).strip("\n") for p in paragraphs if p.strip()]


def _read_text(path: Path, max_chars: int) -> str | None:
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


def _interleave(*sources: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """Round-robin over sources, so a small corpus still samples every one of them."""
    iterators = [iter(source) for source in sources]
    while iterators:
        for iterator in list(iterators):
            try:
                yield next(iterator)
            except StopIteration:
                iterators.remove(iterator)


# ----------------------------------------------------------------------------- code and prose


def _stdlib_files(seed: int) -> list[Path]:
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
    held = [f for f in files if _is_held_out(_stdlib_key(f), HELD_OUT_FRACTION)]
    kept = [f for f in files if not _is_held_out(_stdlib_key(f), HELD_OUT_FRACTION)]
    every = max(1, round(1 / HELD_OUT_FRACTION) - 1)  # train files between two held-out ones
    ordered: list[Path] = []
    for i, path in enumerate(kept):
        if i % every == 0 and held:
            ordered.append(held.pop())
        ordered.append(path)
    return ordered + held


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


def _stdlib_key(path: Path) -> str:
    """The held-out unit of code and docstring prose: the stdlib file, whichever task reads it."""
    return f"stdlib:{path.relative_to(sysconfig.get_paths()['stdlib'])}"


def _code_docs(seed: int) -> Iterator[tuple[str, str]]:
    for path in _stdlib_files(seed):
        source = _read_text(path, MAX_SOURCE_BYTES)
        if source:
            for doc in _pack(_top_level_pieces(source), CODE_MERGE_BELOW, CODE_CHUNK_MAX, "\n\n\n"):
                yield _stdlib_key(path), doc


def _prose_docs(seed: int) -> Iterator[tuple[str, str]]:
    return _interleave(_docstring_docs(seed), _topic_docs(seed), _text_file_docs(seed))


def _prose_pack(text: str) -> Iterator[str]:
    paragraphs = [p for p in _paragraphs(text) if not _DEP5_STANZA.match(p)]
    return _pack(paragraphs, PROSE_MERGE_BELOW, PROSE_CHUNK_MAX, "\n\n")


def _docstring_docs(seed: int) -> Iterator[tuple[str, str]]:
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for path in _stdlib_files(seed):
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):  # ValueError: source with NUL bytes
            continue
        for node in ast.walk(tree):
            doc = ast.get_docstring(node) if isinstance(node, documented) else None
            if doc and len(doc) >= MIN_DOCSTRING_CHARS:
                yield from ((_stdlib_key(path), paragraph) for paragraph in _prose_pack(doc))


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
        text = _read_text(path, MAX_TEXT_FILE_CHARS) if path.is_file() else None
        if text:
            yield from ((f"file:{path}", paragraph) for paragraph in _prose_pack(text))


# ----------------------------------------------------------------------------- sql

_PEOPLE = "Ada Lovelace|Grace Hopper|Alan Turing|Maria Garcia|Wei Chen|Priya Patel|Tom Novak|Sara Ali"
# One line per table: "column TYPE kind[=values]"; kinds: label (display name), cat, num=lo..hi,
# date, email, fk=table. Every table also has "id INTEGER PRIMARY KEY".
_SCHEMAS: dict[str, dict[str, str]] = {
    "shop": {
        "customers": f"name TEXT label={_PEOPLE}; email TEXT email; "
        "country TEXT cat=France|Germany|Japan|Brazil|Canada|India; signup_date DATE date",
        "products": "name TEXT label=Desk Lamp|Office Chair|Notebook|USB Cable|Monitor|Backpack; "
        "category TEXT cat=Furniture|Lighting|Stationery|Electronics; price REAL num=5..900; "
        "stock INTEGER num=0..500",
        "orders": "customer_id INTEGER fk=customers; order_date DATE date; "
        "status TEXT cat=pending|shipped|delivered|cancelled; total_amount REAL num=10..2000",
        "order_items": "order_id INTEGER fk=orders; product_id INTEGER fk=products; "
        "quantity INTEGER num=1..20; unit_price REAL num=5..900",
    },
    "hr": {
        "departments": "name TEXT label=Engineering|Sales|Marketing|Finance|Support|Legal; "
        "location TEXT cat=London|Berlin|Toronto|Singapore; budget INTEGER num=100000..5000000",
        "employees": f"name TEXT label={_PEOPLE}; department_id INTEGER fk=departments; "
        "job_title TEXT cat=Engineer|Analyst|Manager|Designer|Recruiter; hire_date DATE date; "
        "salary INTEGER num=30000..200000",
        "salaries": "employee_id INTEGER fk=employees; amount INTEGER num=30000..200000; "
        "effective_date DATE date",
    },
    "school": {
        "teachers": f"name TEXT label={_PEOPLE}; "
        "subject TEXT cat=Mathematics|Physics|History|Literature|Biology; hire_date DATE date",
        "courses": "title TEXT label=Algebra I|World History|Organic Chemistry|Poetry Workshop; "
        "teacher_id INTEGER fk=teachers; level TEXT cat=introductory|intermediate|advanced; "
        "credits INTEGER num=1..6",
        "students": f"name TEXT label={_PEOPLE}; city TEXT cat=Boston|Chicago|Denver|Seattle|Austin; "
        "grade_year INTEGER num=9..12; enrolled_on DATE date",
        "enrollments": "student_id INTEGER fk=students; course_id INTEGER fk=courses; "
        "semester TEXT cat=2023-spring|2023-fall|2024-spring|2024-fall; score INTEGER num=0..100",
    },
    "web": {
        "users": "username TEXT label=sky_walker|data_nerd|night_owl|pixel_pusher|coffee_fan; "
        "country TEXT cat=US|DE|FR|JP|BR|IN; plan TEXT cat=free|pro|team|enterprise; "
        "created_at TIMESTAMP date",
        "sessions": "user_id INTEGER fk=users; device TEXT cat=desktop|mobile|tablet; "
        "started_at TIMESTAMP date; duration_seconds INTEGER num=5..7200",
        "page_views": "session_id INTEGER fk=sessions; url TEXT cat=/home|/pricing|/docs|/blog|/signup; "
        "viewed_at TIMESTAMP date; load_ms INTEGER num=50..5000",
        "events": "user_id INTEGER fk=users; event_type TEXT cat=click|signup|purchase|share|logout; "
        "occurred_at TIMESTAMP date; value REAL num=0..500",
    },
}
_Sql = tuple[str, list[str]]  # (question, query lines)
_AGGREGATES = (("total", "SUM"), ("average", "AVG"), ("highest", "MAX"), ("lowest", "MIN"))


@dataclass(frozen=True)
class _Column:
    name: str
    type: str
    kind: str
    values: tuple[str, ...]  # choices for label/cat, (lo, hi) for num, (table,) for fk

    @property
    def words(self) -> str:
        return self.name.replace("_", " ")


@dataclass(frozen=True)
class _Table:
    name: str
    columns: tuple[_Column, ...]  # without the implicit id

    @property
    def alias(self) -> str:  # order_items -> oi; unique within each schema
        return "".join(part[0] for part in self.name.split("_"))

    @property
    def plural(self) -> str:
        return self.name.replace("_", " ")

    @property
    def singular(self) -> str:
        return re.sub("ies$", "y", self.plural).removesuffix("s")

    @property
    def shown(self) -> str:  # the column a person would read: a name or title, else the id
        return next((c.name for c in self.of("label")), "id")

    def of(self, kind: str) -> list[_Column]:
        return [c for c in self.columns if c.kind == kind]


def _parse_table(name: str, spec: str) -> _Table:
    columns = []
    for entry in spec.split("; "):
        column, type_, kind = entry.split(" ", 2)
        kind, _, values = kind.partition("=")
        columns.append(_Column(column, type_, kind, tuple(re.split(r"\||\.\.", values))))
    return _Table(name, tuple(columns))


def _sql_docs(seed: int) -> Iterator[tuple[str, str]]:
    rng = random.Random(seed)
    schemas = [[_parse_table(n, s) for n, s in tables.items()] for tables in _SCHEMAS.values()]
    templates = (_sql_filter, _sql_group, _sql_join, _sql_missing, _sql_cte, _sql_window, _sql_month,
                 _sql_insert, _sql_update, _sql_create)
    while True:
        question, clauses = rng.choice(templates)(rng, rng.choice(schemas))
        doc = f"-- {question}\n" + "\n".join(clauses) + ";"
        yield doc, doc  # generated: each document is its own source


def _with(rng: random.Random, tables: list[_Table], *kinds: str) -> _Table:
    """A table having every kind of column; each schema is written to have one for every template."""
    return rng.choice([t for t in tables if all(t.of(kind) for kind in kinds)])


def _parent(tables: list[_Table], fk: _Column) -> _Table:
    return next(t for t in tables if t.name == fk.values[0])


def _a(words: str) -> str:
    return f"{'an' if words[0] in 'aeiou' else 'a'} {words}"


def _number(rng: random.Random, column: _Column) -> int:
    return rng.randint(int(column.values[0]), int(column.values[1]))


def _sql_filter(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "num")
    num, k = rng.choice(t.of("num")), rng.choice((3, 5, 10, 20))
    head, order, v = [f"SELECT {t.shown}, {num.name}", f"FROM {t.name}"], f"ORDER BY {num.name} DESC", \
        _number(rng, num)
    return rng.choice([
        (f"Show the top {k} {t.plural} by {num.words}.", head + [order, f"LIMIT {k}"]),
        (f"Which {t.plural} have {_a(num.words)} above {v}, highest first?",
         head + [f"WHERE {num.name} > {v}", order]),
        (f"Which {t.plural} have {_a(num.words)} above the average?",
         head + [f"WHERE {num.name} > (SELECT AVG({num.name}) FROM {t.name})", order]),
    ])


def _sql_group(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "cat", "num")
    cat, num, (word, fn) = rng.choice(t.of("cat")), rng.choice(t.of("num")), rng.choice(_AGGREGATES)
    alias, v = f"{fn.lower()}_{num.name}", _number(rng, num)
    if rng.random() < 0.4:
        return f"How many {t.plural} are there for each {cat.words}?", [
            f"SELECT {cat.name}, COUNT(*) AS {t.name}_count", f"FROM {t.name}",
            f"GROUP BY {cat.name}", f"ORDER BY {t.name}_count DESC"]
    return f"What is the {word} {num.words} of {t.plural} per {cat.words}, if above {v}?", [
        f"SELECT {cat.name}, {fn}({num.name}) AS {alias}", f"FROM {t.name}", f"GROUP BY {cat.name}",
        f"HAVING {fn}({num.name}) > {v}", f"ORDER BY {alias} DESC"]


def _sql_join(rng: random.Random, tables: list[_Table]) -> _Sql:
    """An aggregate of a child table per parent row, sometimes two joins up (order_items per customer)."""
    c = _with(rng, tables, "fk", "num")
    num, (word, fn), k = rng.choice(c.of("num")), rng.choice(_AGGREGATES), rng.choice((5, 10, 25))
    hops = [(c, rng.choice(c.of("fk")))]  # (child, its foreign key), walking up to the parent
    while (up := _parent(tables, hops[-1][1])).of("fk") and rng.random() < 0.5:
        hops.append((up, rng.choice(up.of("fk"))))
    p, alias = _parent(tables, hops[-1][1]), f"{fn.lower()}_{num.name}"
    joins = [f"JOIN {child.name} AS {child.alias} ON {child.alias}.{key.name} = "
             f"{_parent(tables, key).alias}.id" for child, key in reversed(hops)]
    return f"What is the {word} {num.words} of {c.plural} for each {p.singular}? Show the top {k}.", [
        f"SELECT {p.alias}.{p.shown}, {fn}({c.alias}.{num.name}) AS {alias}",
        f"FROM {p.name} AS {p.alias}", *joins, f"GROUP BY {p.alias}.{p.shown}",
        f"ORDER BY {alias} DESC", f"LIMIT {k}"]


def _sql_missing(rng: random.Random, tables: list[_Table]) -> _Sql:
    c = _with(rng, tables, "fk")
    fk = rng.choice(c.of("fk"))
    p = _parent(tables, fk)
    head, on = [f"SELECT {p.alias}.{p.shown}", f"FROM {p.name} AS {p.alias}"], \
        f"{c.alias}.{fk.name} = {p.alias}.id"
    if rng.random() < 0.5:
        return f"Which {p.plural} have no {c.plural}?", head + [
            f"LEFT JOIN {c.name} AS {c.alias} ON {on}", f"WHERE {c.alias}.id IS NULL"]
    return f"List the {p.plural} without any {c.plural}.", head + [
        f"WHERE NOT EXISTS (SELECT 1 FROM {c.name} AS {c.alias} WHERE {on})"]


def _sql_cte(rng: random.Random, tables: list[_Table]) -> _Sql:
    c = _with(rng, tables, "fk", "num")
    fk, num = rng.choice(c.of("fk")), rng.choice(c.of("num"))
    p, v, total = _parent(tables, fk), _number(rng, num) * rng.choice((2, 5, 10)), f"total_{num.name}"
    return f"Which {p.plural} have a total {num.words} over {v}?", [
        "WITH totals AS (", f"    SELECT {fk.name}, SUM({num.name}) AS {total}", f"    FROM {c.name}",
        f"    GROUP BY {fk.name}", ")", f"SELECT {p.alias}.{p.shown}, totals.{total}", "FROM totals",
        f"JOIN {p.name} AS {p.alias} ON {p.alias}.id = totals.{fk.name}",
        f"WHERE totals.{total} > {v}", f"ORDER BY totals.{total} DESC"]


def _sql_window(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "cat", "num")
    cat, num, k = rng.choice(t.of("cat")), rng.choice(t.of("num")), rng.choice((1, 3, 5))
    over, shown = f"OVER (PARTITION BY {cat.name} ORDER BY {num.name} DESC)", \
        f"{t.shown}, {cat.name}, {num.name}"
    if rng.random() < 0.5:
        return f"Rank {t.plural} by {num.words} within each {cat.words}.", [
            f"SELECT {shown},", f"       RANK() {over} AS {num.name}_rank",
            f"FROM {t.name}", f"ORDER BY {cat.name}, {num.name}_rank"]
    return f"Find the top {k} {t.plural} by {num.words} in each {cat.words}.", [
        "WITH ranked AS (", f"    SELECT {shown},", f"           ROW_NUMBER() {over} AS row_num",
        f"    FROM {t.name}", ")", f"SELECT {shown}", "FROM ranked", f"WHERE row_num <= {k}"]


def _sql_month(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "date")
    day, year, month = rng.choice(t.of("date")), rng.randint(2021, 2024), rng.randint(1, 11)
    return f"List the {t.plural} whose {day.name} falls in {calendar.month_name[month]} {year}.", [
        "SELECT *", f"FROM {t.name}", f"WHERE {day.name} >= '{year}-{month:02d}-01'",
        f"  AND {day.name} < '{year}-{month + 1:02d}-01'", f"ORDER BY {day.name}"]


def _sql_insert(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = rng.choice(tables)
    values = {c.name: _sql_value(rng, c) for c in t.columns}
    label = next((values[c.name][1:-1] for c in t.of("label")), None)  # unquoted
    for c in t.of("email"):  # only tables with a label have an email
        values[c.name] = f"'{label.lower().replace(' ', '.')}@example.com'"
    question = f"Add a new {t.singular} named {label}." if label else f"Record a new {t.singular}."
    return question, [f"INSERT INTO {t.name} ({', '.join(values)})", f"VALUES ({', '.join(values.values())})"]


def _sql_value(rng: random.Random, column: _Column) -> str:
    if column.kind in ("label", "cat"):
        return f"'{rng.choice(column.values)}'"
    if column.kind == "num":
        return str(_number(rng, column))
    if column.kind == "fk":
        return str(rng.randint(1, 500))
    return f"'{rng.randint(2021, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}'"  # date


def _sql_update(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = _with(rng, tables, "cat", "num")
    cat, num, pct = rng.choice(t.of("cat")), rng.choice(t.of("num")), rng.choice((5, 10, 15, 20))
    value, row = rng.choice(cat.values), rng.randint(1, 500)
    if rng.random() < 0.5:
        return f"Increase the {num.words} of {t.plural} with {cat.words} {value} by {pct} percent.", [
            f"UPDATE {t.name}", f"SET {num.name} = {num.name} * {1 + pct / 100:.2f}",
            f"WHERE {cat.name} = '{value}'"]
    return f"Change the {cat.words} of {t.singular} number {row} to {value}.", [
        f"UPDATE {t.name}", f"SET {cat.name} = '{value}'", f"WHERE id = {row}"]


def _sql_create(rng: random.Random, tables: list[_Table]) -> _Sql:
    t = rng.choice(tables)
    lines = ["    id INTEGER PRIMARY KEY"]
    for c in t.columns:
        required = " NOT NULL" if c.kind in ("fk", "label") or rng.random() < 0.3 else ""
        refers = f" REFERENCES {c.values[0]} (id)" if c.kind == "fk" else ""
        lines.append(f"    {c.name} {c.type}{required}{refers}")
    exists = " IF NOT EXISTS" if rng.random() < 0.5 else ""
    return f"Create the {t.name} table.", [f"CREATE TABLE{exists} {t.name} (", ",\n".join(lines), ")"]


# ----------------------------------------------------------------------------- math

_NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam")
_ITEMS = ("notebooks", "apples", "pencils", "tickets", "cupcakes", "comic books", "plant pots")
_Problem = tuple[str, list[str], int]  # (question, steps, answer)
_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a // b,
}


def _calc(a: int, op: str, b: int) -> tuple[str, int]:
    """("a op b = c", c): every step the model sees is exact integer arithmetic."""
    if op == "/" and a % b:
        raise ArithmeticError(f"{a} / {b} is not an integer; the template chose bad numbers")
    result = _OPS[op](a, b)
    return f"{a} {op} {b} = {result}", result


def _math_docs(seed: int) -> Iterator[tuple[str, str]]:
    rng = random.Random(seed)
    templates = (_shopping, _travel, _sharing, _garden, _discount, _packing, _wages, _expression)
    while True:
        question, steps, answer = rng.choice(templates)(rng)
        lines = [f"Question: {question}"] + [f"Step {i}: {s}" for i, s in enumerate(steps, 1)]
        doc = "\n".join(lines + [f"Answer: {answer}"])
        yield doc, doc  # generated: each document is its own source


def _shopping(rng: random.Random) -> _Problem:
    name, item, n, price = rng.choice(_NAMES), rng.choice(_ITEMS), rng.randint(2, 9), rng.randint(2, 20)
    cost_text, cost = _calc(n, "*", price)
    bill = min(b for b in (20, 50, 100, 200) if b >= cost)
    change_text, change = _calc(bill, "-", cost)
    return (f"{name} buys {n} {item} at ${price} each and pays with a ${bill} bill. How much change "
            f"does {name} get?", [f"The {item} cost {cost_text} dollars.",
                                  f"The change is {change_text} dollars."], change)


def _travel(rng: random.Random) -> _Problem:
    vehicle = rng.choice(("train", "bus", "cyclist", "car", "ferry"))
    (s1, h1), (s2, h2) = [(rng.randint(10, 90), rng.randint(1, 6)) for _ in range(2)]
    (first_text, first), (second_text, second) = _calc(s1, "*", h1), _calc(s2, "*", h2)
    total_text, total = _calc(first, "+", second)
    return (f"A {vehicle} travels at {s1} km per hour for {h1} hours, then at {s2} km per hour for {h2} "
            f"hours. How many kilometres does it travel in total?", [f"First part: {first_text} km.",
            f"Second part: {second_text} km.", f"Total distance: {total_text} km."], total)


def _sharing(rng: random.Random) -> _Problem:
    name, trays, per = rng.choice(_NAMES), rng.randint(2, 9), rng.randint(4, 24)
    total_text, total = _calc(trays, "*", per)
    friends = rng.choice([k for k in range(2, 13) if total % k == 0])  # trays itself always divides
    each_text, each = _calc(total, "/", friends)
    return (f"{name} bakes {trays} trays of {per} cookies and shares them equally among {friends} "
            f"friends. How many cookies does each friend get?",
            [f"There are {total_text} cookies.", f"Each friend gets {each_text} cookies."], each)


def _garden(rng: random.Random) -> _Problem:
    length, width, cost = rng.randint(6, 30), rng.randint(5, 20), rng.randint(2, 9)
    side = rng.randint(2, min(length, width) - 1)
    (area_text, area), (patio_text, patio) = _calc(length, "*", width), _calc(side, "*", side)
    grass_text, grass = _calc(area, "-", patio)
    price_text, price = _calc(grass, "*", cost)
    return (f"A garden is {length} m long and {width} m wide. A square patio with sides of {side} m is "
            f"built in it, and grass seed for the rest costs ${cost} per square metre. How much does "
            f"the seed cost?", [f"The garden covers {area_text} square metres.", f"The patio covers "
            f"{patio_text} square metres.", f"Grass covers {grass_text} square metres.",
            f"The seed costs {price_text} dollars."], price)


def _discount(rng: random.Random) -> _Problem:
    item = rng.choice(("jacket", "bicycle", "lamp", "backpack", "guitar"))
    price, rate = 20 * rng.randint(1, 25), rng.choice(range(5, 55, 5))  # so price * rate / 100 is whole
    scaled_text, scaled = _calc(price, "*", rate)
    off_text, off = _calc(scaled, "/", 100)
    sale_text, sale = _calc(price, "-", off)
    return (f"A {item} costs ${price} and is on sale for {rate}% off. What is the sale price?",
            [f"Multiply the price by the rate: {scaled_text}.", f"The discount is {off_text} dollars.",
             f"The sale price is {sale_text} dollars."], sale)


def _packing(rng: random.Random) -> _Problem:
    crates, per, box = rng.randint(3, 12), rng.randint(3, 12), rng.randint(2, 6)
    total_text, total = _calc(crates, "*", per)
    broken = total - box * rng.randint(1, (total - 1) // box)  # what is left fills whole boxes
    rest_text, rest = _calc(total, "-", broken)
    boxes_text, boxes = _calc(rest, "/", box)
    return (f"A farm fills {crates} crates with {per} jars of honey each. {broken} jars crack, and the "
            f"rest are packed into boxes of {box}. How many boxes are filled?",
            [f"There are {total_text} jars.", f"Unbroken jars: {rest_text}.",
             f"Boxes filled: {boxes_text}."], boxes)


def _wages(rng: random.Random) -> _Problem:
    name, rate, hours, days = rng.choice(_NAMES), rng.randint(9, 40), rng.randint(3, 10), rng.randint(2, 6)
    daily_text, daily = _calc(rate, "*", hours)
    gross_text, gross = _calc(daily, "*", days)
    fee = rng.randint(1, gross // 4)
    net_text, net = _calc(gross, "-", fee)
    return (f"{name} earns ${rate} per hour and works {hours} hours a day for {days} days, then pays "
            f"${fee} in fees. How much does {name} keep?", [f"Each day pays {daily_text} dollars.",
            f"The days pay {gross_text} dollars.", f"After fees: {net_text} dollars."], net)


def _expression(rng: random.Random) -> _Problem:
    a, b, c = rng.randint(2, 50), rng.randint(2, 50), rng.randint(2, 12)
    sum_text, total = _calc(a, "+", b)
    product_text, product = _calc(total, "*", c)
    d = rng.randint(1, product - 1)  # keep the result positive
    result_text, result = _calc(product, "-", d)
    return (f"What is ({a} + {b}) * {c} - {d}?",
            [f"Add first: {sum_text}.", f"Multiply: {product_text}.", f"Subtract: {result_text}."], result)
