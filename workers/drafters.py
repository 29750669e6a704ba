"""A draft model's session for one request, wherever it runs: one class per drafting method.

A drafter is told each step what stands (a ``DraftStep``, workers/draft_steps.py), brings its
session there (bookkeeping: a length) and returns the run that drafts the proposal, a step a batch
scheduler runs in shared passes (a draft worker, workers/draft_worker.py) or that runs alone (the
in-process engine, workers/session_proposer.py); ``proposal`` reads what the run drafted. The
same class serves a request in both places, so the in-process engine and the service draft alike.

    ModelDrafter    a draft model of the target's tokenizer (a cascade too: prompt lookup under
                    it, workers/drafting.py); drafts a branch beside a lookahead where asked
    BridgedDrafter  a draft model of another tokenizer (workers/token_bridge.py)
    HeadDrafter     an EAGLE-3 head or MTP module fed the target's hidden states (heads/proposer.py)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from .draft_steps import DraftStep
from .drafting import (DRAFT_MAX_SUPPORT, NO_CASCADE, BranchRun, Cascade, DraftRun, DraftSession, DraftTokens,
                       Misalignment)
from .grammar import GrammarState
from .kv_cache import STEP_ROOM
from .ragged_pass import PooledSequence
from .sampling import SamplingParams
from .seeds import DraftDraws
from .steps import Step
from .token_bridge import TokenBridge

log = logging.getLogger("specserve.workers")


class Drafter(Protocol):
    """One request's draft session: what the engine's proposer and a draft worker's stream drive."""

    greedy: bool  # its proposals are one-hot (their ids alone travel)
    alternatives: bool  # each proposed token's alternative goes with it (where branches fork)
    branch: BranchRun | None  # drafted beside the last run, for another verdict

    def step(self, step: DraftStep) -> Step:
        """The run this step asks for, after bringing the session to what stands."""

    def adopt(self) -> None:
        """The session holds the last run's branch from now on."""

    def proposal(self, run: Step) -> DraftTokens:
        """What ``run`` drafted (stopped early: so far)."""


class ModelDrafter:
    """A draft model's session of the target's tokenizer: each step resyncs its cache (a length),
    then drafts, and with a lookahead's ``fork`` drafts a branch beside it in the same passes."""

    def __init__(self, session: DraftSession) -> None:
        self.session = session
        self.greedy = session.sampling.greedy
        self.alternatives = session.alternatives
        self.last: DraftRun | None = None  # its result is the proposal the next step's lengths refer to
        self.held: DraftTokens | None = None  # that proposal: the last run's result, or an adopted branch's
        self.branch: BranchRun | None = None
        self.adopted = False  # the branch was adopted for the coming step already (``adopt``)

    def adopt(self) -> None:
        """The router used the last run's branch: the session holds it from now on (its keys and
        values moved into place: on a worker, on the device thread, between passes)."""
        if self.branch is None:
            raise ValueError("adopt: the last step drafted no branch")
        self.held, self.branch, self.adopted = self.branch.adopt(), None, True

    def step(self, step: DraftStep) -> DraftRun:
        """The drafting this step asks for, after moving the session to what stands (bookkeeping):
        the last run's branch first if the router used it, then ``keep`` and ``append``."""
        if step.adopt and not self.adopted:
            self.adopt()
        elif not step.adopt and self.last is not None:
            self.held = self.last.result
        self.adopted = False
        self.session.resync(self.held, step.keep, list(step.append))
        reach = len(self.session.sequence.committed) + step.k  # what this run may write up to
        self.last, self.branch = self.session.step(step.k, step.min_confidence, step.min_tokens, step.guess), None
        # A fork past what the cache holds (the router cannot see the worker's length) drafts no
        # branch: the verdict it assumed then finds none in the reply, a plain miss.
        fork = step.fork
        if fork is not None and step.guess and fork.keep <= self.session.sequence.length:
            self.branch = BranchRun(self.session, fork.keep, fork.token, fork.k, step.min_confidence,
                                    step.min_tokens, reach)
            self.last.within(step.k)  # the branch writes from ``reach`` on
        return self.last  # a step that failed has no result: nothing to rewind

    def proposal(self, run: DraftRun) -> DraftTokens:
        return run.so_far()


