"""The router's Session without Ray or gRPC: fake streams that answer from in-process workers.

The fakes run the workers' own session code (``target_session``, ``opened_drafter``) on the tiny zoo's
models and speak the same protobuf messages as the real streams, so what is tested is the router's
loop: propose, verify, commit, emit, the lookahead, the draft mirror and failover. Every test
asserts that the committed tokens equal target-only decoding.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

import pytest

from specserve.router.config import TimeoutsConfig
from specserve.workers.draft_length import DraftLength
from specserve.router.policy import Route
from specserve.router.proposers import ProposerFactory
from specserve.router.request import DRAFT_LOST, Request, Routing, Workers
from specserve.router.target_link import FULL_POLL_SECONDS, TargetsFull
from specserve.workers.lookup import DraftFree
from specserve.workers.proposer_kinds import DRAFT_FREE
from specserve.router.tasks import ResolvedTask
from specserve.router.validation import ValidRequest
from specserve.workers.sampling import SamplingParams
from specserve.workers.batching import Scheduler
from specserve.workers.config import BatchingConfig
from specserve.workers.grpc_host import Device
from specserve.workers.kv_cache import session_capacity
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.prompt import encode_prompt
from specserve.workers.request import GenerationParams

from fake_workers import DRAFT, FakeDirectory, FakeWorker

PROMPT = "def parse_header(line):\n    "
MAX_TOKENS = 40
K = 4


@pytest.fixture(scope="module")
def models(tiny_engine):
    return tiny_engine.target, tiny_engine.tokenizer


@pytest.fixture(scope="module")
def target_only(tiny_engine) -> list[int]:
    return tiny_engine.generate(PROMPT, GenerationParams(max_tokens=MAX_TOKENS, speculation=False)).complete().token_ids


def make_session(models, directory: FakeDirectory, *, lookahead: bool, sampling: SamplingParams = SamplingParams(),
                 schedule: str = "fixed", seed: int = 7, route: Route = Route(DRAFT, K, "requested"),
                 decode_run: int = 1, draft_free: DraftFree | None = None,
                 timeouts: TimeoutsConfig = TimeoutsConfig(), ahead: bool = True,
                 branch_odds: float | None = 0.0, stop: tuple[str, ...] = ()) -> Request:
    target, tokenizer = models
    params = GenerationParams(max_tokens=MAX_TOKENS, sampling=sampling, k=K, seed=seed, stop=stop)
    request = ValidRequest(encode_prompt(tokenizer, PROMPT), params, "code", route.draft, route.k, "on")
    proposers = ProposerFactory(draft_free or DraftFree(), {"code": (DRAFT, "ngram", "suffix")})
    return Request(request, Routing(ResolvedTask("code", "request", 1.0), route, DraftLength(schedule, route.k, 8),
                                    lookahead=ahead),
                   Workers(tokenizer, directory, timeouts, proposers, lookahead, decode_run, branch_odds))


async def drain(session: Request) -> list[int]:
    tokens = []
    async for chunk in session.run():
        tokens += chunk.token_ids
    return tokens


def run(session: Request) -> list[int]:
    return asyncio.run(drain(session))


def test_lookahead_hits_and_misses(models, target_only):
    # Every third draft reply gets its first token wrong: a lookahead with it misses its guess.
    target = FakeWorker("target", "t0", models[0])
    draft = FakeWorker("draft", "d0", models[0], corrupt=lambda step: 0 if step % 3 == 0 else None)
    session = make_session(models, FakeDirectory(target, draft), lookahead=True)
    assert run(session) == target_only
    stats = session.decoding.stats
    assert 0 < stats.lookahead_hits < stats.lookaheads, (stats.lookahead_hits, stats.lookaheads)
    assert draft.streams[0].closed and target.streams[0].closed


def test_a_lookaheads_branch_is_used_where_the_verdict_rejects_as_it_assumed(models, target_only):
    """The draft's second token is swapped with its runner-up in every reply, so every verdict
    rejects there and corrects with the draft's own choice: what a branch forked there assumes.
    Lookaheads beside their branches then hit on the branch, the worker adopts it (its cache moved
    into place), and the output is the target's. (Greedy: with the draft the target itself, a
    sampled verdict never rejects; a sampled branch is the fresh draft q for q, test_batching.)"""
    target = FakeWorker("target", "t0", models[0])
    draft = FakeWorker("draft", "d0", models[0], corrupt=lambda step: 1, swap=True)
    session = make_session(models, FakeDirectory(target, draft), lookahead=True)
    assert run(session) == target_only
    stats = session.decoding.stats
    assert 0 < stats.branch_hits <= stats.lookahead_hits <= stats.lookaheads, stats
    # A verdict on a swapped proposal accepts its first token; on a branch's (which the fake does
    # not swap), all of it: the draft is the target, so with its cache moved into place its tokens
    # are the target's own (a cache moved wrongly would draft others).
    verdicts = list(zip(target.proposals, target.verdicts, strict=True))
    assert all(accepted in (1, len(proposal.ids)) for proposal, accepted in verdicts if len(proposal.ids) >= 2)
    assert sum(accepted >= 2 for _, accepted in verdicts) >= stats.branch_hits, target.verdicts


def test_a_lookahead_out_when_a_stop_ends_the_request_is_neither_hit_nor_miss(models, target_only):
    """The draft is the target: every lookahead a verdict judges hits. One still out when a stop
    sequence ends the request had no verdict: it must not count as a miss (the lookahead budget
    would hold back drafts whose lookaheads all hit)."""
    tokenizer = models[1]
    text = tokenizer.decode(target_only)
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    target = FakeWorker("target", "t0", models[0])
    draft = FakeWorker("draft", "d0", models[0])
    session = make_session(models, FakeDirectory(target, draft), lookahead=True, stop=(stop,))
    run(session)
    stats = session.decoding.stats
    assert session.decoding.finished and len(session.decoding.committed) < MAX_TOKENS
    assert 0 < stats.lookahead_hits == stats.lookaheads, stats


def test_a_request_the_lookahead_budget_holds_back_drafts_in_turn(models, target_only):
    """Routing.lookahead False (router/lookahead_budget.py: its arm's lookaheads rarely hit): no
    lookahead, the same output."""
    target = FakeWorker("target", "t0", models[0])
    draft = FakeWorker("draft", "d0", models[0])
    session = make_session(models, FakeDirectory(target, draft), lookahead=True, ahead=False)
    assert run(session) == target_only
    assert session.decoding.stats.lookaheads == 0 and session.decoding.stats.proposed > 0


def test_a_sampled_requests_output_does_not_depend_on_the_lookahead_budget(models):
    """Held back or not, the first step is target-only and a draft's draws are keyed by position:
    one seed, one output."""
    target = FakeWorker("target", "t0", models[0])
    draft = FakeWorker("draft", "d0", models[0])
    sampled = SamplingParams(temperature=1.0)
    outputs = [run(make_session(models, FakeDirectory(target, draft), lookahead=True, sampling=sampled, ahead=ahead))
               for ahead in (True, False)]
    assert outputs[0] == outputs[1]


def test_a_rejection_at_every_position(models, target_only):
    # Step n corrupts position n % (K + 1): K + 1 means none, so every outcome 0..K occurs.
    target = FakeWorker("target", "t0", models[0])
    draft = FakeWorker("draft", "d0", models[0], corrupt=lambda step: step % (K + 1))
    session = make_session(models, FakeDirectory(target, draft), lookahead=False)
    assert run(session) == target_only
    assert set(range(K + 1)) <= set(target.verdicts), target.verdicts
    assert session.decoding.stats.rejections > 0


@pytest.mark.parametrize("lookahead", [False, True])
def test_a_draft_lost_mid_request_is_reopened_elsewhere(models, target_only, lookahead):
    target = FakeWorker("target", "t0", models[0])
    lost = FakeWorker("draft", "d0", models[0], fail_at_step=3)
    spare = FakeWorker("draft", "d1", models[0])
    directory = FakeDirectory(target, lost, spare)
    session = make_session(models, directory, lookahead=lookahead)
    assert run(session) == target_only
    assert session.draft_reopens == 1 and directory.failed == ["d0"]
    assert spare.steps > 1 and session.route.draft == DRAFT  # the spare drafted the rest
    # The failover's time (the reopened draft's prefill included) is recovery, not a step's cost.
    assert session.recovery_seconds > 0
    observed = session.observation()
    assert observed.seconds <= session.elapsed() - session.first_token_seconds - session.recovery_seconds + 1e-9


def test_a_request_whose_drafts_are_all_lost_goes_on_target_only(models, target_only):
    target = FakeWorker("target", "t0", models[0])
    draft = FakeWorker("draft", "d0", models[0], fail_at_step=2)
    session = make_session(models, FakeDirectory(target, draft), lookahead=True)
    assert run(session) == target_only
    assert session.route.reason == DRAFT_LOST and session.proposer is None


@pytest.mark.parametrize("lookahead", [False, True])
def test_a_target_lost_mid_request_resumes_on_another(models, target_only, lookahead):
    lost = FakeWorker("target", "t0", models[0], fail_at_step=4)
    spare = FakeWorker("target", "t1", models[0])
    draft = FakeWorker("draft", "d0", models[0], corrupt=lambda step: 1 if step % 2 else None)
    session = make_session(models, FakeDirectory(lost, spare, draft), lookahead=lookahead)
    assert run(session) == target_only
    assert session.target_resumes == 1 and spare.steps > 1
    assert session.recovery_seconds > 0  # left out of what the policy learns
    # The replacement was opened holding every token committed before the failure.
    prompt = lost.opened[0]
    assert spare.opened[0] > prompt


def test_a_sampled_request_survives_its_draft_and_its_target(models):
    sampling = SamplingParams(temperature=0.8, top_k=20)
    workers = (FakeWorker("target", "t0", models[0], fail_at_step=5), FakeWorker("target", "t1", models[0]),
               FakeWorker("draft", "d0", models[0], fail_at_step=3), FakeWorker("draft", "d1", models[0]))
    session = make_session(models, FakeDirectory(*workers), lookahead=False, sampling=sampling)
    tokens = run(session)
    assert len(tokens) == MAX_TOKENS or session.decoding.output.finish_reason == "eos"
    assert session.target_resumes == 1 and session.draft_reopens == 1


def kv_for_sessions(models, sessions: float) -> Scheduler:
    """A target scheduler whose KV budget holds ``sessions`` of this file's requests (a fraction:
    not even one), as a replica's ``kv_cache_mib`` bounds its pool."""
    target, tokenizer = models
    shape = KVShape.of(target)
    capacity = session_capacity(len(encode_prompt(tokenizer, PROMPT)), MAX_TOKENS, target.config.max_position_embeddings)
    return Scheduler(target, KVPool(shape, Budget(int(sessions * capacity * shape.bytes_per_position))), Device(1),
                     BatchingConfig())


