"""Operator metrics through Ray's metrics system (scraped at each node's metrics export port).

Names start with `specserve_`; Ray exports them with its `ray_` prefix (counters also with a
`_total` suffix). The speculation counters follow vLLM's spec-decode metrics (drafts, draft tokens,
accepted tokens, accepted per position). Everything is recorded once per request, after its last
chunk went out, so the step loop pays nothing for it. Batching is recorded per step (kind: target
or draft) from the pass each reply says it ran in: a pass of n sessions is counted once per session.
Gauges are set again every second and the counters of rare events (failovers, fallback and load
decisions) start at 0, so an idle router's panels read their last value or 0, never "no data".

Derived figures are defined here once, in PromQL, under the names workers/stats.py gives them: the dashboard
(deploy/kuberay/grafana-dashboard.json) charts exactly these expressions (tests/test_metrics_promql.py
holds it to them) and DERIVED_PROMQL is this block, parsed. They are written as Grafana runs them:
`$__rate_interval` is the rate window, `$__range` the dashboard's time range and `$task` the task
filter (a regex; `.*` for all); elsewhere put e.g. `5m` and `.*` in their place. A figure is
`name = expression`, indented lines continue it, `#` lines say what it means. Quantiles are not
figures of their own: histogram_quantile over one histogram's buckets, summed by the labels kept.

BEGIN PROMQL
# Goodput: committed output tokens per second (of requests that succeeded), by task.
goodput =
    sum by (task) (rate(ray_specserve_output_tokens_total{task=~"$task"}[$__rate_interval]))
# Share of finished requests that ended with a status other than OK, by status (refused at the edge:
# task "", so only `.*` counts them).
error_share =
    sum by (status) (rate(ray_specserve_requests_total{task=~"$task", status!="OK"}[$__rate_interval]))
    / ignoring (status) group_left
    sum (rate(ray_specserve_requests_total{task=~"$task"}[$__rate_interval]))
# Acceptance rate (vLLM's): accepted draft tokens over proposed ones, by task and draft. It falls with
# a longer k even at a fixed per-token acceptance, as the policy's alpha estimate does not.
acceptance_rate =
    sum by (task, draft) (rate(ray_specserve_accepted_tokens_total{task=~"$task"}[$__rate_interval]))
    / sum by (task, draft) (rate(ray_specserve_draft_tokens_total{task=~"$task"}[$__rate_interval]))
# Mean acceptance length (vLLM's; workers/stats.py tokens_per_pass): tokens committed per target pass
# that verified a proposal, its accepted tokens and one of the target's own, by task. 1: speculation gains nothing; k + 1: all kept.
tokens_per_pass =
    1 + sum by (task) (rate(ray_specserve_accepted_tokens_total{task=~"$task"}[$__rate_interval]))
    / sum by (task) (rate(ray_specserve_drafts_total{task=~"$task"}[$__rate_interval]))
# Per-token acceptance (workers/stats.py alpha: accepted / (accepted + rejections)) by task, draft
# and segment (router/segments.py: a name router.segments lists, "other" for the rest, "" for
# requests that named none): how well each draft does for each segment's traffic. A segment whose
# steps were never rejected has no rejections series (a counter appears at its first event): 0 then.
alpha_by_segment =
    sum by (task, draft, segment) (rate(ray_specserve_accepted_tokens_total{task=~"$task"}[$__rate_interval]))
    / (sum by (task, draft, segment) (rate(ray_specserve_accepted_tokens_total{task=~"$task"}[$__rate_interval]))
      + (sum by (task, draft, segment) (rate(ray_specserve_rejections_total{task=~"$task"}[$__rate_interval]))
         or 0 * sum by (task, draft, segment) (rate(ray_specserve_accepted_tokens_total{task=~"$task"}[$__rate_interval]))))
# Tokens per pass (as tokens_per_pass) by task, draft and segment.
tokens_per_pass_by_segment =
    1 + sum by (task, draft, segment) (rate(ray_specserve_accepted_tokens_total{task=~"$task"}[$__rate_interval]))
    / sum by (task, draft, segment) (rate(ray_specserve_drafts_total{task=~"$task"}[$__rate_interval]))
# Draft work no proposal used (drafted ahead of a verdict that did not come: lookaheads that missed),
# as a share of the tokens the draft computed, by task and draft (workers/stats.py wasted_share).
wasted_share =
    sum by (task, draft) (rate(ray_specserve_wasted_draft_tokens_total{task=~"$task"}[$__rate_interval]))
    / sum by (task, draft) (rate(ray_specserve_drafted_tokens_total{task=~"$task"}[$__rate_interval]))
# The share of proposals drafted ahead (while the target verified the one before) that the verdict
# they assumed came and were used as drafted (outcome hit, or branch_hit: the branch beside it,
# drafted for a rejection), by task, draft and sampling (greedy or sampled); 0 where every one
# missed. A lookahead that missed costs draft-device time (wasted_share), not a wait.
lookahead_hit_rate =
    (sum by (task, draft, sampling) (rate(ray_specserve_lookaheads_total{task=~"$task", outcome=~"hit|branch_hit"}[$__rate_interval]))
      or 0 * sum by (task, draft, sampling) (rate(ray_specserve_lookaheads_total{task=~"$task"}[$__rate_interval])))
    / sum by (task, draft, sampling) (rate(ray_specserve_lookaheads_total{task=~"$task"}[$__rate_interval]))
# The draft's device seconds per token it computed (proposed or not), by task and draft: c's
# numerator (workers/stats.py cost_ratio divides it by a target-only pass's time).
draft_seconds_per_token =
    sum by (task, draft) (rate(ray_specserve_draft_seconds_total{task=~"$task"}[$__rate_interval]))
    / sum by (task, draft) (rate(ray_specserve_drafted_tokens_total{task=~"$task"}[$__rate_interval]))
# Per position i of a proposal (0 first): the share of verify steps that accepted their i-th draft
# token, by task and draft.
acceptance_by_position =
    sum by (task, draft, position) (rate(ray_specserve_accepted_tokens_per_position_total{task=~"$task"}[$__rate_interval]))
    / on (task, draft) group_left
    sum by (task, draft) (rate(ray_specserve_drafts_total{task=~"$task"}[$__rate_interval]))
# The same over the whole time range and every selected task and draft, highest first.
acceptance_by_position_over_range =
    sort_desc(
      sum by (position) (increase(ray_specserve_accepted_tokens_per_position_total{task=~"$task"}[$__range]))
      / ignoring (position) group_left
      sum (increase(ray_specserve_drafts_total{task=~"$task"}[$__range]))
    )
# Mean sessions, and mean tokens (all sessions': the pass's width), in the forward pass a step ran in, by kind.
sessions_per_pass =
    sum by (kind) (rate(ray_specserve_pass_sessions_sum[$__rate_interval]))
    / sum by (kind) (rate(ray_specserve_pass_sessions_count[$__rate_interval]))
pass_width =
    sum by (kind) (rate(ray_specserve_pass_tokens_sum[$__rate_interval]))
    / sum by (kind) (rate(ray_specserve_pass_tokens_count[$__rate_interval]))
# Prefix caching: the share of finished requests' prompt tokens the target replica took from its
# prefix cache rather than prefilled, by task.
prefix_hit_rate =
    sum by (task) (rate(ray_specserve_prompt_tokens_total{task=~"$task", cached="true"}[$__rate_interval]))
    / sum by (task) (rate(ray_specserve_prompt_tokens_total{task=~"$task"}[$__rate_interval]))
END PROMQL
"""

