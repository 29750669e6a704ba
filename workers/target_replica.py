"""A target replica: a Ray Serve deployment holding the target model on its own device.

Each Verify stream is one session with its own region of the replica's KV pool. A step is one
proposal (possibly empty: target-only decoding); the replica's scheduler verifies it in a forward
pass shared with the steps of other sessions pending at that moment (continuous batching), commits
the verdict to the session's cache and answers with the verdict. A session decoding target-only
asks for a run of tokens instead, answered one reply per pass while it stays in the batch. Serve
deploys, places and restarts replicas; the per-step traffic goes over the stream, never through
Serve handles (a handle hop costs ~4 ms).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from dataclasses import replace
from collections.abc import AsyncIterator, Callable

import grpc

from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc

from .acceptance import Outcome
from .batching import Scheduler, StepResult
from .calibration import widest_within
from .config import TargetConfig
from .drafting import DRAFT_MAX_SUPPORT
from .grammar import GrammarCompiler, grammar_compiler, no_grammars, warm_grammars
from .heads.fed_guess import FedGuessBatch, FedGuesser
from .heads.format import load_head_of
from .heads.medusa import MedusaHeads, load_medusa
from .heads.medusa_draft import GuessBatch, MedusaGuesser, runner_up
from .heads.proposer import opened_state
from .loading import ModelSpec, gemv_layout, load_model
from .logs import log_to_stderr
from .model_host import ModelHost, SessionIdle, SessionLimit, first_open
from .multiplexing import serve_multiplexed
from .pass_hooks import HiddenKeeper, PassHook
from .ragged_pass import PooledSequence
from .registry import Registration
from .request import DEFAULT_K, MAX_K
from .seeds import DraftDraws, verifier_generator
from .verifying import DecodeRun, TargetSession
from .wire import (extras_message, logprobs_message, pass_info, processing_from, proposal_from, sampling_from,
                   verdict_message)


class TargetReplica:
    """The Serve deployment class (options applied in ``cluster/app.py``)."""

    def __init__(self, config: dict, target: ModelSpec, registration: Registration,
                 medusa: dict[str, ModelSpec] | None = None, heads: dict[str, ModelSpec] | None = None) -> None:
        """``medusa``: the Medusa heads it serves by name, guessing in its verify passes; ``heads``:
        heads fed by its hidden states (an MTP module, an EAGLE-3 head) it serves by name, drafting
        after each verify pass (heads/fed_guess.py)."""
        log_to_stderr()
        cfg = TargetConfig.model_validate(config)  # plain data across Serve, checked again here
        self.autoscaling = cfg.autoscaling
        # Structured output's grammars, over the target's own tokenizer, built in the background now.
        self.grammars = lambda: grammar_compiler(target.source)
        warm_grammars(target.source)
        model = load_model(target)
        layer = MedusaHeads.reads_layer(model.config)
        self.medusa = {name: GuessBatch(gemv_layout(load_medusa(spec.source, model)), layer)
                       for name, spec in (medusa or {}).items()}
        self.heads = {name: FedGuessBatch(gemv_layout(load_head_of(spec.source, model)))
                      for name, spec in (heads or {}).items()}
        servicer = VerifierServicer(self)
        self.host = ModelHost("target", f"target-{uuid.uuid4().hex[:8]}", {"target": model}, cfg,
                              registration, lambda server: rpc.add_VerifierServicer_to_server(servicer, server),
                              time_passes=True)

    def guesser(self, opened: pb.SessionOpen, reused: int = 0) -> MedusaGuesser | FedGuesser:
        """A session's side of the heads it names, its ``PassHook`` (workers/pass_hooks.py); its first
        ``reused`` positions came from the prefix cache: a fed head starts after them. ValueError if
        it serves none so named."""
        name, depth = opened.target.on_verifier, opened.target.on_verifier_depth or DEFAULT_K
        if (fed := self.heads.get(name)) is not None:
            return FedGuesser(fed, opened_state(fed.head, opened, name), depth, reused)
        batch = self.medusa.get(name)
        if batch is None:
            raise ValueError(f"this target replica serves no heads {name!r}; it serves "
                             f"{', '.join([*self.medusa, *self.heads]) or 'none'}")
        return MedusaGuesser(batch, sampling_from(opened.sampling),
                             DraftDraws(opened.sampling.seed, name), DRAFT_MAX_SUPPORT,
                             DraftDraws(opened.sampling.seed, runner_up(name)))

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What Serve's autoscaler reads of this replica (``cluster/autoscaling.py``): its live
        sessions, and how many it holds within the TPOT budget (its start-up pass timings)."""
        budget = self.autoscaling.tpot_budget_ms / 1000 if self.autoscaling else math.inf
        return {"sessions": float(self.host.slots.live),
                "capacity": float(widest_within(self.host.pass_times, budget))}

    def check_health(self) -> None:
        """Serve restarts a replica whose stream server has died."""
        if not self.host.server.alive:
            raise RuntimeError(f"target replica {self.host.worker_id}: its gRPC server stopped")

    def __del__(self) -> None:
        """Serve removing the replica (autoscaling down, an update): its sessions end here first,
        for up to DRAIN_SECONDS, instead of resuming elsewhere (which counts against a request's resumes)."""
        host = getattr(self, "host", None)
        if host is not None:
            host.drain()
            host.shutdown()


