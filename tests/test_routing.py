"""Workload-aware routing through the service: task classification, draft choice, full-information
scoring, fallback to target-only, and the operator metrics. Real cluster, real gRPC."""

from __future__ import annotations

import time
import urllib.request
from collections import Counter

import grpc
import pytest

from specserve.workers.security import SecuritySettings, internal_channel
from specserve.proto.v1 import internal_pb2, internal_pb2_grpc
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.workers.drafting import score_continuation

from conftest import POOR_TASK, ROUTED_TASK, routed_arms, routed_prompts_task

WARM_UP_PER_TASK = 6  # requests per (task, draft) before routing is judged
JUDGED_PER_TASK = 12
GOOD_ALPHA, CLEAR_GAP = 0.6, 0.3  # a draft is clearly better: alpha at least this, and ahead by this
# Until the policy prices a clearly better draft this much above the task's others, its drafts are
# warmed up again, at most this many times more.
POLICY_LEAD, MORE_WARM_UPS = 1.1, 3
METRICS_WAIT_SECONDS = 30.0  # the embedded cluster reports metrics every 2 s


def request(prompt: str, **fields) -> pb.GenerateRequest:
    fields.setdefault("max_tokens", 24)
    return pb.GenerateRequest(prompt=prompt, **fields)


def task_row(client, task: str) -> pb.TaskStats:
    return next(t for t in client.stats().tasks if t.task == task and not t.draft)


def drive_to_fallback(client, zoo, limit: int = 30) -> pb.TaskStats:
    """Send POOR_TASK traffic until the policy serves it target-only."""
    prompts = zoo.prompts("prose")
    for i in range(limit):
        client.generate(request(prompts[i % len(prompts)], task=POOR_TASK))
        row = task_row(client, POOR_TASK)
        if row.decision == "fallback":
            return row
    pytest.fail(f"{POOR_TASK} never fell back: {task_row(client, POOR_TASK)}")


def test_prompts_without_a_task_are_classified(client, tiny_zoo):
    resolved = Counter()
    for task in tiny_zoo.tasks:
        for prompt in tiny_zoo.prompts(task)[:6]:
            stats = client.generate(request(prompt)).stats
            resolved[task, stats.task] += 1
            assert stats.task_source in ("classifier", "default")
            assert 0 <= stats.task_confidence <= 1
    for task in tiny_zoo.tasks:
        assert resolved[task, task] >= 4, f"{task} prompts resolved as {dict(resolved)}"


def measured_alpha(client, prompts: list[str], task: str, draft: str) -> float:
    accepted = rejections = 0
    for prompt in prompts:
        stats = client.generate(request(prompt, task=task, draft=draft, speculation=pb.SPECULATION_ON)).stats
        accepted, rejections = accepted + stats.accepted_tokens, rejections + stats.rejections
    return accepted / max(accepted + rejections, 1)


def test_a_task_is_routed_to_its_clearly_better_draft(client, tiny_zoo):
    """A task's requests go to the draft that serves it best, as the policy learns it from what the
    service accepts. ROUTED_TASK's drafts are a clear choice on any host (conftest.routed_arms; the
    zoo's own tasks are not, their drafts barely trained): the test measures each on the task's
    prompts (which also warms the policy up) and holds that premise before it judges the choice.
    The policy starts from the zoo's teacher-forced acceptance, weighed as router.policy.prior_trials
    and faded by the requests that follow, so the drafts are warmed up again until it prices the
    better one clearly above (or MORE_WARM_UPS times). That prompts without a task reach their task
    is test_prompts_without_a_task_are_classified's to judge; that they then go to their task's own
    draft, on a zoo whose task drafts are distilled for their tasks, tests/test_routing_demo.py's
    (slow)."""
    drafts, prompts = routed_arms(tiny_zoo), tiny_zoo.prompts(routed_prompts_task(tiny_zoo))
    alphas = {draft: measured_alpha(client, prompts[:WARM_UP_PER_TASK], ROUTED_TASK, draft) for draft in drafts}
    best, other = sorted(drafts, key=alphas.get, reverse=True)
    assert alphas[best] >= GOOD_ALPHA and alphas[best] - alphas[other] >= CLEAR_GAP, f"no clear choice: {alphas}"
    for _ in range(MORE_WARM_UPS):
        priced = {r.draft: r.expected_speedup for r in client.stats().tasks if r.task == ROUTED_TASK}
        if priced[best] >= POLICY_LEAD * priced[other]:
            break
        for draft in drafts:
            measured_alpha(client, prompts[:WARM_UP_PER_TASK], ROUTED_TASK, draft)
    on = pb.SPECULATION_ON  # the draft choice, whatever the fallback decision
    judged = [client.generate(request(prompts[i % len(prompts)], task=ROUTED_TASK, speculation=on)).stats
              for i in range(JUDGED_PER_TASK)]
    served = Counter(stats.draft for stats in judged)
    rows = [(r.draft, round(r.alpha, 2), round(r.cost_ratio, 2), r.k, round(r.expected_speedup, 2), r.decision)
            for r in client.stats().tasks if r.task == ROUTED_TASK]
    assert served[best] >= 0.75 * JUDGED_PER_TASK, f"served by {dict(served)}; measured {alphas}; policy {rows}"
    assert sum(r.scored_tokens for r in client.stats().tasks) > 0, "full-information scoring never ran"


