"""Prompt lookup (n-gram) drafting: propose what followed the last time the context's ending occurred.

Saxena's prompt lookup decoding, as transformers' ``PromptLookupCandidateGenerator`` and vLLM's
n-gram proposer do it: take the last ``n`` tokens of the request (prompt and output so far), find
an earlier occurrence of them in the same request, and propose the tokens that followed it. Code
edits, quoting, SQL that repeats column names and text that restates its prompt make such matches
common; elsewhere it proposes nothing, and the step is an ordinary target-only one.

The proposal is a deterministic function of the committed tokens, so its q is one-hot on each
proposed token: exactly the distribution it was "drawn" from, and the acceptance rule stays lossless.

An index from each n-gram to where its latest occurrence was followed is kept up to date as tokens
are committed, so a lookup costs ``max_n`` dictionary probes whatever the request's length.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from .config import FrozenConfig


class NgramConfig(FrozenConfig):
    """Prompt lookup: the n-gram lengths it matches, longest first."""

    min_n: int = Field(2, ge=1)  # a 1-token match is mostly noise (a space, a bracket)
    max_n: int = Field(4, ge=1, le=32)  # transformers' prompt_lookup_max_ngram default is 2; longer matches are surer

    @model_validator(mode="after")
    def _ordered(self) -> NgramConfig:
        if self.min_n > self.max_n:
            raise ValueError(f"ngram.min_n ({self.min_n}) must not exceed ngram.max_n ({self.max_n})")
        return self


class NgramIndex:
    """The tokens of one request and, per n, where each n-gram's latest occurrence was followed."""

    def __init__(self, tokens: Sequence[int] = (), config: NgramConfig = NgramConfig()) -> None:
        self.config = config
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest occurrence
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Commit ``tokens`` after the ones held. Each n-gram ending just before a new token is
        indexed then, once it has a continuation."""
        for token in tokens:
            end = len(self.tokens)  # the new token's index: the n-grams ending before it now have a follower
            for n in range(self.config.min_n, min(self.config.max_n, end) + 1):
                self._next[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(token)

    def match(self) -> tuple[int, int]:
        """(n, start): the longest n-gram ending the tokens that occurred before with a follower,
        and that follower's index; (0, -1) when none did."""
        for n in range(min(self.config.max_n, len(self.tokens)), self.config.min_n - 1, -1):
            start = self._next.get(tuple(self.tokens[-n:]))
            if start is not None:
                return n, start
        return 0, -1

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens: those that followed the longest matching n-gram (none: no match)."""
        n, start = self.match()
        if not n or k < 1:
            return []
        # A match ending near the end can run into the tokens being continued (periodic text): the
        # proposal then repeats the period, which is what the text would do.
        out: list[int] = []
        while len(out) < k:
            index = start + len(out)
            out.append(self.tokens[index] if index < len(self.tokens) else out[index - len(self.tokens)])
        return out
