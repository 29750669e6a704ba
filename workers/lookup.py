"""Draft-free proposers: prompt lookup (``ngram``) and suffix decoding (``suffix``).

They propose from the request's own tokens (and, for suffix decoding, its task's recent outputs),
with no model: microseconds a token, in whatever process runs the loop (the router, or the
in-process engine). Their proposals are deterministic, so q is one-hot and travels as ids alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .drafting import DraftTokens
from .ngram import NgramConfig, NgramIndex
from .proposer_kinds import DRAFT_FREE, NGRAM, SUFFIX
from .proposing import Committed, Proposer, StepRecorder
from .suffix_tree import SuffixConfig, SuffixProposer, TaskOutputs

class LookupProposer(Proposer):
    """Prompt lookup or suffix decoding over the request's committed tokens."""

    def __init__(self, name: str, source: NgramIndex | SuffixProposer, recorder: StepRecorder,
                 committed: Sequence[int]) -> None:
        self.name = name
        self.source = source  # .tokens, .extend(ids), .propose(k)
        self.source.extend(committed)
        self.recorder = recorder
        self.proposed: list[int] = []  # its last proposal

    async def propose(self, k: int) -> DraftTokens:
        started = time.perf_counter()
        self.proposed = self.source.propose(k) if k >= 1 else []
        seconds = time.perf_counter() - started  # its c: microseconds a token
        if k >= 1 and not self.proposed:
            self.recorder.missed()
        self.recorder.waited(seconds)
        self.recorder.drafted(len(self.proposed), seconds)
        return DraftTokens.of_ids(self.proposed)

    def commit(self, step: Committed) -> None:
        self.source.extend(self.proposed[: step.accepted] + list(step.appended))
        self.proposed = []


@dataclass
class DraftFree:
    """The draft-free proposers: their configs, and each task's recent outputs (the suffix
    proposer's global tries), shared by the task's requests."""

    ngram: NgramConfig = field(default_factory=NgramConfig)
    suffix: SuffixConfig = field(default_factory=SuffixConfig)
    outputs: dict[str, TaskOutputs] = field(default_factory=dict)

    def proposer(self, name: str, task: str, recorder: StepRecorder, committed: Sequence[int]) -> LookupProposer:
        """``name``'s proposer for a request of ``task`` that has ``committed`` these tokens so far."""
        return LookupProposer(name, self._source(name, task), recorder, committed)

    def score(self, name: str, task: str, prompt_ids: Sequence[int],
              output_ids: Sequence[int]) -> tuple[int, int, int]:
        """Full information: (positions, proposed, matches) over a verified greedy output: the
        positions where the proposer had a first token to propose, and where that token was the target's."""
        source = self._source(name, task)
        source.extend(prompt_ids)
        proposed = matches = 0
        for token in output_ids:
            guess = source.propose(1)
            proposed += bool(guess)
            matches += bool(guess) and guess[0] == token
            source.extend([token])
        return len(output_ids), proposed, matches

    def _source(self, name: str, task: str) -> NgramIndex | SuffixProposer:
        if name == NGRAM:
            return NgramIndex(config=self.ngram)
        if name == SUFFIX:
            return SuffixProposer((), self._outputs(task), self.suffix)
        raise ValueError(f"{name!r} is not a draft-free proposer ({', '.join(DRAFT_FREE)})")

    def learn(self, task: str, output_ids: Sequence[int]) -> None:
        """A finished request's output joins its task's global trie."""
        self._outputs(task).add(output_ids)

    def _outputs(self, task: str) -> TaskOutputs:
        if task not in self.outputs:
            self.outputs[task] = TaskOutputs(self.suffix)
        return self.outputs[task]