from __future__ import annotations

import math
import threading
import time

from ray.util import metrics

from specserve.workers.stats import time_per_output_token

from .canary import STATES, CanaryStatus
from .load_check import LoadCheck
from .passes import PassLog
from .policy import LOW_SPEEDUP, LOWERED_K, MEASURED_SLOWER, RAISED_K, TARGET_SATURATED, TaskView
from .request import Request


def _figures(doc: str | None) -> dict[str, str]:
    """The docstring's PromQL block as {name: expression}, each expression on one line."""
    if doc is None:  # python -OO strips docstrings
        return {}
    figures: dict[str, list[str]] = {}
    for line in doc.split("BEGIN PROMQL\n")[1].split("END PROMQL")[0].splitlines():
        if line.startswith(" "):
            figures[name].append(line)
        elif line and not line.startswith("#"):
            name, expression = line.split(" =", 1)
            if name in figures:
                raise ValueError(f"{name} is defined twice in router/metrics.py's docstring")
            figures[name] = [expression]
    return {name: " ".join(" ".join(lines).split()) for name, lines in figures.items()}


DERIVED_PROMQL = _figures(__doc__)

ARM = ("task", "draft")
# The per-request counters alpha and tokens per pass are derived from also carry the request's
# segment as counted (router/segments.py: a name router.segments lists, "other", or "" for none).
ARM_SEGMENT = (*ARM, "segment")
KIND = ("kind",)
WORKER_KINDS = ("target", "draft")
FALLBACK_CAUSES = (LOW_SPEEDUP, TARGET_SATURATED)
LOAD_REASONS = (LOWERED_K, RAISED_K, TARGET_SATURATED, MEASURED_SLOWER)
# Ray (2.60) exports a gauge's value in the report after it was set and its agent drops it two
# reports later, so a gauge set only when something changes leaves the scrape whenever the router
# is idle (Prometheus then has no data, not the last value). Each gauge is set again this often:
# at least once per report, whatever the cluster's interval (Ray's floor is 1 s).
GAUGE_REFRESH_SECONDS = 1.0
# Seconds: a draft or verify step on CPU is a few ms, on a GPU well under one; a first token can
# wait for a queue.
STEP_BOUNDARIES = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0]
LATENCY_BOUNDARIES = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
# A pass holds up to BatchingConfig.max_sessions_per_pass sessions and max_tokens_per_pass tokens.
SESSIONS_BOUNDARIES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
TOKENS_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