@pytest.mark.parametrize("limit", ["sessions", "kv", "sessions-target-only"])
def test_a_full_replica_passes_the_request_on_to_one_with_room(models, target_only, limit):
    """A replica at its session limit, or whose KV budget cannot hold the request, refuses it; the
    request opens on another replica at once (no resume, no recovery counted) with the same output,
    also target-only, where the refusal ends a decode run granted ahead."""
    full = (FakeWorker("target", "t0", models[0], scheduler=kv_for_sessions(models, 0.5)) if limit == "kv"
            else FakeWorker("target", "t0", models[0], max_sessions=0))
    roomy = FakeWorker("target", "t1", models[0])
    route = dict(route=TARGET_ONLY, decode_run=8) if limit.endswith("target-only") else {}
    session = make_session(models, FakeDirectory(full, roomy, FakeWorker("draft", "d0", models[0])), lookahead=True,
                           **route)
    assert run(session) == target_only
    assert full.refused == 1 and not full.opened and roomy.steps > 1
    assert session.target_resumes == 0 and session.recovery_seconds == 0


def test_with_every_replica_full_a_request_waits_for_room(models, target_only):
    """The only replica's KV budget holds one request: a second one, refused, waits (the bounded
    full wait) until the first gives its region back, then runs there, and both keep their output."""
    replica = FakeWorker("target", "t0", models[0], scheduler=kv_for_sessions(models, 1))
    directory = FakeDirectory(replica, FakeWorker("draft", "d0", models[0]))
    first, second = (make_session(models, directory, lookahead=False) for _ in range(2))

    async def both():
        return await asyncio.gather(drain(first), drain(second))

    assert asyncio.run(both()) == [target_only, target_only]
    assert replica.refused >= 1 and len(replica.opened) == 2
    assert first.target_resumes == second.target_resumes == 0


