"""Where model processes run: one GPU each when the cluster has GPUs, else a custom resource.

Targets and drafts ask for different resources, so Ray never places a draft worker on a target's
device (DESIGN.md invariant 5). On CPU-only machines the custom resources stand in for devices and
exercise the same logic.
"""

from __future__ import annotations

import ray

from .config import ServiceConfig, WorkerConfig


def cluster_gpus() -> float:
    return float(ray.cluster_resources().get("GPU", 0))


def actor_options(config: WorkerConfig, gpus_in_cluster: float) -> dict:
    """``ray_actor_options`` for one model process of this kind."""
    on_gpu = config.device == "gpu" or (config.device == "auto" and gpus_in_cluster > 0)
    if on_gpu:
        return {"num_cpus": 0, "num_gpus": config.gpus}
    # num_cpus 0: the device resource is what the process needs; cores are pinned by config instead.
    return {"num_cpus": 0, "resources": {config.device_resource: 1}}


def check_devices(config: ServiceConfig, resources: dict[str, float]) -> None:
    """Refuse a cluster where the model processes could never be placed (they would wait forever),
    saying which resource is missing and how to provide it."""
    gpus = resources.get("GPU", 0)
    for key, worker, count in (("target.replicas", config.target, config.target.replicas),
                               ("draft_pool.workers", config.draft_pool, config.draft_pool.workers)):
        options = actor_options(worker, gpus)
        name = "GPU" if "num_gpus" in options else worker.device_resource
        need = options["num_gpus"] * count if "num_gpus" in options else count
        have = resources.get(name, 0)
        if have < need:
            raise ValueError(f"{key}={count} needs {need:g} {name!r} but the cluster has {have:g}: start nodes "
                             f"with --resources '{{\"{name}\": N}}' (or GPUs), or lower {key}")


def local_resources(target_devices: int = 1, draft_devices: int = 2) -> dict[str, float]:
    """The custom resources an embedded cluster advertises: one target device, two draft devices."""
    from .config import DRAFT_DEVICE, TARGET_DEVICE

    return {TARGET_DEVICE: target_devices, DRAFT_DEVICE: draft_devices}
