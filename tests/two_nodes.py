"""Two Ray nodes on one machine, as the multi-node test needs them: run as a program.

The head advertises two target devices and the router's node; the second node advertises draft
devices only, so every draft worker must land there. Ray's own tests build clusters this way
(``ray.cluster_utils.Cluster``). It runs in a process of its own because the test session's
process is already attached to the session's embedded cluster.

Prints one JSON line: {"address", "head", "draft"} (the GCS address and the two node ids). Then
reads commands, one per line: ``remove-draft-node`` kills the draft node's raylet and its workers
and every process it started, at once, as when the machine is lost, and answers ``removed``. End of input shuts it down.
"""

from __future__ import annotations

import json
import sys

from ray.cluster_utils import Cluster

from specserve.router.config import ROUTER_NODE
from specserve.workers.config import DRAFT_DEVICE, TARGET_DEVICE

SMALL_STORE = 100 * 1024 * 1024  # bytes; tokens travel over gRPC, not through the object store


def main() -> None:
    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 1, "resources": {TARGET_DEVICE: 2, ROUTER_NODE: 1},
        "include_dashboard": False, "object_store_memory": SMALL_STORE})
    draft_node = cluster.add_node(num_cpus=1, resources={DRAFT_DEVICE: 2}, object_store_memory=SMALL_STORE)
    cluster.wait_for_nodes()
    print(json.dumps({"address": cluster.address, "head": cluster.head_node.node_id,
                      "draft": draft_node.node_id}), flush=True)
    try:
        for line in sys.stdin:
            if line.strip() == "remove-draft-node":
                lose_machine(cluster, draft_node)
                print("removed", flush=True)
    finally:
        cluster.shutdown()


def lose_machine(cluster: Cluster, node) -> None:
    """Kill the node's workers with its raylet. Removing the node alone kills the raylet, but its
    workers notice only later, and a draft worker's gRPC server would keep answering meanwhile."""
    import psutil

    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    workers = raylet.children(recursive=True)
    for process in workers:
        process.kill()
    psutil.wait_procs(workers, timeout=10)
    cluster.remove_node(node, allow_graceful=False)


if __name__ == "__main__":
    main()
