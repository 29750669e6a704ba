"""The bookkeeping of one request's speculative loop, written once for every place the loop runs.

The in-process engine (``engine.py``) and the router's request (``router/request.py``) drive the
same algorithm (propose, verify, commit, emit) over different transports: method calls on local
models, or streams to workers. What they share is here: how long a proposal may be, what is
committed, the statistics, and the client's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from .logprobs import TokenLogprobs
from .request import GenerationParams
from .stats import SpecStats
from .stopping import Chunk, OutputAssembler


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: SpecStats
    draft: str | None
    logprobs: TokenLogprobs | None = None


class Decoding:
    """One request's committed tokens, output and statistics."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: Sequence[int], params: GenerationParams,
                 seed: int) -> None:
        self.prompt_ids = list(prompt_ids)
        self.stats = SpecStats(seed=seed)
        self.output = OutputAssembler(tokenizer, params.max_tokens, params.stop)

    @property
    def finished(self) -> bool:
        return bool(self.output.finish_reason)

    @property
    def remaining(self) -> int:
        """Tokens the request may still commit."""
        return self.output.remaining

    @property
    def committed(self) -> list[int]:
        """The output's tokens committed so far."""
        return self.output.token_ids

    def committed_ids(self) -> list[int]:
        """The prompt and every token committed so far: what a replacement worker prefills."""
        return self.prompt_ids + self.output.token_ids

    def draft_length(self, k: int) -> int:
        """``k`` for the next proposal: a step commits up to k + 1 tokens, so it never drafts past
        max_tokens. Below 1, the step proposes nothing (target-only)."""
        return min(k, self.remaining - 1)

    def commit(self, proposed: Sequence[int], num_accepted: int, token: int,
               logprobs: TokenLogprobs | None = None, ended: str = "") -> Chunk:
        """Commit the verdict's tokens (the accepted prefix, then the target's token; with their
        ``logprobs``) and return the output they add, up to the first stop condition: what the loop
        emits. ``ended``: the target ends the text after them, and why."""
        return self.output.add(list(proposed[:num_accepted]) + [token], logprobs, ended)

    def completion(self, draft: str | None) -> Completion:
        out = self.output
        return Completion(out.text, out.token_ids, out.finish_reason or "length", self.stats, draft, out.logprobs)
