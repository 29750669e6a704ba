"""One request through the cluster: the workers' loop (propose, verify, commit, emit) over streams.

The router owns the truth (DESIGN.md invariant 2): the committed tokens live here, in the request's
``Decoding``; the workers' KV caches are derived from them. The loop is the one the in-process
engine runs (workers/loop.py); here its verifier is a link to a target replica (target_link.py)
and its proposer a draft on a draft worker (remote_draft.py), a draft-free one, or a token tree
(proposers.py). Because the truth is here, a worker that fails mid-request loses nothing: a target
replica is replaced by another re-prefilled from the committed tokens; a draft worker is replaced
the same way, or dropped (target-only). The client's stream neither loses nor repeats a token.

To follow one step: workers/loop.py, then target_link.py ``verify`` and remote_draft.py ``propose``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from specserve.workers.decoding import Decoding
from specserve.workers.draft_length import DraftLength
from specserve.workers.loop import SpeculativeLoop
from specserve.workers.proposing import NEEDS_NOTHING, Proposer, ProposerGone
from specserve.workers.request import GenerationParams
from specserve.workers.stopping import Chunk

from .config import TimeoutsConfig
from .context import RequestContext
from .directory import WorkerDirectory
from .policy import Observation, Route
from .proposers import ProposerFactory
from .recording import RequestRecorder, StepTimes
from .target_link import TargetLink
from .tasks import ResolvedTask
from .validation import ValidRequest

log = logging.getLogger("specserve.router")
# Route reasons a request sets itself when its draft is not there: none could be opened (the service
# still starting: its draft workers have not all registered yet), or it failed mid-request. The
# request goes on target-only: the target alone decides every token.
DRAFT_UNAVAILABLE, DRAFT_STARTING, DRAFT_LOST = "unavailable", "starting", "lost"


@dataclass(frozen=True)
class Workers:
    """What the service gives every request: its workers, how to reach them and how to use them."""

    tokenizer: PreTrainedTokenizerBase
    directory: WorkerDirectory
    timeouts: TimeoutsConfig
    proposers: ProposerFactory
    lookahead: bool = False  # drafts draft ahead while the target verifies (router.lookahead)
    decode_run: int = 1  # target-only tokens granted ahead (router config decode_run_tokens)
    branch_odds: float | None = None  # lookaheads' branches (router.lookahead_branch_min_odds); None: none
    decode_group: int = 1  # a decode run's tokens per message from the replica (router.stream_interval_tokens)


@dataclass(frozen=True)
class Routing:
    """What the router decided for a request before it runs."""

    task: ResolvedTask
    route: Route  # its proposer (``route.draft``; None: target-only) and k
    length: DraftLength  # k per step
    pressure: float = 0.0  # sessions per target replica when it was routed
    lookahead: bool = True  # it may draft ahead, where the service does (router/lookahead_budget.py)
    starting: bool = False  # the service is not ready yet (router/readiness.py): a missing draft is "starting"


class Request:
    """A request in flight. Iterate ``run()`` for chunks as they are committed."""

    def __init__(self, valid: ValidRequest, routing: Routing, workers: Workers, deadline: float | None = None) -> None:
        self.valid = valid
        self.task = routing.task
        self.route = routing.route
        self.pressure = routing.pressure
        self.starting = routing.starting
        self.request_id = uuid.uuid4().hex[:12]
        self.decoding = Decoding(workers.tokenizer, valid.prompt_ids, valid.params, valid.params.resolved_seed())
        self.recorder = RequestRecorder(self.decoding.stats)
        context = RequestContext(self.request_id, routing.task.task, valid.params, self.decoding, workers.directory,
                                 workers.timeouts, deadline, workers.lookahead, workers.decode_run,
                                 ahead=routing.lookahead, branch_odds=workers.branch_odds,
                                 decode_group=workers.decode_group)
        self.proposed_by = self._proposer(workers.proposers, context, routing.length)  # for its counts, once gone
        self.target = TargetLink(context, self.recorder, self.proposed_by.needs if self.proposed_by else NEEDS_NOTHING)
        self.loop = SpeculativeLoop(self.decoding, self.target, self.proposed_by, routing.length, self.recorder,
                                    lost=self._lose_draft)
        self.started = time.perf_counter()
        self.first_token_seconds = 0.0
        self.first_chunk_tokens = 0

    def _proposer(self, factory: ProposerFactory, context: RequestContext, length: DraftLength) -> Proposer | None:
        if not self.route.draft:
            return None
        try:
            return factory.make(self.route.draft, context, length, self.recorder)
        except ProposerGone as exc:
            self._lose_draft(str(exc))
            return None

    async def run(self) -> AsyncIterator[Chunk]:
        async for chunk in self.loop.run():
            if not self.first_token_seconds:
                self.first_token_seconds = time.perf_counter() - self.started
                self.first_chunk_tokens = len(chunk.token_ids)
            yield chunk

    def abandon(self) -> None:
        """Cancel the request's sessions on every worker now (idempotent): its client is gone."""
        self.loop.abandon()

    def _lose_draft(self, why: str) -> None:
        """Go on target-only: the output does not depend on the draft, only the speed does."""
        log.warning("request %s continues target-only: draft %s: %s", self.request_id, self.route.draft, why)
        drafted = self.decoding.stats.proposed > 0
        self.route = Route(self.route.draft if drafted else None, self.route.k if drafted else 0,
                           DRAFT_LOST if drafted else DRAFT_STARTING if self.starting else DRAFT_UNAVAILABLE)

    @property
    def params(self) -> GenerationParams:
        return self.valid.params

    @property
    def proposer(self) -> Proposer | None:
        """The proposer it has now (None: target-only, from the start or once it was gone)."""
        return self.loop.proposer

    @property
    def times(self) -> StepTimes:
        return self.recorder.times

    @property
    def recovery_seconds(self) -> float:
        return self.recorder.recovery_seconds

    @property
    def target_resumes(self) -> int:
        return self.target.resumes

    @property
    def full_refusals(self) -> int:
        return self.target.full_refusals

    @property
    def draft_reopens(self) -> int:
        """Draft workers replaced mid-request."""
        return self.recorder.reopens

    def observation(self) -> Observation:
        """What this request tells the routing policy."""
        s, t = self.decoding.stats, self.times
        return Observation(accepted=s.accepted, rejections=s.rejections,
                           misses=self.recorder.misses, draft_tokens=s.proposed,
                           draft_seconds=sum(t.draft_steps), verify_passes=len(t.verify_steps),
                           verify_seconds=sum(t.verify_steps), verify_device_seconds=t.verify_device,
                           plain_passes=len(t.plain_steps), plain_seconds=sum(t.plain_steps),
                           plain_device_seconds=t.plain_device, accepted_per_position=s.accepted_per_position,
                           tested_per_position=s.tested_per_position, passes=t.pass_fit,
                           tokens=len(self.decoding.committed) - self.first_chunk_tokens,
                           seconds=max(self.elapsed() - self.first_token_seconds - self.recovery_seconds, 0.0),
                           pressure=self.pressure)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started
