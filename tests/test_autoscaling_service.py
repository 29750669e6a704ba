"""A running service's target replicas and draft pool following a load step (target.autoscaling,
draft_pool.autoscaling), with nothing lost.

On the two-node cluster (tests/two_nodes.py: two target devices on the head, two draft devices on the
other node), the service starts with one target replica and one draft worker and may grow to two of
each. A replica's capacity is set to one session (a budget no pass meets), and a draft worker's to
one session, so four clients speculating with the sql draft at once ask for two of each: Serve adds a
replica, the router adds a worker, each registers, and requests keep coming. When the load drops to
one client, each shrinks back to one: the replica and the worker removed first let their sessions
end (none resumes or reopens elsewhere). Every output, during the step and during the removals, is
the target-only output of its prompt.

In the slow suite (~3 min).
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import yaml

from specserve.cluster.bringup import serve_config
from specserve.cluster.config import DEFAULT_CONFIG_FILE as SERVE_CONFIG
from specserve.proto.v1 import specserve_pb2 as pb

from conftest import serve_in_subprocess
from test_multinode import TwoNodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SCALING = {"min_replicas": 1, "max_replicas": 2, "tpot_budget_ms": 0.001, "upscale_delay_s": 0.0,
           "downscale_delay_s": 5.0, "metrics_interval_s": 0.5}
POOL_SCALING = {"min_workers": 1, "max_workers": 2, "sessions_per_worker": 1, "upscale_delay_s": 0.0,
                "downscale_delay_s": 5.0, "metrics_interval_s": 0.5}
PROMPTS = ("SELECT name FROM", "SELECT id, total FROM orders WHERE", "SELECT count(*) FROM", "SELECT * FROM users")


def registered(client) -> tuple[int, int]:
    """(target replicas, draft workers) registered now."""
    kinds = [w.kind for w in client.stats().workers]
    return kinds.count("target"), kinds.count("draft")


def test_target_replicas_and_draft_workers_scale_up_under_a_load_step_and_back_down_with_nothing_lost(
        specserve_home, tiny_zoo, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"SPECSERVE_HOME": specserve_home}
    nodes = TwoNodes(env, tmp_path / "cluster.log")
    try:
        doc = serve_config(SERVE_CONFIG, overrides={"models": {"zoo": str(tiny_zoo.root)},
                                                    "target": {"replicas": 1, "autoscaling": SCALING},
                                                    "draft_pool": {"workers": 1, "autoscaling": POOL_SCALING}})
        config = tmp_path / "serve_config.yaml"
        config.write_text(yaml.safe_dump(doc))
        args = ["--address", nodes.address, "--config", str(config), "--port", "0"]
        with serve_in_subprocess(args, env, tmp_path / "serve.log") as (client, _):
            assert registered(client) == (1, 1)
            alone = {p: list(client.generate(pb.GenerateRequest(prompt=p, task="sql", max_tokens=64,
                                                                speculation=pb.SPECULATION_OFF)).token_ids)
                     for p in PROMPTS}
            served: list[tuple[str, list[int]]] = []
            resumes: list[int] = []  # target replicas and draft workers a request moved off mid-way
            failures: list[BaseException] = []
            load = {"clients": len(PROMPTS)}

            def client_loop(i: int) -> None:
                while i < load["clients"]:
                    prompt = PROMPTS[i]
                    try:
                        reply = client.generate(pb.GenerateRequest(prompt=prompt, task="sql", max_tokens=64, draft="sql",
                                                                   speculation=pb.SPECULATION_ON), timeout=120)
                        served.append((prompt, list(reply.token_ids)))
                        resumes.append(reply.stats.target_resumes + reply.stats.draft_reopens)
                    except BaseException as exc:  # noqa: BLE001 - reported below, with every other
                        failures.append(exc)
                        return

            threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(len(PROMPTS))]
            for thread in threads:
                thread.start()
            try:
                deadline = time.monotonic() + 180
                while registered(client) != (2, 2):  # the step asks for two of each; they load, then register
                    assert time.monotonic() < deadline and not failures, ("never scaled up", failures)
                    time.sleep(1)
                during_step = len(served)
                time.sleep(5)  # requests go on with two replicas
                assert len(served) > during_step and not failures, failures
                load["clients"] = 1  # the step ends: one client stays while a replica goes
                deadline = time.monotonic() + 180
                while registered(client) != (1, 1):
                    assert time.monotonic() < deadline and not failures, ("never scaled down", failures)
                    time.sleep(1)
                time.sleep(3)
            finally:
                load["clients"] = 0
                for thread in threads:
                    thread.join(timeout=180)
            assert not failures, failures
            assert served and all(tokens == alone[prompt] for prompt, tokens in served), \
                [(p, t) for p, t in served if t != alone[p]][:2]
            # The removed replica and worker drain (their sessions end there); with one short request at a
            # time a session is seldom on them when they go, so ModelHost.drain has a unit test of its own.
            assert sum(resumes) == 0, resumes
    finally:
        nodes.stop()
