"""A canary's test and routing (router/canary.py), without Ray: the arms' sums against a plain
reference, the decision on arms clearly apart, and its error rate on arms of one alpha (a
statistical test with a stated tolerance); the share routed, and what each arm counts."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest

from specserve.router.canary import (PROMOTE, ROLL_BACK, RUNNING, ArmSums, CanaryConfig, CanaryRoutes,
                                     CanaryStatus, decide, z_score)
from specserve.router.policy import Route


def arm(requests: list[tuple[int, int]]) -> ArmSums:
    sums = ArmSums()
    for accepted, rejections in requests:
        sums.add(accepted, rejections)
    return sums


def reference_variance(requests: list[tuple[int, int]]) -> float:
    """The ratio estimator's variance over requests, from the requests themselves."""
    a = np.array([r[0] for r in requests], float)
    t = np.array([r[0] + r[1] for r in requests], float)
    alpha, m = a.sum() / t.sum(), len(a)
    return m / (m - 1) * float(((a - alpha * t) ** 2).sum()) / t.sum() ** 2


def draws(rng: random.Random, alpha: float, requests: int, steps: int = 12, k: int = 4) -> list[tuple[int, int]]:
    """Requests of ``steps`` verify steps of k drafts each, every draft accepted with ``alpha``
    (until a step's first rejection), with a per-request alpha that varies around it (prompts differ)."""
    out = []
    for _ in range(requests):
        own = min(0.99, max(0.01, rng.gauss(alpha, 0.1)))
        accepted = rejections = 0
        for _ in range(steps):
            for _ in range(k):
                if rng.random() < own:
                    accepted += 1
                else:
                    rejections += 1
                    break
        out.append((accepted, rejections))
    return out


def test_the_sums_give_the_reference_alpha_and_variance_and_add_up_over_routers():
    rng = random.Random(1)
    requests = draws(rng, 0.6, 40)
    sums = arm(requests)
    assert sums.alpha == pytest.approx(sum(a for a, _ in requests) / sum(a + r for a, r in requests))
    assert sums.variance == pytest.approx(reference_variance(requests))
    assert (arm(requests[:15]) + arm(requests[15:])) == sums  # two routers' arms: the service's
    assert math.isinf(arm(requests[:1]).variance)


def test_a_canary_clearly_better_is_promoted_one_clearly_worse_rolled_back_at_the_first_look():
    rng = random.Random(2)
    config = CanaryConfig(min_requests=20, max_requests=200)
    good, poor = arm(draws(rng, 0.8, 20)), arm(draws(rng, 0.4, 20))
    assert decide(poor, good, config, 0) == (PROMOTE, 1)
    assert decide(good, poor, config, 0) == (ROLL_BACK, 1)
    assert decide(poor, good, config, 1) == ("", 1)  # that look was taken: the next is at 40 each
    assert decide(arm(draws(rng, 0.4, 19)), good, config, 0) == ("", 0)  # not both arms there yet


def test_a_canary_not_shown_better_by_the_last_look_is_rolled_back():
    config = CanaryConfig(min_requests=10, max_requests=30)
    same = arm([(5, 2)] * 15 + [(3, 3)] * 15)
    assert decide(same, same, config, 2) == (ROLL_BACK, 3)
    two_looks = arm([(5, 2)] * 10 + [(3, 3)] * 10)
    assert decide(two_looks, two_looks, config, 1) == ("", 2)


def test_on_arms_of_one_alpha_a_canary_is_promoted_at_most_as_often_as_the_confidence_allows():
    """The looks' Bonferroni bound: P(promote | same alpha) <= 1 - confidence = 0.05. Over 300 runs
    of up to 5 looks, the tolerance is three binomial standard errors above the bound."""
    rng = random.Random(3)
    config = CanaryConfig(confidence=0.95, min_requests=20, max_requests=100)
    runs, promoted = 300, 0
    for _ in range(runs):
        base, canary = draws(rng, 0.6, config.max_requests), draws(rng, 0.6, config.max_requests)
        looks = 0
        for n in range(config.min_requests, config.max_requests + 1, config.min_requests):
            decision, looks = decide(arm(base[:n]), arm(canary[:n]), config, looks)
            if decision:
                promoted += decision == PROMOTE
                break
    assert promoted / runs <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / runs), promoted


