"""Faults injected into the running service with Ray's own API and signals: a worker killed or
frozen while a request streams. The request completes with exactly the undisturbed output, or gets
the documented status; the service returns to its full strength and holds no sessions after.

A process is frozen (SIGSTOP) while Ray's kill is sent, and thawed to take it: the kill then lands
mid-request for certain, however fast the tiny zoo decodes. A process left frozen stands for a stuck
worker or a machine that vanished (bench/faults.py).
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from specserve.workers.security import SecuritySettings, internal_channel
from specserve.bench.faults import freeze, holding_a_session, inspect, kill, thaw, workers
from specserve.proto.v1 import internal_pb2, internal_pb2_grpc
from specserve.proto.v1 import specserve_pb2 as pb

from conftest import SERVICE_TIMEOUTS, SESSION_IDLE_SECONDS
from test_service import wait_for_no_sessions

RECOVERY_SECONDS = 120.0  # a replica or worker restarts and loads its models
MAX_TOKENS = 128  # the tiny zoo's context is 256


@pytest.fixture
def recovered(client):
    """After the test: every worker back (a target, both draft workers), answering, holding no session."""
    yield
    deadline = time.monotonic() + RECOVERY_SECONDS
    while True:
        try:
            kinds = [w.kind for w in client.stats().workers]
            if kinds.count("target") >= 1 and kinds.count("draft") >= 2:
                wait_for_no_sessions(client)
                # Served once more: the router has stopped passing over a replica that failed
                # (a request waits for that), so the next test starts on a service at rest.
                client.generate(pb.GenerateRequest(prompt="def", max_tokens=2), timeout=RECOVERY_SECONDS)
                return
        except grpc.RpcError as exc:  # a dead worker's entry, until the registry drops it
            kinds = exc
        assert time.monotonic() < deadline, f"the service did not recover: {kinds}"
        time.sleep(0.5)


def long_request(tiny_zoo, **fields) -> pb.GenerateRequest:
    task = tiny_zoo.tasks[0]
    fields.setdefault("draft", task)
    return pb.GenerateRequest(prompt=min(tiny_zoo.prompts(task), key=len), task=task, max_tokens=MAX_TOKENS,
                              speculation=pb.SPECULATION_ON, **fields)


def stream_with_fault(client, request, fault, timeout=None) -> tuple[list[int], pb.GenerateStats]:
    """Stream ``request``; after the first chunk, inject ``fault``; the tokens as the client saw them."""
    chunks = client.stream(request, timeout=timeout)
    first = next(chunks)
    fault()
    rest = list(chunks)
    tokens = [t for c in [first, *rest] for t in c.token_ids]
    return tokens, rest[-1].stats if rest else first.stats


def with_draft_struck(client, tiny_zoo, strike, times: dict | None = None, **fields):
    """A long request streamed while ``strike(worker)`` hits the draft worker holding its session
    (thawed afterwards, should it have been frozen): (tokens, stats, undisturbed tokens, worker).
    ``times`` gets the seconds of the undisturbed request and of the struck one."""
    request = long_request(tiny_zoo, **fields)
    started = time.monotonic()
    undisturbed = list(client.generate(request).token_ids)
    times = {} if times is None else times
    times["undisturbed"] = time.monotonic() - started
    drafts = workers(client, "draft")
    struck = []

    def fault():
        struck.append(holding_a_session(drafts))
        strike(struck[0])

    started = time.monotonic()
    try:
        tokens, stats = stream_with_fault(client, request, fault)
    finally:
        times["struck"] = time.monotonic() - started
        for worker in struck:
            thaw(worker.pid)
    return tokens, stats, undisturbed, struck[0]


def test_target_replica_killed_mid_request_resumes_with_identical_output(client, tiny_zoo, recovered):
    """Serve restarts the replica; the request re-prefills on it from the router's committed tokens."""
    request = long_request(tiny_zoo)
    undisturbed = client.generate(request)
    (target,) = workers(client, "target")
    tokens, stats = stream_with_fault(client, request, lambda: kill(target))
    assert tokens == list(undisturbed.token_ids), "the resumed request lost, repeated or changed tokens"
    assert stats.target_resumes == 1 and stats.draft == request.draft


def test_health_is_not_serving_while_no_target_replica_is_registered(client, service, recovered):
    """With its only replica gone the router cannot serve: health (and so the Kubernetes readiness
    probe, and the HTTP API's /health) says so until Serve's replacement registers."""
    import urllib.error
    import urllib.request

    from grpc_health.v1 import health_pb2

    from specserve.cluster.probe import main as probe

    (target,) = workers(client, "target")
    kill(target)
    seen = _wait_for(lambda: client.health() == health_pb2.HealthCheckResponse.NOT_SERVING, 60)
    assert seen, "health stayed SERVING with no target replica"
    assert probe([service.address, "specserve.v1.SpecServe"]) == 1
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(f"http://{service.http_address}/health")
    assert http.value.code == 503
    assert _wait_for(lambda: client.health() == health_pb2.HealthCheckResponse.SERVING), "never SERVING again"
    assert probe([service.address, "specserve.v1.SpecServe"]) == 0


