"""Continuous batching without Ray: the ragged pass, the KV pool and the scheduler on the tiny zoo.

The property everything rests on: a session's result never depends on what shared its passes.
Greedy steps run in a batch give the tokens they give alone; sampled steps give the same draws
(each session draws from its own generator).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from specserve.workers.sampling import SamplingParams
from specserve.workers.batching import Scheduler, Ticket, candidates
from specserve.workers.config import ATTENTION_BLOCK, BatchingConfig
from specserve.workers.drafting import BranchRun, DraftSession, DraftTokens
from specserve.workers.grpc_host import Device
from specserve.workers.kv_pool import Budget, KVPool, KVShape, PoolFull
from specserve.workers.ragged_pass import PooledSequence, Segment, run_pass
from specserve.workers.steps import private_sequence, run_alone
from specserve.workers.verifying import TargetSession
from specserve.workers.seeds import DraftDraws

from cached_lm import CachedLM
from scheduled import decode_alone

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=1.0, top_p=0.9)


@pytest.fixture(scope="module")
def target(tiny_engine):
    return tiny_engine.target


@pytest.fixture(scope="module")
def draft(tiny_engine):
    return next(iter(tiny_engine.drafts.values()))


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (int(n),), generator=gen).tolist()
            for n in torch.randint(2, 60, (count,), generator=gen)]


def test_a_ragged_pass_gives_each_session_its_own_logits(target):
    pool = KVPool(KVShape.of(target), Budget(2**26))
    sequences = prompts(5)
    regions = [pool.take(128) for _ in sequences]
    batched = run_pass(target, pool, [Segment(r, 0, p, 2) for r, p in zip(regions, sequences, strict=True)])
    then = run_pass(target, pool, [Segment(r, len(p), [7, 8, 9][: i % 3 + 1], i % 3 + 1)
                                   for i, (r, p) in enumerate(zip(regions, sequences, strict=True))])
    for i, (prompt, first, second) in enumerate(zip(sequences, batched, then, strict=True)):
        alone = CachedLM(target)
        assert torch.allclose(first, alone.extend(prompt, 2), atol=1e-5)
        assert torch.allclose(second, alone.extend([7, 8, 9][: i % 3 + 1], i % 3 + 1), atol=1e-5)


def test_a_greedy_step_gets_its_rows_argmax_and_the_others_their_logits_from_one_pass(target):
    """A segment that asks for ids only gets [rows] ids, the argmax of the [rows, V] logits the
    same pass gives a segment that does not; the others' logits are unchanged by its asking."""
    pool = KVPool(KVShape.of(target), Budget(2**26))
    sequences = prompts(4, seed=3)
    regions = [pool.take(128) for _ in sequences]
    run_pass(target, pool, [Segment(r, 0, p, 0) for r, p in zip(regions, sequences, strict=True)])

    def step(ids_only: list[bool]) -> list[torch.Tensor]:
        return run_pass(target, pool, [Segment(r, len(p), [7, 8, 9], 3, ids_only=only)
                                       for r, p, only in zip(regions, sequences, ids_only, strict=True)])

    logits = step([False] * 4)
    for mixed in ([True, False, True, False], [True] * 4):
        rows = step(mixed)
        for only, got, full in zip(mixed, rows, logits, strict=True):
            if only:
                assert got.dtype == torch.long and torch.equal(got, full.argmax(-1))
            else:
                assert torch.equal(got, full)


def test_the_pool_reuses_freed_regions_and_refuses_past_its_budget(target):
    shape = KVShape.of(target)
    pool = KVPool(shape, Budget(1000 * shape.bytes_per_position), arena_positions=600)
    a, b = pool.take(300), pool.take(300)
    assert pool.allocated_bytes == 600 * shape.bytes_per_position  # one arena holds both
    with pytest.raises(PoolFull, match="kv_cache_mib"):
        pool.take(500)  # a second arena would pass the budget (only 400 positions are left)
    c = pool.take(400)  # what the budget has left, as a last arena
    pool.give_back(a)
    pool.give_back(b)
    assert pool.take(600).arena == a.arena  # freed neighbours merged into one region
    pool.give_back(c)
    assert pool.in_use == 600 and pool.allocated_bytes == 1000 * shape.bytes_per_position


