"""The service end to end: a real Ray cluster, Serve replicas, draft actors, gRPC over sockets."""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2

from specserve.workers.config import DRAFT_DEVICE, TARGET_DEVICE
from specserve.workers.security import SecuritySettings, internal_channel
from specserve.proto.v1 import internal_pb2, internal_pb2_grpc
from specserve.proto.v1 import specserve_pb2 as pb

from conftest import SERVICE_CONCURRENCY

SESSION_DRAIN_SECONDS = 15.0  # workers see a cancellation within milliseconds; this only bounds the wait


def request(prompt: str, **fields) -> pb.GenerateRequest:
    fields.setdefault("max_tokens", 24)
    return pb.GenerateRequest(prompt=prompt, **fields)


def worker_states(client) -> list[internal_pb2.WorkerState]:
    """Each worker's live state, asked over its own Inspect RPC (not the registry's heartbeat copy)."""
    states = []
    for worker in client.stats().workers:
        with internal_channel(worker.address, SecuritySettings.from_env()) as channel:
            stub = (internal_pb2_grpc.VerifierStub if worker.kind == "target" else internal_pb2_grpc.DrafterStub)(channel)
            states.append(stub.Inspect(internal_pb2.InspectRequest(), timeout=10))
    return states


def wait_for_no_sessions(client) -> None:
    """Back to baseline: no session and no reserved KV memory on any worker, no request in the router."""
    deadline = time.monotonic() + SESSION_DRAIN_SECONDS
    while (held := {s.worker_id: (s.live_sessions, s.kv_reserved_bytes) for s in worker_states(client)
                    if s.live_sessions or s.kv_reserved_bytes}):
        assert time.monotonic() < deadline, f"workers still hold (sessions, KV bytes): {held}"
        time.sleep(0.2)
    stats = client.stats()
    assert stats.requests_in_flight == 0 and stats.requests_queued == 0


def test_health_is_serving(client):
    assert client.health() == health_pb2.HealthCheckResponse.SERVING


def test_greedy_speculation_on_equals_off_for_every_task(client, tiny_zoo):
    """With the lookahead on (the default): drafting ahead changes speed, never the output. Also
    with the policy deciding everything (no task, draft or k: classifier, routing, adaptive k)."""
    lookaheads = hits = 0
    for task in tiny_zoo.tasks:
        for prompt in tiny_zoo.prompts(task)[:2]:
            on = client.generate(request(prompt, task=task, draft=task, speculation=pb.SPECULATION_ON))
            off = client.generate(request(prompt, task=task, speculation=pb.SPECULATION_OFF))
            auto = client.generate(request(prompt))
            assert list(on.token_ids) == list(off.token_ids), f"{task}: speculative output differs from the target's"
            assert list(auto.token_ids) == list(off.token_ids), f"{task}: routed output differs from the target's"
            assert on.text == off.text and on.finish_reason == off.finish_reason
            assert on.stats.draft == task and on.stats.proposed_tokens > 0 and on.stats.task == task
            assert off.stats.draft == "" and off.stats.proposed_tokens == 0
            assert off.stats.target_passes >= len(off.token_ids)
            lookaheads += on.stats.lookaheads
            hits += on.stats.lookahead_hits
    assert lookaheads > 0 and 0 <= hits <= lookaheads


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_draft_free_proposers_keep_the_targets_output_on_every_task(client, tiny_zoo, proposer):
    """Prompt lookup and suffix decoding, proposed in the router: every task, several k, token for
    token the target's; a proposal is made and kept somewhere (the tiny target repeats itself)."""
    accepted = 0
    for task in tiny_zoo.tasks:
        for prompt, k in zip(tiny_zoo.prompts(task)[:2], (2, 6), strict=False):
            on = client.generate(request(prompt, task=task, draft=proposer, k=k, max_tokens=40,
                                         speculation=pb.SPECULATION_ON))
            off = client.generate(request(prompt, task=task, max_tokens=40, speculation=pb.SPECULATION_OFF))
            assert list(on.token_ids) == list(off.token_ids), (proposer, task, k)
            assert on.stats.draft == proposer
            accepted += on.stats.accepted_tokens
    assert accepted > 0


