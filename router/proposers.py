"""Where a request's draft tokens come from: one interface for every proposer.

In the spirit of transformers' ``CandidateGenerator``: a proposer ``propose``s up to k tokens after
the request's committed ones, each with the exact distribution q it was drawn from, and learns the
verdict when the session ``commit``s it. The session's loop (propose, verify, commit, emit) and the
routing policy treat every proposer alike; what differs is where its tokens come from:

    ModelDraft      a draft model on a draft worker, over its session stream (router/model_draft.py)
    LookupProposer  draft-free, in the router itself: prompt lookup (``ngram``) or suffix decoding
                    (``suffix``) over the request's tokens and its task's recent outputs. Its
                    proposals are deterministic, so q is one-hot and travels as ids alone.
    TreeProposer    several of these at once, their proposals merged into one token tree
                    (``tree``: router/token_tree.py)

A proposer that can no longer propose (its draft worker lost, none left to reopen on) raises
``ProposerGone``; the request goes on target-only, its output unchanged.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specserve.proto.v1 import internal_pb2 as pb
from specserve.workers.ngram import NgramConfig, NgramIndex
from specserve.workers.suffix_tree import SuffixConfig, SuffixProposer, TaskOutputs

if TYPE_CHECKING:
    from .session import Session

NGRAM, SUFFIX = "ngram", "suffix"
DRAFT_FREE = (NGRAM, SUFFIX)
TREE = "tree"  # a task's draft and draft-free proposers at once, as one token tree (router/token_tree.py)
RESERVED = (*DRAFT_FREE, TREE)  # proposer names no draft model may take
EMPTY_PROPOSAL = pb.Proposal()


class ProposerGone(Exception):
    """The proposer cannot propose any more (the reason is the message): go on target-only."""


class Proposer(ABC):
    """One request's source of draft tokens."""

    name: str
    reopens = 0  # its worker replaced mid-request (a draft model's)
    misses = 0  # steps it had nothing to propose for (a draft-free one without a match): its coverage

    async def open(self) -> None:
        """Be ready to propose after the request's committed tokens."""

    @abstractmethod
    async def propose(self, k: int) -> pb.Proposal:
        """Up to ``k`` tokens after the committed ones, with their q (empty ids: none this step)."""

    def draft_ahead(self, proposal: pb.Proposal) -> None:
        """The target is verifying ``proposal``: start on the next one meanwhile, if this proposer can."""

    def commit(self, proposal: pb.Proposal, verdict: pb.Verdict) -> None:
        """The request committed ``verdict`` on ``proposal``, this proposer's last one."""
        self.follow(verdict.num_accepted, [verdict.token])

    def follow(self, accepted: int, appended: Sequence[int]) -> None:
        """Of this proposer's last proposal, the first ``accepted`` tokens were committed, then
        ``appended`` (the target's token; in a token tree, first another branch's accepted tokens)."""

    async def close(self) -> None:
        """The request is done: free whatever the proposer holds."""

    def abandon(self) -> None:
        """The request was cancelled or failed: free everything now (idempotent)."""


class LookupProposer(Proposer):
    """Prompt lookup or suffix decoding over the request's committed tokens, in the router."""

    def __init__(self, session: Session, name: str, source: NgramIndex | SuffixProposer) -> None:
        self.session = session
        self.name = name
        self.source = source  # .tokens, .extend(ids), .propose(k)

    async def propose(self, k: int) -> pb.Proposal:
        started = time.perf_counter()
        committed = self.session.decoding.committed_ids()
        self.source.extend(committed[len(self.source.tokens) :])
        proposal = pb.Proposal(ids=self.source.propose(k) if k >= 1 else [])
        proposal.seconds = time.perf_counter() - started  # its c: microseconds a token
        self.misses += k >= 1 and not proposal.ids
        self.session.times.draft_steps.append(proposal.seconds)
        self.session.count_draft(proposal)
        return proposal


@dataclass
class DraftFree:
    """The router's draft-free proposers: their configs, and each task's recent outputs (the
    suffix proposer's global tries), shared by the task's requests."""

    ngram: NgramConfig = field(default_factory=NgramConfig)
    suffix: SuffixConfig = field(default_factory=SuffixConfig)
    outputs: dict[str, TaskOutputs] = field(default_factory=dict)

    def proposer(self, name: str, session: Session) -> LookupProposer:
        return LookupProposer(session, name, self._source(name, session.task.task))

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

