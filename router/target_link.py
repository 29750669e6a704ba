"""A request's link to a target replica: the service's verifier.

It opens the request's session on a replica (the least loaded that has not refused it as full),
asks it for each verdict over one stream, and survives the replica: a failed one is replaced by
another (or the restarted one) re-prefilled from the committed tokens, and the failed step is
asked again there; a full one passes the request on, or waits for room up to the full wait.
Target-only for good, it decodes in runs granted ahead instead of a round trip per token.
"""

from __future__ import annotations

import asyncio
import logging
import time

from specserve.proto.v1 import internal_pb2 as pb
from specserve.workers.acceptance import Outcome
from specserve.workers.drafting import DraftTokens
from specserve.workers.proposing import NEEDS_NOTHING, Verified, VerifyNeeds
from specserve.workers.logprobs import TokenLogprobs
from specserve.workers.wire import extras_from, logprobs_from, proposal_message

from .context import RequestContext
from .directory import NoWorker
from .recording import RequestRecorder
from .streams import WorkerStream, WorkerFailed

log = logging.getLogger("specserve.router")
# Per request. A request that keeps killing replicas (say, one whose prefill exhausts memory) must
# not take the whole fleet down with it, one resume at a time.
MAX_TARGET_RESUMES = 2
TARGET_POLL_SECONDS = 0.25  # while waiting for a target replica to resume on
# While every target replica is full: how often to try them again. A refusal costs the replica a
# microsecond (it checks its slots and pool before reading anything), the router one round trip.
FULL_POLL_SECONDS = 0.5


class TargetUnavailable(NoWorker):
    """No target replica could take (or take back) the request in time: the client gets UNAVAILABLE."""


class TargetsFull(Exception):
    """Every target replica refused the request as full for the whole full wait: the client gets
    RESOURCE_EXHAUSTED, to back off and retry."""


