"""Corpora for the draft-model zoo: deterministic, held-out split by text, exact arithmetic, usable prompts."""

import re
from pathlib import Path

import pytest

from specserve.cluster.zoo import corpora
from specserve.cluster.zoo.corpora import task_prose
from specserve.cluster.zoo.corpora import (
    HELD_OUT_FRACTION, TASKS, Corpus, build_corpus, prompt_of, split_held_out,
)

SIZE = 200_000
SCHEMA_TABLES = {  # written out here so the test does not trust the generator's own tables
    "shop": {"customers", "orders", "products", "order_items"},
    "hr": {"employees", "departments", "salaries"},
    "school": {"students", "courses", "enrollments", "teachers"},
    "web": {"users", "sessions", "page_views", "events"},
}
STEP_ARITHMETIC = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")


@pytest.fixture(scope="module")
def built() -> dict[str, Corpus]:
    return {task: build_corpus(task, seed=0, max_chars=SIZE) for task in TASKS}


@pytest.fixture(scope="module")
def large() -> dict[str, Corpus]:
    """Corpora of code and prose large enough to read hundreds of files."""
    return {task: build_corpus(task, seed=0, max_chars=3_000_000) for task in ("code", "prose")}


def all_docs(corpus: Corpus) -> list[str]:
    return corpus.train + corpus.held_out


@pytest.mark.parametrize("task", TASKS)
def test_same_arguments_same_corpus(task, built):
    assert build_corpus(task, seed=0, max_chars=SIZE) == built[task]


@pytest.mark.parametrize("task", ["sql", "math"])
def test_other_seed_other_documents(task, built):
    other = build_corpus(task, seed=1, max_chars=SIZE)
    assert set(all_docs(other)) != set(all_docs(built[task]))


@pytest.mark.parametrize("task", TASKS)
def test_documents_are_clean_and_within_budget(task, built):
    docs = all_docs(built[task])
    assert SIZE * 0.9 <= sum(map(len, docs)) <= SIZE
    for doc in docs:
        assert corpora.MIN_DOC_CHARS <= len(doc) <= corpora.MAX_DOC_CHARS
        assert "\0" not in doc and doc == doc.rstrip()
        doc.encode("utf-8")


@pytest.mark.parametrize("task", TASKS)
def test_held_out_is_disjoint_and_about_the_fraction(task, built, large):
    corpus = built[task]
    assert corpus.held_out and not set(corpus.train) & set(corpus.held_out)
    # Code and prose hold out whole files: a small corpus has few, so check the fraction on a large one.
    corpus = large[task] if task in large else corpus
    assert 0.01 < len(corpus.held_out) / len(all_docs(corpus)) < 0.12


def test_split_depends_on_text_only():
    docs = [f"document number {i} " * 8 for i in range(20_000)]
    train, held_out = split_held_out(docs, HELD_OUT_FRACTION)
    assert abs(len(held_out) / len(docs) - HELD_OUT_FRACTION) < 0.01  # ~5 sigma at n = 20k
    # A document's side is the same in any subset, in any order, and for every copy of it.
    subset = docs[::7][::-1] + docs[:50]
    sub_train, sub_held_out = split_held_out(subset, HELD_OUT_FRACTION)
    assert set(sub_held_out) == set(subset) & set(held_out)
    assert set(sub_train) == set(subset) & set(train)
    assert len(sub_train) + len(sub_held_out) == len(subset)


def test_math_steps_are_exact():
    problems = all_docs(build_corpus("math", seed=3, max_chars=60_000))
    assert len(problems) > 200
    ops = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "/": int.__floordiv__}
    for problem in problems:
        lines = problem.split("\n")
        assert lines[0].startswith("Question: ") and lines[-1].startswith("Answer: ")
        last = None
        for number, line in enumerate(lines[1:-1], 1):
            assert line.startswith(f"Step {number}: ")
            found = STEP_ARITHMETIC.findall(line)
            assert found, line
            for a, op, b, c in found:
                a, b, c = int(a), int(b), int(c)
                assert ops[op](a, b) == c and (op != "/" or a % b == 0), line
                last = c
        assert lines[-1] == f"Answer: {last}"


def test_sql_documents_are_commented_queries_over_four_schemas(built):
    queries = all_docs(built["sql"])
    tables = set()
    for query in queries:
        comment, body = query.split("\n", 1)
        assert comment.startswith("-- ") and query.endswith(";")
        assert re.match(r"(SELECT|WITH|INSERT|UPDATE|CREATE TABLE)\b", body), query
        tables |= set(re.findall(r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE(?: IF NOT EXISTS)?) (\w+)", body))
    assert all(tables & names for names in SCHEMA_TABLES.values())
    statements = {re.match(r"\w+", q.split("\n", 1)[1]).group() for q in queries}
    assert statements >= {"SELECT", "WITH", "INSERT", "UPDATE", "CREATE"}


@pytest.mark.parametrize("task", TASKS)
def test_prompts_are_proper_prefixes(task, built):
    for doc in built[task].held_out:
        prompt = prompt_of(doc, task)
        assert prompt.strip() and doc.startswith(prompt) and len(prompt) <= 160
        assert prompt == prompt.rstrip(), "a prompt ending in whitespace derails byte-level BPE models"
        assert doc[len(prompt):].strip(), "nothing left to generate"
        if task == "sql" and len(doc.split("\n")[0]) < 160:
            assert prompt == doc.split("\n")[0]
        if task == "math":
            assert prompt.startswith("Question: ") and "Step" not in prompt


def test_prompt_respects_a_tiny_budget():
    doc = "Question: What is 2 + 3?\nStep 1: 2 + 3 = 5.\nAnswer: 5"
    assert prompt_of(doc, "math") == "Question: What is 2 + 3?"
    assert prompt_of(doc, "math", max_chars=12) == "Question:"
    assert prompt_of("x" * 200, "prose", max_chars=5) == "xxxxx"


def test_unknown_task_names_the_valid_ones():
    with pytest.raises(ValueError) as error:
        build_corpus("poetry", seed=0, max_chars=1_000)
    assert all(task in str(error.value) for task in TASKS)
    with pytest.raises(ValueError, match="valid tasks"):
        prompt_of("some document text", "poetry")


def test_prose_without_usr_share_doc(monkeypatch):
    monkeypatch.setattr(task_prose, "DOC_DIRS", (Path("/nonexistent/licenses"), Path("/nonexistent/doc")))
    corpus = build_corpus("prose", seed=0, max_chars=50_000)
    assert corpus.train and sum(map(len, all_docs(corpus))) <= 50_000


def test_no_held_out_text_is_trained_on_by_another_task(large):
    """Docstring prose comes from the same stdlib files as code: a held-out prose paragraph must not
    sit inside a code training document (compared with whitespace folded: docstrings are indented)."""
    code, prose = large["code"], large["prose"]

    def folded(texts):
        return "\x00".join(" ".join(t.split()) for t in texts)

    code_train = folded(code.train)
    leaked_prose = [d for d in prose.held_out if " ".join(d.split()) in code_train]
    assert not leaked_prose, f"{len(leaked_prose)} held-out prose documents are in the code training set"
    code_held_out = folded(code.held_out)  # and the other way round: trained prose inside held-out code
    leaked_code = [d for d in prose.train if " ".join(d.split()) in code_held_out]
    assert not leaked_code, f"{len(leaked_code)} prose training documents are inside held-out code"
    docstring_sources = [d for d in prose.held_out if " ".join(d.split()) in code_held_out]
    assert docstring_sources, "some held-out docstrings should come from held-out code files (same source key)"
