"""Full information, off the request path (HedgeSpec): what would the other proposers have done?

After a sampled fraction of finished greedy requests, each other draft allowed for the task scores
the verified continuation with one teacher-forced pass on a draft worker: at each position, would
its greedy choice have been the target's token? That is an acceptance trial per position at no
cost to the target, so the policy learns every draft's alpha while routing to one. The draft-free
proposers score finished greedy requests in the router, within its learning budget
(router/learning_budget.py): every one at low traffic, a sample under load.
"""

from __future__ import annotations

import asyncio
import logging
import random

import grpc

from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc

from .directory import NoWorker, WorkerDirectory
from .policy import Policy
from specserve.workers.lookup import DraftFree
from specserve.workers.proposer_kinds import ProposerKind, kind_of

log = logging.getLogger("specserve.router")
SCORE_TIMEOUT_SECONDS = 10.0


class ContinuationScorer:
    def __init__(self, policy: Policy, directory: WorkerDirectory, fraction: float, rng: random.Random,
                 draft_free: DraftFree | None = None, heads: frozenset[str] = frozenset()) -> None:
        self.policy = policy
        self.directory = directory
        self.fraction = fraction
        self.rng = rng
        self.draft_free = draft_free or DraftFree()
        # EAGLE-3 and Medusa heads are priced by serving only: scoring one needs the target's hidden
        # states of the whole continuation, which no draft worker has.
        self.heads = heads
        self.running: asyncio.Task | None = None  # one scoring job at a time: never a queue

    def score_draft_free(self, task: str, served_draft: str | None, prompt_ids: list[int],
                         output_ids: list[int]) -> None:
        """Score this finished greedy request by the task's draft-free proposers, now, in the router."""
        for name in self.policy.tasks[task]:
            if name == served_draft or kind_of(name) is not ProposerKind.DRAFT_FREE:
                continue
            positions, proposed, matches = self.draft_free.score(name, task, prompt_ids, output_ids)
            if positions:
                self.policy.observe_scored(task, name, positions, matches, proposed)

    def offer(self, task: str, served_draft: str | None, prompt_ids: list[int], output_ids: list[int]) -> bool:
        """Maybe score this finished greedy request by the task's other drafts, off the request
        path; True when a scoring job started."""
        # Draft models only: draft-free ones are scored above, trees are their members, heads only serve.
        others = [d for d in self.policy.tasks[task]
                  if d != served_draft and kind_of(d, self.heads) is ProposerKind.DRAFT]
        if not (others and output_ids) or (self.running and not self.running.done()):
            return False
        if self.rng.random() >= self.fraction:
            return False
        self.running = asyncio.create_task(self._score(task, others, prompt_ids + output_ids, len(prompt_ids)))
        return True

    async def _score(self, task: str, drafts: list[str], ids: list[int], start: int) -> None:
        for draft in drafts:
            try:
                worker = await self.directory.pick("draft", draft)
                stub = rpc.DrafterStub(self.directory.channel(worker))
                reply = await stub.Score(pb.ScoreRequest(model=draft, ids=ids, start=start),
                                         timeout=SCORE_TIMEOUT_SECONDS)
            except (NoWorker, grpc.aio.AioRpcError) as exc:  # best effort: the request is long done
                log.info("scoring %s on %s skipped: %s", task, draft, exc)
                continue
            self.policy.observe_scored(task, draft, reply.positions, reply.matches)
