"""Bounds per component: the router's admission (a concurrency limit, a bounded FIFO queue behind
it, refusal beyond both) and a worker's session slots (a session limit and a KV memory budget)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from specserve.router.admission import Admission, Overloaded
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.model_host import SessionLimit, SessionSlots


def test_limit_then_queue_then_refusal_in_arrival_order():
    async def scenario():
        admission = Admission(limit=2, queue=2)
        await admission.enter()
        await admission.enter()
        order = []

        async def queued(name):
            await admission.enter()
            order.append(name)

        waiters = [asyncio.create_task(queued(n)) for n in ("first", "second")]
        await asyncio.sleep(0)
        assert (admission.running, admission.waiting) == (2, 2)
        with pytest.raises(Overloaded, match="limit of 2 concurrent requests with 2 more queued"):
            await admission.enter()
        admission.leave()
        await asyncio.sleep(0)
        assert order == ["first"]
        admission.leave()
        await asyncio.gather(*waiters)
        assert order == ["first", "second"] and (admission.running, admission.waiting, admission.refused) == (2, 0, 1)

    asyncio.run(scenario())


def test_a_waiter_that_goes_away_leaves_the_queue():
    async def scenario():
        changes = []
        admission = Admission(limit=1, queue=1, on_change=lambda a: changes.append((a.running, a.waiting)))
        await admission.enter()
        waiter = asyncio.create_task(admission.enter())
        await asyncio.sleep(0)
        waiter.cancel()  # its client's deadline passed
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert (admission.running, admission.waiting) == (1, 0)
        admission.leave()
        await admission.enter()  # the turn was not lost with the cancelled waiter
        assert changes[-1] == (1, 0)

    asyncio.run(scenario())


def small_pool(positions: int) -> KVPool:
    shape = KVShape(layers=1, heads=1, head_dim=1, dtype=torch.float32, device=torch.device("cpu"))
    return KVPool(shape, Budget(positions * shape.bytes_per_position), arena_positions=positions)


def test_worker_slots_bound_sessions_and_kv_memory_and_free_both():
    slots, pool = SessionSlots("target t1", max_sessions=3), small_pool(100)
    with slots.hold(lambda: pool.take(60), pool.give_back):
        with pytest.raises(SessionLimit, match="needs 41 positions of KV cache"):
            with slots.hold(lambda: pool.take(41), pool.give_back):  # would hold 101 of 100
                pass
        with slots.hold(lambda: pool.take(40), pool.give_back):
            assert (slots.live, pool.in_use) == (2, 100)
            with pytest.raises(SessionLimit, match="limit of 3 sessions"):
                with slots.hold(), slots.hold():
                    pass
    assert (slots.live, pool.in_use) == (0, 0)  # every refusal and exit gave back what it took


def test_a_session_slot_released_by_its_rpc_ending_first_is_released_once():
    """grpc may finish a cancelled RPC without closing its handler: the RPC's done callback
    releases the slot, and the handler's own exit later does not release it again."""
    slots, pool = SessionSlots("draft d1", max_sessions=2), small_pool(100)
    callbacks = []
    with slots.hold(lambda: pool.take(30), pool.give_back, on_done=callbacks.append):
        with slots.hold(lambda: pool.take(30), pool.give_back):
            callbacks[0]()  # the first session's RPC ended
            assert (slots.live, pool.in_use) == (1, 30)
        callbacks[0]()
    assert (slots.live, pool.in_use) == (0, 0)