def test_the_workers_score_a_continuation_as_the_model_does_in_process(client, tiny_engine, tiny_zoo, service):
    prompt = tiny_zoo.prompts("sql")[0]
    off = client.generate(request(prompt, task="sql", speculation=pb.SPECULATION_OFF))
    prompt_ids = tiny_engine.tokenizer(prompt)["input_ids"]
    ids = list(prompt_ids) + list(off.token_ids)
    worker = next(w for w in client.stats().workers if w.kind == "draft" and "sql" in w.models)
    with internal_channel(worker.address, SecuritySettings.from_env()) as channel:
        stub = internal_pb2_grpc.DrafterStub(channel)
        reply = stub.Score(internal_pb2.ScoreRequest(model="sql", ids=ids, start=len(prompt_ids)), timeout=30)
        assert (reply.positions, reply.matches) == score_continuation(tiny_engine.drafts["sql"], ids, len(prompt_ids))
        assert reply.positions == len(off.token_ids)
        with pytest.raises(grpc.RpcError) as bad:
            stub.Score(internal_pb2.ScoreRequest(model="sql", ids=ids, start=0), timeout=30)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_task_with_poor_drafts_falls_back_and_is_then_served_as_off(client, tiny_zoo):
    row = drive_to_fallback(client, tiny_zoo)
    assert "expected speedup" in row.reason and row.expected_speedup < 1
    prompts = tiny_zoo.prompts("sql")
    sent = [prompts[i % len(prompts)] for i in range(40)]
    served = [(p, client.generate(request(p, task=POOR_TASK))) for p in sent]
    fallback = [(p, r) for p, r in served if r.stats.route == "fallback"]
    probes = [r for _, r in served if r.stats.route == "probe"]
    # 10% probes by default: more than 12 of 40 has a probability of ~1e-5.
    assert len(fallback) >= 28 and len(fallback) + len(probes) == len(served)
    assert all(r.stats.draft for r in probes)
    for prompt, routed in fallback[:4]:
        # Target-only through the same path: the output, the passes and no draft work, as OFF.
        off = client.generate(request(prompt, task=POOR_TASK, speculation=pb.SPECULATION_OFF))
        assert list(routed.token_ids) == list(off.token_ids)
        assert routed.stats.draft == "" and routed.stats.proposed_tokens == 0
        assert routed.stats.target_passes == off.stats.target_passes
    assert task_row(client, POOR_TASK).decision == "fallback"  # its own probes do not bring it back
    on = client.generate(request(prompts[0], task=POOR_TASK, speculation=pb.SPECULATION_ON))
    assert on.stats.draft and on.stats.proposed_tokens > 0  # a client asking for speculation still gets it


REQUIRED_METRICS = [
    "ray_specserve_requests_total", "ray_specserve_drafts_total", "ray_specserve_draft_tokens_total",
    "ray_specserve_accepted_tokens_total", "ray_specserve_accepted_tokens_per_position_total",
    "ray_specserve_draft_step_seconds_count", "ray_specserve_verify_step_seconds_count",
    "ray_specserve_time_to_first_token_seconds_count", "ray_specserve_time_per_output_token_seconds_count",
    "ray_specserve_routing_decisions_total", "ray_specserve_fallback_decisions_total",
    "ray_specserve_expected_speedup", "ray_specserve_acceptance_alpha",
]


def scrape(port: int) -> dict[str, float]:
    """Sum of each metric's samples over its label sets; a key per refused request's status too."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    totals: Counter[str] = Counter()
    for line in body.splitlines():
        if line.startswith("ray_specserve_"):
            name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
            totals[name] += value
            if name == "ray_specserve_requests_total" and 'task=""' in line:
                totals["refused " + line.split('status="')[1].split('"')[0]] += value
    return totals


def test_the_metrics_endpoint_exposes_routing_and_speculation_metrics(client, tiny_zoo, metrics_port):
    drive_to_fallback(client, tiny_zoo)
    for task in tiny_zoo.tasks:
        client.generate(request(tiny_zoo.prompts(task)[0], task=task, draft=task, speculation=pb.SPECULATION_ON))
        client.generate(request(tiny_zoo.prompts(task)[1]))
    with pytest.raises(grpc.RpcError):  # refused at the edge: counted, with no task
        client.generate(request(tiny_zoo.prompts("sql")[0], temperature=-1.0))
    deadline = time.monotonic() + METRICS_WAIT_SECONDS
    while True:
        totals = scrape(metrics_port)
        missing = [name for name in [*REQUIRED_METRICS, "refused INVALID_ARGUMENT"] if not totals.get(name)]
        if not missing:
            break
        assert time.monotonic() < deadline, f"no non-zero values for {missing} at :{metrics_port}/metrics"
        time.sleep(1.0)
    assert totals["ray_specserve_accepted_tokens_total"] <= totals["ray_specserve_draft_tokens_total"]
