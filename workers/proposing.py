"""Where a request's draft tokens come from: one interface for every proposer.

In the spirit of transformers' ``CandidateGenerator`` (two verbs): a proposer ``propose``s up to k
tokens after the request's committed ones, each with the exact distribution q it was drawn from
(sparse, or one-hot), and is told the verdict when the loop ``commit``s it (workers/loop.py). The
loop and the routing policy treat every proposer alike; what differs is where its tokens come from:

    LocalDraft      a draft model in this process (workers/local_draft.py)
    LookupProposer  draft-free: prompt lookup or suffix decoding over the request's tokens and its
                    task's recent outputs (workers/lookup.py); one-hot q, ids alone on the wire
    TreeProposer    several of these at once, merged into one token tree (workers/token_tree.py)
    RemoteDraft     a draft model on a draft worker, over a stream (router/remote_draft.py)

A proposer that needs more than the verdict from the verify pass (an EAGLE-3 head needs the
target's hidden states of the positions it commits) declares it in ``needs`` (``VerifyNeeds``), and
nowhere else: the target's session is opened for it from there, the verifier returns it in
``Verified.extras``, and the loop hands that to ``commit`` without knowing which proposer it drives.

The interface: ``propose`` and ``commit`` (``follow`` for a tree's members), which every proposer
implements; ``open``, ``close`` and ``abandon`` around a request; ``draft_ahead`` where a proposer can
work while the target verifies. Proposers report what their proposals cost, the steps they had
nothing for and the workers they lost to a ``StepRecorder``, never to the request itself.
A proposer that can no longer propose (its draft worker lost, none left to reopen on) raises
``ProposerGone``; the request goes on target-only, its output unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import torch

from .acceptance import Outcome
from .drafting import DraftTokens
from .logprobs import TokenLogprobs

NO_EXTRAS: Mapping[str, object] = MappingProxyType({})
# The key of ``Verified.extras`` under which a verify pass returns the hidden states ``VerifyNeeds``
# asks for: ``HiddenRows`` in process; through the service, the ``pb.HiddenStates`` its replica sent,
# forwarded to the draft worker as they came.
AUX_HIDDEN = "aux_hidden"


@dataclass(frozen=True)
class VerifyNeeds:
    """What a proposer needs of each verify pass besides the verdict: the target's hidden states of
    ``hidden_layers`` at the positions the pass committed (an EAGLE-3 head's aux layers; workers/heads/)."""

    hidden_layers: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.hidden_layers)

    def with_(self, other: VerifyNeeds) -> VerifyNeeds:
        """Both proposers' needs (a token tree's members): one target pass serves one set of layers."""
        if self and other and self.hidden_layers != other.hidden_layers:
            raise ValueError(f"a tree's heads must read the same target layers, got {self.hidden_layers} "
                             f"and {other.hidden_layers}")
        return self or other


NEEDS_NOTHING = VerifyNeeds()


@dataclass(frozen=True)
class HiddenRows:
    """Hidden states of consecutive positions from ``start``: [positions, width]."""

    start: int
    rows: torch.Tensor

    @property
    def stop(self) -> int:
        return self.start + len(self.rows)


class ProposerGone(Exception):
    """The proposer cannot propose any more (the reason is the message): go on target-only."""


@dataclass(frozen=True)
class Verified:
    """What one verify pass returns to the loop."""

    verdict: Outcome
    seconds: float  # the target's device time for the pass (0 where unknown)
    extras: Mapping[str, object] = field(default_factory=lambda: NO_EXTRAS)  # what the proposer ``needs``, as far as given
    logprobs: TokenLogprobs | None = None  # the committed tokens' (workers/logprobs.py), when the request asks
    ended: str = ""  # the target ends the text after these tokens, and why ("grammar"; "": it goes on)


class StepRecorder(Protocol):
    """Where the loop and its proposer report what a request's steps cost (workers/recording.py)."""

    def drafted(self, tokens: int, seconds: float, batch: object = None) -> None:
        """Draft work done: ``tokens`` drafted in ``seconds`` (a lookahead that missed counts too);
        ``batch`` is the pass it ran in, where a worker says (a ``PassInfo``)."""

    def waited(self, seconds: float) -> None:
        """The request waited ``seconds`` for a proposal (a lookahead that hit: about 0)."""

    def looked_ahead(self) -> None:
        """A proposal is being drafted while the target verifies the previous one."""

    def lookahead_hit(self, branch: bool = False) -> None:
        """A proposal drafted ahead guessed the verdict and is used (``branch``: the one drafted for
        a rejection, beside the one for all accepted)."""

    def lookahead_unjudged(self) -> None:
        """The request ended while a lookahead was out: no verdict judged it, neither hit nor miss."""

    def lookahead_missed(self, tokens: int) -> None:
        """A proposal drafted ahead did not guess the verdict: its ``tokens`` (counted as drafted
        already) are thrown away."""

    def recovered(self, started: float) -> None:
        """The time since ``started`` (perf_counter) went to recovering from a failed worker."""

    def verified(self, proposed: int, accepted: int, seconds: float) -> None:
        """A verify pass kept ``accepted`` of a proposal of ``proposed`` (its depth, for a tree)."""

    def missed(self) -> None:
        """The proposer had nothing to propose for a step (a draft-free one without a match): what its
        coverage is measured by."""

    def reopened(self) -> None:
        """The proposer's worker failed mid-request and it reopened on another (a remote draft)."""


class Proposer(ABC):
    """One request's source of draft tokens."""

    name: str
    needs: VerifyNeeds = NEEDS_NOTHING  # what it needs from the verify pass besides the verdict
    deterministic = True  # one-hot proposals (no draw): a token tree may merge them with others'

    async def open(self, committed: Sequence[int]) -> None:
        """Be ready to propose after ``committed`` (the prompt, or more on a late open)."""

    @abstractmethod
    async def propose(self, k: int) -> DraftTokens:
        """Up to ``k`` tokens after the committed ones, with their q (no ids: none this step)."""

    def draft_ahead(self, proposal: DraftTokens, branch: bool = True) -> None:
        """The target is verifying ``proposal``: start on the next one meanwhile, if this proposer can
        (``branch``: and on the one for its likeliest rejection, where it can)."""

    def commit(self, proposal: DraftTokens, verdict: Outcome, extras: Mapping[str, object] = NO_EXTRAS) -> None:
        """The request committed ``verdict`` on ``proposal``, this proposer's last one; ``extras``
        holds what it ``needs`` of the verify pass."""
        self.follow(verdict.num_accepted, [verdict.token], extras)

    def follow(self, accepted: int, appended: Sequence[int], extras: Mapping[str, object] = NO_EXTRAS) -> None:
        """Of this proposer's last proposal, the first ``accepted`` tokens were committed, then
        ``appended`` (the target's token; in a token tree, first another branch's accepted tokens);
        ``extras``: what it ``needs`` of the verify pass."""

    async def close(self) -> None:
        """The request is done: free whatever the proposer holds."""

    def abandon(self) -> None:
        """The request was cancelled or failed: free everything now (idempotent)."""


def proposal_depth(proposal: DraftTokens) -> int:
    """The longest path a proposal offers: its length (a chain), or its tree's depth."""
    if proposal.parents is None:
        return len(proposal.ids)
    depths: list[int] = []
    for parent in proposal.parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return max(depths, default=0)


def accepted_ids(proposal: DraftTokens, verdict: Outcome) -> list[int]:
    """The proposal's tokens the verdict kept, in order."""
    if verdict.path:
        return [proposal.ids[node] for node in verdict.path]
    return list(proposal.ids[: verdict.num_accepted])