class TargetLink:
    def __init__(self, context: RequestContext, recorder: RequestRecorder, needs: VerifyNeeds = NEEDS_NOTHING) -> None:
        self.context = context
        self.recorder = recorder
        # The proposer's: the hidden states its replica sends with each verdict (a head's), or the
        # guesses of the Medusa heads it serves.
        self.needs = needs
        self.stream: WorkerStream | None = None
        self.owed = 0  # target-only tokens granted to the replica and not yet received
        self.verdicts = 0  # answered so far (the first is the prefill's: no decode step's price)
        self.resumes = 0  # target replicas replaced mid-request
        self.cached_tokens = 0  # of the prompt, those its replica took from its prefix cache (the latest session's)
        self.replica = ""  # the replica of its latest session, and why it was picked (router/prefix_routing.py)
        self.pick = ""
        # Target replicas that refused this request as full since it last had one, and since when
        # every registered one has (None: one has room, as far as the request knows).
        self.refused_by: set[str] = set()
        self.all_full_since: float | None = None
        self.full_refusals = 0  # over the whole request
        self.failed: WorkerFailed | None = None  # met by ``arrived``, raised by the next ``verify``

    async def open(self, after: WorkerFailed | None = None) -> None:
        """A session on a target replica, waiting for one to be registered (a replica restarting
        after a failure) until the target wait or the client's deadline, whichever is first."""
        context, directory = self.context, self.context.directory
        give_up = context.before_deadline(time.monotonic() + context.timeouts.target_wait_seconds)
        while True:
            try:
                opening = context.target_opening(self.resumes, self.needs)
                target, self.pick = await directory.pick_for("target", avoid=self.refused_by,
                                                             prompt=opening.prompt_ids)
                self.replica = target.worker_id
                # A prefill is one step: the same timeout.
                self.stream = directory.stream(target, context.timeouts.target_step_seconds)
                await self.stream.send(pb.VerifyRequest(open=opening))
                return
            except (NoWorker, WorkerFailed) as exc:
                if isinstance(exc, WorkerFailed):
                    self._drop(exc)
                self.refused_by.clear()  # waiting for a replica: those that were full may have room by then
                if time.monotonic() + TARGET_POLL_SECONDS >= give_up:
                    raise TargetUnavailable(
                        f"no target replica could serve request {context.request_id} within "
                        f"{context.timeouts.target_wait_seconds:g} s or its deadline, after "
                        f"{len(context.history.committed)} tokens ({after or exc}); retry") from None
                await asyncio.sleep(TARGET_POLL_SECONDS)
                await directory.refresh(force=True)  # a restarted replica registers anew

    async def verify(self, proposal: DraftTokens, alone: bool, needs: VerifyNeeds) -> Verified:
        """The target's verdict on the proposal. If its replica fails, the request moves to another
        (or the restarted one), re-prefilled from the committed tokens, and the step is asked again."""
        runs = alone and not proposal.ids and self.context.decode_run > 1
        started = waited = time.perf_counter()
        reply = None
        while reply is None:
            try:
                if self.failed is not None:
                    failed, self.failed = self.failed, None
                    raise failed
                reply = await self._answer(proposal, runs)
            except WorkerFailed as exc:
                await self._resume(exc)
                waited = None  # this step's wait includes a prefill: no cost sample
        if waited is None:  # the whole step was a recovery: detecting the failure, waiting, re-prefilling
            self.recorder.recovered(started)
            self._room_again()  # a replica took it
        if self.verdicts and waited is not None:  # the prefill is no decode step: left out
            wait = time.perf_counter() - waited
            if runs:  # replies queued while the router was busy arrive at once, but a token of a
                wait = max(wait, reply.seconds)  # run costs at least its pass
            self.recorder.times.record(bool(proposal.ids), wait, reply)
        if reply.cached_tokens:
            self.cached_tokens = reply.cached_tokens
        self.verdicts += 1
        verdict = reply.verdict
        outcome = Outcome(verdict.num_accepted, verdict.token, tuple(verdict.path))
        return Verified(outcome, reply.seconds, extras_from(reply), self._logprobs(reply), reply.ended)

    def arrived(self) -> Verified | None:
        """A decode run's next token if its reply is already here. The last token owed is left to
        ``verify``, which tops the run up before it waits, so the replica never runs dry."""
        if self.owed <= 1 or self.stream is None:
            return None
        try:
            reply = self.stream.ready()
        except WorkerFailed as exc:  # the next ``verify`` raises it, and resumes as for any failure
            self.failed = exc
            return None
        if reply is None:
            return None
        self.owed -= 1
        self.recorder.times.record(False, reply.seconds, reply)  # queued: it cost its pass
        self.verdicts += 1
        return Verified(Outcome(reply.verdict.num_accepted, reply.verdict.token), reply.seconds,
                        logprobs=self._logprobs(reply), ended=reply.ended)

    def _logprobs(self, reply: pb.VerifyReply) -> TokenLogprobs | None:
        """The reply's logprobs, where the request asks for them."""
        top = self.context.params.logprobs
        return None if top is None else logprobs_from(reply.logprobs, top)

    async def _answer(self, proposal: DraftTokens, runs: bool) -> pb.VerifyReply:
        """The target's answer to this step: one round trip, or target-only for good, the next token
        of a decode run, topped up to ``decode_run`` tokens ahead once half of it has arrived (never
        past the request's token budget)."""
        if not runs:
            step = proposal_message(proposal, self.context.params.sampling.greedy)
            return await self.stream.ask(pb.VerifyRequest(step=step))
        decode_run = self.context.decode_run
        ungranted = self.context.history.remaining - self.owed
        if self.owed <= decode_run // 2 and ungranted > 0:
            grant = min(decode_run - self.owed, ungranted)
            await self.stream.send(pb.VerifyRequest(decode=grant))
            self.owed += grant
        reply = await self.stream.receive()
        self.owed -= 1
        return reply

    async def close(self) -> None:
        if self.stream is None:
            return
        if self.owed:  # decoded past the end: drop the rest of the run
            self.stream.cancel()
        await self.stream.close()

    def abandon(self) -> None:
        if self.stream is not None:
            self.stream.cancel()

    def _drop(self, failure: WorkerFailed) -> None:
        """End the session on a failed target replica; new requests pass it over for a while."""
        if self.stream is not None and self.stream.worker.worker_id == failure.worker.worker_id:
            self.stream.cancel()
            self.stream = None
        if failure.broken:
            self.context.directory.mark_failed(failure.worker)

    async def _resume(self, failure: WorkerFailed) -> None:
        self._drop(failure)
        self.owed = 0  # the failed replica's run is gone; the next one starts afresh
        if failure.full:  # refused at open: full, not failed
            await self._pass_on(failure)
            return
        self._room_again()  # it had a replica: the full wait, if it comes again, starts afresh
        request_id = self.context.request_id
        if self.resumes >= MAX_TARGET_RESUMES:
            raise TargetUnavailable(f"request {request_id} lost its target replica "
                                    f"{self.resumes + 1} times; giving up ({failure}); retry") from None
        self.resumes += 1
        log.warning("request %s resumes after %d tokens on another target replica: %s", request_id,
                    len(self.context.history.committed), failure)
        await self.open(after=failure)

    async def _pass_on(self, refusal: WorkerFailed) -> None:
        """A replica refused the session as full (its session or KV cache limit): open it on one
        that has not refused it. Once every registered replica has, wait for room, trying them all
        again every FULL_POLL_SECONDS, up to the full wait or the client's deadline."""
        self.refused_by.add(refusal.worker.worker_id)
        self.full_refusals += 1
        context = self.context
        replicas = {e.worker_id for e in await context.directory.available("target")}
        if replicas and replicas <= self.refused_by:  # (none at all: open waits for one)
            now = time.monotonic()
            self.all_full_since = self.all_full_since or now
            full_wait = context.timeouts.target_full_wait_seconds
            give_up = context.before_deadline(self.all_full_since + full_wait)
            if now >= give_up:
                raise TargetsFull(
                    f"every target replica is full (at its session or KV cache limit) and none freed room for "
                    f"request {context.request_id} within {full_wait:g} s or its deadline ({refusal}); retry "
                    f"later, or add replicas (target.replicas) or raise target.kv_cache_mib / "
                    f"target.max_sessions") from None
            await asyncio.sleep(min(FULL_POLL_SECONDS, give_up - now))  # the last try at the end of the wait
            self.refused_by.clear()
        await self.open(after=refusal)

    def _room_again(self) -> None:
        """Forget the refusals: every replica may have room for this request again."""
        self.refused_by.clear()
        self.all_full_since = None