def test_full_for_the_whole_wait_is_resource_exhausted(models):
    """Refused by every replica for target_full_wait_seconds: TargetsFull (the client gets
    RESOURCE_EXHAUSTED), saying what is full and what to change, after trying again meanwhile."""
    wait = 1.5
    full = FakeWorker("target", "t0", models[0], max_sessions=0)
    session = make_session(models, FakeDirectory(full, FakeWorker("draft", "d0", models[0])), lookahead=False,
                           timeouts=TimeoutsConfig(target_full_wait_seconds=wait))
    started = time.monotonic()
    with pytest.raises(TargetsFull) as refused:
        # A guard, not a measurement: a wait that never ends fails here instead of at the suite's timeout.
        asyncio.run(asyncio.wait_for(drain(session), timeout=20 * wait))
    # It gave up no sooner than the wait: a slow machine only makes this longer.
    assert time.monotonic() - started >= wait
    # One try when refused, then one every FULL_POLL_SECONDS until the wait is over, the last at its
    # end: at most 1 + 1.5 / 0.5 = 4 tries, fewer on a slow machine (a try that ends a poll late
    # leaves less of the wait). A wait that never tried again makes 1, one that polls without
    # sleeping many more (and one restarted at each refusal never ends: the guard above).
    assert 2 <= full.refused <= 1 + math.ceil(wait / FULL_POLL_SECONDS), full.refused
    assert session.full_refusals == full.refused and not full.opened
    assert f"within {wait:g} s" in str(refused.value)  # the full wait it was given, not another
    assert "every target replica is full" in str(refused.value) and "target.kv_cache_mib" in str(refused.value)