def target_session(sequence: PooledSequence, opened: pb.SessionOpen,
                   grammars: Callable[[], GrammarCompiler] = no_grammars,
                   guesser: Callable[[pb.SessionOpen, int], PassHook | None] = lambda opened, reused: None
                   ) -> TargetSession:
    """The session a Verify stream's open message asks for (with the hook that serves its proposer:
    the hidden states its head reads, or the side of the heads that draft in or after its passes,
    ``guesser``'s; its processing and its grammar, which has consumed the output it already holds)."""
    if opened.WhichOneof("role") == "draft":
        raise ValueError("a target replica's session opens with SessionOpen.target (or no role), not .draft")
    target = opened.target
    if target.on_verifier and target.aux_layers:
        raise ValueError("a session drafts on the verifier or with a head's hidden states elsewhere, not both: "
                         "give TargetOpen.on_verifier or aux_layers")
    if target.on_verifier_depth > MAX_K:
        raise ValueError(f"on_verifier_depth must be 0..{MAX_K} (0: {DEFAULT_K}), got {target.on_verifier_depth}")
    grammar = None
    if opened.HasField("grammar"):
        output = opened.prompt_ids[opened.grammar.output_start:]
        grammar = grammars().state(opened.grammar.compiled, output)
    hook = (HiddenKeeper(tuple(target.aux_layers), sequence.reused) if target.aux_layers
            else guesser(opened, sequence.reused) if target.on_verifier else None)
    return TargetSession(sequence, sampling_from(opened.sampling), verifier_generator(opened.sampling.seed), hook,
                         target.top_logprobs if target.logprobs else None, processing_from(target.processing),
                         target.processing.output_start if target.HasField("processing") else None, grammar)


def verify_reply(verdict: Outcome, done: StepResult, session: TargetSession) -> pb.VerifyReply:
    reply = pb.VerifyReply(verdict=verdict_message(verdict), seconds=done.device_seconds, pass_info=pass_info(done))
    if session.sequence.reused:
        reply.cached_tokens = session.sequence.reused
    extras_message(reply, session.take_extras(), session.sampling.greedy)
    if (logprobs := session.take_logprobs()) is not None:
        reply.logprobs.CopyFrom(logprobs_message(logprobs))
    if session.ended:
        reply.ended = session.ended
    return reply