def test_a_cpu_process_takes_kv_cache_mib_whatever_the_gpu_share():
    from specserve.workers.kv_pool import device_budget

    cpu = torch.device("cpu")  # the GPU rule (a share of the card less the models) is in tests/test_gpu.py
    assert device_budget(64, 0.9, 1.0, cpu).limit_bytes == device_budget(64, None, 1.0, cpu).limit_bytes == 64 * 2**20


def test_cpu_pools_grow_in_small_arenas(target):
    from specserve.workers.kv_pool import ARENA_POSITIONS, arena_positions

    # on CUDA each pool's share is one arena, so decode passes can replay graphs (tests/test_gpu.py)
    assert arena_positions(Budget(2**30), KVShape.of(target), 1) == ARENA_POSITIONS


def test_chunked_prefill_cuts_a_long_prompt_at_attention_blocks_and_keeps_every_row_with_logits(target):
    assert ATTENTION_BLOCK == 32  # the cuts below are at its multiples
    pool = KVPool(KVShape.of(target), Budget(2**26))
    sequence = PooledSequence(pool.take(128), list(range(3, 83)))  # 80 prompt tokens
    chunk = sequence.segment([5, 6], logits=3, room=32)
    assert (chunk.start, len(chunk.tokens), chunk.logits) == (0, 32, 0)
    sequence.ran(chunk)
    assert len(sequence.segment([5, 6], logits=3, room=64).tokens) == 50  # the rest, then the proposal
    chunk = sequence.segment([5, 6], logits=3, room=47)  # room up to slot 79: cut back to the block at 64
    assert (chunk.start, len(chunk.tokens), chunk.logits) == (32, 32, 0)
    sequence.ran(chunk)
    assert sequence.segment([5, 6], logits=3, room=15) is None  # no block boundary before the rows with logits
    assert sequence.segment([5, 6], logits=3, room=17) is None  # never split the rows that want logits
    assert len(sequence.segment([5, 6], logits=3, room=18).tokens) == 18


def test_attention_blocks_cut_where_a_chunked_prefill_may_cut_and_nowhere_else():
    from specserve.workers.ragged_pass import attention_blocks

    assert attention_blocks(0, 51, 1) == [(0, 32), (32, 51)]  # a prompt whole
    assert attention_blocks(0, 32, 0) + attention_blocks(32, 51, 1) == attention_blocks(0, 51, 1)  # chunked
    assert attention_blocks(0, 64, 0) == [(0, 32), (32, 64)]  # no empty block at the end
    assert attention_blocks(0, 69, 5) == [(0, 32), (32, 64), (64, 69)]  # the proposal's rows stay whole
    assert attention_blocks(94, 99, 5) == [(94, 99)]  # a verify step across a block edge: one call


def test_a_rows_logits_are_the_same_bits_alone_and_batched_whole_or_chunked(target):
    """What batching must never change (the module docstring): a 51-token prompt prefilled whole in
    a pass of its own, and in chunks of 32 and 19 sharing passes with other sessions, gives the same
    logits to the last bit; so does a one-row decode step alone and beside others' verify steps."""
    pool = KVPool(KVShape.of(target), Budget(2**26))
    prompt, others = list(range(3, 54)), prompts(3, seed=8)
    alone = pool.take(128)
    whole = run_pass(target, pool, [Segment(alone, 0, prompt, 1)])[0]
    step_alone = run_pass(target, pool, [Segment(alone, 51, [9], 1)])[0]
    shared, regions = pool.take(128), [pool.take(128) for _ in others]
    run_pass(target, pool, [Segment(shared, 0, prompt[:32], 0)]
             + [Segment(r, 0, p, 1) for r, p in zip(regions, others, strict=True)])
    chunked = run_pass(target, pool, [Segment(r, len(p), [4, 5, 6], 3) for r, p in zip(regions, others, strict=True)]
                       + [Segment(shared, 32, prompt[32:], 1)])[-1]
    step_shared = run_pass(target, pool, [Segment(shared, 51, [9], 1)]
                           + [Segment(r, len(p) + 3, [7, 8], 2) for r, p in zip(regions, others, strict=True)])[0]
    assert torch.equal(whole, chunked)
    assert torch.equal(step_alone, step_shared)