class RefreshedGauge(metrics.Gauge):
    """A Ray gauge that keeps its values in every report (see GAUGE_REFRESH_SECONDS)."""

    def __init__(self, name: str, description: str, tag_keys: tuple[str, ...] = ()) -> None:
        super().__init__(name, description, tag_keys)
        self._values: dict[tuple[tuple[str, str], ...], float] = {}
        self._lock = threading.Lock()  # set by the router, set again by the refresh thread

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        with self._lock:
            super().set(value, tags)
            self._values[tuple(sorted((tags or {}).items()))] = value

    def refresh(self) -> None:
        with self._lock:
            for tags, value in self._values.items():
                super().set(value, dict(tags))


class CounterFromZero(metrics.Counter):
    """A Ray counter whose label sets known in advance start at 0 (Ray's inc refuses 0): a series that
    first appears at 1 has no increase for rate() or increase() to see, so a lone event (a failover)
    would never show, and a panel of events that did not happen would read 'no data', not 0."""

    def start(self, tags: dict[str, str]) -> None:
        self._record(0, tags)


class RouterMetrics:
    def __init__(self) -> None:
        self.requests = metrics.Counter("specserve_requests", "Finished requests by task and gRPC status (task "
                                        "empty: refused before it was resolved)",
                                        tag_keys=("task", "status"))
        self.drafts = metrics.Counter("specserve_drafts", "Verify steps that checked a draft proposal",
                                      tag_keys=ARM_SEGMENT)
        self.draft_tokens = metrics.Counter("specserve_draft_tokens", "Draft tokens proposed for verification",
                                            tag_keys=ARM_SEGMENT)
        self.rejections = metrics.Counter("specserve_rejections", "Verify steps that ended on a rejected draft "
                                          "token (the others accepted their whole proposal)", tag_keys=ARM_SEGMENT)
        self.drafted_tokens = metrics.Counter("specserve_drafted_tokens", "Tokens the draft computed (proposed, "
                                              "guesses drafted ahead, and wasted)", tag_keys=ARM)
        self.wasted_draft_tokens = metrics.Counter("specserve_wasted_draft_tokens", "Drafted tokens no proposal "
                                                   "used (lookaheads that missed the verdict)", tag_keys=ARM)
        self.lookaheads = metrics.Counter("specserve_lookaheads", "Proposals drafted ahead while the target "
                                          "verified, by outcome: hit (the verdict they assumed came), branch_hit "
                                          "(the rejection their branch assumed came) or miss",
                                          tag_keys=(*ARM, "sampling", "outcome"))
        self.draft_seconds = metrics.Counter("specserve_draft_seconds", "The draft's device time for the tokens "
                                             "it computed", tag_keys=ARM)
        self.accepted_tokens = metrics.Counter("specserve_accepted_tokens", "Draft tokens the target accepted",
                                               tag_keys=ARM_SEGMENT)
        self.accepted_per_position = metrics.Counter(
            "specserve_accepted_tokens_per_position", "Accepted draft tokens by position in the proposal (0 first)",
            tag_keys=(*ARM, "position"))
        self.output_tokens = metrics.Counter("specserve_output_tokens", "Tokens returned to clients",
                                             tag_keys=ARM_SEGMENT)
        self.prompt_tokens = metrics.Counter("specserve_prompt_tokens", "Prompt tokens of finished requests: "
                                             "computed (cached: false), or taken from the target replica's prefix "
                                             "cache (cached: true)",
                                             tag_keys=("task", "cached"))
        self.target_picks = metrics.Counter("specserve_target_picks", "Target replicas picked for a request's "
                                            "session, by why: prefix (it was sent the longest prefix of the prompt) "
                                            "or load (the least loaded)", tag_keys=("reason",))
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
                                      "explore, probe, fallback, off, or unavailable / starting / lost (no "
                                      "draft worker at the start / none yet, the service starting / it "
                                      "failed mid-request: target-only)", tag_keys=(*ARM, "reason", "task_source"))
        self.fallbacks = CounterFromZero("specserve_fallback_decisions", "Requests served target-only by the "
                                         "policy, by cause", tag_keys=("task", "reason"))
        self.speculating = RefreshedGauge("specserve_task_speculating", "1 while the policy speculates for a "
                                          "task, 0 in fallback", tag_keys=("task",))
        self.expected_speedup = RefreshedGauge("specserve_expected_speedup", "The cost model's speedup for the "
                                               "arm at its best k", tag_keys=ARM)
        self.alpha = RefreshedGauge("specserve_acceptance_alpha", "Per-token acceptance estimate", tag_keys=ARM)
        self.segment_speedup = RefreshedGauge(
            "specserve_segment_expected_speedup", "The cost model's speedup for a segment's requests of a task "
            "served by a draft: at the segment's measured alpha, with the draft's c and k as the policy prices "
            "them (GetStats segments)", tag_keys=ARM_SEGMENT)
        self.in_flight = RefreshedGauge("specserve_requests_in_flight", "Requests the router is serving")
        self.queued = RefreshedGauge("specserve_requests_queued", "Requests waiting for a turn (beyond the "
                                     "router's concurrency limit)")
        self.pass_sessions = metrics.Histogram("specserve_pass_sessions", "Sessions in the forward pass a step "
                                               "ran in", boundaries=SESSIONS_BOUNDARIES, tag_keys=KIND)
        self.pass_tokens = metrics.Histogram("specserve_pass_tokens", "Tokens (all sessions') in the forward pass "
                                             "a step ran in", boundaries=TOKENS_BOUNDARIES, tag_keys=KIND)
        self.step_queue = metrics.Histogram("specserve_step_queue_seconds", "How long a step waited on its worker "
                                            "before its first pass began", boundaries=STEP_BOUNDARIES, tag_keys=KIND)
        self.load_decisions = CounterFromZero(
            "specserve_load_decisions", "Requests whose route the target's load shaped: lowered_k / raised_k (the "
            "policy's k at this load differs from its k unloaded), target_saturated (served target-only: at this "
            "load a step costs more than it commits), measured_slower (served target-only: at this load "
            "speculating requests ran slower than target-only ones)", tag_keys=("task", "reason"))
        self.priced_sessions = RefreshedGauge("specserve_priced_sessions_per_pass", "The sessions per target "
                                              "pass the policy prices a step at (its load)")
        self.realized_speed = RefreshedGauge(
            "specserve_realized_decode_tokens_per_second", "What the policy's load check compares: the faded "
            "decode speed (tokens/s after the first chunk) of a task's requests served by a proposer (draft), or "
            "of target-only requests (task and draft \"\"), at a load level (sessions per replica: 2^level up to "
            "2^(level+1))", tag_keys=("task", "draft", "level"))
        self.failovers = CounterFromZero("specserve_failovers", "Workers that failed a request mid-way and were "
                                         "replaced, re-prefilled from its committed tokens (kind: target or draft)",
                                         tag_keys=("kind",))
        for kind in WORKER_KINDS:
            self.failovers.start({"kind": kind})
        self.full_refusals = CounterFromZero("specserve_target_full_refusals", "Sessions a target replica refused "
                                             "as full (its session or KV cache limit); the request went on to "
                                             "another replica or waited for room (router.timeouts.target_full_wait_seconds)")
        self.full_refusals.start({})
        self._tasks_started: set[str] = set()
        keep_refreshed([m for m in vars(self).values() if isinstance(m, RefreshedGauge)])

    def record_refused(self, status: str) -> None:
        """A request refused at the edge (invalid, or over the limit): counted with no task yet."""
        self.requests.inc(1, {"task": "", "status": status})

    def record(self, request: Request, view: TaskView, status: str = "OK") -> None:
        task, draft = request.task.task, request.route.draft or ""
        arm = {"task": task, "draft": draft}
        self._start_task(task)
        s, t = request.decoding.stats, request.times
        self.requests.inc(1, {"task": task, "status": status})
        self.routes.inc(1, arm | {"reason": request.route.reason, "task_source": request.task.source})
        _add(self.failovers, request.target_resumes, {"kind": "target"})
        _add(self.failovers, request.draft_reopens, {"kind": "draft"})
        _add(self.full_refusals, request.full_refusals, {})
        if request.route.reason == "fallback":
            self.fallbacks.inc(1, {"task": task, "reason": view.cause or LOW_SPEEDUP})
        if request.route.load:
            self.load_decisions.inc(1, {"task": task, "reason": request.route.load})
        if status != "OK":
            return
        counted = arm | {"segment": request.valid.segment}
        _add(self.output_tokens, len(request.decoding.committed), counted)
        _add(self.prompt_tokens, len(request.valid.prompt_ids) - request.target.cached_tokens,
             {"task": task, "cached": "false"})
        _add(self.prompt_tokens, request.target.cached_tokens, {"task": task, "cached": "true"})
        if request.target.pick:
            self.target_picks.inc(1, {"reason": request.target.pick})
        _add(self.drafts, len(t.verify_steps), counted)
        _add(self.draft_tokens, s.proposed, counted)
        _add(self.rejections, s.rejections, counted)
        _add(self.accepted_tokens, s.accepted, counted)
        _add(self.drafted_tokens, s.drafted, arm)
        _add(self.wasted_draft_tokens, s.wasted, arm)
        sampling = "greedy" if request.params.sampling.greedy else "sampled"
        _add(self.lookaheads, s.lookahead_hits - s.branch_hits, arm | {"sampling": sampling, "outcome": "hit"})
        _add(self.lookaheads, s.branch_hits, arm | {"sampling": sampling, "outcome": "branch_hit"})
        _add(self.lookaheads, s.lookaheads - s.lookahead_hits, arm | {"sampling": sampling, "outcome": "miss"})
        _add(self.draft_seconds, s.draft_seconds, arm)
        for position, accepted in enumerate(s.accepted_per_position):
            _add(self.accepted_per_position, accepted, arm | {"position": str(position)})
        for seconds in t.draft_steps:
            self.draft_step.observe(seconds, arm)
        for seconds in t.verify_steps + t.plain_steps:
            self.verify_step.observe(seconds, arm)
        self._record_passes(t.target_passes, "target")
        self._record_passes(t.draft_passes, "draft")
        self.ttft.observe(request.first_token_seconds, {"task": task})
        tpot = time_per_output_token(request.elapsed(), request.first_token_seconds, len(request.decoding.committed),
                                     request.first_chunk_tokens)
        if tpot is not None:
            self.tpot.observe(tpot, {"task": task})

    def _start_task(self, task: str) -> None:
        """The task's decision counters at 0, the first time it is seen."""
        if task not in self._tasks_started:
            self._tasks_started.add(task)
            for cause in FALLBACK_CAUSES:
                self.fallbacks.start({"task": task, "reason": cause})
            for reason in LOAD_REASONS:
                self.load_decisions.start({"task": task, "reason": reason})

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


