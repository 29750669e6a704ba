"""Prefix caching without Ray (workers/prefix_cache.py): sessions sharing a prompt prefix copy its
keys and values instead of computing them, and decode exactly what they decode without the cache,
greedy and sampled, with the source live, retained or evicted."""

from __future__ import annotations

import asyncio

import pytest
import torch

from specserve.workers.sampling import SamplingParams
from specserve.workers.batching import Scheduler
from specserve.workers.config import ATTENTION_BLOCK, BatchingConfig
from specserve.workers.grpc_host import Device
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.prefix_cache import Holder, block_hashes, shareable_blocks
from specserve.workers.ragged_pass import PooledSequence
from specserve.workers.pass_hooks import HiddenKeeper
from specserve.workers.proposing import AUX_HIDDEN
from specserve.workers.verifying import TargetSession

from scheduled import decode_alone

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=1.0, top_p=0.9)
TOKENS = 10
SYSTEM = list(range(40, 40 + 70))  # a shared "system prompt" of 70 tokens: two whole blocks to share


@pytest.fixture(scope="module")
def target(tiny_engine):
    return tiny_engine.target


def questions(count: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [SYSTEM + torch.randint(3, 300, (int(n),), generator=gen).tolist()
            for n in torch.randint(1, 30, (count,), generator=gen)]


def decode_cached(scheduler: Scheduler, prompts: list[list[int]], sampling: SamplingParams,
                  seeds: list[int]) -> tuple[list[list[int]], list[int]]:
    """Each prompt decoded as a session of a host would run it (its region taken, the cache
    consulted, the region released at the end), all at once; their tokens and the tokens each reused."""

    async def run() -> tuple[list[list[int]], list[int]]:
        sequences = []
        for prompt in prompts:
            sequence = PooledSequence(scheduler.pool.take(len(prompt) + TOKENS + 1), prompt, scheduler.pool)
            scheduler.prefix.open(sequence)
            sequences.append(sequence)
        sessions = [TargetSession(s, sampling, torch.Generator().manual_seed(seed))
                    for s, seed in zip(sequences, seeds, strict=True)]
        done = await asyncio.gather(*(scheduler.run(s.decode(TOKENS)) for s in sessions))
        for sequence in sequences:
            scheduler.release(sequence.region)
        return [[v.token for v in d.result] for d in done], [s.reused for s in sequences]

    return asyncio.run(run())


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_sessions_sharing_a_prefix_reuse_it_and_decode_what_they_decode_without_it(target, sampling):
    """A first wave computes the shared prefix (its sessions start together: nothing to reuse yet);
    the second reuses its two whole blocks from the first wave's retained regions. Every session's
    tokens are its tokens alone, to the draw."""
    prompts = questions(12, seed=5)
    alone = decode_alone(target, prompts, TOKENS, sampling)
    scheduler = Scheduler(target, KVPool(KVShape.of(target), Budget(2**28)), Device(1), BatchingConfig(),
                          prefix_caching=True)
    first, reused = decode_cached(scheduler, prompts[:4], sampling, [0, 1, 2, 3])
    assert first == alone[:4] and reused == [0, 0, 0, 0]
    assert scheduler.prefix.stats.retained == 4
    second, reused = decode_cached(scheduler, prompts[4:8], sampling, [4, 5, 6, 7])
    assert second == alone[4:8] and reused == [2 * ATTENTION_BLOCK] * 4
    stats = scheduler.prefix.stats
    assert (stats.sessions, stats.hits, stats.reused_tokens) == (8, 4, 8 * ATTENTION_BLOCK)


def test_a_live_sessions_written_blocks_serve_a_session_opened_beside_it(target):
    pool = KVPool(KVShape.of(target), Budget(2**28))
    scheduler = Scheduler(target, pool, Device(1), BatchingConfig(), prefix_caching=True)
    prompts = questions(2, seed=6)
    alone = decode_alone(target, prompts, TOKENS)

    async def run() -> tuple[list[int], list[int], int]:
        live = PooledSequence(pool.take(len(prompts[0]) + TOKENS + 1), prompts[0], pool)
        scheduler.prefix.open(live)
        first = TargetSession(live, GREEDY, torch.Generator())
        tokens = [v.token for v in (await scheduler.run(first.decode(TOKENS))).result]  # prefilled, still open
        beside = PooledSequence(pool.take(len(prompts[1]) + TOKENS + 1), prompts[1], pool)
        scheduler.prefix.open(beside)
        second = TargetSession(beside, GREEDY, torch.Generator())
        return tokens, [v.token for v in (await scheduler.run(second.decode(TOKENS))).result], beside.reused

    first, second, reused = asyncio.run(run())
    assert [first, second] == alone and reused == 2 * ATTENTION_BLOCK


def test_retained_regions_give_way_to_new_sessions_least_recently_used_first(target):
    """A pool with room for about three sessions: every new wave evicts what the last left, the
    pool never grows for the cache, and the outputs stay the sessions' own."""
    shape = KVShape.of(target)
    prompts = questions(6, seed=7)
    room = 3 * (max(map(len, prompts)) + TOKENS + 1)
    pool = KVPool(shape, Budget(room * shape.bytes_per_position), arena_positions=room)
    scheduler = Scheduler(target, pool, Device(1), BatchingConfig(), prefix_caching=True)
    alone = decode_alone(target, prompts, TOKENS)
    for i in range(0, 6, 2):
        tokens, _ = decode_cached(scheduler, prompts[i:i + 2], GREEDY, [0, 0])
        assert tokens == alone[i:i + 2]
    assert scheduler.prefix.stats.evictions > 0 and len(pool.arenas) == 1
    assert scheduler.prefix.stats.hits >= 2  # each later wave found one retained copy at least
    scheduler.prefix.clear()
    assert pool.in_use == 0


def test_only_whole_blocks_before_a_prompts_last_token_are_shared():
    assert shareable_blocks(64) == 1 and shareable_blocks(65) == 2 and shareable_blocks(1) == 0
    a, b = list(range(100)), list(range(64)) + [7] * 36
    assert block_hashes(a, 3)[:2] == block_hashes(b, 3)[:2] and block_hashes(a, 3)[2] != block_hashes(b, 3)[2]


def test_a_hash_that_names_another_prefix_is_never_copied(target):
    """The tokens are compared before a copy: a colliding entry is passed over, not trusted."""
    pool = KVPool(KVShape.of(target), Budget(2**26))
    scheduler = Scheduler(target, pool, Device(1), BatchingConfig(), prefix_caching=True)
    other = PooledSequence(pool.take(128), [5] * 80, pool)
    other.length = 80  # as if prefilled
    prompt = list(range(3, 83))
    impostor = Holder(other, [5] * 80, block_hashes(prompt, 2))
    for chain in impostor.hashes:
        scheduler.prefix.index[chain] = [impostor]
    fresh = PooledSequence(pool.take(128), prompt, pool)
    assert scheduler.prefix.open(fresh) == 0 and fresh.length == 0


def test_a_session_serving_a_head_reuses_a_prefix_and_hands_out_hidden_states_after_it(target):
    """A target session serving an EAGLE-3 head that starts from a cached prefix: the rows before
    it were computed by another session, so its first hidden states start where its own prefill
    does (the head starts there, as after a long prompt's window), and its tokens are unchanged."""
    pool = KVPool(KVShape.of(target), Budget(2**28))
    scheduler = Scheduler(target, pool, Device(1), BatchingConfig(), prefix_caching=True)
    prompts = questions(2, seed=9)
    alone = decode_alone(target, prompts, TOKENS)
    decode_cached(scheduler, prompts[:1], GREEDY, [0])  # computes the prefix, then retained
    layers = (1, 2)

    async def run() -> tuple[list[int], int, int]:
        sequence = PooledSequence(pool.take(len(prompts[1]) + TOKENS + 1), prompts[1], pool)
        scheduler.prefix.open(sequence)
        session = TargetSession(sequence, GREEDY, torch.Generator(), HiddenKeeper(layers, sequence.reused))
        done = await scheduler.run(session.decode(TOKENS))
        hidden = session.take_extras()[AUX_HIDDEN]
        return [v.token for v in done.result], sequence.reused, hidden.start

    tokens, reused, start = asyncio.run(run())
    assert tokens == alone[1] and reused == 2 * ATTENTION_BLOCK and start == reused


def test_a_session_that_must_draft_as_it_did_before_reuses_nothing_but_still_shares(target):
    """A sampled target session serving a head computes its whole prompt (``reuse`` off: a seeded
    replay must hand the head the same hidden states whatever the cache holds); its blocks still
    serve the next session."""
    pool = KVPool(KVShape.of(target), Budget(2**26))
    scheduler = Scheduler(target, pool, Device(1), BatchingConfig(), prefix_caching=True)
    first = PooledSequence(pool.take(128), SYSTEM + [9], pool)
    first.length = len(SYSTEM) + 1  # as if prefilled
    scheduler.prefix.open(first)
    second = PooledSequence(pool.take(128), SYSTEM + [8], pool)
    assert scheduler.prefix.open(second, reuse=False) == 0 and second.length == 0
    third = PooledSequence(pool.take(128), SYSTEM + [7], pool)
    assert scheduler.prefix.open(third) == 2 * ATTENTION_BLOCK


def test_a_retired_models_pool_gives_its_memory_back_once_its_last_session_ends(target):
    """A draft worker's version replaced or retired (workers/draft_worker.py): its scheduler retires
    while a session is open on it; that session decodes on to its end (its tokens its own), then the
    pool's arenas, its cached prefix's too, go back to the budget the process's pools share, where a
    new version's pool takes them."""
    shape = KVShape.of(target)
    prompt = questions(1, seed=8)[0]
    room = 2 * (len(prompt) + TOKENS + 1)
    budget = Budget(room * shape.bytes_per_position)
    old = Scheduler(target, KVPool(shape, budget, arena_positions=room), Device(1), BatchingConfig(),
                    prefix_caching=True)

    async def run() -> list[int]:
        sequence = PooledSequence(old.take(len(prompt) + TOKENS + 1), prompt, old.pool)
        old.prefix.open(sequence)
        old.retire()
        assert budget.allocated_bytes == budget.limit_bytes  # a session still on it
        done = await old.run(TargetSession(sequence, GREEDY, torch.Generator()).decode(TOKENS))
        old.release(sequence.region)
        return [v.token for v in done.result]

    assert asyncio.run(run()) == decode_alone(target, [prompt], TOKENS)[0]
    assert budget.allocated_bytes == 0 and old.pool.arenas == [] and not old.prefix.lru
    new = KVPool(shape, budget, arena_positions=room)
    assert new.take(room).capacity == room  # the whole budget, free again
