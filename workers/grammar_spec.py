"""What a request constrains its output to (a JSON schema, a regular expression, a Lark grammar),
checked and compiled at the edge: llguidance alone, imported where a grammar is first compiled, and
no torch, so that requests are made and checked without a model (workers/grammar.py masks the
target with them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "lark")
MAX_GRAMMAR_CHARS = 64 * 1024  # a schema or grammar's source; far above any tool list a client sends
ANY_OBJECT = {"type": "object"}  # response_format json_object: any JSON object
# JSON is laid out as Python's json.dumps does, with no other whitespace: with whitespace free
# between tokens a model can pad forever (a small one does, from the first brace) and never
# produce the JSON before max_tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar that does not compile; the message says where."""


@dataclass(frozen=True)
class GrammarSpec:
    """What a request constrains its output to: ``kind`` (one of GRAMMAR_KINDS) and its source text
    (a JSON schema as JSON, a regular expression, a Lark grammar; empty for json_object)."""

    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise GrammarError(f"a grammar's kind is one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")
        if len(self.source) > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"a {self.kind} grammar is at most {MAX_GRAMMAR_CHARS} characters, "
                               f"got {len(self.source)}")

    def compiled(self) -> str:
        """llguidance's form of the grammar, checked (a GrammarError says what is wrong)."""
        return compile_grammar(self.kind, self.source)


def load_llguidance():
    """llguidance, imported where a grammar is first used: a deployment that never constrains an
    output runs without it (the GPU bundle, .ci/gpu/, carries only what every request needs)."""
    try:
        import llguidance
        import llguidance.hf
    except ImportError:
        raise GrammarError("structured output needs the llguidance package, which this deployment lacks: "
                           "pip install llguidance (deploy/constraints.txt pins it)") from None
    return llguidance


@lru_cache(maxsize=256)
def compile_grammar(kind: str, source: str) -> str:
    llguidance = load_llguidance()
    if kind in ("json_object", "json_schema"):
        try:
            schema = ANY_OBJECT if kind == "json_object" else json.loads(source)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema is a JSON object, got {type(schema).__name__}")
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_LAYOUT)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema does not compile: {exc}") from None
    elif kind == "regex":
        grammar = llguidance.LLMatcher.grammar_from_regex(source)
    else:
        grammar = llguidance.LLMatcher.grammar_from_lark(source)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise GrammarError(f"the {kind.replace('_', ' ')} does not compile: {first_line(messages[0])}")
    return grammar


def first_line(message: str) -> str:
    """llguidance's error: its first line and the regex engine's ``error:`` line, less the source
    excerpts and carets it draws under them."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    kept = lines[:1] + [line for line in lines[1:] if line.startswith("error:")]
    return " ".join(kept) if kept else "unknown error"
