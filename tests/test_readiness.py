"""Readiness: what the router waits for before it says SERVING, and what a request that comes earlier
gets (target-only, route "starting", the same tokens), without Ray: the service over fake workers."""

from __future__ import annotations

import asyncio
import random

from specserve.proto.v1 import specserve_pb2 as pb
from specserve.router.config import RouterConfig
from specserve.router.readiness import Readiness
from specserve.router.service import SpecServeService
from specserve.router.tasks import TaskResolver
from specserve.router.validation import Limits
from specserve.workers.registry import Endpoint

from fake_workers import DRAFT, FakeDirectory, FakeWorker

TARGET = Endpoint("target", "t0", "h:1", ("target",))


def draft_worker(name: str, *models: str) -> Endpoint:
    return Endpoint("draft", name, f"h:{name}", models)


def test_ready_once_a_target_the_whole_pool_and_every_draft_registered():
    readiness = Readiness(frozenset({"code", "sql"}), pool_size=2)
    assert not readiness.check([])
    assert readiness.waiting_for == ("a target replica; 2 of 2 draft workers (loading models, compiling passes); "
                                     "a worker for drafts code, sql")
    assert not readiness.check([TARGET, draft_worker("d0", "code")])
    assert readiness.waiting_for == "1 of 2 draft workers (loading models, compiling passes); a worker for draft sql"
    assert readiness.check([TARGET, draft_worker("d0", "code"), draft_worker("d1", "sql")])
    assert readiness.waiting_for == "" and readiness.targets == 1
    assert readiness.describe([TARGET, draft_worker("d0", "code"), draft_worker("d1", "sql")]) == \
        "1 target replica, 2 draft workers serving code, sql"
    # Once up it stays ready: a worker lost later is a request's "lost"; the targets are still counted.
    assert readiness.check([]) and readiness.targets == 0


def test_a_request_before_ready_runs_target_only_says_starting_and_keeps_its_tokens(tiny_engine):
    tasks = {"code": (DRAFT,)}
    limits = Limits(tasks=tasks, drafts=(DRAFT,), context_window=tiny_engine.context_window)
    config = RouterConfig(tasks=tasks, default_task="code")
    readiness = Readiness(frozenset({DRAFT}), pool_size=1)
    target = FakeWorker("target", "t0", tiny_engine.target)
    directory = FakeDirectory(target)  # the draft worker has not registered yet
    readiness.check(asyncio.run(directory.refresh()))
    service = SpecServeService(tiny_engine.tokenizer, limits, directory, config,
                               TaskResolver(frozenset(tasks), "code", None, 0.6), random.Random(0), readiness=readiness)
    request = pb.GenerateRequest(prompt="def parse(line):\n    ", max_tokens=16, speculation=pb.SPECULATION_ON)

    async def generate():
        turn = await service.admit(request)
        ids = [t async for chunk in service.run(turn, None) for t in chunk.token_ids]
        return ids, turn.running.route, await service.GetStats(pb.GetStatsRequest(), None)

    early, route, stats = asyncio.run(generate())
    assert route.draft is None and route.reason == "starting"
    assert not stats.ready and stats.waiting_for == f"1 of 1 draft workers (loading models, compiling passes); " \
                                                    f"a worker for draft {DRAFT}"
    directory.workers["d0"] = FakeWorker("draft", "d0", tiny_engine.target)  # it registers
    assert readiness.check(asyncio.run(directory.refresh()))
    later, route, stats = asyncio.run(generate())
    assert route.draft == DRAFT and route.reason == "best"
    assert stats.ready and stats.waiting_for == ""
    assert later == early  # speculation or not, the target's tokens


def test_the_router_waits_for_the_pools_floor_and_the_drafts_it_serves(tiny_zoo):
    """An autoscaled pool may shrink to its floor before its idle start-up workers register, and a
    router started later finds it there: the router waits for the floor. A draft of the task table
    that the pool does not serve is not waited for: no worker of it will come."""
    from specserve.cluster.config import ServiceConfig
    from specserve.cluster.models import resolve_models
    from specserve.cluster.pool import initial_size, ready_size, served_drafts

    def config(pool: dict) -> ServiceConfig:
        return ServiceConfig.model_validate({"models": {"zoo": str(tiny_zoo.root)}, "draft_pool": pool})

    fixed, scaled = config({"workers": 2}), config({"workers": 3, "autoscaling": {"min_workers": 1, "max_workers": 4}})
    models = resolve_models(fixed.models, fixed.router)
    assert ready_size(fixed, models) == initial_size(fixed, models) == 2
    assert (initial_size(scaled, models), ready_size(scaled, models)) == (3, 1)
    assert served_drafts(config({"drafts": ["sql"]}), models) == ("sql",)
    assert set(served_drafts(fixed, models)) == set(models.drafts)