def verify_session(model, prompt, sampling, seed):
    pool, sequence = private_sequence(model, prompt, 256)
    return pool, TargetSession(sequence, sampling, torch.Generator().manual_seed(seed))


def pooled_sessions(model, sequences, sampling) -> tuple[KVPool, list[TargetSession]]:
    """The same sessions (same seeds) in one shared pool, for a scheduler."""
    pool = KVPool(KVShape.of(model), Budget(2**28))
    return pool, [TargetSession(PooledSequence(pool.take(256), p), sampling, torch.Generator().manual_seed(i))
                  for i, p in enumerate(sequences)]


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_verdicts_in_a_batch_equal_verdicts_alone(target, sampling):
    """Target-only decoding of eight sessions, lengths mixed, a pass shared by all: each session's
    tokens equal what it decodes alone, greedy or sampled (its own generator)."""
    sequences = prompts(8, seed=1)
    alone = decode_alone(target, sequences, 12, sampling)
    pool, sessions = pooled_sessions(target, sequences, sampling)

    async def scenario():
        scheduler = Scheduler(target, pool, Device(1), BatchingConfig(max_tokens_per_pass=64))
        tokens = [[] for _ in sessions]

        async def decode(i):
            for _ in range(12):
                done = await scheduler.run(sessions[i].step(DraftTokens.empty()))
                tokens[i].append(done.result.token)
        await asyncio.gather(*(decode(i) for i in range(len(sessions))))
        return scheduler, tokens

    scheduler, batched = asyncio.run(scenario())
    assert batched == alone
    assert scheduler.counts.max_sessions > 1  # passes really were shared
    assert scheduler.counts.passes < 12 * len(sessions)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_decode_runs_stay_in_every_pass_and_draw_what_steps_draw(target, sampling):
    """Eight sessions decode 12 tokens each as one run (prompts chunked at 64 tokens a pass): each
    draws what 12 plain steps alone draw, hears of every token as its pass settles, and all share
    every pass once their prompts are in, with no pass lost to a round trip."""
    sequences = prompts(8, seed=2)
    alone = decode_alone(target, sequences, 12, sampling)
    pool, sessions = pooled_sessions(target, sequences, sampling)

    async def scenario():
        scheduler = Scheduler(target, pool, Device(1), BatchingConfig(max_tokens_per_pass=64))
        heard = [[] for _ in sessions]

        async def decode(i):
            run = sessions[i].decode(12)
            done = await scheduler.run(run, on_pass=lambda _: heard[i].append(len(run.verdicts)))
            assert [v.token for v in done.result] == [v.token for v in run.verdicts]
            return [v.token for v in done.result]
        tokens = await asyncio.gather(*(decode(i) for i in range(len(sessions))))
        return scheduler, tokens, heard

    scheduler, batched, heard = asyncio.run(scenario())
    assert batched == alone
    assert all(h[-12:] == list(range(1, 13)) for h in heard)  # each token heard in the pass that drew it
    assert scheduler.counts.max_sessions == len(sessions)
    assert scheduler.counts.passes <= 12 + sum(len(p) for p in sequences) // 64 + 2  # prefill, then 12 shared


def test_drafts_in_a_batch_equal_drafts_alone_and_leave_when_done(draft):
    """Draft steps of different k share passes position by position; a short one leaves early."""
    sequences, ks = prompts(6, seed=2), [1, 2, 3, 4, 5, 6]

    alone = []
    for i, (prompt, k) in enumerate(zip(sequences, ks, strict=True)):
        pool, sequence = private_sequence(draft, prompt, 256)
        alone.append(run_alone(draft, pool, DraftSession(sequence, SAMPLED, DraftDraws(i, "draft")).step(k)).ids)

    pool = KVPool(KVShape.of(draft), Budget(2**28))
    steps = [DraftSession(PooledSequence(pool.take(256), p), SAMPLED, DraftDraws(i, "draft")).step(k)
             for i, (p, k) in enumerate(zip(sequences, ks, strict=True))]

    async def scenario():
        scheduler = Scheduler(draft, pool, Device(1), BatchingConfig())
        return scheduler, await asyncio.gather(*(scheduler.run(step) for step in steps))

    scheduler, results = asyncio.run(scenario())
    assert [r.result.ids for r in results] == alone
    assert scheduler.counts.passes == max(ks)  # one pass per draft position, shared
    assert [r.pass_sessions for r in results] == [6, 5, 4, 3, 2, 1]  # each left after its last token


