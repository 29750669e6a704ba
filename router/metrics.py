"""Operator metrics through Ray's metrics system (scraped at each node's metrics export port).

Names start with `specserve_`; Ray exports them with its `ray_` prefix. The speculation counters
follow vLLM's spec-decode metrics (drafts, draft tokens, accepted tokens, accepted per position).
Everything is recorded once per request, after its last chunk went out, so the step loop pays
nothing for it.

Batching, per step (kind: target or draft), from the pass each reply says it ran in:
    mean sessions per pass  rate(specserve_pass_sessions_sum[5m]) / rate(specserve_pass_sessions_count[5m])
    mean tokens per pass    rate(specserve_pass_tokens_sum[5m]) / rate(specserve_pass_tokens_count[5m])
    queue wait, p99         histogram_quantile(0.99, rate(specserve_step_queue_seconds_bucket[5m]))
    (a pass of n sessions is counted once per session: these are the passes a step runs in)
"""

from __future__ import annotations

from ray.util import metrics

from .load_check import LoadCheck
from .passes import PassLog
from .policy import TaskView
from .session import Session

ARM = ("task", "draft")
KIND = ("kind",)
# Seconds: a draft or verify step on CPU is a few ms, on a GPU well under one; a first token can
# wait for a queue.
STEP_BOUNDARIES = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0]
LATENCY_BOUNDARIES = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
# A pass holds up to BatchingConfig.max_sessions_per_pass sessions and max_tokens_per_pass tokens.
SESSIONS_BOUNDARIES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
TOKENS_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