def test_a_resumed_request_passes_over_a_full_replica(models, target_only):
    """A request that lost its replica is refused by a full spare and resumes on the next one: one
    resume, not two."""
    lost = FakeWorker("target", "t0", models[0], fail_at_step=4)
    full = FakeWorker("target", "t1", models[0], max_sessions=0)
    spare = FakeWorker("target", "t2", models[0])
    session = make_session(models, FakeDirectory(lost, full, spare, FakeWorker("draft", "d0", models[0])),
                           lookahead=False)
    assert run(session) == target_only
    assert session.target_resumes == 1 and full.refused == 1 and spare.steps > 1


def test_a_request_resumed_while_its_spare_is_full_waits_for_room_there(models, target_only):
    """Its replica dies (and stays listed, as in the registry until its entry expires, passed over);
    the only other one is full until its own request ends. The resumed request waits for room on it
    (the full wait), not for the dead one to come back."""
    roomy_once = FakeWorker("target", "t1", models[0], scheduler=kv_for_sessions(models, 1))
    dying = FakeWorker("target", "t0", models[0], fail_at_step=4)
    directory = FakeDirectory(roomy_once, dying, FakeWorker("draft", "d0", models[0]))
    timeouts = TimeoutsConfig(target_wait_seconds=5.0)
    holder, resumed = (make_session(models, directory, lookahead=False, timeouts=timeouts) for _ in range(2))

    async def both():
        return await asyncio.gather(drain(holder), drain(resumed))

    assert asyncio.run(both()) == [target_only, target_only]
    assert resumed.target_resumes == 1 and resumed.full_refusals >= 1 and "t0" in directory.failed