def test_an_abandoned_draft_stops_at_the_next_pass_and_keeps_what_it_drafted(draft):
    """A stale lookahead (workers/draft_worker.py): abandoned mid-proposal, its run returns after the
    pass it is in, with the tokens drafted so far, the ones it drafts alone; its neighbour goes on."""
    prompt = prompts(1, seed=3)[0]
    pool, sequence = private_sequence(draft, prompt, 256)
    alone = run_alone(draft, pool, DraftSession(sequence, GREEDY, DraftDraws(0, "draft")).step(8)).ids

    pool = KVPool(KVShape.of(draft), Budget(2**28))
    stale, other = (DraftSession(PooledSequence(pool.take(256), prompt), GREEDY, DraftDraws(0, "draft")).step(8)
                    for _ in range(2))

    async def scenario():
        # Abandoned while its second pass is held on the device thread (its passes run back to
        # back there): where it stops does not depend on how this machine schedules threads.
        scheduler = GatedScheduler(draft, pool, Device(1), BatchingConfig(), hold_at=1)
        runs = [asyncio.create_task(scheduler.run(step)) for step in (stale, other)]
        assert await asyncio.to_thread(scheduler.held.wait, 10), "the second pass never ran"
        scheduler.abandon(stale)
        scheduler.go.set()
        return scheduler, await asyncio.gather(*runs)

    scheduler, (stopped, finished) = asyncio.run(scenario())
    assert stopped.result is None and 2 <= len(stale.so_far().ids) < 8
    assert stale.so_far().ids == alone[: len(stale.so_far().ids)]
    assert finished.result.ids == alone and scheduler.counts.passes == 8


def test_a_step_that_cannot_fit_its_session_fails_alone(target):
    pool = KVPool(KVShape.of(target), Budget(2**28))
    small = TargetSession(PooledSequence(pool.take(4), list(range(3, 10))), GREEDY, torch.Generator())
    fine = TargetSession(PooledSequence(pool.take(64), list(range(3, 10))), GREEDY, torch.Generator())

    async def scenario():
        scheduler = Scheduler(target, pool, Device(1), BatchingConfig())
        return await asyncio.gather(scheduler.run(small.step(DraftTokens.empty())),
                                    scheduler.run(fine.step(DraftTokens.empty())), return_exceptions=True)

    failed, verified = asyncio.run(scenario())
    assert isinstance(failed, ValueError) and "past the 4 it reserved" in str(failed)
    assert verified.result.token >= 0


def test_a_cancelled_step_leaves_the_batch_and_its_region_returns_after_the_pass(target):
    pool = KVPool(KVShape.of(target), Budget(2**28))
    sessions = [TargetSession(PooledSequence(pool.take(64), list(range(3, 40))), GREEDY, torch.Generator())
                for _ in range(3)]

    async def scenario():
        scheduler = Scheduler(target, pool, Device(1), BatchingConfig())
        tasks = [asyncio.create_task(scheduler.run(s.step(DraftTokens.empty()))) for s in sessions]
        while not scheduler.passing:  # the first pass starts with all three
            await asyncio.sleep(0)
        tasks[0].cancel()  # its client went away mid-pass
        scheduler.release(sessions[0].sequence.region)
        assert pool.in_use == 3 * 64  # still written by the pass in flight
        await asyncio.gather(*tasks, return_exceptions=True)
        return tasks

    tasks = asyncio.run(scenario())
    assert tasks[0].cancelled() and all(t.result().result is not None for t in tasks[1:])
    assert pool.in_use == 2 * 64


