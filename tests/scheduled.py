"""Target-only decoding two ways, for tests that a session's tokens do not depend on its neighbours:
each prompt alone (a pool of its own, one plain step at a time), and all of them at once through a
scheduler that shares its passes between them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import torch

from specserve.workers.sampling import SamplingParams
from specserve.workers.batching import Scheduler
from specserve.workers.config import BatchingConfig
from specserve.workers.drafting import DraftTokens
from specserve.workers.grpc_host import Device
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.ragged_pass import PooledSequence
from specserve.workers.steps import private_sequence, run_alone
from specserve.workers.verifying import TargetSession

GREEDY = SamplingParams()


def decode_alone(model, prompts: list[list[int]], tokens: int, sampling: SamplingParams = GREEDY) -> list[list[int]]:
    """Each prompt's target-only tokens, one plain step at a time in a pool of its own (seeds 0, 1, ...)."""
    decoded = []
    for i, prompt in enumerate(prompts):
        pool, sequence = private_sequence(model, prompt, len(prompt) + tokens + 1)
        session = TargetSession(sequence, sampling, torch.Generator().manual_seed(i))
        decoded.append([run_alone(model, pool, session.step(DraftTokens.empty())).token for _ in range(tokens)])
    return decoded


def decode_scheduled(model, prompts: list[list[int]], tokens: int, config: BatchingConfig = BatchingConfig(),
                     prepare: Callable[[Scheduler], None] = lambda _: None) -> tuple[list[list[int]], Scheduler]:
    """Every prompt decoded as one run through one scheduler (``prepare`` sees it first)."""
    pool = KVPool(KVShape.of(model), Budget(2**30))

    async def batched() -> tuple[list[list[int]], Scheduler]:
        scheduler = Scheduler(model, pool, Device(1), config)
        prepare(scheduler)
        sessions = [TargetSession(PooledSequence(pool.take(len(p) + tokens + 1), p), GREEDY, torch.Generator())
                    for p in prompts]
        done = await asyncio.gather(*(scheduler.run(s.decode(tokens)) for s in sessions))
        assert scheduler.counts.max_sessions > 1, "the sessions should have shared passes"
        return [[v.token for v in d.result] for d in done], scheduler

    return asyncio.run(batched())


def verify_scheduled(model, prompts: list[list[int]], expected: list[list[int]],
                     prepare: Callable[[Scheduler], None] = lambda _: None) -> tuple[list[list[int]], Scheduler]:
    """Every prompt's greedy tokens decoded by verifying proposals through one scheduler: each
    session proposes k = 1..5 tokens of its ``expected`` continuation, the last one wrong at every
    third step, so passes mix sessions of different row counts, accepted and rejected proposals."""
    pool = KVPool(KVShape.of(model), Budget(2**30))
    tokens = max(map(len, expected))

    async def verified() -> tuple[list[list[int]], Scheduler]:
        scheduler = Scheduler(model, pool, Device(1), BatchingConfig())
        prepare(scheduler)

        async def one(i: int) -> list[int]:
            session = TargetSession(PooledSequence(pool.take(len(prompts[i]) + tokens + 8), prompts[i]), GREEDY,
                                    torch.Generator())
            produced: list[int] = []
            while len(produced) < len(expected[i]):
                k = 1 + (i + len(produced)) % 5
                proposal = list(expected[i][len(produced): len(produced) + k]) or [3]
                if len(produced) % 3 == 1:
                    proposal[-1] = (proposal[-1] + 1) % model.config.vocab_size
                verdict = (await scheduler.run(session.step(DraftTokens.of_ids(proposal)))).result
                produced += proposal[: verdict.num_accepted] + [verdict.token]
            return produced[: len(expected[i])]
        done = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        assert scheduler.counts.max_sessions > 1, "the sessions should have shared passes"
        return list(done), scheduler

    return asyncio.run(verified())
