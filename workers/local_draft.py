"""A draft model in this process, as one request's proposer (the in-process engine's draft)."""

from __future__ import annotations

import time

from transformers import PreTrainedModel

from .drafting import DraftSession, DraftTokens
from .draft_length import DraftLength
from .kv_pool import KVPool
from .proposing import Committed, Proposer, StepRecorder
from .steps import run_alone


class LocalDraft(Proposer):
    """Drafts with ``model`` over a session of its own, one pass per token, alone."""

    def __init__(self, name: str, model: PreTrainedModel, pool: KVPool, session: DraftSession,
                 length: DraftLength, recorder: StepRecorder, first_alone: bool = False) -> None:
        """``first_alone``: the first step proposes nothing, as in the service, where a draft that
        drafts ahead prefills while the target's prefill answers the first token alone (so the two
        paths draw the verifier's uniforms alike, and a seeded sampled request gets one output)."""
        self.name = name
        self.first_alone = first_alone
        self.model = model
        self.pool = pool
        self.session = session
        self.length = length  # its min_confidence: where a confidence schedule stops a proposal early
        self.recorder = recorder
        self.deterministic = session.sampling.greedy
        self.proposed = DraftTokens.empty()  # its last proposal

    async def propose(self, k: int) -> DraftTokens:
        if k < 1 or self.first_alone:
            self.proposed = DraftTokens.empty()
            return self.proposed
        started = time.perf_counter()
        self.proposed = run_alone(self.model, self.pool, self.session.step(k, self.length.min_confidence))
        seconds = time.perf_counter() - started
        self.recorder.waited(seconds)
        self.recorder.drafted(len(self.proposed.ids), seconds)
        return self.proposed

    def commit(self, step: Committed) -> None:
        self.first_alone = False
        keep = len(self.session.sequence.committed) + step.accepted
        self.session.resync(self.proposed, keep, list(step.appended))
        self.proposed = DraftTokens.empty()
