"""Autoscaling policies: target replicas (through Serve) and the draft pool (by the router that owns it).

Target replicas: as many as the live sessions fill.

Requests reach replicas over the router's gRPC streams, never through Serve handles, so Serve's
default signal (requests ongoing through handles) sees nothing. Each replica reports instead
(``TargetReplica.record_autoscaling_stats``) its live sessions and its capacity: the widest pass
its start-up timings say keeps a token within ``target.autoscaling.tpot_budget_ms``. The policy
asks for the replicas the sessions would fill at the smallest reported capacity; Serve applies the
bounds and the delays (``min_replicas``, ``max_replicas``, ``upscale_delay_s``,
``downscale_delay_s``). A new replica registers and takes new sessions; one Serve removes drains
first (``TargetReplica.__del__``: unregistered, its live sessions end there, for up to
``DRAIN_SECONDS``), and what is left then continues on the others from the router's history, as
after a failure (docs/pages/reliability.md).

The draft pool: its workers are Ray actors the router starts (``cluster/pool.py``), not a Serve
deployment, so the pool scales itself, on the workers' own signals: their live sessions and how long
a draft step waits for its first pass. ``pool_wanted`` turns a reading into a size, ``Hysteresis``
applies the delays as Serve does for targets (a need must last ``upscale_delay_s`` /
``downscale_delay_s`` before the pool acts on it).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from specserve.workers.config import Autoscaling, PoolAutoscaling, ScalingDelays
from specserve.workers.model_host import HostLoad

POLICY = "specserve.cluster.autoscaling:target_policy"  # what Serve imports on its controller


def target_policy(ctx) -> tuple[int, dict]:
    """Serve's ``AutoscalingContext`` -> (replicas wanted, policy state). Without reports yet (replicas
    starting), the replicas Serve already aims for."""
    metrics = ctx.aggregated_metrics() if callable(ctx.aggregated_metrics) else ctx.aggregated_metrics
    sessions, capacity = (metrics or {}).get("sessions", {}), (metrics or {}).get("capacity", {})
    if not sessions or not capacity:
        return ctx.target_num_replicas, {}
    return wanted(sum(sessions.values()), min(capacity.values())), {}


def wanted(sessions: float, capacity: float) -> int:
    """Replicas that hold ``sessions`` at ``capacity`` each (at least one)."""
    return max(1, math.ceil(sessions / max(capacity, 1.0)))


def serve_options(config: Autoscaling, replicas: int) -> dict:
    """The target deployment's ``autoscaling_config``, starting at ``replicas`` within the bounds."""
    return {"min_replicas": config.min_replicas, "max_replicas": config.max_replicas,
            "initial_replicas": min(max(replicas, config.min_replicas), config.max_replicas),
            "upscale_delay_s": config.upscale_delay_s, "downscale_delay_s": config.downscale_delay_s,
            "metrics_interval_s": config.metrics_interval_s, "look_back_period_s": 5 * config.metrics_interval_s,
            "policy": {"policy_function": POLICY}}


@dataclass(frozen=True)
class PoolLoad:
    sessions: int  # live, over the pool's workers
    mean_wait_s: float  # of the draft steps that reached a pass since the last reading (0: none did)


def pool_load(before: Mapping[Hashable, HostLoad], now: Mapping[Hashable, HostLoad]) -> PoolLoad:
    """The pool's load from two readings of its workers (worker -> totals). A worker new since
    the last reading, or restarted (its totals went back), counts from zero."""
    steps = waited = 0.0
    for worker, load in now.items():
        last = before.get(worker)
        if last is None or load.steps < last.steps:
            last = HostLoad(0, 0, 0.0)
        steps += load.steps - last.steps
        waited += load.queue_seconds - last.queue_seconds
    return PoolLoad(sum(load.sessions for load in now.values()), waited / steps if steps else 0.0)


def pool_wanted(load: PoolLoad, workers: int, config: PoolAutoscaling) -> int:
    """The draft workers ``load`` asks for, within the bounds: enough for its sessions at
    ``sessions_per_worker`` each, and one more than ``workers`` while steps wait longer than
    ``max_queue_wait_ms`` (the passes are full: sessions alone undercount a long draft). Fewer than
    ``workers`` only while steps wait under half that, so growth by waiting is not undone at once."""
    wait_ms = load.mean_wait_s * 1000
    need = math.ceil(load.sessions / config.sessions_per_worker)
    if wait_ms > config.max_queue_wait_ms:
        need = max(need, workers + 1)
    elif wait_ms > config.max_queue_wait_ms / 2:
        need = max(need, workers)
    return min(max(need, config.min_workers), config.max_workers)


class Hysteresis:
    """The size to act on: a wanted size different from the current one is acted on once it (or
    another size on the same side) has been wanted for the delay of that side."""

    def __init__(self, delays: ScalingDelays) -> None:
        self.delays = delays
        self.side = 0  # +1: wanted more, -1: fewer, since ``self.since``
        self.since = 0.0

    def decide(self, now: float, current: int, wanted: int) -> int:
        side = (wanted > current) - (wanted < current)
        if side != self.side:
            self.side, self.since = side, now
        if side == 0:
            return current
        delay = self.delays.upscale_delay_s if side > 0 else self.delays.downscale_delay_s
        if now - self.since < delay:
            return current
        self.side = 0  # acted on: a further change waits its own delay
        return wanted