class CanaryMetrics:
    """The canaries', set by the control deployment as each one changes (cluster/canary.py): what
    `specserve stats` shows, for alerts and dashboards. A version's requests also carry
    draft="<draft>@<version>" in every per-draft series above."""

    def __init__(self) -> None:
        self.state = RefreshedGauge("specserve_canary_state", "1 for a canary's state now, 0 for the others "
                                    f"({', '.join(STATES)})", tag_keys=("draft", "version", "state"))
        self.alpha = RefreshedGauge("specserve_canary_alpha", "A canary's acceptance on the requests counted so "
                                    "far, by arm: base (the draft as it serves) or canary (the new version)",
                                    tag_keys=("draft", "version", "arm"))
        self.requests = RefreshedGauge("specserve_canary_requests", "Requests a canary's arms have counted",
                                       tag_keys=("draft", "version", "arm"))
        self.z = RefreshedGauge("specserve_canary_z", "The canary's alpha above the base's in standard errors (the "
                                "test that decides it)", tag_keys=("draft", "version"))
        keep_refreshed([self.state, self.alpha, self.requests, self.z])

    def record(self, status: CanaryStatus) -> None:
        tags = {"draft": status.draft, "version": status.version}
        for state in STATES:
            self.state.set(int(state == status.state), tags | {"state": state})
        for arm, sums in (("base", status.base), ("canary", status.canary)):
            self.alpha.set(sums.alpha, tags | {"arm": arm})
            self.requests.set(sums.requests, tags | {"arm": arm})
        if math.isfinite(status.z):
            self.z.set(status.z, tags)


class PoolMetrics:
    """The draft pool's, set by the process that runs it (the control replica: cluster/control.py)."""

    def __init__(self) -> None:
        self.draft_workers = RefreshedGauge("specserve_draft_pool_workers", "The draft pool's workers by state: "
                                            "serving, draining (being removed: their sessions ending), and wanted "
                                            "(what draft_pool.autoscaling asks for now; set only with it)",
                                            tag_keys=("state",))
        keep_refreshed([self.draft_workers])


def keep_refreshed(gauges: list[RefreshedGauge]) -> None:
    """Re-set ``gauges`` every GAUGE_REFRESH_SECONDS from a daemon thread, for as long as the process lives."""
    threading.Thread(target=_refresh_forever, args=(gauges,), name="specserve-gauges", daemon=True).start()


def _refresh_forever(gauges: list[RefreshedGauge]) -> None:
    while True:
        time.sleep(GAUGE_REFRESH_SECONDS)
        for gauge in gauges:
            gauge.refresh()


def _add(counter: metrics.Counter, value: float, tags: dict[str, str]) -> None:
    if value:  # Ray refuses increments of 0
        counter.inc(value, tags)