def test_z_of_arms_without_variance_is_decisive_or_zero():
    assert z_score(arm([(4, 0)] * 3), arm([(4, 0)] * 3)) == 0.0
    assert math.isinf(z_score(arm([(2, 2)] * 3), arm([(4, 0)] * 3)))


@pytest.mark.parametrize("fields,words", [({"share": 1.0}, "share must be in"), ({"confidence": 1.0}, "confidence"),
                                          ({"min_requests": 1}, "min_requests"),
                                          ({"min_requests": 50, "max_requests": 40}, "min_requests")])
def test_a_canary_config_out_of_range_says_what_to_fix(fields, words):
    with pytest.raises(ValueError, match=words):
        CanaryConfig(**fields)


def running(share: float = 0.25, tasks: tuple[str, ...] = ("sql",)) -> CanaryStatus:
    return CanaryStatus("c1", "eagle3", "eagle3@v2", "/heads/v2", tasks, CanaryConfig(share=share), RUNNING)


def test_a_router_sends_the_share_of_the_drafts_requests_of_its_tasks_to_the_canary_once_a_worker_serves_it():
    routes = CanaryRoutes(random.Random(4))
    routes.update((running(),))
    chosen = Route("eagle3", 4, "best")
    assert routes.assign("sql", chosen, served=lambda name: False) == chosen  # not registered yet
    picks = [routes.assign("sql", chosen, served=lambda name: True) for _ in range(4000)]
    canary = [p for p in picks if p.draft == "eagle3@v2"]
    assert all(p.reason == "canary" and p.k == 4 for p in canary)
    assert abs(len(canary) / len(picks) - 0.25) < 4 * math.sqrt(0.25 * 0.75 / len(picks))
    assert routes.assign("code", chosen, served=lambda name: True) == chosen  # not its task
    other = Route("sql", 3, "best")
    assert routes.assign("sql", other, served=lambda name: True) == other  # not its draft
    assert routes.assign("sql", Route(None, 0, "off"), served=lambda name: True).draft is None


def test_a_router_counts_each_arm_of_a_running_canary_and_forgets_it_once_finished():
    routes = CanaryRoutes()
    routes.update((running(),))
    routes.record("sql", "eagle3", 6, 2)
    routes.record("sql", "eagle3@v2", 7, 1)
    routes.record("sql", "eagle3@v2", 0, 0)  # tested nothing: tells nothing
    routes.record("code", "eagle3", 6, 2)  # not its task
    base, canary = routes.counts()["c1"]
    assert (base.requests, base.accepted, canary.requests, canary.accepted) == (1, 6, 1, 7)
    base.add(1, 1)  # a copy: the report does not change the router's sums
    assert routes.counts()["c1"][0].requests == 1
    from dataclasses import replace

    routes.update((replace(running(), state="promoted"),))
    assert routes.counts() == {}
    assert routes.assign("sql", Route("eagle3", 4, "best"), served=lambda name: True).draft == "eagle3"


# --- the control's lifecycle (cluster/canary.py) over a pool that only records -------------------------


