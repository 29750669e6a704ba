"""Where the service's processes run.

Every model process asks for one unit of its kind's custom resource (target or draft device), and
for its GPU as well when on GPUs. The custom resource is what keeps the kinds apart: only target
nodes advertise target devices and only draft nodes draft devices, so a draft worker never lands on
a target's node even when both kinds of node have GPUs (DESIGN.md invariant 5). On CPU-only
machines the custom resources alone stand in for devices and exercise the same logic. The router
asks for a sliver of the router node's resource: it runs where clients can reach it (on KubeRay,
the head pod, behind the Service).
"""

from __future__ import annotations

import ray

from .config import DRAFT_DEVICE, ROUTER_NODE, TARGET_DEVICE, RouterConfig, ServiceConfig, WorkerConfig

# A fraction, so a Serve rollout can start the new router replica before the old one stops.
ROUTER_SHARE = 0.01


def cluster_gpus() -> float:
    return float(ray.cluster_resources().get("GPU", 0))


def actor_options(config: WorkerConfig, gpus_in_cluster: float) -> dict:
    """``ray_actor_options`` for one model process of this kind."""
    # num_cpus 0: the device is what the process needs; on CPU its cores are pinned by config instead.
    options = {"num_cpus": 0, "resources": {config.device_resource: 1}}
    if config.device == "gpu" or (config.device == "auto" and gpus_in_cluster > 0):
        options["num_gpus"] = config.gpus
    return options


def router_options(config: RouterConfig) -> dict:
    resources = {config.node_resource: ROUTER_SHARE} if config.node_resource else {}
    return {"num_cpus": 0, "resources": resources}


def check_devices(config: ServiceConfig, resources: dict[str, float]) -> None:
    """Refuse a cluster where the model processes could never be placed (they would wait forever),
    saying which resource is missing and how to provide it."""
    gpus, taken = resources.get("GPU", 0), {}  # what the kinds checked so far take (GPUs are shared)
    for key, worker, count in (("target.replicas", config.target, config.target.replicas),
                               ("draft_pool.workers", config.draft_pool, config.draft_pool.workers)):
        options = actor_options(worker, gpus)
        needs = {name: amount * count for name, amount in options["resources"].items()}
        if "num_gpus" in options:
            needs["GPU"] = options["num_gpus"] * count
        for name, need in needs.items():
            have = resources.get(name, 0) - taken.get(name, 0)
            if have < need:
                how = "GPUs" if name == "GPU" else f"--resources '{{\"{name}\": N}}'"
                left = " left" if taken.get(name) else ""
                raise ValueError(f"{key}={count} needs {need:g} {name!r} but the cluster has {have:g}{left}: "
                                 f"start nodes with {how}, or lower {key}")
            taken[name] = taken.get(name, 0) + need
    router = config.router.node_resource
    if router and resources.get(router, 0) < ROUTER_SHARE:
        raise ValueError(f"the router needs a node with the custom resource {router!r} and the cluster has none: "
                         f"start the node clients reach with --resources '{{\"{router}\": 1}}', or set "
                         f"router.node_resource to null to place the router anywhere")


def local_resources(target_devices: int = 1, draft_devices: int = 2) -> dict[str, float]:
    """The custom resources an embedded cluster advertises: one target device, two draft devices,
    and the router's node."""
    return {TARGET_DEVICE: target_devices, DRAFT_DEVICE: draft_devices, ROUTER_NODE: 1}
