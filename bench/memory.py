"""Resident memory of each component, read from the processes of the local cluster.

Ray names its worker processes after what they run (``ray::ServeReplica:<app>:<deployment>``,
``ray::DraftWorker``), so the components are found by process title; this works for the embedded
cluster or any cluster whose processes run on this machine, and finds nothing otherwise. An
embedded cluster's processes descend from the process that started it, which tells them apart from
another cluster's on the same machine.
"""

from __future__ import annotations

import re

import psutil

from specserve.cluster.app import CONTROL_DEPLOYMENT, ROUTER_DEPLOYMENT, TARGET_DEPLOYMENT

# A replica's title is ray::ServeReplica:<app>:<deployment>, with ".<method>" appended while a call
# runs (a health check, say): the deployment name ends at the first character a name cannot hold.
SERVE_REPLICA = re.compile(r"ray::ServeReplica:[^:\s]+:([\w-]+)")


def component_of(title: str) -> str | None:
    replica = SERVE_REPLICA.match(title)
    if replica:
        return {TARGET_DEPLOYMENT: "target replica", ROUTER_DEPLOYMENT: "router",
                CONTROL_DEPLOYMENT: "control"}.get(replica.group(1))
    return "draft worker" if title.startswith("ray::DraftWorker") else None


def resident_memory(own_cluster: bool) -> list[dict]:
    """One row per component process: component, pid, rss_bytes. ``own_cluster``: only this
    process's descendants (it started the cluster); otherwise every matching process here."""
    processes = psutil.Process().children(recursive=True) if own_cluster else psutil.process_iter()
    rows = []
    for proc in processes:
        try:
            title = " ".join(proc.cmdline())
            component = component_of(title)
            if component:
                rows.append({"component": component, "pid": proc.pid, "rss_bytes": proc.memory_info().rss})
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # gone or not ours: not a component of this service
    return sorted(rows, key=lambda r: (r["component"], r["pid"]))