class RecordingPool:
    """The draft pool's interface to canaries, recording calls; ``fail`` names calls that raise."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.specs = {"eagle3": SimpleNamespace(source="zoo-head")}
        self.calls: list[tuple] = []
        self.fail = fail

    async def _call(self, *call) -> list[str]:
        self.calls.append(call)
        if call[0] in self.fail:
            raise ValueError(f"{call[0]} refused")
        return ["draft-worker-0"]

    async def add_version(self, name, source):
        await self._call("add_version", name, source)
        self.specs[name] = SimpleNamespace(source=source)

    async def swap_draft(self, name, source):
        await self._call("swap_draft", name, source)
        self.specs[name] = SimpleNamespace(source=source)

    async def retire_version(self, name):
        await self._call("retire_version", name)
        self.specs.pop(name, None)


def canary_run(tmp_path, pool, arms, monkeypatch, change_head=False):
    """Start a canary of eagle3, report ``arms`` (base, canary) from one router, let it settle."""
    import asyncio

    import specserve.cluster.canary as control_side
    from specserve.cluster.canary import Canaries

    monkeypatch.setattr(control_side, "RETIRE_AFTER_SECONDS", 0.0)
    head = tmp_path / "v2"
    head.mkdir(parents=True)
    (head / "model.safetensors").write_bytes(b"weights")

    async def run():
        canaries = Canaries(pool, {"sql": ("eagle3",), "code": ("code",)})
        status = await canaries.start("eagle3", str(head), config=CanaryConfig(min_requests=10, max_requests=100))
        if change_head:
            (head / "model.safetensors").write_bytes(b"other weights, same directory")
        canaries.report("router-a", {status.canary_id: arms})
        await asyncio.gather(*canaries._settling)
        return canaries.statuses[status.canary_id]

    return asyncio.run(run())


def test_a_better_canary_is_promoted_then_retired_and_a_worse_one_only_retired(tmp_path, monkeypatch):
    rng = random.Random(5)
    good, poor = arm(draws(rng, 0.85, 12)), arm(draws(rng, 0.4, 12))
    pool = RecordingPool()
    status = canary_run(tmp_path / "a", pool, (poor, good), monkeypatch)
    assert status.state == "promoted" and "look 1" in status.reason and status.finished
    assert [c[0] for c in pool.calls] == ["add_version", "swap_draft", "retire_version"]
    pool = RecordingPool()
    status = canary_run(tmp_path / "b", pool, (good, poor), monkeypatch)
    assert status.state == "rolled back" and [c[0] for c in pool.calls] == ["add_version", "retire_version"]


def test_a_failed_promotion_or_a_head_changed_since_the_start_leaves_the_draft_and_still_retires(tmp_path,
                                                                                               monkeypatch):
    rng = random.Random(6)
    arms = (arm(draws(rng, 0.4, 12)), arm(draws(rng, 0.85, 12)))
    pool = RecordingPool(fail=("swap_draft",))
    status = canary_run(tmp_path / "a", pool, arms, monkeypatch)
    assert status.state == "failed" and "the promotion failed, the draft unchanged" in status.reason
    assert pool.calls[-1][0] == "retire_version" and "eagle3@v2" not in pool.specs
    pool = RecordingPool()
    status = canary_run(tmp_path / "b", pool, arms, monkeypatch, change_head=True)
    assert status.state == "failed" and "changed since the canary started" in status.reason
    assert [c[0] for c in pool.calls] == ["add_version", "retire_version"]  # never swapped to unmeasured weights


def test_a_canary_that_cannot_load_fails_rather_than_loading_forever_and_a_draft_without_tasks_is_refused(tmp_path):
    import asyncio

    from specserve.cluster.canary import Canaries

    async def run():
        pool = RecordingPool(fail=("add_version",))
        pool.specs["idle"] = SimpleNamespace(source="zoo-idle")
        canaries = Canaries(pool, {"sql": ("eagle3",), "code": ("code",)})
        with pytest.raises(ValueError, match="no draft 'nothing' in the draft pool"):
            await canaries.start("nothing", str(tmp_path))
        with pytest.raises(ValueError, match="add_version refused"):
            await canaries.start("eagle3", str(tmp_path))
        (status,) = canaries.statuses.values()
        assert status.state == "failed" and "did not load" in status.reason
        with pytest.raises(ValueError, match="serves no task"):
            await canaries.start("idle", str(tmp_path))
        canaries.pool.fail = ()
        return await canaries.start("eagle3", str(tmp_path), "again")  # the failed one does not block the next

    assert asyncio.run(run()).state == "running"