def ticket(task: str, queued_at: float) -> Ticket:
    loop = asyncio.new_event_loop()
    try:
        return Ticket(step=None, task=task, future=loop.create_future(), queued_at=queued_at)
    finally:
        loop.close()


def test_candidates_keep_steps_under_way_first_and_bound_the_pass():
    active, waiting = [ticket("code", 0.0)], [ticket("sql", 0.1), ticket("code", 0.2), ticket("math", 0.3)]
    chosen = candidates(active, waiting, BatchingConfig(max_sessions_per_pass=3), now=1.0)
    assert chosen == [active[0], waiting[0], waiting[1]]
    assert candidates(active, waiting, BatchingConfig(max_sessions_per_pass=1), now=1.0) == active


def test_same_task_passes_hold_other_tasks_back_until_their_wait_is_over():
    waiting = [ticket("code", 0.0), ticket("sql", 0.9), ticket("code", 0.95), ticket("sql", 0.5)]
    config = BatchingConfig(same_task_wait_ms=200)
    assert [t.task for t in candidates([], waiting, config, now=1.0)] == ["code", "code", "sql"]  # sql@0.5 waited 500 ms
    assert [t.task for t in candidates([], waiting, BatchingConfig(), now=1.0)] == ["code", "sql", "code", "sql"]


class FakeContext:
    """What a replica's session handler uses of a gRPC servicer context: its done callbacks."""

    def __init__(self) -> None:
        self.callbacks = []

    def add_done_callback(self, callback) -> None:
        self.callbacks.append(callback)

    def end(self) -> None:  # the RPC ended (cancelled, or the router went away)
        for callback in self.callbacks:
            callback(self)


def test_a_replica_extends_a_run_with_grants_and_drops_it_when_its_rpc_ends(target):
    """The replica side of decode runs: a grant that arrives mid-run extends it (one run, no pass
    missed between grants), replies equal the tokens alone, and a run whose RPC ends while its
    handler is paused at a reply leaves the batch at once, before its region can be reused."""
    from specserve.proto.v1 import internal_pb2 as pb
    from specserve.workers.target_replica import DecodeRuns

    prompt = prompts(1, seed=3)[0]
    pool, alone_session = verify_session(target, prompt, GREEDY, seed=0)
    alone = [run_alone(target, pool, alone_session.step(DraftTokens.empty())).token for _ in range(12)]

    async def scenario():
        pool = KVPool(KVShape.of(target), Budget(2**28))
        scheduler = Scheduler(target, pool, Device(1), BatchingConfig())
        session = TargetSession(PooledSequence(pool.take(256), prompt), GREEDY, torch.Generator())
        runs_made = []
        decode = session.decode
        session.decode = lambda n: runs_made.append(n) or decode(n)
        grants: asyncio.Queue = asyncio.Queue()

        async def inbox():
            while (grant := await grants.get()) is not None:
                yield pb.VerifyRequest(decode=grant)

        runs = DecodeRuns(scheduler, session, "", inbox(), FakeContext())
        tokens = []
        async for reply in runs.replies(8):
            tokens.append(reply.verdict.token)
            if len(tokens) == 4:
                grants.put_nowait(4)  # as the router tops up at half
            if len(tokens) == 12:
                grants.put_nowait(None)  # the router closes the stream
        ended = scheduler.counts.passes

        context = FakeContext()
        other = TargetSession(PooledSequence(pool.take(256), prompt), GREEDY, torch.Generator())
        replies = DecodeRuns(scheduler, other, "", inbox(), context).replies(100)
        await anext(replies)
        await anext(replies)  # paused at its second reply, as gRPC leaves a cancelled handler
        context.end()
        await until(lambda: not scheduler.waiting and not scheduler.active)
        return tokens, runs_made, ended, scheduler

    tokens, runs_made, passes, scheduler = asyncio.run(scenario())
    assert tokens == alone
    assert runs_made == [8] and passes == 12  # one run, extended by the grant: a pass per token
    assert not scheduler.waiting and not scheduler.active  # the dropped run left the batch


