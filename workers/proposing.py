"""Where a request's draft tokens come from: one interface for every proposer.

In the spirit of transformers' ``CandidateGenerator`` (two verbs): a proposer ``propose``s up to k
tokens after the request's committed ones, each with the exact distribution q it was drawn from
(sparse, or one-hot), and is told what the verify pass kept when the loop ``commit``s it
(``Committed``; workers/loop.py). ``close`` and ``abandon`` free what it holds when the request ends,
as the verifier's do. That is all the loop calls, on every proposer alike; what differs is where
the tokens come from:

    SessionProposer a draft session in this process (workers/session_proposer.py): a draft model,
                    one of another tokenizer, or a head fed by the target, each a ``Drafter``
                    (workers/drafters.py) as a draft worker runs it
    LookupProposer  draft-free: prompt lookup or suffix decoding over the request's tokens and its
                    task's recent outputs (workers/lookup.py); one-hot q, ids alone on the wire
    TreeProposer    several of these at once, merged into one token tree (workers/token_tree.py)
    RemoteDraft     a draft session on a draft worker, over a stream (router/remote_draft.py),
                    told the same steps (workers/draft_steps.py)

A proposer is built holding the request's committed tokens (workers/proposers.py builds the one a
name stands for, for the engine and the router alike); one that holds state elsewhere (a draft
worker's session) opens it on its first ``propose``, and one that can work while the target
verifies (a draft worker's lookahead) starts on its next proposal as ``propose`` returns this one.

A proposer that needs more than the verdict from the verify pass (an EAGLE-3 head needs the
target's hidden states of the positions it commits) declares it in ``needs`` (``VerifyNeeds``), and
nowhere else: the target's session is opened for it from there, the verifier returns it in
``Verified.extras``, and the loop hands that to ``commit`` without knowing which proposer it drives.

Proposers report what their proposals cost, the steps they had nothing for and the workers they
lost to a ``StepRecorder``, never to the request itself. A proposer that can no longer propose (its
draft worker lost, none left to reopen on) raises ``ProposerGone``; the request goes on target-only,
its output unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
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
# The key under which a verify pass returns the next proposal of the heads drafting where the
# target verifies that ``VerifyNeeds.on_verifier`` names (``DraftTokens``; through the service, from
# the replica's ``VerifyReply.next``).
VERIFIER_NEXT = "verifier_next"


@dataclass(frozen=True)
class VerifyNeeds:
    """What a proposer needs of each verify pass besides the verdict, served by the target session's
    hook (workers/pass_hooks.py): the target's hidden states of ``hidden_layers`` at the positions the
    pass committed (for a head drafting elsewhere: an EAGLE-3 head's aux layers; workers/heads/), or
    the next proposal of the heads ``on_verifier`` that draft where the target verifies: Medusa heads
    guessing in the pass, or a head fed by hidden states drafting ``depth`` tokens after it (0: its
    default)."""

    hidden_layers: tuple[int, ...] = ()
    on_verifier: str = ""
    depth: int = 0

    def __bool__(self) -> bool:
        return bool(self.hidden_layers or self.on_verifier)

    def with_(self, other: VerifyNeeds) -> VerifyNeeds:
        """Both proposers' needs (a token tree's members): one target pass serves one set of layers."""
        if self and other and self != other:
            raise ValueError(f"a tree's members must need the same of the verify pass, got {self} and {other}")
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

    def then(self, later: HiddenRows) -> HiddenRows:
        """These rows and ``later``'s as one (``later`` starts where these stop, or restarts from an
        earlier position: a verifier that took the request over sends them all), as
        ``wire.join_hidden`` joins them packed."""
        if later.start <= self.start:
            return later
        if later.start != self.stop:
            raise ValueError(f"hidden states from {later.start} do not follow rows {self.start}..{self.stop}")
        return HiddenRows(self.start, torch.cat([self.rows, later.rows]))


# Hidden states taken at once, at most: a long prompt's are cut to its last positions that fit
# (SmolLM2 in float32, 6.9 kB a position: about 900). Two replies' may travel joined
# (wire.join_hidden), and a gRPC message holds 16 MiB at most (workers/grpc_host.py), so a prompt of
# any length reaches the head, which then attends over that window of it instead of all of it.
AUX_WINDOW_BYTES = 6 * 1024 * 1024


def windowed(taken: HiddenRows) -> HiddenRows:
    """Hidden states taken at once, at most AUX_WINDOW_BYTES of them: a long prompt's last positions
    only (a head starts there, wherever it drafts: a draft worker, in process, the target replica)."""
    window = max(1, AUX_WINDOW_BYTES // max(1, taken.rows[:1].numel() * taken.rows.element_size()))
    if len(taken.rows) > window:
        return HiddenRows(taken.stop - window, taken.rows[-window:])
    return taken


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


@dataclass(frozen=True)
class Committed:
    """One verify pass's verdict as a proposer sees it: of its last proposal, the nodes ``kept``, in
    order (a chain's first n, or a tree's accepted path), then the tokens ``appended`` after them
    (the target's own; for a tree's member, first the tokens of the path that are not its own);
    ``extras``: what the proposer ``needs`` of the pass, as far as given."""

    kept: tuple[int, ...]
    appended: tuple[int, ...]
    extras: Mapping[str, object] = field(default_factory=lambda: NO_EXTRAS)

    @classmethod
    def of(cls, verified: Verified) -> Committed:
        verdict = verified.verdict
        kept = tuple(verdict.path) if verdict.path else tuple(range(verdict.num_accepted))
        return cls(kept, (verdict.token,), verified.extras)

    @property
    def accepted(self) -> int:
        """How many of the last proposal's tokens stand."""
        return len(self.kept)

    def ids(self, proposal: DraftTokens) -> list[int]:
        """The tokens the pass committed after ``proposal``: its kept ones, then the appended."""
        return [proposal.ids[node] for node in self.kept] + list(self.appended)


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
    """One request's source of draft tokens: built holding the request's committed tokens."""

    name: str
    needs: VerifyNeeds = NEEDS_NOTHING  # what it needs from the verify pass besides the verdict
    deterministic = True  # one-hot proposals (no draw): a token tree may merge them with others'

    @abstractmethod
    async def propose(self, k: int) -> DraftTokens:
        """Up to ``k`` tokens after the committed ones, with their q (no ids: none this step)."""

    @abstractmethod
    def commit(self, step: Committed) -> None:
        """The request committed ``step`` after this proposer's last proposal."""

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