def test_draft_worker_killed_mid_request_continues_with_identical_output(client, tiny_zoo, recovered):
    """Another draft worker takes over where the request stands; Ray restarts the dead one."""
    tokens, stats, undisturbed, killed = with_draft_struck(client, tiny_zoo, lambda w: kill(w, restart=True))
    assert tokens == undisturbed
    assert stats.draft_reopens == 1 and stats.route != "lost" and stats.draft == tiny_zoo.tasks[0]
    restarted = _wait_for(lambda: [w for w in client.stats().workers
                                   if w.worker_id == killed.worker_id and w.address != killed.address])
    assert restarted, f"Ray did not restart the killed draft worker {killed.worker_id}"


def test_a_sampled_request_goes_on_through_a_draft_worker_killed(client, tiny_zoo, recovered):
    """Sampling: the reopened draft draws from a seed of its own; the output is the target's
    distribution either way (not comparable token for token with an undisturbed run)."""
    tokens, stats, _, _ = with_draft_struck(client, tiny_zoo, lambda w: kill(w, restart=True),
                                            temperature=1.0, top_p=1.0, seed=11)
    assert stats.draft_reopens == 1 and stats.route != "lost" and stats.proposed_tokens > 0
    assert 0 < len(tokens) <= MAX_TOKENS  # and the stream ended OK


def test_draft_pool_replaces_a_worker_gone_for_good(client, recovered):
    before = {w.worker_id for w in client.stats().workers if w.kind == "draft"}
    victim = sorted(before)[0]
    kill(next(w for w in workers(client, "draft") if w.worker_id == victim), restart=False)
    replacement = _wait_for(lambda: {w.worker_id for w in client.stats().workers if w.kind == "draft"} - before)
    assert replacement and all(r.startswith(victim.rsplit("-", 1)[0]) for r in replacement), replacement


def test_stuck_draft_is_dropped_and_the_request_goes_on(client, tiny_zoo, recovered):
    times = {}
    tokens, stats, undisturbed, _ = with_draft_struck(client, tiny_zoo, lambda w: freeze(w.pid), times)
    assert tokens == undisturbed
    assert stats.draft_reopens == 1 or stats.route == "lost", stats
    # The struck request pays one draft step timeout, then goes on at about its undisturbed pace
    # (measured in the same minute, so a loaded machine slows both alike); a draft that held it
    # up would cost the session idle time (120 s) or the client's deadline.
    bound = SERVICE_TIMEOUTS["draft_step_seconds"] + 2 * times["undisturbed"] + 5
    assert times["struck"] < bound, f"the stuck draft held the request up: {times}"


def test_stuck_target_and_no_other_replica_answers_unavailable_within_the_deadline(client, tiny_zoo, recovered):
    """The only replica stops answering: after its step timeout the request waits for another
    within the client's deadline, and then says so (UNAVAILABLE), not a bare DEADLINE_EXCEEDED."""
    deadline = SERVICE_TIMEOUTS["target_step_seconds"] + 3.0
    (target,) = workers(client, "target")
    started = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as failure:
            stream_with_fault(client, long_request(tiny_zoo), lambda: freeze(target.pid), timeout=deadline)
    finally:
        thaw(target.pid)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE, failure.value
    assert "no target replica could serve" in failure.value.details() and "retry" in failure.value.details()
    assert time.monotonic() - started < deadline


def test_client_deadline_is_honoured_and_frees_the_sessions(client, tiny_zoo, recovered):
    """The client's deadline passes while the target is stuck: DEADLINE_EXCEEDED at the client,
    and once the replica wakes, nothing is left of the request anywhere."""
    (target,) = workers(client, "target")
    started = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as failure:
            stream_with_fault(client, long_request(tiny_zoo), lambda: freeze(target.pid), timeout=1.5)
    finally:
        thaw(target.pid)
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 1.5 + 1.0


def _wait_for(condition, timeout: float = RECOVERY_SECONDS):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            return result
        time.sleep(0.5)
    return result


def test_an_abandoned_session_is_evicted_and_its_memory_freed(client):
    """A caller that opens a session and goes silent (a router that hung) holds it only for the
    idle time; the worker then ends it (DEADLINE_EXCEEDED) and gives back its KV reservation."""
    (target,) = workers(client, "target")
    opened = internal_pb2.SessionOpen(session_id="abandoned", prompt_ids=[1, 2, 3], max_new_tokens=8,
                                      sampling=internal_pb2.Sampling(top_p=1.0))
    silent = threading.Event()

    def open_then_say_nothing():
        yield internal_pb2.VerifyRequest(open=opened)
        silent.wait(RECOVERY_SECONDS)

    with internal_channel(target.address, SecuritySettings.from_env()) as channel:
        call = internal_pb2_grpc.VerifierStub(channel).Verify(open_then_say_nothing())
        state = _wait_for(lambda: (s := inspect("target", target.address)).live_sessions and s, 10)
        assert state and state.kv_reserved_bytes > 0
        started = time.monotonic()
        try:
            with pytest.raises(grpc.RpcError) as evicted:
                list(call)
        finally:
            silent.set()
    assert evicted.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "evicted" in evicted.value.details()
    assert time.monotonic() - started < SESSION_IDLE_SECONDS + 5
    idle = inspect("target", target.address)
    assert (idle.live_sessions, idle.kv_reserved_bytes) == (0, 0)