def test_a_replica_sends_a_runs_tokens_in_groups_when_asked_the_first_at_once_the_last_at_the_end(target):
    """SessionOpen.decode_group: the run's first token as its pass settles, then groups of 4 (put
    out in one turn, so they leave in one message), and where the grant ends, what is left; the
    tokens are the same as one by one."""
    from specserve.proto.v1 import internal_pb2 as pb
    from specserve.workers.target_replica import DecodeRuns

    prompt = prompts(1, seed=5)[0]

    async def scenario(group: int) -> tuple[list[int], list[int]]:
        pool = KVPool(KVShape.of(target), Budget(2**28))
        scheduler = Scheduler(target, pool, Device(1), BatchingConfig())
        session = TargetSession(PooledSequence(pool.take(256), prompt), GREEDY, torch.Generator())

        async def inbox():
            if False:
                yield pb.VerifyRequest()

        tokens, seen_at = [], []
        async for reply in DecodeRuns(scheduler, session, "", inbox(), FakeContext(), group).replies(11):
            tokens.append(reply.verdict.token)
            seen_at.append(scheduler.counts.passes)
        return tokens, seen_at

    one_by_one, passes = asyncio.run(scenario(1))
    assert passes == list(range(1, 12))
    grouped, seen_at = asyncio.run(scenario(4))
    assert grouped == one_by_one
    assert seen_at == [1, 5, 5, 5, 5, 9, 9, 9, 9, 11, 11]  # first; two groups of 4; the 2 the grant left


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_proposal_drafted_ahead_is_the_one_drafted_afresh_after_the_verdict(draft, sampling):
    """A lookahead drafts past a proposal as if all of it is accepted, first its guess of the
    target's token (its argmax), then the next proposal. With the guess right, that proposal must
    be token for token (and q for q) what the draft drafts afresh from the committed prefix: a
    sampled draft's uniforms are keyed by position (workers/seeds.py), so drafting ahead changes
    neither the output nor its distribution."""
    prompt, k = prompts(1, seed=5)[0], 4
    draws = DraftDraws(11, "draft")
    pool, sequence = private_sequence(draft, prompt, 256)
    session = DraftSession(sequence, sampling, draws)
    proposal = run_alone(draft, pool, session.step(k))
    session.resync(proposal, len(prompt) + k, [])  # as the lookahead's step says: all of it accepted
    ahead = run_alone(draft, pool, session.step(k + 1, guess=True))

    fresh_pool, fresh_sequence = private_sequence(draft, prompt + proposal.ids + ahead.ids[:1], 256)
    fresh = run_alone(draft, fresh_pool, DraftSession(fresh_sequence, sampling, draws).step(k))
    assert ahead.ids[1:] == fresh.ids
    assert torch.equal(ahead.q.ids[1:], fresh.q.ids) and torch.allclose(ahead.q.probs[1:], fresh.q.probs)
    guess_pool, guess_sequence = private_sequence(draft, prompt + proposal.ids, 256)
    assert ahead.ids[0] == run_alone(draft, guess_pool, DraftSession(guess_sequence, GREEDY, draws).step(1)).ids[0]