class BridgedDrafter:
    """A draft of another tokenizer (workers/token_bridge.py). Its steps speak the target's tokens:
    ``keep`` counts them and ``append`` holds them, and its proposals are target ids (one per draft
    token: the draft draws among those it shares with the target). The session holds the draft's
    tokens of the text; each step re-encodes what stands and keeps the prefix its cache shares with
    it. It drafts no branch (a fork is a target position), no alternatives and within no grammar
    (the target's, over the target's tokens): all lossless, as its q is exact."""

    alternatives = False
    branch = None

    def __init__(self, session: DraftSession, bridge: TokenBridge, committed: Sequence[int], name: str) -> None:
        self.session = session
        self.greedy = session.sampling.greedy
        self.bridge = bridge
        self.name = name
        self.committed = list(committed)  # the target's tokens that stand
        self.session.keyed_to(len(self.committed))
        self.last: DraftRun | None = None
        self.outgrown = False
        self.sent: tuple[DraftTokens, DraftTokens] | None = None  # the last proposal: the draft's, and as sent

    def adopt(self) -> None:
        raise ValueError("a draft of another tokenizer drafts no branch to adopt")

    def step(self, step: DraftStep) -> DraftRun:
        if step.adopt:
            self.adopt()
        held = self.last.result if self.last is not None else None  # (None: a run that failed)
        target_held = self.committed + (self._translated(held).ids if held is not None else [])
        if not 1 <= step.keep <= len(target_held):
            raise ValueError(f"keep must be 1..{len(target_held)} (the tokens this session holds), got {step.keep}")
        self.committed = target_held[: step.keep] + list(step.append)
        self.session.sequence.rewrite(held.ids if held is not None else [], self.bridge.encode(self.committed))
        self.session.keyed_to(len(self.committed))
        # Its tokens of the text may outgrow the room the session took (a finer cut than the
        # target's): it then proposes nothing, and the request goes on as target-only would.
        sequence = self.session.sequence
        k = max(0, min(step.k, sequence.region.capacity - STEP_ROOM - len(sequence.committed)))
        if k < step.k and not self.outgrown:
            self.outgrown = True
            log.info("draft %s: its tokens of the text outgrew the session's %d positions; it proposes no more",
                     self.name, sequence.region.capacity)
        self.last = self.session.step(k, step.min_confidence, step.min_tokens, step.guess)
        return self.last

    def proposal(self, run: DraftRun) -> DraftTokens:
        return self._translated(run.so_far())

    def _translated(self, proposal: DraftTokens) -> DraftTokens:
        """``proposal`` in the target's ids: translated once, when it is sent, and read again by the
        next step."""
        if self.sent is None or self.sent[0] is not proposal:
            self.sent = (proposal, self.bridge.proposal(proposal))
        return self.sent[1]


def model_drafter(sequence: PooledSequence, sampling: SamplingParams, draws: DraftDraws, *,
                  max_support: int = DRAFT_MAX_SUPPORT, alternatives: bool = False, grammar: GrammarState | None = None,
                  output_start: int = 0, cascade: Cascade = NO_CASCADE, misalignment: Misalignment | None = None,
                  bridge: TokenBridge | None = None, committed: Sequence[int] = (), name: str = "") -> Drafter:
    """A draft model's session over ``sequence`` (its tokens of the request, in its pool). With a
    ``bridge``, a draft of another tokenizer (``committed``: the target's tokens that stand), which
    drafts within no grammar and gives no alternatives (``BridgedDrafter``)."""
    if bridge is not None:
        session = DraftSession(sequence, sampling, draws, max_support, cascade=cascade, allowed=bridge.mask,
                               misalignment=misalignment)
        return BridgedDrafter(session, bridge, committed, name)
    return ModelDrafter(DraftSession(sequence, sampling, draws, max_support, alternatives, grammar, output_start,
                                     cascade, misalignment=misalignment))
