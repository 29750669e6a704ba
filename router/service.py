"""The client-facing SpecServe gRPC service: validate at the edge, admit, run the request, answer.

Handlers take the request's raw bytes and decode them here, so a malformed request (invalid UTF-8
included) is the client's INVALID_ARGUMENT rather than the server's INTERNAL. Errors map to
status codes once, in ``status_of``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import asdict

import grpc
from transformers import PreTrainedTokenizerBase

from .config import RouterConfig
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.workers.draft_length import DraftLength
from specserve.workers.drafting import Cascade
from specserve.workers.logprobs import TokenLogprobs
from specserve.workers.lookup import DraftFree
from specserve.workers.stats import SpecStats
from specserve.workers.stopping import Chunk

from .admission import Admission, Overloaded
from .canary import ArmSums, CanaryRoutes, CanaryStatus
from .directory import NoWorker, WorkerDirectory
from .learning_budget import LearningBudget
from .lookahead_budget import LookaheadBudget
from .metrics import RouterMetrics
from .passes import PassWindow
from .policy import ArmView, Policy
from .proposers import ProposerFactory
from .readiness import Readiness
from .scoring import ContinuationScorer
from .request import Request, Routing, Workers
from .target_link import TargetsFull
from .streams import WorkerFailed
from .tasks import TaskResolver
from .traffic_sample import TrafficSample
from .validation import InvalidRequest, Limits, ValidRequest, parse_request, validate

log = logging.getLogger("specserve.router")
# What ends a request mid-stream: no worker could serve or resume it, or a worker refused a step.
FAILURES = (NoWorker, TargetsFull, WorkerFailed, grpc.aio.AioRpcError)
SERVICE_NAME = "specserve.v1.SpecServe"
FINISH_REASONS = {"eos": pb.FINISH_REASON_EOS, "stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH,
                  "grammar": pb.FINISH_REASON_GRAMMAR}


Key = tuple[str, ...]  # (task, draft served; "" for target-only), and the segment as counted after them


class Totals:
    """Counts per key since the router started, for GetStats: per (task, draft), and per (task,
    draft, segment) of the requests that named a segment."""

    def __init__(self) -> None:
        self.requests: defaultdict[Key, int] = defaultdict(int)
        self.output_tokens: defaultdict[Key, int] = defaultdict(int)
        self.stats: defaultdict[Key, SpecStats] = defaultdict(SpecStats)

    def add(self, key: Key, request: Request) -> None:
        self.requests[key] += 1
        self.output_tokens[key] += len(request.decoding.committed)
        self.stats[key].add(request.decoding.stats)

    def task_message(self, task: str, draft: str) -> pb.TaskStats:
        key = (task, draft)
        s = self.stats.get(key, SpecStats())
        return pb.TaskStats(task=task, draft=draft, requests=self.requests.get(key, 0),
                            proposed_tokens=s.proposed, accepted_tokens=s.accepted, target_passes=s.target_passes,
                            output_tokens=self.output_tokens.get(key, 0), drafted_tokens=s.drafted,
                            wasted_draft_tokens=s.wasted,
                            acceptance_rate=s.acceptance_rate, tokens_per_pass=s.tokens_per_pass)

    def segment_message(self, key: Key, priced: ArmView | None) -> pb.SegmentStats:
        s = self.stats[key]
        task, draft, segment = key
        return pb.SegmentStats(task=task, draft=draft, segment=segment, requests=self.requests[key],
                               proposed_tokens=s.proposed, accepted_tokens=s.accepted, rejections=s.rejections,
                               target_passes=s.target_passes, output_tokens=self.output_tokens[key], alpha=s.alpha,
                               tokens_per_pass=s.tokens_per_pass,
                               expected_speedup=priced.expected_speedup if priced else 0.0, k=priced.k if priced else 0)


class SpecServeService:
    """The client API. Per request: validate, admit, resolve the task, route (policy), run the
    request, then teach the policy what happened and record metrics."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, limits: Limits, directory: WorkerDirectory,
                 config: RouterConfig, resolver: TaskResolver, rng: random.Random | None = None,
                 priors: dict[str, dict[str, float]] | None = None,
                 trees: dict[str, tuple[str, ...]] | None = None,
                 heads: dict[str, tuple[int, ...]] | None = None, router_id: str = "router",
                 readiness: Readiness | None = None, on_verifier: frozenset[str] = frozenset(),
                 cascades: dict[str, str] | None = None) -> None:
        self.config = config
        # Whether the configured capacity is up (the ingress keeps it; in process: from the start).
        self.readiness = readiness or Readiness(frozenset(), 0, ready=True, waiting_for="")
        self.router_id = router_id  # which router process this is (GetStats says: router.replicas > 1)
        self.tokenizer = tokenizer
        self.limits = limits
        self.directory = directory
        self.resolver = resolver
        rng = rng or random.Random()
        self.policy = Policy(config.policy, limits.tasks, rng, priors=priors or {}, on_verifier=on_verifier)
        self.lookahead_budget = LookaheadBudget(config.lookahead_min_hit_rate)
        self.draft_free = DraftFree(config.ngram, config.suffix)
        proposers = ProposerFactory(self.draft_free, trees or {}, config.tree_max_tokens, heads or {}, on_verifier,
                                    cascades or {}, Cascade(config.cascade_guesses, config.cascade_min_p))
        # A group of more than half a run would hold the replica's run up at its end (the router
        # tops a run up once half of it has arrived).
        decode_group = min(config.stream_interval_tokens, max(1, config.decode_run_tokens // 2))
        self.workers = Workers(tokenizer, directory, config.timeouts, proposers, config.lookahead,
                               config.decode_run_tokens,
                               config.lookahead_branch_min_odds if config.lookahead_branch else None, decode_group)
        self.learning = LearningBudget(config.learning_cpu_share)
        self.scorer = ContinuationScorer(self.policy, directory, config.policy.score_fraction, rng, self.draft_free,
                                         frozenset(heads or {}) | on_verifier)
        self.metrics = RouterMetrics()
        self.admission = Admission(config.max_concurrent_requests, config.max_queued_requests, self._record_admission)
        self.totals = Totals()  # per (task, draft)
        self.segments = Totals()  # per (task, draft, segment)
        self.canaries = CanaryRoutes(rng)  # the control's canaries, as the ingress last read them
        self.sample = TrafficSample(config.traffic_sample, router_id).start() if config.traffic_sample.dir else None
        self.passes = {"target": PassWindow(), "draft": PassWindow()}  # the latest steps' batches, for GetStats

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Generate": grpc.unary_unary_rpc_method_handler(
                self.Generate, response_serializer=pb.GenerateResponse.SerializeToString),
            "GenerateStream": grpc.unary_stream_rpc_method_handler(
                self.GenerateStream, response_serializer=pb.GenerateChunk.SerializeToString),
            "GetStats": grpc.unary_unary_rpc_method_handler(
                self.GetStats, request_deserializer=pb.GetStatsRequest.FromString,
                response_serializer=pb.ServiceStats.SerializeToString),
        })

    async def Generate(self, data: bytes, context: grpc.aio.ServicerContext) -> pb.GenerateResponse:
        chunks = [chunk async for chunk in self.GenerateStream(data, context)]
        # Joined once at the end: appending to a protobuf string field copies it on every step.
        return pb.GenerateResponse(text="".join(c.text for c in chunks),
                                   token_ids=[t for c in chunks for t in c.token_ids],
                                   finish_reason=chunks[-1].finish_reason, stats=chunks[-1].stats,
                                   logprobs=[lp for c in chunks for lp in c.logprobs])

    async def GenerateStream(self, data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateChunk]:
        try:
            turn = await self.admit(parse_request(data))
        except (InvalidRequest, Overloaded) as exc:
            await _abort(context, exc)
        # grpc does not close a handler's generator when its RPC is cancelled during a write (a
        # slow client): the generator's finally would wait for garbage collection. The done
        # callback frees the request's turn and its workers' sessions at once either way.
        context.add_done_callback(turn.release)
        try:
            async for chunk in self.run(turn, _deadline(context)):
                message = pb.GenerateChunk(text=chunk.text, token_ids=chunk.token_ids)
                if chunk.logprobs is not None:
                    message.logprobs.extend(logprob_messages(chunk.logprobs))
                if chunk.finish_reason:
                    message.finish_reason = FINISH_REASONS[chunk.finish_reason]
                    message.stats.CopyFrom(stats_message(turn.running))
                yield message
        except FAILURES as exc:
            await _abort(context, exc)

    async def admit(self, raw: pb.GenerateRequest) -> Turn:
        """Validate a request and wait for its turn: what every front (gRPC, HTTP) does first.
        Raises InvalidRequest or Overloaded, counted as refused."""
        try:
            request = validate(raw, self.tokenizer, self.limits)
            await self.admission.enter()
        except (InvalidRequest, Overloaded) as exc:
            self.metrics.record_refused(status_of(exc).name)
            raise
        return Turn(self.admission, request, raw.prompt)

    async def run(self, turn: Turn, deadline: float | None) -> AsyncIterator[Chunk]:
        """An admitted request's output, chunk by chunk; then the policy learns from it and its
        metrics are recorded. A worker failure the request could not survive raises one of
        FAILURES mid-stream. The turn is released at the end, or earlier by the front."""
        status = grpc.StatusCode.OK
        try:
            turn.running = self._start(turn.request, turn.prompt, deadline)
            async for chunk in paced(turn.running.run(), self.config.stream_interval_tokens):
                yield chunk
            self._learn(turn.running)
            if self.sample is not None:  # the prompt as sent (a chat's: as its template rendered it)
                self.sample.offer(turn.running.task.task, turn.prompt, turn.running.decoding.output.text)
        except FAILURES as exc:
            status = status_of(exc)
            log.warning("request %s failed: %s", turn.running and turn.running.request_id, exc)
            raise
        except (asyncio.CancelledError, GeneratorExit):  # the client went away or its deadline passed
            status = grpc.StatusCode.CANCELLED
            raise
        finally:
            turn.release()
            if turn.running is not None:
                view = self.policy.view(turn.running.task.task)
                self.metrics.record(turn.running, view, status.name)
                self.metrics.record_view(view)
                self.metrics.record_realized(self.policy.realized)

    def _start(self, request: ValidRequest, prompt: str, deadline: float | None) -> Request:
        task = self.resolver.resolve(request.task, prompt)
        self.policy.pass_cap = self.directory.target_pass_cap()
        if not self.policy.passes_timed:
            self.policy.seed_passes(self.directory.target_pass_times())  # once: until real passes are timed
        pressure = self.directory.target_pressure()
        route = self.policy.route(task.task, request.mode, request.draft, request.k, pressure)
        route = self.canaries.assign(task.task, route, self.directory.serves)
        policy = self.config.policy
        schedule = "fixed" if request.k is not None else policy.k_schedule  # a client's k is taken as given
        length = DraftLength(schedule, route.k, policy.k_max, policy.confidence_threshold)
        ahead = self.lookahead_budget.allows(task.task, route.draft, request.params.sampling.greedy)
        starting = not self.readiness.ready
        return Request(request, Routing(task, route, length, pressure, ahead, starting), self.workers, deadline)

    def _learn(self, request: Request) -> None:
        """A finished request: into the totals and the policy; scored by the other proposers (the
        draft-free ones within the learning budget, drafts sometimes); its output joins its task's
        suffix trie (within the budget too)."""
        task, draft = request.task.task, request.route.draft or ""
        self.totals.add((task, draft), request)
        if request.valid.segment:
            key = (task, draft, request.valid.segment)
            self.segments.add(key, request)
            self._record_segment(key)
        self.passes["target"].add(request.times.target_passes)
        self.passes["draft"].add(request.times.draft_passes)
        self.policy.observe(task, request.route.draft, request.observation())
        stats = request.decoding.stats
        self.canaries.record(task, request.route.draft, stats.accepted, stats.rejections)
        self.lookahead_budget.observe(task, request.route.draft, request.params.sampling.greedy, stats.lookaheads,
                                      stats.lookahead_hits)
        greedy, prompt, output = request.params.sampling.greedy, request.valid.prompt_ids, request.decoding.committed

        def learn_draft_free() -> None:
            if greedy:  # scoring compares greedy choices
                self.scorer.score_draft_free(task, request.route.draft, prompt, output)
            self.draft_free.learn(task, output)  # after scoring: no proposer sees its own answer

        self.learning.run(learn_draft_free)
        if greedy:
            self.scorer.offer(task, request.route.draft, prompt, output)

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.ServiceStats:
        workers = [pb.WorkerInfo(kind=e.kind, worker_id=e.worker_id, address=e.address, models=e.models,
                                 live_sessions=e.live_sessions, node_id=e.node_id,
                                 pass_widths=[tokens for tokens, _ in e.pass_times],
                                 pass_seconds=[seconds for _, seconds in e.pass_times],
                                 prefix_prompt_tokens=e.prefix_tokens[0], prefix_reused_tokens=e.prefix_tokens[1])
                   for e in await self.directory.refresh(force=True) if e.kind != "router"]
        self.policy.pressure = self.directory.target_pressure()  # judged on the targets as they are now
        self.policy.pass_cap = self.directory.target_pass_cap()
        if not self.policy.passes_timed:
            self.policy.seed_passes(self.directory.target_pass_times())
        return pb.ServiceStats(tasks=self._task_rows(), workers=workers, requests_in_flight=self.admission.running,
                               requests_rejected=self.admission.refused, requests_queued=self.admission.waiting,
                               passes=self._pass_rows(), load=self._load_pricing(), router=self.router_id,
                               ready=self.readiness.ready, waiting_for=self.readiness.waiting_for,
                               segments=[self._segment_row(key) for key in sorted(self.segments.requests)],
                               canaries=[self._canary_row(status) for status in self.canaries.statuses])

    def _canary_row(self, status: CanaryStatus) -> pb.CanaryStats:
        def speedup(arm: ArmSums) -> float:
            priced = self.policy.priced_at(status.tasks[0], status.draft, arm.alpha) if arm.trials else None
            return priced.expected_speedup if priced else 0.0

        return pb.CanaryStats(draft=status.draft, version=status.version, source=status.source, tasks=status.tasks,
                              share=status.config.share, state=status.state, reason=status.reason,
                              base_requests=status.base.requests, canary_requests=status.canary.requests,
                              base_alpha=status.base.alpha, canary_alpha=status.canary.alpha,
                              base_speedup=speedup(status.base), canary_speedup=speedup(status.canary),
                              z=_finite(status.z), z_needed=status.config.z_needed, looks=status.looks,
                              max_looks=status.config.looks, started_unix=status.started,
                              finished_unix=status.finished)

    def _priced(self, key: Key) -> ArmView | None:
        """A segment's requests priced with the draft that served them, at their alpha; None where
        there is nothing to price (target-only, or no proposal verified yet: no alpha, not 0)."""
        task, draft, _ = key
        s = self.segments.stats[key]
        return self.policy.priced_at(task, draft, s.alpha) if draft and s.accepted + s.rejections else None

    def _segment_row(self, key: Key) -> pb.SegmentStats:
        return self.segments.segment_message(key, self._priced(key))

    def _record_segment(self, key: Key) -> None:
        """The segment's expected speedup with its draft, as GetStats prices it, into the gauge."""
        if (priced := self._priced(key)) is not None:
            task, draft, segment = key
            self.metrics.segment_speedup.set(priced.expected_speedup, {"task": task, "draft": draft, "segment": segment})

    def _pass_rows(self) -> list[pb.PassStats]:
        return [pb.PassStats(kind=kind, **asdict(window.summary())) for kind, window in self.passes.items()]

    def _load_pricing(self) -> pb.LoadPricing:
        """What a step is priced at now."""
        load = self.policy.load()
        line = load.pass_time
        return pb.LoadPricing(sessions=load.sessions, saturated=load.saturated,
                              pass_fixed_seconds=line.fixed if line else 0.0,
                              pass_seconds_per_token=line.per_token if line else 0.0)

    def _task_rows(self) -> list[pb.TaskStats]:
        """Per task, a row for the task (draft "": its decision, and its target-only totals), then
        one per draft allowed for it (the policy's estimates, and the totals it served)."""
        rows = []
        sampled = self.sample.counts() if self.sample is not None else {}
        for task in sorted(self.policy.tasks):
            view = self.policy.view(task)
            row = self.totals.task_message(task, "")
            row.MergeFrom(pb.TaskStats(alpha=view.best.alpha, cost_ratio=view.best.c, k=view.best.k,
                                       expected_speedup=view.best.expected_speedup, decision=view.decision,
                                       reason=view.reason, step_cost=view.best.step_cost,
                                       unloaded_k=view.best.unloaded_k, sampled_requests=sampled.get(task, 0)))
            rows.append(row)
            for arm in view.arms:
                row = self.totals.task_message(task, arm.draft)
                standing = "best" if arm.draft == view.best.draft else ("candidate" if arm.trials else "unseen")
                row.MergeFrom(pb.TaskStats(alpha=arm.alpha, cost_ratio=arm.c, k=arm.k, step_cost=arm.step_cost,
                                           unloaded_k=arm.unloaded_k, expected_speedup=arm.expected_speedup,
                                           decision=standing, scored_tokens=arm.scored_tokens,
                                           alpha_per_position=arm.alpha_per_position))
                rows.append(row)
        return rows

    def _record_admission(self, admission: Admission) -> None:
        self.metrics.in_flight.set(admission.running)
        self.metrics.queued.set(admission.waiting)