class RouterMetrics:
    def __init__(self) -> None:
        self.requests = metrics.Counter("specserve_requests", "Finished requests by task and gRPC status (task "
                                        "empty: refused before it was resolved)",
                                        tag_keys=("task", "status"))
        self.drafts = metrics.Counter("specserve_drafts", "Verify steps that checked a draft proposal", tag_keys=ARM)
        self.draft_tokens = metrics.Counter("specserve_draft_tokens", "Draft tokens proposed for verification",
                                            tag_keys=ARM)
        self.accepted_tokens = metrics.Counter("specserve_accepted_tokens", "Draft tokens the target accepted",
                                               tag_keys=ARM)
        self.accepted_per_position = metrics.Counter(
            "specserve_accepted_tokens_per_position", "Accepted draft tokens by position in the proposal (0 first)",
            tag_keys=(*ARM, "position"))
        self.output_tokens = metrics.Counter("specserve_output_tokens", "Tokens returned to clients", tag_keys=ARM)
        self.draft_step = metrics.Histogram("specserve_draft_step_seconds", "Router wait for one proposal",
                                            boundaries=STEP_BOUNDARIES, tag_keys=ARM)
        self.verify_step = metrics.Histogram("specserve_verify_step_seconds",
                                             "Router wait for one target pass (draft '' : target-only)",
                                             boundaries=STEP_BOUNDARIES, tag_keys=ARM)
        self.ttft = metrics.Histogram("specserve_time_to_first_token_seconds", "Request start to first chunk",
                                      boundaries=LATENCY_BOUNDARIES, tag_keys=("task",))
        self.tpot = metrics.Histogram("specserve_time_per_output_token_seconds",
                                      "After the first chunk, seconds per further output token",
                                      boundaries=STEP_BOUNDARIES, tag_keys=("task",))
        self.routes = metrics.Counter("specserve_routing_decisions", "Draft choices: reason is requested, best, "
                                      "explore, probe, fallback, off, or unavailable / lost (no draft "
                                      "worker at the start / it failed mid-request: target-only)", tag_keys=(*ARM, "reason", "task_source"))
        self.fallbacks = metrics.Counter("specserve_fallback_decisions", "Requests served target-only by the "
                                         "policy, by cause", tag_keys=("task", "reason"))
        self.speculating = metrics.Gauge("specserve_task_speculating", "1 while the policy speculates for a task, "
                                         "0 in fallback", tag_keys=("task",))
        self.expected_speedup = metrics.Gauge("specserve_expected_speedup", "The cost model's speedup for the "
                                              "arm at its best k", tag_keys=ARM)
        self.alpha = metrics.Gauge("specserve_acceptance_alpha", "Per-token acceptance estimate", tag_keys=ARM)
        self.in_flight = metrics.Gauge("specserve_requests_in_flight", "Requests the router is serving")
        self.queued = metrics.Gauge("specserve_requests_queued", "Requests waiting for a turn (beyond the "
                                    "router's concurrency limit)")
        self.pass_sessions = metrics.Histogram("specserve_pass_sessions", "Sessions in the forward pass a step "
                                               "ran in", boundaries=SESSIONS_BOUNDARIES, tag_keys=KIND)
        self.pass_tokens = metrics.Histogram("specserve_pass_tokens", "Tokens (all sessions') in the forward pass "
                                             "a step ran in", boundaries=TOKENS_BOUNDARIES, tag_keys=KIND)
        self.step_queue = metrics.Histogram("specserve_step_queue_seconds", "How long a step waited on its worker "
                                            "before its first pass began", boundaries=STEP_BOUNDARIES, tag_keys=KIND)
        self.load_decisions = metrics.Counter(
            "specserve_load_decisions", "Requests whose route the target's load shaped: lowered_k / raised_k (the "
            "policy's k at this load differs from its k unloaded), target_saturated (served target-only: at this "
            "load a step costs more than it commits), measured_slower (served target-only: at this load "
            "speculating requests ran slower than target-only ones)", tag_keys=("task", "reason"))
        self.priced_sessions = metrics.Gauge("specserve_priced_sessions_per_pass", "The sessions per target pass "
                                             "the policy prices a step at (its load)")
        self.realized_speed = metrics.Gauge(
            "specserve_realized_decode_tokens_per_second", "What the policy's load check compares: the faded "
            "decode speed (tokens/s after the first chunk) of a task's requests served by a proposer (draft), or "
            "of target-only requests (task and draft \"\"), at a load level (sessions per replica: 2^level up to "
            "2^(level+1))", tag_keys=("task", "draft", "level"))
        self.failovers = metrics.Counter("specserve_failovers", "Workers that failed a request mid-way and were "
                                         "replaced, re-prefilled from its committed tokens (kind: target or draft)",
                                         tag_keys=("kind",))

    def record_refused(self, status: str) -> None:
        """A request refused at the edge (invalid, or over the limit): counted with no task yet."""
        self.requests.inc(1, {"task": "", "status": status})

    def record(self, session: Session, view: TaskView, status: str = "OK") -> None:
        task, draft = session.task.task, session.route.draft or ""
        arm = {"task": task, "draft": draft}
        s, t = session.decoding.stats, session.times
        self.requests.inc(1, {"task": task, "status": status})
        self.routes.inc(1, arm | {"reason": session.route.reason, "task_source": session.task.source})
        _add(self.failovers, session.target_resumes, {"kind": "target"})
        _add(self.failovers, session.draft_reopens, {"kind": "draft"})
        if session.route.reason == "fallback":
            self.fallbacks.inc(1, {"task": task, "reason": view.cause or "low_speedup"})
        if session.route.load:
            self.load_decisions.inc(1, {"task": task, "reason": session.route.load})
        if status != "OK":
            return
        _add(self.output_tokens, len(session.decoding.committed), arm)
        _add(self.drafts, len(t.verify_steps), arm)
        _add(self.draft_tokens, s.proposed, arm)
        _add(self.accepted_tokens, s.accepted, arm)
        for position, accepted in enumerate(s.accepted_per_position):
            _add(self.accepted_per_position, accepted, arm | {"position": str(position)})
        for seconds in t.draft_steps:
            self.draft_step.observe(seconds, arm)
        for seconds in t.verify_steps + t.plain_steps:
            self.verify_step.observe(seconds, arm)
        self._record_passes(t.target_passes, "target")
        self._record_passes(t.draft_passes, "draft")
        self.ttft.observe(session.first_token_seconds, {"task": task})
        later_tokens = len(session.decoding.committed) - session.first_chunk_tokens
        if later_tokens > 0:
            self.tpot.observe((session.elapsed() - session.first_token_seconds) / later_tokens, {"task": task})

    def _record_passes(self, log: PassLog, kind: str) -> None:
        tags = {"kind": kind}
        for sessions, tokens, queued in zip(log.sessions, log.tokens, log.queue_seconds, strict=True):
            self.pass_sessions.observe(sessions, tags)
            self.pass_tokens.observe(tokens, tags)
            self.step_queue.observe(queued, tags)

    def record_realized(self, check: LoadCheck) -> None:
        for (task, proposer, level), speed in check.speeds.items():
            self.realized_speed.set(speed.rate, {"task": task, "draft": proposer, "level": str(level)})

    def record_view(self, view: TaskView) -> None:
        self.speculating.set(int(view.decision == "speculate"), {"task": view.task})
        self.priced_sessions.set(view.load.sessions)
        for arm in view.arms:
            tags = {"task": view.task, "draft": arm.draft}
            self.expected_speedup.set(arm.expected_speedup, tags)
            self.alpha.set(arm.alpha, tags)


def _add(counter: metrics.Counter, value: int, tags: dict[str, str]) -> None:
    if value:  # Ray refuses increments of 0
        counter.inc(value, tags)