class DecodeRuns:
    """A session decoding target-only, from its first decode request to the end of its stream.

    Each grant is a run of tokens the scheduler keeps in every pass, answered one reply per token
    as its pass settles (or, with a ``group`` > 1, a group's replies together: the run's first at
    once, then each full group, and what is left where the run's granted tokens end). The router
    grants more before a run ends; a grant that has arrived by the end of a pass extends the run
    under way, so the session stays in the batch for as long as the router keeps granting (one that
    comes too late starts the next run). A session decoding in runs takes decode requests only: it
    has no draft, and never gets one back.
    """

    def __init__(self, scheduler: Scheduler, session: TargetSession, task: str, inbox: AsyncIterator,
                 context: grpc.aio.ServicerContext, group: int = 1) -> None:
        self.scheduler = scheduler
        self.session = session
        self.task = task
        self.inbox = inbox
        self.group = max(1, group)  # replies sent together (TargetOpen.decode_group)
        self.reader = self._read()
        self.runner: asyncio.Future | None = None
        # The RPC may end while its handler is paused at a reply; the run must leave the batch then,
        # before the session's region (given back by the same callbacks) is taken by another.
        context.add_done_callback(lambda _: self.stop())

    async def replies(self, grant: int) -> AsyncIterator[pb.VerifyReply]:
        try:
            while grant:
                async for reply in self._run(self.session.decode(grant)):
                    yield reply
                grant = await self._next_grant()
        finally:
            self.stop()

    def stop(self) -> None:
        self.reader.cancel()
        if self.runner is not None:
            self.runner.cancel()

    async def _run(self, run: DecodeRun) -> AsyncIterator[pb.VerifyReply]:
        replies: asyncio.Queue = asyncio.Queue()
        held: list[pb.VerifyReply] = []  # this group's replies so far

        drawn = 0

        def on_pass(done: StepResult) -> None:  # between passes, on the event loop
            nonlocal drawn
            if len(run.verdicts) > drawn:  # a prefill chunk draws no token
                drawn += 1  # the run's queue wait is its first token's only
                held.append(verify_reply(run.verdicts[-1], done if drawn == 1 else replace(done, queue_seconds=0.0),
                                         self.session))
            grant = self._arrived_grant()
            if grant and run.extend(grant):
                self.reader = self._read()
            if held and (drawn == 1 or len(held) >= self.group or run.result is not None):  # first, full, or last
                for reply in held:  # put in one turn: they leave in one message
                    replies.put_nowait(reply)
                held.clear()

        self.runner = asyncio.ensure_future(self.scheduler.run(run, self.task, on_pass))
        self.runner.add_done_callback(replies.put_nowait)  # after the last pass's reply
        while (reply := await replies.get()) is not self.runner:
            yield reply
        self.runner.result()  # the run's error, if it failed

    def _arrived_grant(self) -> int:
        """The tokens of a decode request read already (0: none yet, or not a valid grant)."""
        if not self.reader.done() or self.reader.cancelled() or self.reader.exception() is not None:
            return 0
        request = self.reader.result()
        return request.decode if request is not None and request.WhichOneof("kind") == "decode" else 0

    async def _next_grant(self) -> int:
        """The next run's tokens; 0 when the router closed the stream."""
        request = await self.reader
        if request is None:
            return 0
        if request.WhichOneof("kind") != "decode":
            raise ValueError("a session decoding in runs takes decode requests only")
        self.reader = self._read()
        return request.decode

    def _read(self) -> asyncio.Future:
        reader = asyncio.ensure_future(anext(self.inbox, None))
        reader.add_done_callback(lambda t: t.cancelled() or t.exception())  # surfaced by _next_grant, if awaited
        return reader


class VerifierServicer(rpc.VerifierServicer):
    def __init__(self, replica: TargetReplica) -> None:
        self.replica = replica

    async def Verify(self, requests, context: grpc.aio.ServicerContext):
        async for reply in self.serve(requests, context):
            yield reply

    async def VerifyMany(self, frames, context: grpc.aio.ServicerContext):
        """A router's sessions on this replica over one stream, each served as ``Verify`` serves one."""
        async for message in serve_multiplexed(frames, self.serve, pb.VerifyRequest.FromString):
            yield message

    async def serve(self, requests, context):
        """One session: its requests (the first opens it), answered one reply a step or a token."""
        opened = await first_open(requests, context)
        host = self.replica.host
        try:
            with host.session("target", opened, context) as (scheduler, sequence):
                session = target_session(sequence, opened, self.replica.grammars, self.replica.guesser)
                inbox = host.steps(requests)
                async for request in inbox:
                    if request.WhichOneof("kind") == "decode":  # target-only from here to the end
                        runs = DecodeRuns(scheduler, session, opened.task, inbox, context, opened.target.decode_group)
                        async for reply in runs.replies(request.decode):
                            yield reply
                        return
                    done = await scheduler.run(session.step(proposal_from(request.step)), opened.task)
                    yield verify_reply(done.result, done, session)
        except SessionLimit as exc:  # before any reply: said on the stream (ModelHost.refuse says why)
            yield pb.VerifyReply(refused=str(exc))
            await host.refuse(requests)
        except SessionIdle as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except ValueError as exc:  # a malformed proposal: this session ends, the replica carries on
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def Inspect(self, request, context) -> pb.WorkerState:
        return self.replica.host.state()
