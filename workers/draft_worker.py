"""A draft worker: a Ray actor holding one or more draft models on its own device.

Each Draft stream is one session (a ``Drafter``, workers/drafters.py: the same class drafts in the
in-process engine). Per step the router says what stands, in absolute lengths (keep
this many tokens of what the session holds, append these: a verdict, or a whole proposal for a
lookahead), and how many tokens to propose; the worker moves its cache length accordingly (rollback
is bookkeeping) and drafts from there. A step may say the one before it is stale (a lookahead for a
verdict that did not come): that one stops at the next pass boundary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from specserve.proto.v1 import internal_pb2 as pb
from specserve.proto.v1 import internal_pb2_grpc as rpc

from .batching import Scheduler, StepResult
from .config import DraftPoolConfig
from .drafters import Drafter, model_drafter
from .drafting import Cascade, Misalignment, score_continuation
from .grammar import GrammarCompiler, GrammarState, grammar_compiler, no_grammars, warm_grammars
from .grammar_spec import GrammarError
from .heads.eagle3 import Eagle3Head
from .heads.format import is_head, load_heads
from .heads.proposer import HeadDrafter, HeadScheduler, opened_state
from .loading import ModelSpec, gemv_layout, load_model, load_tokenizer
from .logs import log_to_stderr
from .proposer_kinds import VERSION_MARK, base_draft
from .model_host import HostLoad, ModelHost, SessionIdle, SessionLimit, first_open
from .multiplexing import serve_multiplexed
from .ragged_pass import PooledSequence
from .registry import Registration
from .request import MAX_K
from .seeds import DraftDraws
from .steps import Step
from .token_bridge import TokenBridge, bridge_if_needed
from .tokenizer_check import TokenizerMismatch, check_compatible
from .proposing import ProposerGone
from .wire import alternatives_message, pass_info, proposal_message, sampling_from, step_from

log = logging.getLogger("specserve.workers")


class DraftWorker:
    """Runs as a Ray actor (see ``cluster/pool.py``); its stream endpoint is in the registry.

    A draft that is an EAGLE-3 head directory is held as a head of ``target`` (whose config it is
    checked against, and whose embeddings it borrows if it has none of its own)."""

    def __init__(self, worker_id: str, drafts: dict[str, ModelSpec], config: DraftPoolConfig,
                 registration: Registration, target: ModelSpec | None = None) -> None:
        log_to_stderr()
        heads = {name: spec for name, spec in drafts.items() if is_head(spec.source)}
        self.models = {name: load_model(spec) for name, spec in drafts.items() if name not in heads}
        # Each draft's structured output, over its own tokenizer (the target's ids: checked at start-up).
        self.grammars = {name: functools.partial(grammar_compiler, drafts[name].source) for name in self.models}
        for name in self.models:
            warm_grammars(drafts[name].source)
        self.heads = {name: gemv_layout(head) for name, head in (load_heads(heads, target) if heads else {}).items()}
        self.specs, self.target, self.batching = dict(drafts), target, config.batching  # what swaps load from
        # Drafts of another tokenizer than the target's, by name: they draft through the tokens the
        # two share (workers/token_bridge.py). Without a target given, every draft is taken as the
        # target's tokenizer's (the pool checked them at start-up).
        target_tokenizer = load_tokenizer(target.source) if target is not None and self.models else None
        self.bridges = {name: bridge for name, model in self.models.items() if target_tokenizer is not None
                        and (bridge := bridge_if_needed(target_tokenizer, drafts[name].source,
                                                        model.config.vocab_size, name)) is not None}
        servicer = DrafterServicer(self)
        self.host = ModelHost("draft", worker_id, self.models, config, registration,
                              lambda server: rpc.add_DrafterServicer_to_server(servicer, server), extra=tuple(self.heads),
                              spare_pools=config.version_pools if self.models else 0)
        # Each head's sessions draft in shared passes, as a draft model's do (on the same device).
        self.head_schedulers = {name: HeadScheduler(head, self.host.device, config.batching, name)
                                for name, head in self.heads.items()}

    def misalignment(self, opened: pb.SessionOpen) -> Misalignment | None:
        """On a simulated device, the alignment set for the session's draft on its task (a version
        takes its draft's), as the in-process engine's (SpecEngine.simulate)."""
        return Misalignment.of(self.host.device.sim, base_draft(opened.draft.model), opened.task, opened.sampling.seed,
                               opened.draft.model)

    def swap_draft(self, name: str, source: str) -> str:
        """Serve the draft at ``source`` (a model directory, or an EAGLE-3 head's for a head) as draft
        ``name`` from now on, without a restart: sessions opened after this draft with it; those
        already open finish on the one they opened with (their stream holds it and its scheduler),
        which goes once the last of them ends (a model's KV memory with it). The version served
        beside it from that ``source`` (a canary promoted) is taken as it is, not loaded again. A
        new head is checked against the target as at start-up. Returns this worker's id. A worker
        Ray restarts after a crash comes back with the drafts it was started with; the pool swaps
        it again (``DraftPool.supervise``)."""
        if name not in self.heads and name not in self.models:
            raise ValueError(f"this worker has no draft {name!r}; its drafts: {', '.join(self.served()) or 'none'}")
        self._serve(name, source)
        log.info("%s: draft %s is now the one at %s; sessions open on the one before finish on it",
                 self.host.worker_id, name, source)
        return self.host.worker_id

    def add_version(self, name: str, source: str) -> str:
        """Serve the draft at ``source`` beside its draft as ``name`` (``draft@version``: a canary,
        cluster/canary.py); the same as a swap where it serves that version already."""
        if base_draft(name) == name or base_draft(name) not in self.served():
            raise ValueError(f"{name!r} is not a version of one of this worker's drafts "
                             f"({', '.join(self.served()) or 'none'}): name it <draft>{VERSION_MARK}<version>")
        self._serve(name, source)
        self._register()
        log.info("%s: serving the draft at %s as %s beside %s", self.host.worker_id, source, name, base_draft(name))
        return self.host.worker_id

    def retire_version(self, name: str) -> str:
        """Take no new sessions on version ``name``; those open on it finish on it (their stream holds
        the head, or the model's scheduler), which goes once the last of them ends."""
        if base_draft(name) != name and name in self.served():
            if name in self.heads:
                self.host.on_loop(lambda: self._unserve_head(name))
            else:
                self.host.on_loop(lambda: self._unserve_model(name))
            self._register()
            log.info("%s: version %s retired; its open sessions finish on it", self.host.worker_id, name)
        return self.host.worker_id

    def served(self) -> tuple[str, ...]:
        """The drafts it serves now: its models and heads, and their versions."""
        return (*self.models, *self.heads)

    def _register(self) -> None:
        """Say what it serves now at once, not at the next heartbeat: routers route by it."""
        self.host.models = self.served()
        self.host.heartbeat.beat()

    def _serve(self, name: str, source: str) -> None:
        """Load the draft at ``source`` for ``name`` (a draft, or a version of one) and serve it to the
        sessions opened from now on."""
        base = base_draft(name)
        spec = dataclasses.replace(self.specs[base], source=source)
        if base in self.heads:
            head = self._loaded_head(base, spec)
            scheduler = HeadScheduler(head, self.host.device, self.batching, base)
            self.host.on_loop(lambda: self._serve_head(name, spec, head, scheduler))
            return
        adopted = next((n for n in self.models if n != name and base_draft(n) == base and self.specs[n] == spec), None)
        if adopted is not None:  # a canary promoted: its model and scheduler, as measured
            model, scheduler = self.models[adopted], self.host.schedulers[adopted]
        else:
            if self.target is not None:
                check_version_tokenizer(self.target.source, source, base)
            model = load_model(spec)
            scheduler = self.host.added_scheduler(model, base)
            warm_grammars(source)
        self.host.on_loop(lambda: self._serve_model(name, spec, model, scheduler))

    def _loaded_head(self, base: str, spec: ModelSpec) -> Eagle3Head:
        """The head at ``spec`` for a version or swap of head ``base``: it must read the target layers
        ``base`` reads, which the routers ask the target for."""
        head = gemv_layout(load_heads({base: spec}, self.target)[base])
        before, after = self.heads[base].config.aux_layers, head.config.aux_layers
        if tuple(after) != tuple(before):
            raise ValueError(f"the head at {spec.source} reads the target's layers {list(after)}, draft {base!r} reads "
                             f"{list(before)}: the routers send those; distil the new version with --aux-layers "
                             f"{','.join(map(str, before))}, or serve it under a new name (a restart)")
        return head

    def _serve_head(self, name: str, spec: ModelSpec, head: Eagle3Head, scheduler: HeadScheduler) -> None:
        self.heads[name], self.head_schedulers[name], self.specs[name] = head, scheduler, spec

    def _unserve_head(self, name: str) -> None:
        del self.heads[name], self.head_schedulers[name], self.specs[name]

    def _serve_model(self, name: str, spec: ModelSpec, model, scheduler: Scheduler) -> None:
        before = self.host.schedulers.get(name)
        self.host.schedulers[name], self.specs[name] = scheduler, spec
        self.grammars[name] = functools.partial(grammar_compiler, spec.source)
        self.models[name] = model
        # A version speaks the target's tokenizer (the pool checks it): a draft of another
        # tokenizer swapped for one drafts unbridged from now on (open sessions keep their bridge).
        self.bridges.pop(name, None)
        self._retire_unserved(before)

    def _unserve_model(self, name: str) -> None:
        del self.models[name], self.grammars[name], self.specs[name]
        self._retire_unserved(self.host.schedulers.pop(name))

    def _retire_unserved(self, scheduler: Scheduler | None) -> None:
        """A model's scheduler no name serves any more (a version promoted serves two for a while)
        closes its pool once its open sessions end."""
        if scheduler is not None and all(s is not scheduler for s in self.host.schedulers.values()):
            scheduler.retire()

    def sources(self) -> dict[str, str]:
        """Where each of its drafts (and versions) was loaded from (the pool checks a restarted
        worker's: Ray restarts it with the drafts it was first started with)."""
        return {name: self.specs[name].source for name in self.served()}

    def ping(self) -> str:
        """The pool's liveness check (a Ray call, not the stream server)."""
        return self.host.worker_id

    def load(self) -> HostLoad:
        """What the pool's autoscaling reads (``cluster/pool.py``)."""
        return self.host.load(tuple(self.head_schedulers.values()))  # a snapshot: versions come and go on the loop

    def drain(self) -> int:
        """Before the pool removes it: take no new sessions and let the live ones end (up to
        ``DRAIN_SECONDS``); returns how many are left, which the router reopens elsewhere."""
        self.host.drain()
        return self.host.slots.live

    def shutdown(self) -> None:
        self.host.shutdown()


def check_version_tokenizer(target: str, source: str, name: str) -> None:
    """A new version of draft model ``name`` at ``source`` speaks the target's tokenizer, or ValueError."""
    try:
        check_compatible(load_tokenizer(target), load_tokenizer(source))
    except TokenizerMismatch as exc:
        raise TokenizerMismatch(f"the draft at {source} cannot serve as {name!r}: {exc}") from None
    except OSError as exc:
        raise ValueError(f"no draft model at {source} ({exc}): give a directory `specserve distill` wrote, "
                         f"readable at that path on the draft workers' nodes") from None


def draft_grammar(opened: pb.SessionOpen, grammars: Callable[[], GrammarCompiler]) -> GrammarState | None:
    """The grammar a draft drafts within, if the request has one. A draft that cannot build it
    (no tokenizer beside its weights) drafts unmasked: still lossless, as a head's proposals are,
    only accepted less often."""
    if not opened.HasField("grammar"):
        return None
    try:
        return grammars().state(opened.grammar.compiled)
    except GrammarError as exc:
        log.warning("draft %s drafts without the request's grammar: %s", opened.draft.model, exc)
        return None


def opened_drafter(sequence: PooledSequence, opened: pb.SessionOpen,
                   grammars: Callable[[], GrammarCompiler] = no_grammars, bridge: TokenBridge | None = None,
                   misalignment: Misalignment | None = None) -> Drafter:
    """The session a Draft stream's open asks for of a draft model over ``sequence`` (its tokens of
    the request, in its pool); with a ``bridge``, of a draft of another tokenizer."""
    if opened.draft.cascade >= MAX_K or not 0.0 <= opened.draft.cascade_min_p <= 1.0:
        raise ValueError(f"cascade must be 0..{MAX_K - 1} (prompt lookup's guesses a proposal's first pass "
                         f"verifies) and cascade_min_p 0..1, got {opened.draft.cascade} and "
                         f"{opened.draft.cascade_min_p}")
    return model_drafter(sequence, sampling_from(opened.sampling), DraftDraws(opened.sampling.seed, opened.draft.model),
                         alternatives=opened.draft.alternatives,
                         grammar=draft_grammar(opened, grammars) if bridge is None else None,
                         output_start=opened.grammar.output_start,
                         cascade=Cascade(opened.draft.cascade, opened.draft.cascade_min_p), misalignment=misalignment,
                         bridge=bridge, committed=opened.prompt_ids, name=opened.draft.model)


def proposal_reply(drafter: Drafter, run: Step, done: StepResult) -> pb.Proposal:
    """The run's proposal as it stands (stopped early: what it drafted), with the draft's
    alternatives at each token, and the branch beside it, if one was drafted."""
    message = proposal_message(drafter.proposal(run), drafter.greedy, done.device_seconds, pass_info(done))
    if drafter.alternatives:
        alternatives_message(message, run.alternatives)
    if drafter.branch is not None:
        message.branch.CopyFrom(proposal_message(drafter.branch.so_far(), drafter.greedy))
        alternatives_message(message.branch, drafter.branch.alternatives)
    return message


async def _runs(scheduler: Scheduler, drafter: Drafter, requests: AsyncIterator[pb.DraftRequest],
                task: str) -> AsyncIterator[tuple[Step, StepResult]]:
    """Each step request's run, in order, while the next request is read as it comes: one that says
    ``drop_previous`` while the step before it still runs (a lookahead the verdict proved stale)
    stops that step at the scheduler's next pass boundary, and it answers with what it drafted so
    far. The router then waits one pass for the stale step, not all of its k + 1 tokens. (The
    session's idle clock now runs from a step's start, not its answer: harmless, as the idle time,
    120 s by default, is far above any step's timeout in the router, which ends the stream first.)"""
    following: asyncio.Future | None = None
    try:
        request = await anext(requests, None)
        while request is not None:
            step = step_from(request.step)
            if step.adopt:  # a copy in the device's memory: on its thread, between passes
                await scheduler.device.run(drafter.adopt)
            run = drafter.step(step)
            work = asyncio.ensure_future(_with_branch(scheduler, run, drafter, task))
            following = asyncio.ensure_future(anext(requests, None))
            try:
                await asyncio.wait((work, following), return_when=asyncio.FIRST_COMPLETED)
                if not work.done() and _drops_previous(following):
                    scheduler.abandon(run)
                    if drafter.branch is not None:
                        scheduler.abandon(drafter.branch)
                done = await work
            except BaseException:  # the session ends (cancelled, a bad step): so does its step
                work.cancel()
                raise
            yield run, done
            request = await following
    finally:  # ended early: stop reading, and leave no error unretrieved
        if following is not None:
            following.cancel()
            if following.done() and not following.cancelled():
                following.exception()


async def _with_branch(scheduler: Scheduler, run: Step, drafter: Drafter, task: str) -> StepResult:
    """The run, and its branch in the same passes (two steps of one session: the branch writes
    apart). A branch that fails is left out of the reply (a plain miss for the router), and the
    session goes on; a run that fails (or is cancelled) takes its branch out of the scheduler with it."""
    if drafter.branch is None:
        return await scheduler.run(run, task)
    main = asyncio.ensure_future(scheduler.run(run, task))
    side = asyncio.ensure_future(scheduler.run(drafter.branch, task))
    try:
        done = await main
        try:
            await side
        except Exception:
            log.exception("a draft's branch failed; the session goes on without it")
            drafter.branch = None
        return done
    finally:
        for work in (main, side):
            if not work.done():
                work.cancel()


def _drops_previous(following: asyncio.Future) -> bool:
    """The next request has come, and it says the step before it is stale."""
    if not following.done() or following.cancelled() or following.exception() is not None:
        return False
    request = following.result()
    return request is not None and request.step.drop_previous


class DrafterServicer(rpc.DrafterServicer):
    def __init__(self, worker: DraftWorker) -> None:
        self.worker = worker

    async def Draft(self, requests, context: grpc.aio.ServicerContext):
        async for proposal in self.serve(requests, context):
            yield proposal

    async def DraftMany(self, frames, context: grpc.aio.ServicerContext):
        """A router's sessions on this worker over one stream, each served as ``Draft`` serves one."""
        async for message in serve_multiplexed(frames, self.serve, pb.DraftRequest.FromString):
            yield message

    async def serve(self, requests, context):
        """One session: its requests (the first opens it), answered one proposal a step."""
        opened = await first_open(requests, context)
        if opened.WhichOneof("role") != "draft":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a draft worker's session opens with "
                                "SessionOpen.draft (the draft's name, its options); this one has none")
        name = opened.draft.model
        if base_draft(name) != name and name not in self.worker.served():
            # A version retired since the router read the registry: refused as a full worker is, so
            # the request drafts elsewhere or goes on target-only.
            yield pb.Proposal(refused=f"this worker no longer serves version {name!r}")
            await self.worker.host.refuse(requests)
            return
        if name in self.worker.heads:
            async for proposal in self._head(opened, requests, context):
                yield proposal
            return
        model = self.worker.models.get(name)
        if model is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"this worker has no draft {name!r}; it has "
                                f"{', '.join([*self.worker.models, *self.worker.heads])}")
        host = self.worker.host
        try:
            bridge = self.worker.bridges.get(name)
            with host.session(name, opened, context, bridge) as (scheduler, sequence):
                drafter = opened_drafter(sequence, opened, self.worker.grammars[name], bridge,
                                         self.worker.misalignment(opened))
                async for run, done in _runs(scheduler, drafter, host.steps(requests), opened.task):
                    yield proposal_reply(drafter, run, done)
        except SessionLimit as exc:  # before any reply: said on the stream (ModelHost.refuse says why)
            yield pb.Proposal(refused=str(exc))
            await host.refuse(requests)
        except SessionIdle as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except ValueError as exc:  # a step that does not fit this session: it ends, the worker carries on
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def _head(self, opened: pb.SessionOpen, requests, context: grpc.aio.ServicerContext):
        host = self.worker.host
        try:
            with host.slots.hold(on_done=context.add_done_callback):
                # One read: the head and its scheduler of one version, whatever a swap does meanwhile.
                scheduler = self.worker.head_schedulers.get(opened.draft.model)
                if scheduler is None:  # retired since ``serve`` looked
                    raise SessionLimit(f"this worker no longer serves version {opened.draft.model!r}")
                drafter = HeadDrafter(opened_state(scheduler.model, opened, opened.draft.model), opened.prompt_ids)
                async for run, done in _runs(scheduler, drafter, host.steps(requests), opened.task):
                    yield proposal_reply(drafter, run, done)
        except SessionLimit as exc:
            yield pb.Proposal(refused=str(exc))
            await host.refuse(requests)
        except SessionIdle as exc:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        except (ValueError, ProposerGone) as exc:  # hidden states that do not fit this session's tokens
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreReply:
        model = self.worker.models.get(request.model)
        if model is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"this worker has no draft {request.model!r}; it has {', '.join(self.worker.models)}")
        if request.model in self.worker.bridges:  # (scores compare target ids with the draft's choices)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"draft {request.model!r} has another tokenizer than the target's: it is not scored")
        try:
            (positions, matches), seconds = await self.worker.host.device.run_timed(
                score_continuation, model, list(request.ids), request.start)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.ScoreReply(positions=positions, matches=matches, seconds=seconds)

    async def Inspect(self, request, context) -> pb.WorkerState:
        return self.worker.host.state()