def test_a_full_draft_worker_passes_the_draft_on(models, target_only):
    """A draft worker with no room refuses; the draft opens on another at once (no reopen spent);
    with every draft worker full the request goes on target-only. The output is the same."""
    full = FakeWorker("draft", "d0", models[0], max_sessions=0)
    roomy = FakeWorker("draft", "d1", models[0])
    session = make_session(models, FakeDirectory(FakeWorker("target", "t0", models[0]), full, roomy), lookahead=True)
    assert run(session) == target_only
    assert full.refused == 1 and roomy.steps > 1 and session.draft_reopens == 0
    assert session.route.reason != DRAFT_LOST and session.decoding.stats.proposed > 0

    also_full = FakeWorker("draft", "d1", models[0], max_sessions=0)
    session = make_session(models, FakeDirectory(FakeWorker("target", "t0", models[0]),
                                                 FakeWorker("draft", "d0", models[0], max_sessions=0), also_full),
                           lookahead=False)
    assert run(session) == target_only
    assert also_full.refused == 1 and session.proposer is None and session.draft_reopens == 0


def test_a_cancelled_request_frees_its_workers(models, target_only):
    target = FakeWorker("target", "t0", models[0])
    draft = FakeWorker("draft", "d0", models[0])
    session = make_session(models, FakeDirectory(target, draft), lookahead=True)

    async def first_chunks() -> list[int]:
        tokens = []
        chunks = session.run()
        async for chunk in chunks:
            tokens += chunk.token_ids
            if len(tokens) >= 5:
                break
        await chunks.aclose()  # what grpc does to the handler of a cancelled RPC
        return tokens

    tokens = asyncio.run(first_chunks())
    assert tokens == target_only[: len(tokens)]
    assert target.streams[0].cancelled and draft.streams[0].cancelled
    assert not target.streams[0].closed  # abandoned, not finished


TARGET_ONLY = Route(None, 0, "requested")


def test_target_only_decodes_in_runs_granted_ahead(models, target_only):
    target = FakeWorker("target", "t0", models[0])
    session = make_session(models, FakeDirectory(target), lookahead=False, route=TARGET_ONLY, decode_run=8)
    chunks = asyncio.run(chunks_of(session))
    assert [t for chunk in chunks for t in chunk.token_ids] == target_only
    runs = target.streams[0].decode_runs
    # Topped up to 8 ahead once half or less is owed, never past the request's budget. The fake
    # replica answers a run at once, so the loop finds all but the last token it is owed already
    # there, and commits them as one chunk: 8, then 7s, then the rest of the budget.
    assert runs[0] == 8 and all(4 <= r <= 8 for r in runs[1:]) and sum(runs) == MAX_TOKENS, runs
    assert target.streams[0].closed and not target.streams[0].unread
    assert len(chunks) < len(target_only) // 4, [len(c.token_ids) for c in chunks]
    # The chunks' text is the output's, token for token, as if emitted one by one.
    assert "".join(c.text for c in chunks) == session.decoding.output.text


async def chunks_of(session: Request) -> list:
    return [chunk async for chunk in session.run()]