def test_an_eagle3_head_on_a_draft_worker_keeps_the_targets_output(client, tiny_zoo):
    """The zoo's head drafts on a draft worker from the target's hidden states, which ride from the
    replica's replies through the router to the worker with each step: every task, several k,
    token for token the target's, and it is accepted (the tiny target repeats itself)."""
    accepted = proposed = 0
    for task in tiny_zoo.tasks:
        for prompt, k in zip(tiny_zoo.prompts(task)[:2], (2, 4), strict=False):
            on = client.generate(request(prompt, task=task, draft="eagle3", k=k, max_tokens=40,
                                         speculation=pb.SPECULATION_ON))
            off = client.generate(request(prompt, task=task, max_tokens=40, speculation=pb.SPECULATION_OFF))
            assert list(on.token_ids) == list(off.token_ids), (task, k)
            assert on.stats.draft == "eagle3" and on.stats.route != "lost", on.stats
            proposed += on.stats.proposed_tokens
            accepted += on.stats.accepted_tokens
    assert accepted > proposed / 2  # measured: 0.9-1.0 of the tokens proposed on the tiny zoo


def test_a_token_tree_keeps_the_targets_output_on_every_tasks_prompts(client, tiny_zoo):
    """The general task's tree (its draft, prompt lookup, suffix decoding) on every task's prompts,
    several k: token for token the target's. Suffix decoding learns the task's answers as they
    finish, so later requests' trees branch where it and the draft disagree."""
    stats = []
    for task in tiny_zoo.tasks:
        for prompt, k in zip(tiny_zoo.prompts(task)[:2], (2, 5), strict=False):
            off = client.generate(request(prompt, task="general", max_tokens=40, speculation=pb.SPECULATION_OFF))
            for _ in range(2):  # the second time, suffix decoding has seen the answer
                on = client.generate(request(prompt, task="general", draft="tree", k=k, max_tokens=40,
                                             speculation=pb.SPECULATION_ON))
                assert list(on.token_ids) == list(off.token_ids), (task, k)
                stats.append(on.stats)
    assert all(s.draft == "tree" for s in stats) and sum(s.accepted_tokens for s in stats) > 0


def test_a_cascade_keeps_the_targets_output_and_proposes_past_k(client, tiny_zoo):
    """A task's draft model under prompt lookup (``cascade``: the draft worker verifies the lookup's
    guesses as it drafts, and goes on past k down those it draws) on every task's prompts said
    twice, greedy and seeded sampled: greedy token for token the target's, and some proposal longer
    than k (more tokens proposed than k a target pass). It never drafts ahead (router/remote_draft.py)."""
    past_k = accepted = 0
    for task in tiny_zoo.tasks:
        prompt = tiny_zoo.prompts(task)[0]
        prompt = f"{prompt} {prompt}"
        off = client.generate(request(prompt, task=task, max_tokens=40, speculation=pb.SPECULATION_OFF))
        on = client.generate(request(prompt, task=task, draft="cascade", k=2, max_tokens=40,
                                     speculation=pb.SPECULATION_ON))
        assert list(on.token_ids) == list(off.token_ids), task
        assert on.stats.draft == "cascade" and on.stats.route != "lost", on.stats
        assert on.stats.lookaheads == 0  # a cascade drafts in turn: a lookahead would not be its fresh draft
        past_k += on.stats.proposed_tokens > 2 * on.stats.target_passes
        accepted += on.stats.accepted_tokens
        sampled = client.generate(request(prompt, task=task, draft="cascade", k=2, max_tokens=20, temperature=1.0,
                                          seed=7, speculation=pb.SPECULATION_ON))
        assert sampled.stats.draft == "cascade" and len(sampled.token_ids) > 0
    assert past_k > 0 and accepted > 0


def test_stream_chunks_concatenate_to_the_unary_result(client, tiny_zoo):
    prompt = tiny_zoo.prompts("code")[0]
    # Draft and k pinned: the policy's own choices may differ between two calls, and with them
    # the number of steps (not the text).
    pinned = request(prompt, task="code", max_tokens=40, draft="general", k=3, speculation=pb.SPECULATION_ON)
    whole = client.generate(pinned)
    chunks = list(client.stream(pinned))
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.token_ids] == list(whole.token_ids)
    assert all(c.finish_reason == pb.FINISH_REASON_UNSPECIFIED for c in chunks[:-1])
    assert chunks[-1].finish_reason == whole.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    assert chunks[-1].stats.target_passes == whole.stats.target_passes
    assert len(chunks) == whole.stats.target_passes  # one message per committed step
    # Drafting ahead, the first token is the target prefill's alone: it does not wait for a proposal.
    assert len(chunks[0].token_ids) == 1 and whole.stats.lookaheads > 0


