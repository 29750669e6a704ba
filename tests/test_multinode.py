"""Several nodes on one machine: two target replicas on the head, drafts on a node of their own,
models from a directory as a mounted volume gives them, a full replica passing a request on to the
other, and the draft node going away under a running service.

A two-node cluster (tests/two_nodes.py) in its own process, and `specserve serve --address` in
another, exactly as an operator attaches the service to a cluster that is already running.

In the slow suite (~2 min): losing workers mid-request is covered in the default run by
tests/test_faults.py on the shared cluster; this adds the second node.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specserve.cluster.bringup import serve_config
from specserve.cluster.config import DEFAULT_CONFIG_FILE as SERVE_CONFIG
from specserve.proto.v1 import specserve_pb2 as pb

from conftest import serve_in_subprocess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
REPLICA_SESSIONS = 4  # per target replica: few, for the test that fills one
REGISTRY_EXPIRY_SECONDS = 30  # an entry lives 3 heartbeats (6 s by default); generous on a busy machine
VOLUME_DRAFTS = ("sql", "general")


class TwoNodes:
    """The cluster program's process: its node ids, and a command to lose the draft node."""

    def __init__(self, env: dict, log: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("two_nodes.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"),
                                     text=True, env=env)
        line = self.proc.stdout.readline()
        assert line, f"the two-node cluster did not start:\n{log.read_text()[-3000:]}"
        facts = json.loads(line)
        self.address, self.head, self.draft = facts["address"], facts["head"], facts["draft"]

    def remove_draft_node(self) -> None:
        self.proc.stdin.write("remove-draft-node\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "removed"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def two_nodes(specserve_home, tmp_path_factory):
    # The cluster's own environment: not the test session's cluster (RAY_ADDRESS), the test's home.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"SPECSERVE_HOME": specserve_home}
    logs = tmp_path_factory.mktemp("two-nodes")
    nodes = TwoNodes(env, logs / "cluster.log")
    yield nodes, env, logs
    nodes.stop()


@pytest.fixture(scope="module")
def volume_config(tiny_zoo, tmp_path_factory) -> Path:
    """The Serve config an operator would write for models on a mounted volume (no zoo): the tiny
    zoo's target and two drafts copied to a directory of their own, named by path."""
    volume = tmp_path_factory.mktemp("models")
    shutil.copytree(tiny_zoo.target_dir, volume / "target")
    for name in VOLUME_DRAFTS:
        shutil.copytree(tiny_zoo.draft_dir(name), volume / f"draft-{name}")
    models = {"zoo": None, "target": str(volume / "target"),
              "drafts": {name: str(volume / f"draft-{name}") for name in VOLUME_DRAFTS}}
    doc = serve_config(SERVE_CONFIG, overrides={"models": models,
                                                "router": {"tasks": {name: [name] for name in VOLUME_DRAFTS}},
                                                "target": {"replicas": 2, "max_sessions": REPLICA_SESSIONS}})
    path = volume / "serve_config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def attached_service(two_nodes, volume_config):
    nodes, env, logs = two_nodes
    args = ["--address", nodes.address, "--config", str(volume_config), "--port", "0"]
    with serve_in_subprocess(args, env, logs / "serve.log") as (client, _):
        yield client


def test_targets_run_on_the_head_and_drafts_on_the_draft_node(two_nodes, attached_service):
    nodes, _, _ = two_nodes
    client = attached_service
    workers = client.stats().workers
    assert {(w.kind, w.node_id) for w in workers} == {("target", nodes.head), ("draft", nodes.draft)}, workers
    assert all(set(w.models) == set(VOLUME_DRAFTS) for w in workers if w.kind == "draft"), workers  # the volume's


def test_a_full_replica_passes_the_request_on_to_the_other(attached_service):
    """The replica the router would pick holds its limit of sessions (opened by another router, so
    this one cannot know): it refuses the request, which opens on the other replica at once, with
    the same output, not counted as a resume. Target-only, so the refusal ends a decode run."""
    from test_faults import HeldSessions
    from specserve.bench.faults import workers

    client = attached_service
    alone = client.generate(request(speculation=pb.SPECULATION_OFF, max_tokens=32))
    first = min(workers(client, "target"), key=lambda w: w.worker_id)  # least loaded, ties by id
    held = HeldSessions(first, REPLICA_SESSIONS)
    try:
        passed_on = client.generate(request(speculation=pb.SPECULATION_OFF, max_tokens=32), timeout=60)
    finally:
        held.release()
    assert list(passed_on.token_ids) == list(alone.token_ids)
    assert passed_on.stats.target_full_refusals == 1 and passed_on.stats.target_resumes == 0, passed_on.stats


def test_generation_crosses_nodes_and_survives_losing_the_draft_node(two_nodes, attached_service):
    nodes, _, _ = two_nodes
    client = attached_service
    target_only = client.generate(request(speculation=pb.SPECULATION_OFF))
    speculated = client.generate(request(speculation=pb.SPECULATION_ON, draft="sql", k=1))
    assert speculated.stats.proposed_tokens > 0, "the draft on the other node proposed nothing"
    assert list(speculated.token_ids) == list(target_only.token_ids)

    # Mid-request: the draft node is lost once the draft is seen working (a chunk of more than one
    # token holds an accepted proposal). k=1 makes the request a long run of small steps, so it is
    # still drafting when the node goes.
    stream = client.stream(request(speculation=pb.SPECULATION_ON, draft="sql", k=1), timeout=120)
    chunks = [next(stream)]
    while len(chunks[-1].token_ids) < 2:
        chunks.append(next(stream))
    nodes.remove_draft_node()
    chunks += list(stream)
    assert [t for chunk in chunks for t in chunk.token_ids] == list(target_only.token_ids)
    assert chunks[-1].stats.route == "lost" and chunks[-1].stats.proposed_tokens > 0, chunks[-1].stats

    # Right after: the registry still lists the dead workers, so the session finds its draft gone
    # when it opens the stream (trying each worker once), and goes on target-only.
    asks_for_the_draft = request(speculation=pb.SPECULATION_ON, draft="sql")  # not the policy's choice
    right_after = client.generate(asks_for_the_draft, timeout=120)
    assert list(right_after.token_ids) == list(target_only.token_ids)
    assert right_after.stats.route == "unavailable" and right_after.stats.proposed_tokens == 0

    deadline = time.monotonic() + REGISTRY_EXPIRY_SECONDS
    while any(w.kind == "draft" for w in client.stats().workers):  # their entries expire unrenewed
        assert time.monotonic() < deadline, "the lost draft workers were never dropped from the registry"
        time.sleep(1)
    later = client.generate(asks_for_the_draft, timeout=120)
    assert list(later.token_ids) == list(target_only.token_ids)
    assert later.stats.route == "unavailable" and later.stats.draft == ""


def request(**fields) -> pb.GenerateRequest:
    """The sql prompt, long enough that a request takes many steps (the tiny zoo's window is 256)."""
    return pb.GenerateRequest(prompt="SELECT name FROM", task="sql", **({"max_tokens": 200} | fields))