def test_a_stop_mid_run_drops_the_rest_of_it(models, target_only):
    target, tokenizer = models
    stop = tokenizer.decode(target_only[20:22])  # ends the request by then, with tokens of a run owed
    params = GenerationParams(max_tokens=MAX_TOKENS, stop=(stop,))
    request = ValidRequest(encode_prompt(tokenizer, PROMPT), params, "code", None, None, "off")
    worker = FakeWorker("target", "t0", target)
    routing = Routing(ResolvedTask("code", "request", 1.0), TARGET_ONLY, DraftLength("fixed", 0, 8))
    proposers = ProposerFactory(DraftFree(), {})
    session = Request(request, routing, Workers(tokenizer, FakeDirectory(worker), TimeoutsConfig(), proposers,
                                                decode_run=8))
    tokens = run(session)
    assert session.decoding.output.finish_reason == "stop" and tokens == target_only[: len(tokens)]
    assert len(tokens) <= 22 and worker.streams[0].cancelled  # the run's remaining tokens are dropped


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20)],
                         ids=["greedy", "sampled"])
def test_a_decode_run_draws_what_single_steps_draw(models, sampling):
    """The same seed gives the same tokens with runs as with a round trip per token: a run is the
    same plain steps, one per pass, drawing from the same generator."""
    outputs = []
    for decode_run in (1, 8):
        target = FakeWorker("target", "t0", models[0])
        outputs.append(run(make_session(models, FakeDirectory(target), lookahead=False, sampling=sampling,
                                        route=TARGET_ONLY, decode_run=decode_run)))
    assert outputs[0] == outputs[1]


def test_a_target_lost_mid_run_resumes_on_another(models, target_only):
    lost = FakeWorker("target", "t0", models[0], fail_at_step=3)  # its third grant
    spare = FakeWorker("target", "t1", models[0])
    session = make_session(models, FakeDirectory(lost, spare), lookahead=False, route=TARGET_ONLY, decode_run=8)
    assert run(session) == target_only
    assert session.target_resumes == 1 and spare.opened[0] > lost.opened[0]


def test_a_target_lost_while_its_run_is_read_resumes_on_another(models, target_only):
    lost = FakeWorker("target", "t0", models[0], fail_at_token=11)  # mid-way through its second grant
    spare = FakeWorker("target", "t1", models[0])
    session = make_session(models, FakeDirectory(lost, spare), lookahead=False, route=TARGET_ONLY, decode_run=8)
    assert run(session) == target_only
    assert session.target_resumes == 1 and spare.opened[0] == lost.opened[0] + 10
    assert spare.streams[0].decode_runs[0] == 8  # granted afresh: what the lost one owed is not carried over


def test_a_request_whose_draft_is_lost_goes_on_in_runs(models, target_only):
    target = FakeWorker("target", "t0", models[0])
    draft = FakeWorker("draft", "d0", models[0], fail_at_step=2)
    session = make_session(models, FakeDirectory(target, draft), lookahead=True, decode_run=8)
    assert run(session) == target_only
    assert session.proposer is None and target.streams[0].decode_runs


@pytest.mark.parametrize("name", DRAFT_FREE)
def test_a_draft_free_proposer_proposes_in_the_router_and_keeps_the_output(models, target_only, name):
    """No draft worker at all: the proposals come from the router. With the task's earlier answer
    in its trie, suffix decoding proposes that answer, and the target keeps it."""
    draft_free = DraftFree()
    draft_free.learn("code", target_only)
    target = FakeWorker("target", "t0", models[0])
    session = make_session(models, FakeDirectory(target), lookahead=True, route=Route(name, K, "requested"),
                           draft_free=draft_free)
    assert run(session) == target_only
    stats = session.decoding.stats
    assert stats.proposed > 0 and target.streams[0].closed
    if name == "suffix":  # the whole answer was there to propose
        assert stats.accepted > MAX_TOKENS // 2 and stats.target_passes < MAX_TOKENS // 2
    observation = session.observation()  # steps without a proposal are its coverage's misses
    assert observation.rejections == stats.rejections and observation.misses == session.recorder.misses > 0