def test_four_concurrent_clients_get_the_sequential_results(client, tiny_zoo):
    jobs = [(task, prompt) for task in tiny_zoo.tasks for prompt in tiny_zoo.prompts(task)[:2]]
    expected = [list(client.generate(request(p, task=t)).token_ids) for t, p in jobs]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda job: list(client.generate(request(job[1], task=job[0])).token_ids), jobs))
    assert got == expected


def mixed_requests(tiny_zoo) -> list[pb.GenerateRequest]:
    """Tasks, modes, lengths, greedy and sampled; a sampled request names its seed, draft and k
    (what its output may depend on)."""
    modes = [pb.SPECULATION_AUTO, pb.SPECULATION_ON, pb.SPECULATION_OFF]
    requests = []
    for i, task in enumerate(tiny_zoo.tasks * 2):
        prompt = tiny_zoo.prompts(task)[i % 2]
        if i % 3 == 2:
            requests.append(request(prompt, task=task, temperature=0.8, top_p=0.95, seed=100 + i, draft=task, k=2 + i % 3,
                                    speculation=modes[i % 2 + 1], max_tokens=16 + 4 * i))
        else:
            requests.append(request(prompt, task=task, speculation=modes[i % 3], max_tokens=16 + 4 * i))
    return requests


def target_passes(client) -> tuple[int, int, int]:
    """Over the target replicas: passes run, session-steps in them, the most sessions in one pass."""
    states = [s for s in worker_states(client) if "target" in s.models]
    return (sum(s.passes for s in states), sum(s.pass_sessions for s in states),
            max(s.max_pass_sessions for s in states))


def flips(tiny_engine, requests, got: list[list[int]], want: list[list[int]]) -> str:
    """Where batched outputs differ from alone: the first differing token of each, with the target's
    top-2 logit gap there (a batched matrix product may change low bits; a near tie can then flip)."""
    import torch

    from specserve.workers.prompt import encode_prompt

    lines = []
    for r, g, w in zip(requests, got, want, strict=True):
        if g != w:
            i = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
            ids = encode_prompt(tiny_engine.tokenizer, r.prompt) + w[:i]
            with torch.inference_mode():
                top = tiny_engine.target(torch.tensor([ids])).logits[0, -1].topk(2).values
            lines.append(f"{r.task} (temperature {r.temperature:g}) at token {i}: {g[i:i + 1]} vs {w[i:i + 1]}, "
                         f"top-2 logit gap {float(top[0] - top[1]):.2e}")
    return "\n".join(lines)


def test_concurrent_mixed_requests_share_passes_and_each_gets_what_it_gets_alone(client, tiny_zoo, tiny_engine):
    """Batched with whatever else is running, a greedy request's tokens are its target-only tokens
    alone, and a sampled one's are what its seed, draft and k give alone."""
    requests = mixed_requests(tiny_zoo)
    alone = []
    for r in requests:
        if r.temperature:
            alone.append(list(client.generate(r).token_ids))
        else:
            target_only = pb.GenerateRequest()
            target_only.CopyFrom(r)
            target_only.speculation = pb.SPECULATION_OFF
            alone.append(list(client.generate(target_only).token_ids))
    passes, sessions, _ = target_passes(client)
    with ThreadPoolExecutor(SERVICE_CONCURRENCY) as pool:
        together = list(pool.map(lambda r: list(client.generate(r).token_ids), requests))
    assert together == alone, flips(tiny_engine, requests, together, alone)
    more_passes, more_sessions, most = target_passes(client)
    assert most > 1 and (more_sessions - sessions) > (more_passes - passes), "no pass held several sessions"


def test_a_seeded_sampled_request_is_reproducible(client, tiny_zoo):
    # The sample drawn for a seed depends on the proposals it was verified against (the
    # distribution does not): replaying takes the same draft and k, both reported in the stats.
    sampled = request(tiny_zoo.prompts("prose")[0], task="prose", temperature=0.9, top_p=0.95, seed=1234, max_tokens=32,
                      draft="prose", k=3, speculation=pb.SPECULATION_ON)
    first, second = client.generate(sampled), client.generate(sampled)
    assert list(first.token_ids) == list(second.token_ids) and first.stats.seed == 1234
    unseeded = client.generate(request(tiny_zoo.prompts("prose")[0], task="prose", temperature=0.9))
    assert unseeded.stats.seed > 0  # a fresh seed, reported so the request can be replayed