async def paced(chunks: AsyncIterator[Chunk], interval: int) -> AsyncIterator[Chunk]:
    """The chunks, merged so that each carries at least ``interval`` tokens: the first goes at once
    (time to first token is unchanged), the last whatever it holds."""
    held: Chunk | None = None
    first = True
    async for chunk in chunks:
        held = chunk if held is None else held.followed_by(chunk)
        if first or held.finish_reason or len(held.token_ids) >= interval:
            yield held
            held, first = None, False
    if held is not None:  # the request's loop ended without a finish reason: cancelled under us
        yield held


def logprob_messages(logprobs: TokenLogprobs) -> list[pb.TokenLogprob]:
    return [pb.TokenLogprob(logprob=chosen, top_ids=ids, top_logprobs=top)
            for chosen, ids, top in zip(logprobs.chosen, logprobs.top_ids, logprobs.top, strict=True)]


def stats_message(request: Request) -> pb.GenerateStats:
    s = request.decoding.stats
    return pb.GenerateStats(task=request.task.task, draft=request.route.draft or "", proposed_tokens=s.proposed,
                            accepted_tokens=s.accepted, target_passes=s.target_passes, seed=s.seed, rejections=s.rejections,
                            draft_seconds=s.draft_seconds, verify_seconds=s.verify_seconds,
                            total_seconds=request.elapsed(), first_token_seconds=request.first_token_seconds,
                            lookaheads=s.lookaheads, lookahead_hits=s.lookahead_hits, drafted_tokens=s.drafted,
                            branch_hits=s.branch_hits,
                            wasted_draft_tokens=s.wasted,
                            task_source=request.task.source, task_confidence=request.task.confidence,
                            route=request.route.reason, k=request.route.k, target_resumes=request.target_resumes,
                            draft_reopens=request.draft_reopens, target_full_refusals=request.full_refusals,
                            cached_prompt_tokens=request.target.cached_tokens,
                            target_replica=request.target.replica, target_pick=request.target.pick,
                            segment=request.valid.segment)


