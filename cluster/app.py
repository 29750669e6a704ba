"""The Serve application: what `import_path` in deploy/serve_config.yaml names.

``build_app(args)`` turns the config's ``args`` into a bound application: the target deployment
(replicas placed on target devices) bound into the router, the ingress. The draft pool is started
by the router, as plain Ray actors.
"""

from __future__ import annotations

from ray import serve
from ray.serve import Application

from specserve.router.deployment import Router
from specserve.workers.target_replica import TargetReplica

from .config import ServiceConfig
from .models import resolve_models
from .placement import place, router_options

TARGET_DEPLOYMENT = "target"
ROUTER_DEPLOYMENT = "router"


def build_app(args: dict) -> Application:
    config = ServiceConfig.model_validate(args or {})
    models = resolve_models(config.models, config.router)
    plain = config.model_dump(mode="json")  # what crosses to the replicas: plain data, checked again there
    target = serve.deployment(TargetReplica, name=TARGET_DEPLOYMENT).options(
        num_replicas=config.target.replicas, ray_actor_options=place(config.target),
        max_ongoing_requests=config.target.max_sessions, health_check_period_s=5,
    )
    router = serve.deployment(Router, name=ROUTER_DEPLOYMENT).options(
        num_replicas=1, ray_actor_options=router_options(config.router), health_check_period_s=5,
    )
    return router.bind(plain, models, target.bind(plain, models.target))