@pytest.mark.parametrize("fields, message", [
    ({"prompt": ""}, "prompt must not be empty"),
    ({"max_tokens": 0}, "max_tokens must be 1..4096, got 0"),
    ({"max_tokens": -5}, "max_tokens must be 1..4096, got -5"),
    ({"max_tokens": 5000}, "max_tokens must be 1..4096, got 5000"),
    ({"temperature": -0.5}, "temperature must be 0 (greedy) or a finite number >= 0.01, got -0.5"),
    ({"temperature": math.nan}, "temperature must be 0 (greedy) or a finite number >= 0.01, got nan"),
    ({"temperature": math.inf}, "temperature must be 0 (greedy) or a finite number >= 0.01, got inf"),
    ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
    ({"top_k": -1}, "top_k must be >= 0 (0 disables it), got -1"),
    ({"k": 0}, "k must be 1..16, got 0"),
    ({"seed": 2**63}, "seed must be 0..2^63-1"),
    ({"stop": ["x" * 65]}, "each stop string must be 1..64 characters, got 65"),
    ({"task": "poetry"}, "unknown task 'poetry'; this deployment serves: canaried, code, general, guessed, math, poor, predicted, predicted-here, prose, quantized, routed, sql"),
    ({"draft": "huge"}, "unknown draft 'huge'; this deployment has: cascade, code, eagle3, general, math, medusa, mtp, mtp-here, ngram, other, prose, sql, sql-int8, suffix, tree"),
    ({"speculation": 7}, "speculation must be SPECULATION_AUTO, SPECULATION_ON or SPECULATION_OFF, got 7"),
    ({"prompt": "SELECT " * 200, "max_tokens": 100}, "exceed the context window of 256 tokens"),
    ({"prompt": "x" * 100_000}, "far beyond the context window of 256 tokens"),
])
def test_invalid_input_is_invalid_argument_naming_the_field(client, fields, message):
    fields = {"prompt": "SELECT", **fields}
    with pytest.raises(grpc.RpcError) as caught:
        client.generate(pb.GenerateRequest(**fields), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.details()
    assert client.generate(request("SELECT", max_tokens=4)).token_ids  # the service carries on


def test_invalid_utf8_is_invalid_argument(client, service):
    bad_prompt = b"\x0a\x03\xff\xfe\x41"  # field 1 (prompt), 3 bytes, not UTF-8
    with grpc.insecure_channel(service.address) as channel:
        call = channel.unary_unary("/specserve.v1.SpecServe/Generate")
        with pytest.raises(grpc.RpcError) as caught:
            call(bad_prompt, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "valid UTF-8" in caught.value.details()
    assert client.generate(request("SELECT", max_tokens=4)).token_ids


def test_concurrency_limit_is_resource_exhausted(client, tiny_zoo):
    rejected_before = client.stats().requests_rejected
    prompt = tiny_zoo.prompts("prose")[0]
    burst = 3 * SERVICE_CONCURRENCY

    def call(_):
        try:
            client.generate(request(prompt, max_tokens=160, speculation=pb.SPECULATION_OFF), timeout=120)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            return exc.code(), exc.details()

    with ThreadPoolExecutor(burst) as pool:
        outcomes = list(pool.map(call, range(burst)))
    refused = [details for code, details in outcomes if code == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert refused, "no request was refused at the limit"
    assert {code for code, _ in outcomes} <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert f"its limit of {SERVICE_CONCURRENCY} concurrent requests" in refused[0]
    assert client.stats().requests_rejected - rejected_before == len(refused)
    assert client.generate(request("SELECT", max_tokens=4)).token_ids


def test_cancelled_and_timed_out_calls_free_every_session(client, tiny_zoo):
    prompt = tiny_zoo.prompts("sql")[0]
    for i in range(6):  # cancel streams mid-way, with and without a draft
        stream = client.stream(request(prompt, task="sql", max_tokens=200,
                                       speculation=pb.SPECULATION_ON if i % 2 else pb.SPECULATION_OFF))
        next(stream)
        stream.cancel()
    with pytest.raises(grpc.RpcError) as caught:
        client.generate(request(prompt, task="sql", max_tokens=200), timeout=0.05)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(5):  # and finished requests, interleaved
        client.generate(request(prompt, task="sql", max_tokens=8))
    wait_for_no_sessions(client)


def test_draft_workers_and_target_replicas_are_on_disjoint_devices(client):
    states = {s.worker_id: s for s in worker_states(client)}
    targets = [s for wid, s in states.items() if wid.startswith("target")]
    drafts = [s for wid, s in states.items() if wid.startswith("draft")]
    assert len(targets) == 1 and len(drafts) == 2
    assert all(dict(s.resources) == {TARGET_DEVICE: 1.0} for s in targets)
    assert all(dict(s.resources) == {DRAFT_DEVICE: 1.0} for s in drafts)


def test_get_stats_counts_per_task_and_draft(client, tiny_zoo):
    before = {(t.task, t.draft): t.requests for t in client.stats().tasks}
    client.generate(request(tiny_zoo.prompts("math")[0], task="math", draft="math", speculation=pb.SPECULATION_ON))
    after = {(t.task, t.draft): t for t in client.stats().tasks}
    assert after["math", "math"].requests == before.get(("math", "math"), 0) + 1
    assert after["math", "math"].tokens_per_pass >= 1.0
    assert after["math", ""].decision in ("speculate", "fallback") and after["math", ""].reason
    assert after["math", "math"].decision in ("best", "candidate") and after["math", "math"].k >= 1
    assert all(0 <= a <= 1 for a in after["math", "math"].alpha_per_position) and after["math", "math"].alpha_per_position


def test_sampled_output_equals_the_in_process_engine_with_the_same_seed(client, tiny_engine, tiny_zoo):
    """Both paths derive the draft's uniforms and the verifier's generator from the seed, so equal
    output shows the service carries q and the verdicts exactly (a wrong q row changes the
    acceptances), and, for the EAGLE-3 head, the target's hidden states from the replica to the
    draft worker. The service drafts ahead (sampled requests too) and the engine does not: equal
    output, with lookaheads that hit, shows a proposal drafted ahead is the one drafted afresh; with
    branches that hit (tests/conftest.py: every lookahead drafts one), that a branch, adopted, is too."""
    import torch

    from specserve.workers.sampling import SamplingParams
    from specserve.workers.request import GenerationParams

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers run: the same kernels, the same rounding
    try:
        hits = branch_hits = 0
        # The tiny zoo's drafts guess the target's token rarely: at low temperature with k = 1 sql's lookaheads hit.
        cases = [("prose", 0.9, "prose", 3, 0, 77), ("code", 1.0, "code", 3, 0, 77), ("math", 1.0, "eagle3", 3, 0, 77)]
        cases += [("sql", temperature, "sql", k, i, seed) for i in range(3)  # 4 hits in the first 3 requests here
                  for temperature, k, seed in ((0.2, 1, 77), (0.5, 2, 78), (0.3, 1, 79))]
        for task, temperature, draft, k, which, seed in cases:
            prompt = tiny_zoo.prompts(task)[which]
            params = GenerationParams(max_tokens=32, sampling=SamplingParams(temperature=temperature, top_p=0.95),
                                      seed=seed, k=k)
            local = tiny_engine.generate(prompt, params, draft=draft, first_alone=True).complete()
            remote = client.generate(request(prompt, task=task, temperature=temperature, top_p=0.95, seed=seed,
                                             max_tokens=32, k=k, draft=draft, speculation=pb.SPECULATION_ON))
            assert list(remote.token_ids) == local.token_ids, (task, temperature, k, which, seed, remote.stats)
            assert remote.stats.proposed_tokens == local.stats.proposed and remote.stats.accepted_tokens == local.stats.accepted
            hits += remote.stats.lookahead_hits
            branch_hits += remote.stats.branch_hits
        assert hits, "no sampled lookahead hit: the overlapped path went untested"
        assert branch_hits, "no sampled branch hit: a branch's adoption went untested"
    finally:
        torch.set_num_threads(threads)


def test_the_target_replica_registers_its_pass_times_timed_at_start_up(service):
    """workers/calibration.py: the router prices the first burst's load with these (router/policy.py seed_passes)."""
    import ray

    from specserve.workers.calibration import WIDTHS
    from specserve.workers.registry import REGISTRY_NAME

    registry = ray.get_actor(REGISTRY_NAME)  # in the cluster's namespace, which this process joined
    targets = [e for e in ray.get(registry.endpoints.remote("target"))]
    assert targets and all([t for t, _ in e.pass_times] == list(WIDTHS) and all(s > 0 for _, s in e.pass_times)
                           for e in targets)