class Turn:
    """An admitted request: its validated fields, then the request running. ``release`` gives the
    admission turn back and abandons the running request (its workers' sessions), once, whichever
    of the run's end and the front's own notice (an RPC's done callback, a closed HTTP connection)
    comes first."""

    def __init__(self, admission: Admission, request: ValidRequest, prompt: str) -> None:
        self.admission = admission
        self.request = request
        self.prompt = prompt
        self.running: Request | None = None  # set when the run starts
        self.done = False

    def release(self, *_) -> None:
        if self.done:
            return
        self.done = True
        self.admission.leave()
        if self.running is not None:
            self.running.abandon()


def _finite(z: float) -> float:
    """A z for the wire: arms without variance (every draft token accepted: inf) at a bound a reader
    sees as decisive; NaN as 0."""
    return max(-1e9, min(1e9, z)) if z == z else 0.0


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The client's deadline on this process's monotonic clock (None: it set none)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def status_of(exc: Exception) -> grpc.StatusCode:
    if isinstance(exc, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, TargetsFull):
        return grpc.StatusCode.RESOURCE_EXHAUSTED  # every target replica full for the whole full wait
    if isinstance(exc, grpc.aio.AioRpcError):  # a worker refused a step it should have taken: a bug
        return grpc.StatusCode.INTERNAL
    return grpc.StatusCode.UNAVAILABLE  # no worker could serve or resume the request: retryable


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    details = f"a worker answered {exc.code().name}: {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    await context.abort(status_of(exc), details)