async def until(condition, timeout: float = 10.0) -> None:
    """Yield to the event loop until ``condition()`` holds (or ``timeout`` passes: the caller's assert
    then says what did not happen): a wait no machine's load can cut short."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


class GatedScheduler(Scheduler):
    """Records each pass's sessions and each call to the device; the pass numbered ``hold_at``
    waits, once it ran, until the test lets it go."""

    def __init__(self, *args, hold_at: int = -1) -> None:
        super().__init__(*args)
        self.hold_at = hold_at
        self.held, self.go = threading.Event(), threading.Event()
        self.sessions_per_pass: list[int] = []
        self.device_calls = 0

    def _run_passes(self, members):
        self.device_calls += 1
        return super()._run_passes(members)

    def _run(self, members):
        outcomes = super()._run(members)
        self.sessions_per_pass.append(len(members))
        if len(self.sessions_per_pass) == self.hold_at + 1:
            self.held.set()
            self.go.wait(10)
        return outcomes


@pytest.mark.parametrize("back_to_back", [True, False])
def test_a_drafts_passes_run_back_to_back_on_the_device_with_the_same_result(draft, back_to_back):
    """A draft step's k passes follow one another on the device thread without a hop to the event
    loop (one device call) when nothing else happens; the result is the same either way."""
    prompt = prompts(1, seed=4)[0]
    pool, sequence = private_sequence(draft, prompt, 256)
    alone = run_alone(draft, pool, DraftSession(sequence, SAMPLED, DraftDraws(3, "draft")).step(6)).ids
    pool = KVPool(KVShape.of(draft), Budget(2**28))
    step = DraftSession(PooledSequence(pool.take(256), prompt), SAMPLED, DraftDraws(3, "draft")).step(6)
    scheduler = GatedScheduler(draft, pool, Device(1), BatchingConfig(back_to_back=back_to_back))
    done = asyncio.run(scheduler.run(step))
    assert done.result.ids == alone and scheduler.counts.passes == 6
    assert scheduler.device_calls == (1 if back_to_back else 6)


def test_a_step_arriving_during_passes_back_to_back_joins_at_the_next_pass(draft):
    """Back to back or not, sessions join between passes: a step submitted while the device runs
    the third pass of another shares the fourth, and both get what they get alone."""
    first, second = prompts(2, seed=6)
    alone = []
    for prompt, k in ((first, 8), (second, 3)):
        pool, sequence = private_sequence(draft, prompt, 256)
        alone.append(run_alone(draft, pool, DraftSession(sequence, GREEDY, DraftDraws(0, "draft")).step(k)).ids)
    pool = KVPool(KVShape.of(draft), Budget(2**28))
    steps = [DraftSession(PooledSequence(pool.take(256), p), GREEDY, DraftDraws(0, "draft")).step(k)
             for p, k in ((first, 8), (second, 3))]
    scheduler = GatedScheduler(draft, pool, Device(1), BatchingConfig(), hold_at=2)

    async def scenario():
        running = asyncio.create_task(scheduler.run(steps[0]))
        await asyncio.get_running_loop().run_in_executor(None, scheduler.held.wait, 10)
        joining = asyncio.create_task(scheduler.run(steps[1]))
        await asyncio.sleep(0)  # it is submitted: the run of passes stops after the one under way
        scheduler.go.set()
        return await asyncio.gather(running, joining)

    results = asyncio.run(scenario())
    assert [r.result.ids for r in results] == alone
    assert scheduler.sessions_per_pass == [1, 1, 1, 2, 2, 2, 1, 1]
    assert scheduler.device_calls == 3  # passes 0-2; 3-5, the joiner's three; then 6-7 alone


def test_a_run_of_passes_back_to_back_yields_to_another_models_call_on_the_same_device(draft):
    """A draft worker's models share one device thread: a call another scheduler submits while one
    runs passes back to back goes next, as it would between passes."""
    first, second = prompts(2, seed=7)
    device, order = Device(1), []

    class Logged(GatedScheduler):
        def _run(self, members):
            order.append(self.name)
            return super()._run(members)

    pool = KVPool(KVShape.of(draft), Budget(2**28))
    a, b = Logged(draft, pool, device, BatchingConfig(), hold_at=2), Logged(draft, pool, device, BatchingConfig())
    a.name, b.name = "a", "b"
    steps = [DraftSession(PooledSequence(pool.take(256), p), GREEDY, DraftDraws(0, "draft")).step(k)
             for p, k in ((first, 6), (second, 1))]

    async def scenario():
        running = asyncio.create_task(a.run(steps[0]))
        await asyncio.get_running_loop().run_in_executor(None, a.held.wait, 10)
        other = asyncio.create_task(b.run(steps[1]))
        while not device.waiting:  # b's pass is submitted to the device
            await asyncio.sleep(0.001)
        a.go.set()
        await asyncio.gather(running, other)

    asyncio.run(scenario())
    assert order == ["a", "a", "a", "b", "a", "a", "a"]


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_branch_beside_a_lookahead_is_the_draft_after_its_rejection_and_adopts_in_place(draft, sampling):
    """A lookahead's branch (SSD) drafts, in the same passes, for a rejection at one token of the
    proposal under verification and the runner-up there as the target's token: its proposal must be
    token for token (and q for q) what the draft drafts afresh after that prefix. Adopted, its
    keys and values move into place: the next proposal is the fresh draft's too."""
    prompt, k, at = prompts(1, seed=6)[0], 4, 1
    draws = DraftDraws(13, "draft")
    pool, sequence = private_sequence(draft, prompt, 256)
    session = DraftSession(sequence, sampling, draws, alternatives=True)
    first = session.step(k)
    proposal = run_alone(draft, pool, first)
    token = first.alternatives[at].runner_up
    assert token >= 0 and token != proposal.ids[at]
    session.resync(proposal, len(prompt) + k, [])  # the lookahead's step: all of it accepted
    ahead = session.step(k + 1, min_tokens=2, guess=True)
    branch = BranchRun(session, len(prompt) + at, token, k + 1, 0.0, 2, reach=len(session.sequence.committed) + k + 1)
    scheduler = Scheduler(draft, pool, Device(1), BatchingConfig())

    async def both():
        return await asyncio.gather(scheduler.run(ahead), scheduler.run(branch))

    asyncio.run(both())
    assert scheduler.counts.sessions / scheduler.counts.passes > 1  # they shared passes

    def fresh(prefix: list[int], n: int) -> DraftTokens:
        fresh_pool, fresh_sequence = private_sequence(draft, prefix, 256)
        return run_alone(draft, fresh_pool, DraftSession(fresh_sequence, sampling, draws).step(n))

    prefix = prompt + proposal.ids[:at] + [token]
    expected = fresh(prefix, k)
    assert branch.result.ids == [token, *expected.ids]
    assert torch.equal(branch.result.q.ids[1:], expected.q.ids)
    assert torch.allclose(branch.result.q.probs[1:], expected.q.probs)

    held = branch.adopt()  # the verdict: rejected at `at`, the target's token `token`
    correction = 7  # then: all of the branch's proposal accepted but its last, and the target's own token
    session.resync(held, len(prefix) + k - 1, [correction])
    following = run_alone(draft, pool, session.step(k))
    assert following.ids == fresh(prefix + expected.ids[:-1] + [correction], k).ids


