"""Draft-free proposers: prompt lookup (``ngram``) and suffix decoding (``suffix``).

They propose from the request's own tokens (and, for suffix decoding, its task's recent outputs),
with no model: microseconds a token, in whatever process runs the loop (the router, or the
in-process engine). Their proposals are deterministic, so q is one-hot and travels as ids alone.
"""

from __future__ import annotations

import time
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from enum import Enum

from .drafting import DraftTokens
from .ngram import NgramConfig, NgramIndex
from .proposing import Committed, Proposer, StepRecorder
from .suffix_tree import SuffixConfig, SuffixProposer, TaskOutputs

NGRAM, SUFFIX = "ngram", "suffix"
DRAFT_FREE = (NGRAM, SUFFIX)
TREE = "tree"  # a task's draft and draft-free proposers at once, as one token tree (workers/token_tree.py)
CASCADE = "cascade"  # a task's draft model with prompt lookup under it (workers/drafting.py)
RESERVED = (*DRAFT_FREE, TREE, CASCADE)  # proposer names no draft model may take
# A version of a draft served beside it (a canary, cluster/canary.py) is named ``draft@version``:
# it drafts as the draft does (same kind, same target layers), from other weights.
VERSION_MARK = "@"


def base_draft(name: str) -> str:
    """The draft a name is a version of (``eagle3@v2`` -> ``eagle3``); a draft's own name is its own."""
    return name.split(VERSION_MARK, 1)[0]


class ProposerKind(Enum):
    DRAFT = "draft"  # a draft model: on a draft worker, or in process
    HEAD = "head"  # an EAGLE-3 head: a draft fed the target's hidden states (workers/heads/)
    MEDUSA = "medusa"  # Medusa heads: guesses from the target's last hidden state, where it verifies
    DRAFT_FREE = "draft_free"  # prompt lookup or suffix decoding: no model, wherever the loop runs
    TREE = "tree"  # several of a task's proposers merged into one token tree (workers/token_tree.py)
    CASCADE = "cascade"  # a draft model verifying prompt lookup's guesses as it drafts (workers/drafting.py)


def kind_of(name: str, heads: Container[str] = (), medusa: Container[str] = ()) -> ProposerKind:
    """What a proposer's name makes it: the one place a name is read so (``heads``: the names of
    the served EAGLE-3 heads; ``medusa``: of Medusa heads). The engine and the router build each
    kind their own way; the policy and the scorer price and score by kind."""
    if name in DRAFT_FREE:
        return ProposerKind.DRAFT_FREE
    if name == TREE:
        return ProposerKind.TREE
    if name == CASCADE:
        return ProposerKind.CASCADE
    if name in medusa:
        return ProposerKind.MEDUSA
    return ProposerKind.HEAD if base_draft(name) in heads else ProposerKind.DRAFT


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