def test_a_sampled_request_with_a_draft_free_proposer_completes(models):
    target = FakeWorker("target", "t0", models[0])
    session = make_session(models, FakeDirectory(target), lookahead=True, route=Route("ngram", K, "requested"),
                           sampling=SamplingParams(temperature=0.9))
    tokens = run(session)
    assert len(tokens) == MAX_TOKENS or session.decoding.output.finish_reason == "eos"


@pytest.mark.parametrize("lookahead,schedule", [(False, "fixed"), (True, "fixed"), (True, "heuristic")])
def test_a_tree_of_the_draft_and_the_draft_free_proposers_keeps_the_output(models, target_only, lookahead, schedule):
    """The draft (corrupted at every other step, so other branches win there), prompt lookup and
    suffix decoding (knowing the task's earlier answer) as one tree per step; the draft worker lost
    midway is reopened and the tree goes on."""
    draft_free = DraftFree()
    draft_free.learn("code", target_only[: MAX_TOKENS // 2])
    target = FakeWorker("target", "t0", models[0])
    every_other = lambda step: 0 if step % 2 else None  # noqa: E731
    draft = FakeWorker("draft", "d0", models[0], corrupt=every_other, fail_at_step=5)
    spare = FakeWorker("draft", "d1", models[0], corrupt=every_other)
    session = make_session(models, FakeDirectory(target, draft, spare), lookahead=lookahead, schedule=schedule,
                           route=Route("tree", K, "requested"), draft_free=draft_free)
    assert run(session) == target_only
    stats = session.decoding.stats
    assert stats.accepted > 0 and session.draft_reopens == 1 and spare.steps > 0
    assert any(p.parents for p in target.proposals), "no step held a real tree (only chains)"


def test_a_stream_interval_merges_chunks_but_sends_the_first_and_the_last_at_once():
    from specserve.router.service import paced
    from specserve.workers.stopping import Chunk

    async def steps(*sizes: int):
        for n, size in enumerate(sizes):
            last = n == len(sizes) - 1
            yield Chunk(list(range(size)), "x" * size, "length" if last else None)

    async def sent(interval: int, *sizes: int) -> list[tuple[int, str | None]]:
        return [(len(c.token_ids), c.finish_reason) async for c in paced(steps(*sizes), interval)]

    assert asyncio.run(sent(1, 1, 1, 3, 1)) == [(1, None), (1, None), (3, None), (1, "length")]
    assert asyncio.run(sent(4, 1, 1, 1, 1, 1, 5, 2, 1)) == [(1, None), (4, None), (5, None), (3, "length")]
    merged = asyncio.run(chunks_of_paced(4))
    assert "".join(merged) == "x" * 9
    assert asyncio.run(sent(8, 2)) == [(2, "length")]  # a one-step request: its only chunk


async def chunks_of_paced(interval: int) -> list[str]:
    from specserve.router.service import paced
    from specserve.workers.stopping import Chunk

    async def steps():
        for size in (1, 2, 3, 3):
            yield Chunk([0] * size, "x" * size)

    return [c.text async for c in paced(steps(), interval)]


def test_a_target_session_asks_for_the_stream_intervals_groups_and_a_draft_session_for_none(models):
    """The target's open carries the request's decode group (router.stream_interval_tokens, at most
    half a run); a draft worker's carries none (its proposals are one reply a step anyway)."""
    session = make_session(models, FakeDirectory(FakeWorker("target", "t0", models[0])), lookahead=False)
    context = session.target.context
    assert context.target_opening().target.decode_group == 1
    grouped = dataclasses.replace(context, decode_group=4)
    assert grouped.target_opening().target.decode_group == 4
    assert grouped.draft_opening(DRAFT).WhichOneof("role") == "draft"  # no target fields: no decode group
