"""Routing on the demo zoo, whose task drafts are distilled for their tasks (slow: builds the zoo,
~4 minutes, and runs `specserve serve` on a cluster of its own)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from specserve.proto.v1 import specserve_pb2 as pb

from conftest import free_port, serve_in_subprocess

pytestmark = pytest.mark.slow
WARM_UP_PER_TASK = 6
JUDGED_PER_TASK = 10
CLEAR_GAP = 0.3  # judged where the zoo's held-out alpha puts the task's draft this far ahead of general


@pytest.fixture(scope="module")
def demo_zoo(specserve_home):
    from specserve.cluster.zoo.build import build_zoo
    from specserve.cluster.zoo.presets import get_preset

    return build_zoo(get_preset("demo"), Path(specserve_home) / "zoo" / "demo")


@pytest.fixture(scope="module")
def demo_client(demo_zoo, specserve_home):
    args = ["--zoo", str(demo_zoo.root), "--port", "0", "--metrics-port", str(free_port())]
    with serve_in_subprocess(args, dict(os.environ, SPECSERVE_HOME=specserve_home)) as (client, _):
        yield client


def test_prompts_without_a_task_are_served_by_their_tasks_draft(demo_client, demo_zoo):
    """The issue's check: after warm-up, prompts sent with no task go to their task's draft in a
    clear majority. Speculation ON asks for a draft choice even where the policy would serve the
    task target-only (test_routing.py covers fallback)."""
    acceptance, on = demo_zoo.manifest["acceptance"], pb.SPECULATION_ON
    judged = [t for t in demo_zoo.tasks if acceptance[t][t] - acceptance[t]["general"] >= CLEAR_GAP]
    assert judged, f"the demo zoo's task drafts are not clearly ahead anywhere: {acceptance}"
    for task in demo_zoo.tasks:
        for prompt in demo_zoo.prompts(task)[-WARM_UP_PER_TASK:]:
            demo_client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=48, speculation=on))
    for task in judged:
        stats = [demo_client.generate(pb.GenerateRequest(prompt=p, max_tokens=48, speculation=on)).stats
                 for p in demo_zoo.prompts(task)[:JUDGED_PER_TASK]]
        served = Counter(s.draft for s in stats if s.task == task)
        assert sum(served.values()) >= 0.8 * JUDGED_PER_TASK, f"{task}: classified as {Counter(s.task for s in stats)}"
        assert served[task] >= 0.8 * sum(served.values()), f"{task}: served by {dict(served)}"
