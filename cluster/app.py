"""The Serve application: what `import_path` in deploy/serve_config.yaml names.

``build_app(args)`` turns the config's ``args`` into a bound application: the target deployment
(replicas placed on target devices) and the control deployment (one replica: the registry and the
draft pool, whose workers are plain Ray actors) bound into the router, the ingress, whose
``router.replicas`` processes share the client ports.
"""

from __future__ import annotations

from ray import serve
from ray.serve import Application

from specserve.workers.model_host import DRAIN_SECONDS
from specserve.workers.registry import Registration
from specserve.workers.target_replica import TargetReplica

from .autoscaling import serve_options
from .config import ServiceConfig
from .control import Control
from .ingress import Router
from .models import resolve_models
from .placement import place, router_options

TARGET_DEPLOYMENT = "target"
ROUTER_DEPLOYMENT = "router"
CONTROL_DEPLOYMENT = "control"
HEALTH_CHECK_SECONDS = 5  # how often Serve calls each replica's check_health


def build_app(args: dict) -> Application:
    config = ServiceConfig.model_validate(args or {})
    models = resolve_models(config.models, config.router)
    registration = Registration(config.namespace, config.router.heartbeat_seconds)
    scaling = ({"autoscaling_config": serve_options(config.target.autoscaling, config.target.replicas)}
               if config.target.autoscaling else {"num_replicas": config.target.replicas})
    target = serve.deployment(TargetReplica, name=TARGET_DEPLOYMENT).options(
        ray_actor_options=place(config.target), max_ongoing_requests=config.target.max_sessions,
        health_check_period_s=HEALTH_CHECK_SECONDS, graceful_shutdown_timeout_s=DRAIN_SECONDS + 5, **scaling,
    )
    router = serve.deployment(Router, name=ROUTER_DEPLOYMENT).options(
        num_replicas=config.router.replicas, ray_actor_options=router_options(config.router),
        health_check_period_s=HEALTH_CHECK_SECONDS,
    )
    # Beside the routers: the registry must outlive any one of them, and losing a draft node must
    # not take the table of endpoints with it.
    control = serve.deployment(Control, name=CONTROL_DEPLOYMENT).options(
        num_replicas=1, ray_actor_options=router_options(config.router), health_check_period_s=HEALTH_CHECK_SECONDS,
    )
    # What crosses to the replicas is plain data, checked again there.
    target_app = target.bind(config.target.model_dump(mode="json"), models.spec(models.target, config.target.threads),
                             registration, {name: models.spec(models.drafts[name], config.target.threads)
                                            for name in sorted(models.medusa)},
                             {name: models.spec(models.drafts[name], config.target.threads)
                              for name in sorted(models.on_replica)})
    return router.bind(config.model_dump(mode="json"), models, target_app,
                       control.bind(config.model_dump(mode="json"), models))
