"""A draft session in this process, as one request's proposer (the in-process engine's draft).

The session is the ``Drafter`` a draft worker's stream drives (workers/drafters.py: a draft model,
one of another tokenizer, a head fed by the target), told by the same steps from the same mirror of
its tokens (workers/draft_steps.py) as router/remote_draft.py tells one on a worker; here each
step's run runs alone, in passes of its own. So a drafting method has one home, and the in-process
engine and the service draft alike.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from .draft_length import DraftLength
from .draft_steps import DraftMirror
from .drafters import Drafter
from .drafting import DraftTokens
from .proposing import AUX_HIDDEN, NEEDS_NOTHING, Committed, HiddenRows, Proposer, StepRecorder, VerifyNeeds
from .steps import Step


class SessionProposer(Proposer):
    def __init__(self, name: str, drafter: Drafter, run: Callable[[Step], object], committed: int,
                 length: DraftLength, recorder: StepRecorder, needs: VerifyNeeds = NEEDS_NOTHING,
                 first_alone: bool = False) -> None:
        """``run``: runs a step's passes alone until it has a result. ``committed``: the tokens the
        session opened holding. ``first_alone``: the first step proposes nothing, as in the service,
        where a draft that drafts ahead prefills while the target's prefill answers the first token
        alone (so the two paths draw the verifier's uniforms alike, and a seeded sampled request
        gets one output)."""
        self.name = name
        self.drafter = drafter
        self.run = run
        self.mirror = DraftMirror(committed)
        self.length = length  # its min_confidence: where a confidence schedule stops a proposal early
        self.recorder = recorder
        self.needs = needs
        self.first_alone = first_alone
        self.deterministic = drafter.greedy
        self.hidden: HiddenRows | None = None  # the target's, of the positions committed since the last step

    async def propose(self, k: int) -> DraftTokens:
        if k < 1 or self.first_alone:
            return DraftTokens.empty()
        step = self.mirror.step(k, self.length.min_confidence)
        if self.hidden is not None:
            step, self.hidden = dataclasses.replace(step, hidden=self.hidden), None
        run = self.drafter.step(step)
        if run.result is not None:  # nothing to draft (a head before the target's first pass)
            return self.drafter.proposal(run)
        started = time.perf_counter()
        self.run(run)
        seconds = time.perf_counter() - started
        proposal = self.drafter.proposal(run)
        self.recorder.waited(seconds)
        self.recorder.drafted(len(proposal.ids), seconds)
        return proposal

    def commit(self, step: Committed) -> None:
        self.first_alone = False
        self.mirror.verdict(step.accepted, step.appended)  # the session learns it with its next step
        if (hidden := step.extras.get(AUX_HIDDEN)) is not None:
            self.hidden = hidden if self.hidden is None else self.hidden.then(hidden)
