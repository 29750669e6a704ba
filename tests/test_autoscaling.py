"""Autoscaling (cluster/autoscaling.py). Target replicas, scaled by Serve with specserve's policy: the
policy on Serve's context, the replicas' reports, the deployment's options and the checks at
start-up. The draft pool, scaled by its router: its reading of the workers' load, the size it asks
for, and the delays. (A running service scaling both under a load step:
tests/test_autoscaling_service.py, slow suite.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from specserve.cluster.autoscaling import (POLICY, Hysteresis, PoolLoad, pool_load, pool_wanted, serve_options,
                                           target_policy, wanted)
from specserve.cluster.config import ServiceConfig
from specserve.cluster.placement import check_devices
from specserve.workers.calibration import widest_within
from specserve.workers.config import Autoscaling, PoolAutoscaling
from specserve.workers.model_host import HostLoad

from test_config import node


def context(sessions: dict, capacity: dict, target: int = 2, lazy: bool = False) -> SimpleNamespace:
    metrics = {"sessions": sessions, "capacity": capacity} if sessions or capacity else {}
    return SimpleNamespace(aggregated_metrics=(lambda: metrics) if lazy else metrics, target_num_replicas=target)


def test_the_policy_asks_for_the_replicas_the_live_sessions_fill():
    # two replicas holding 30 and 20 sessions, each fits 16 within the budget: 50 / 16 -> 4 replicas
    assert target_policy(context({"a": 30.0, "b": 20.0}, {"a": 16.0, "b": 16.0})) == (4, {})
    assert target_policy(context({"a": 3.0, "b": 1.0}, {"a": 16.0, "b": 32.0}, lazy=True)) == (1, {})
    assert target_policy(context({"a": 20.0}, {"a": 16.0, "b": 8.0})) == (3, {})  # the smallest capacity counts
    assert target_policy(context({}, {}, target=3)) == (3, {})  # no reports yet: what Serve aims for
    assert wanted(0, 16) == 1 and wanted(17, 16) == 2 and wanted(5, 0) == 5


def test_a_replicas_capacity_is_the_widest_pass_within_the_budget():
    timed = ((1, 0.010), (2, 0.012), (4, 0.015), (8, 0.030), (16, 0.055), (32, 0.100))
    assert widest_within(timed, 0.050) == 8 and widest_within(timed, 1.0) == 32 and widest_within(timed, 0.001) == 1


def test_the_deployment_autoscales_within_its_bounds_with_the_policy():
    options = serve_options(Autoscaling(min_replicas=2, max_replicas=6), replicas=1)
    assert options["min_replicas"] == 2 and options["max_replicas"] == 6 and options["initial_replicas"] == 2
    assert options["policy"] == {"policy_function": POLICY}
    from ray.serve.config import AutoscalingConfig

    AutoscalingConfig(**options)  # Serve takes it as it is
    with pytest.raises(ValidationError, match="max_replicas \\(1\\) is below min_replicas \\(2\\)"):
        Autoscaling(min_replicas=2, max_replicas=1)


def test_the_start_up_check_counts_the_replicas_the_cluster_must_hold():
    config = ServiceConfig.model_validate({"target": {"autoscaling": {"min_replicas": 1, "max_replicas": 3}}})
    nodes = [node(specserve_target_device=1, specserve_draft_device=2, specserve_router_node=1)]
    check_devices(config, nodes)  # a cluster that grows (KubeRay's autoscaler) needs room for the minimum
    with pytest.raises(ValueError, match="target.autoscaling.max_replicas=3 needs 3 'specserve_target_device'"):
        check_devices(config, nodes, embedded=True)  # the embedded one never grows: the maximum must fit
    pool = ServiceConfig.model_validate({"draft_pool": {"autoscaling": {"min_workers": 2, "max_workers": 5}}})
    check_devices(pool, nodes)
    with pytest.raises(ValueError, match="draft_pool.autoscaling.max_workers=5 needs 5 'specserve_draft_device'"):
        check_devices(pool, nodes, embedded=True)
    with pytest.raises(ValueError, match="draft_pool.autoscaling.min_workers=3 needs 3 'specserve_draft_device'"):
        check_devices(ServiceConfig.model_validate({"draft_pool": {"autoscaling": {"min_workers": 3}}}), nodes)


def test_a_replica_being_removed_lets_its_live_sessions_end_first(monkeypatch):
    """``ModelHost.drain`` (TargetReplica.__del__, when Serve removes the replica): unregistered at
    once, then waiting while sessions are live, up to its timeout. On a clock that moves only as the
    drain sleeps, so a loaded machine cannot move what is judged."""
    from specserve.workers import model_host
    from specserve.workers.model_host import DRAIN_POLL_SECONDS, ModelHost

    now, events, ends_at = [0.0], [], [0.3]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= ends_at[0]:
            host.slots.live = 0

    monkeypatch.setattr(model_host, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))
    host = ModelHost.__new__(ModelHost)  # the drain's state alone: no model, server or registry
    host.kind, host.worker_id = "target", "t-1"
    host.heartbeat = SimpleNamespace(stop=lambda: events.append(("unregistered", now[0])))
    host.slots = SimpleNamespace(live=2)
    host.drain(timeout=10.0)
    assert events == [("unregistered", 0.0)]  # before waiting
    assert host.slots.live == 0 and 0.3 <= now[0] < 0.3 + DRAIN_POLL_SECONDS + 1e-9  # waited for them, no longer
    now[0], ends_at[0], host.slots.live = 0.0, float("inf"), 1
    host.drain(timeout=0.3)
    assert host.slots.live == 1 and 0.3 <= now[0] < 0.3 + DRAIN_POLL_SECONDS + 1e-9  # one that never ends: the timeout


def test_the_pools_load_is_its_live_sessions_and_the_mean_wait_of_the_steps_since_the_last_reading():
    before = {"0": HostLoad(3, 100, 1.0), "1": HostLoad(1, 50, 0.5)}
    now = {"0": HostLoad(4, 110, 1.2), "1": HostLoad(2, 60, 0.6), "2": HostLoad(1, 10, 0.2)}
    # steps since: 10 + 10 + 10 (worker 2 is new: from zero); waits 0.2 + 0.1 + 0.2 = 0.5 s over 30 steps
    load = pool_load(before, now)
    assert load.sessions == 7 and load.mean_wait_s == pytest.approx(0.5 / 30)
    restarted = {"0": HostLoad(1, 4, 0.4)}  # its totals went back: counted from zero
    assert pool_load(before, restarted).mean_wait_s == pytest.approx(0.1)
    assert pool_load(now, now) == PoolLoad(7, 0.0)  # no step since: no wait


def test_the_pool_asks_for_the_workers_its_sessions_fill_and_one_more_while_steps_wait():
    config = PoolAutoscaling(min_workers=1, max_workers=4, sessions_per_worker=8, max_queue_wait_ms=20)
    assert pool_wanted(PoolLoad(17, 0.001), workers=2, config=config) == 3  # 17 / 8 -> 3
    assert pool_wanted(PoolLoad(0, 0.0), workers=3, config=config) == 1  # idle: down to the minimum
    assert pool_wanted(PoolLoad(4, 0.030), workers=2, config=config) == 3  # few sessions, but passes full
    assert pool_wanted(PoolLoad(4, 0.015), workers=2, config=config) == 2  # waits near the limit: keep
    assert pool_wanted(PoolLoad(4, 0.030), workers=4, config=config) == 4  # never past the maximum
    assert pool_wanted(PoolLoad(100, 0.0), workers=1, config=config) == 4
    with pytest.raises(ValidationError, match="max_workers \\(1\\) is below min_workers \\(2\\)"):
        PoolAutoscaling(min_workers=2, max_workers=1)


def test_the_pool_acts_on_a_need_once_it_has_lasted_its_delay():
    decide = Hysteresis(PoolAutoscaling(upscale_delay_s=10, downscale_delay_s=60)).decide
    assert decide(0.0, current=2, wanted=3) == 2  # wanted since 0
    assert decide(5.0, current=2, wanted=4) == 2  # still more (another size on the same side): since 0
    assert decide(10.0, current=2, wanted=4) == 4  # lasted 10 s: to what is wanted now
    assert decide(11.0, current=4, wanted=3) == 4  # fewer since 11 ...
    assert decide(40.0, current=4, wanted=4) == 4  # ... but the need went away: the clock restarts
    assert decide(41.0, current=4, wanted=3) == 4
    assert decide(100.0, current=4, wanted=3) == 4  # 59 s
    assert decide(101.0, current=4, wanted=2) == 2  # 60 s
    assert decide(102.0, current=2, wanted=3) == 2  # acted: a new need waits its own delay


def test_the_shipped_serve_config_shows_both_autoscaling_blocks_and_they_validate():
    import re

    import yaml

    from specserve.cluster.config import DEFAULT_CONFIG_FILE

    shown = re.findall(r"# autoscaling: (\{[^}]*\})", DEFAULT_CONFIG_FILE.read_text())
    assert len(shown) == 2  # commented out: the embedded default keeps its fixed sizes
    target, pool = (yaml.safe_load(block) for block in shown)
    assert Autoscaling.model_validate(target).max_replicas >= 1
    assert PoolAutoscaling.model_validate(pool).max_workers >= 1
