"""A draft model in this process, as one request's proposer (the in-process engine's draft)."""

from __future__ import annotations

import time

from transformers import PreTrainedModel

from .drafting import DraftSession, DraftTokens
from .draft_length import DraftLength
from .kv_pool import KVPool
from .kv_cache import STEP_ROOM
from .proposing import Committed, Proposer, ProposerGone, StepRecorder
from .steps import run_alone
from .token_bridge import TokenBridge


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


class BridgedDraft(LocalDraft):
    """A local draft of another tokenizer (workers/token_bridge.py): its session holds the draft's
    tokens of the request's text and draws among the tokens the two share (``DraftSession.allowed``);
    what it proposes and is told are the target's ids."""

    def __init__(self, name: str, model: PreTrainedModel, pool: KVPool, session: DraftSession,
                 length: DraftLength, recorder: StepRecorder, bridge: TokenBridge, committed: list[int],
                 first_alone: bool = False) -> None:
        super().__init__(name, model, pool, session, length, recorder, first_alone)
        self.bridge = bridge
        self.committed = list(committed)  # the target's ids
        self.drafted = DraftTokens.empty()  # its last proposal, in the draft's ids
        session.keyed_to(len(self.committed))

    async def propose(self, k: int) -> DraftTokens:
        sequence = self.session.sequence
        if len(sequence.committed) + k + STEP_ROOM > sequence.region.capacity:
            raise ProposerGone(f"draft {self.name}'s tokens of the text outgrew its cache "
                               f"({sequence.region.capacity} positions)")
        self.drafted = await super().propose(k)
        self.proposed = self.bridge.proposal(self.drafted, self.committed)
        return self.proposed

    def commit(self, step: Committed) -> None:
        self.first_alone = False
        self.committed += [self.proposed.ids[node] for node in step.kept] + list(step.appended)
        self.session.sequence.rewrite(self.drafted.ids, self.bridge.encode(self.committed))
        self.session.keyed_to(len(self.committed))
        self.proposed = self.drafted = DraftTokens.empty()
