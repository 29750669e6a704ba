"""Where the service's processes run.

Every model process asks for one unit of its kind's custom resource (target or draft device), and
for its GPU as well when on GPUs. The custom resource is what keeps the kinds apart: only target
nodes advertise target devices and only draft nodes draft devices, so a draft worker never lands on
a target's node even when both kinds of node have GPUs (DESIGN.md invariant 5). On CPU-only
machines the custom resources alone stand in for devices and exercise the same logic. The router
asks for a sliver of the router node's resource: it runs where clients can reach it (on KubeRay,
the router group's pod, behind the Service).
"""

from __future__ import annotations

import logging
import time

import ray

from specserve.router.config import ROUTER_NODE, RouterConfig
from specserve.workers.config import DRAFT_DEVICE, TARGET_DEVICE, DraftPoolConfig, TargetConfig, WorkerConfig

from .config import ServiceConfig

log = logging.getLogger("specserve.placement")
# A fraction, so a Serve rollout can start the new router replica before the old one stops.
ROUTER_SHARE = 0.01
NODE_WAIT_SECONDS = 900.0  # for a node of a kind to join (KubeRay: a GPU pod pulling its image)
NODE_POLL_SECONDS = 5.0


def kind_has_gpus(resource: str, nodes: list[dict]) -> bool | None:
    """Whether the live nodes advertising ``resource`` have GPUs; None while none has joined.
    ``nodes`` as ``ray.nodes()`` lists them."""
    kind = [n for n in nodes if n.get("Alive") and n["Resources"].get(resource, 0) > 0]
    if not kind:
        return None
    return any(n["Resources"].get("GPU", 0) > 0 for n in kind)


def on_gpu(config: WorkerConfig, nodes: list[dict]) -> bool:
    """`auto` follows the nodes of the process's kind, not the cluster: draft nodes without GPUs in
    a cluster whose target nodes have them keep their drafts on CPU."""
    if config.device != "auto":
        return config.device == "gpu"
    return bool(kind_has_gpus(config.device_resource, nodes))


def actor_options(config: WorkerConfig, gpu: bool) -> dict:
    """``ray_actor_options`` for one model process of this kind."""
    # num_cpus 0: the device is what the process needs; on CPU its cores are pinned by config instead.
    options = {"num_cpus": 0, "resources": {config.device_resource: 1}}
    if gpu:
        options["num_gpus"] = config.gpus
    return options


def place(config: WorkerConfig, timeout: float = NODE_WAIT_SECONDS) -> dict:
    """``actor_options`` in the running cluster. For `auto`, waits until a node of this kind has
    joined: deciding before (KubeRay deploys as soon as the head is up, often before the GPU pods
    have pulled their image) would put a target on a GPU node without its GPU."""
    nodes, deadline, told = ray.nodes(), time.monotonic() + timeout, 0.0
    while config.device == "auto" and kind_has_gpus(config.device_resource, nodes) is None:
        if time.monotonic() > deadline:
            raise ValueError(f"no node advertising {config.device_resource!r} joined within {timeout:.0f} s: start "
                             f"one with --resources '{{\"{config.device_resource}\": N}}', or set the device")
        if time.monotonic() - told > 60:
            log.info("waiting for a node with %r to join (device auto follows its GPUs)", config.device_resource)
            told = time.monotonic()
        time.sleep(NODE_POLL_SECONDS)
        nodes = ray.nodes()
    return actor_options(config, on_gpu(config, nodes))


def router_options(config: RouterConfig) -> dict:
    resources = {config.node_resource: ROUTER_SHARE} if config.node_resource else {}
    return {"num_cpus": 0, "resources": resources}


def check_devices(config: ServiceConfig, nodes: list[dict], embedded: bool = False) -> None:
    """Refuse a cluster where the model processes could never be placed (they would wait forever),
    saying which resource is missing and how to provide it. ``nodes`` as ``ray.nodes()``;
    ``embedded``: the local cluster ``serve`` starts, whose resources are fixed."""
    resources: dict[str, float] = {}
    for node in nodes:
        if node.get("Alive"):
            for name, amount in node["Resources"].items():
                resources[name] = resources.get(name, 0) + amount
    taken: dict[str, float] = {}  # what the kinds checked so far take (GPUs are shared)
    for key, worker, count in (_needed("target", "replicas", config.target, embedded),
                               _needed("draft_pool", "workers", config.draft_pool, embedded)):
        options = actor_options(worker, on_gpu(worker, nodes))
        needs = {name: amount * count for name, amount in options["resources"].items()}
        if "num_gpus" in options:
            needs["GPU"] = options["num_gpus"] * count
        for name, need in needs.items():
            have = resources.get(name, 0) - taken.get(name, 0)
            if have < need:
                how = "GPUs" if name == "GPU" else f"--resources '{{\"{name}\": N}}'"
                left = " left" if taken.get(name) else ""
                fix = (f"lower {key}, or start a cluster with more and attach to it (--address)" if embedded
                       else f"start nodes with {how}, or lower {key}")
                where = "the embedded local cluster" if embedded else "the cluster"
                raise ValueError(f"{key}={count} needs {need:g} {name!r} but {where} has {have:g}{left}: {fix}")
            taken[name] = taken.get(name, 0) + need
    router = config.router.node_resource
    if router and resources.get(router, 0) < ROUTER_SHARE:
        raise ValueError(f"the router needs a node with the custom resource {router!r} and the cluster has none: "
                         f"start the node clients reach with --resources '{{\"{router}\": 1}}', or set "
                         f"router.node_resource to null to place the router anywhere")


def _needed(part: str, what: str, worker: TargetConfig | DraftPoolConfig,
            embedded: bool) -> tuple[str, WorkerConfig, int]:
    """(the setting, the config, how many processes must fit): the fixed count, or with autoscaling
    the most it may ask for on an embedded cluster (which never grows) and the least elsewhere (the
    Ray autoscaler adds nodes for the rest)."""
    scaling = worker.autoscaling
    if scaling is None:
        return f"{part}.{what}", worker, getattr(worker, what)
    bound = f"max_{what}" if embedded else f"min_{what}"
    return f"{part}.autoscaling.{bound}", worker, getattr(scaling, bound)


def local_resources(target_devices: int = 1, draft_devices: int = 2) -> dict[str, float]:
    """The custom resources an embedded cluster advertises: one target device, two draft devices,
    and the router's node."""
    return {TARGET_DEVICE: target_devices, DRAFT_DEVICE: draft_devices, ROUTER_NODE: 1}


def embedded_resources(config: ServiceConfig) -> dict[str, float]:
    """What the embedded cluster advertises for ``config``: ``local_resources``, except that a kind on
    simulated devices (which stand for no hardware) gets as many as the config may ask for, so that a
    fleet of them runs on one machine (workers/sim_device.py)."""
    counts = [1, 2]
    for n, (part, what, worker) in enumerate((("target", "replicas", config.target),
                                              ("draft_pool", "workers", config.draft_pool))):
        if worker.device == "sim":
            counts[n] = max(counts[n], _needed(part, what, worker, embedded=True)[2])
    return local_resources(*counts)
