"""Serve's autoscaling policy for target replicas: as many replicas as the live sessions fill.

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
"""

from __future__ import annotations

import math

from specserve.workers.config import Autoscaling

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