def test_a_failing_branch_leaves_the_step_and_a_failing_step_takes_its_branch_along(draft):
    """workers/draft_worker.py: a branch that fails is dropped from the reply and the session goes
    on; a run that fails leaves no branch of its in the scheduler (it would write into a region
    given back)."""
    from specserve.proto.v1 import internal_pb2 as pb
    from specserve.workers.draft_steps import DraftStep, Fork
    from specserve.workers.draft_worker import _with_branch, opened_drafter

    prompt = prompts(1, seed=8)[0]
    pool = KVPool(KVShape.of(draft), Budget(2**28))
    scheduler = Scheduler(draft, pool, Device(1), BatchingConfig())
    stream = opened_drafter(PooledSequence(pool.take(256), prompt, pool),
                            pb.SessionOpen(prompt_ids=prompt, sampling=pb.Sampling(top_p=1.0),
                                           draft=pb.DraftOpen(model="draft", alternatives=True)))

    async def step(fork_token: int, break_it: str):
        stream.step(DraftStep(keep=len(prompt), k=4))
        first = await scheduler.run(stream.last)
        ahead = DraftStep(keep=len(prompt) + 4, k=5, min_tokens=2, guess=True,
                          fork=Fork(keep=len(prompt) + 1, token=fork_token, k=4))
        run = stream.step(ahead)
        assert stream.branch is not None and first.result is not None
        broken = stream.branch if break_it == "branch" else run
        broken.advance = lambda logits: (_ for _ in ()).throw(ValueError("broken by the test"))
        return run, await _with_branch(scheduler, run, stream, "")

    run, done = asyncio.run(step(5, "branch"))
    assert done.result is run.result and len(run.result.ids) == 5 and stream.branch is None

    async def failing():
        with pytest.raises(ValueError, match="broken by the test"):
            await step(6, "run")
        await until(lambda: not (scheduler.waiting + scheduler.active))  # its next round drops what was cancelled
        return scheduler.waiting + scheduler.active

    assert asyncio.run(failing()) == []  # the branch left with its run
