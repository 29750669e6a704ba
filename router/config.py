"""The router's typed config: where it listens, its limits, its timeouts and its routing policy.

Each default is defined here once; ``cluster/config.py`` composes it into the service's config.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from specserve.workers.config import FrozenConfig
from specserve.workers.ngram import NgramConfig
from specserve.workers.request import CASCADE_GUESSES, CASCADE_MIN_P, GENERAL_TASK, MAX_K
from specserve.workers.suffix_tree import SuffixConfig

from specserve.workers.proposer_kinds import DRAFT_FREE

from .segments import MAX_SEGMENTS, OTHER_SEGMENT, SEGMENT_NAME
from .traffic_sample import TrafficSampleConfig

ROUTER_NODE = "specserve_router_node"  # custom resource of the node the router runs on (clients reach it)
DEFAULT_PORT = 50051  # the client API (gRPC's customary port)
DEFAULT_HTTP_PORT = 8000  # the OpenAI-compatible API (vLLM's and SGLang's customary port)


class PolicyConfig(FrozenConfig):
    """How the router picks a task, a draft and k for each request, and when it stops speculating.

    The cost model is Leviathan et al.'s (router/cost_model.py) with the costs the router measures,
    a step priced with the target pass it runs in.
    """

    # Requests without a task: the classifier's answer below this confidence resolves to the
    # default task. Held-out prompts of the zoo's tasks score well above it (see docs/pages/routing.md).
    classifier_min_confidence: float = Field(0.6, ge=0, le=1)
    classifier: str | None = None  # a classifier .npz (`specserve classifier train`); None: the zoo's
    # k is chosen per (task, draft) in [k_min, k_max] to maximise the expected speedup.
    k_min: int = Field(1, ge=1, le=MAX_K)
    k_max: int = Field(8, ge=1, le=MAX_K)
    # Within a request: "fixed" (the chosen k every step), "heuristic" (Hugging Face's: +2 after a
    # fully accepted step, -1 after a rejection) or "confidence" (the draft stops early after a token
    # it gave less than `confidence_threshold`; HF's assistant_confidence_threshold, AdaEDL's idea).
    # On the bench zoo the heuristic matched fixed k and the confidence rule cost math ~15% (docs/pages/routing.md).
    k_schedule: str = Field("heuristic", pattern="^(fixed|heuristic|confidence)$")
    confidence_threshold: float = Field(0.4, ge=0, le=1)  # HF's default
    # Exploration: Thompson sampling over each draft's acceptance (Beta posterior), so a draft
    # without data gets tried and a poor one is tried ever more rarely.
    explore: bool = True
    # Statistics fade with a half-life of this many draft tokens per (task, draft), so the policy
    # follows changes in traffic (a task that recovers is noticed).
    half_life_tokens: float = Field(4000, gt=0)
    # Speculation for a task stops when its best expected speedup falls below `fallback_below` and
    # resumes above `resume_above`; the gap is the hysteresis that keeps it from flapping.
    fallback_below: float = Field(1.0, gt=0)
    resume_above: float = Field(1.1, gt=0)
    min_trials: int = Field(64, ge=0)  # acceptance trials of the best draft before any fallback
    # A draft's acceptance measured before serving (the zoo's held-out evaluation) counts as this
    # many trials: as many as a fallback needs, so a task whose drafts lose starts target-only.
    prior_trials: float = Field(64, ge=0)
    probe_fraction: float = Field(0.1, ge=0, le=1)  # of a fallen-back task's requests still speculate
    # The target counts as saturated at this many sessions per replica: the draft's time then hides
    # behind other requests' verification, and only the target's work per committed token counts.
    # A replica that says how many sessions its pass holds is saturated past that instead: until
    # then every session is in every pass it is ready for, and a session's drafting is time it is
    # not (measured: counting drafting as hidden at 8 of 32 kept AUTO speculating at 16 clients).
    saturated_sessions: int = Field(8, ge=1)
    # Requests a load level needs on each side (the task's speculating ones, target-only ones)
    # before their realized speeds are compared there (router/load_check.py).
    measured_min_requests: int = Field(4, ge=1)
    # The fit of a target pass's device time on its tokens (what prices a step under load) fades
    # with this half-life in decode steps: a few seconds of traffic under load, so it follows a
    # replica whose speed changes (another device, another model) without jumping on one request.
    pass_half_life_steps: float = Field(2000, gt=0)
    # c assumed for a draft with no timings yet (drafts are typically a few % to 30% of a target step).
    prior_cost_ratio: float = Field(0.2, ge=0)
    # Full information (HedgeSpec): this fraction of finished greedy requests is scored, off the
    # request path, by the task's other drafts with one teacher-forced pass each.
    score_fraction: float = Field(0.25, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> PolicyConfig:
        if self.k_min > self.k_max:
            raise ValueError(f"policy.k_min ({self.k_min}) must not exceed policy.k_max ({self.k_max})")
        if self.resume_above < self.fallback_below:
            raise ValueError(f"policy.resume_above ({self.resume_above}) must be >= policy.fallback_below "
                             f"({self.fallback_below}), or speculation would flap")
        return self


class TimeoutsConfig(FrozenConfig):
    """How long the router waits on workers before it takes one as lost (router/streams.py)."""

    # A draft step is k small-model tokens: milliseconds. A draft this late is dropped from the
    # request, which goes on with another draft worker or target-only (the output is the same).
    draft_step_seconds: float = Field(2.0, gt=0)
    # A draft session's first step prefills the prompt (and, reopened mid-request, every committed
    # token), queued behind other sessions' steps on the worker's device.
    draft_prefill_seconds: float = Field(10.0, gt=0)
    # A target step is one pass, but may queue behind other sessions' passes or be a long prompt's
    # prefill on a busy replica. Beyond it the request resumes on another replica.
    target_step_seconds: float = Field(30.0, gt=0)
    # A request whose replica failed waits this long (within its own deadline) for a replica to
    # resume on, re-prefilled from the committed tokens; then the client gets UNAVAILABLE.
    target_wait_seconds: float = Field(30.0, gt=0)
    # A request every target replica refuses as full (at its session or KV cache limit) waits this
    # long (within its own deadline) for one to free room, trying them again; then the client gets
    # RESOURCE_EXHAUSTED. 0: refuse at once. A replica that has room always takes it first.
    target_full_wait_seconds: float = Field(10.0, ge=0)


class RouterConfig(FrozenConfig):
    host: str = "0.0.0.0"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)  # 0: any free port (tests)
    # The OpenAI-compatible HTTP API (router/openai_api.py), on the same host; None turns it off.
    http_port: int | None = Field(DEFAULT_HTTP_PORT, ge=0, le=65535)
    # The model id the OpenAI API lists and requests name; None: the target's name (its directory
    # or file name without .gguf, or its hub id).
    model_name: str | None = Field(None, min_length=1)
    # The router runs on a node advertising this custom resource: the one clients reach (KubeRay:
    # the head pod, behind the Service). None: wherever Ray puts it.
    node_resource: str | None = ROUTER_NODE
    # Router processes (Serve replicas of the ingress) on the router's node, sharing its client ports
    # (SO_REUSEPORT: the kernel spreads connections over them, each connection staying with one).
    # Where one process's CPU caps the service (bench/experiments/router_ceiling.py says how many tokens a
    # second one sustains). Each admits, learns and reports on its own requests: the limits below
    # and GetStats's task rows are per process.
    replicas: int = Field(1, ge=1, le=32)
    max_concurrent_requests: int = Field(32, ge=1)  # run at once; beyond it, requests queue
    # Cache-aware picking (router/prefix_routing.py): a session opens on the worker this router
    # sent the longest prefix of its prompt, among those with at most this many more of its
    # sessions than the least loaded (its prefix cache likely holds it: the prefill is a copy);
    # past that, on the least loaded. 0: among the least loaded only.
    prefix_affinity_sessions: int = Field(4, ge=0)
    max_queued_requests: int = Field(32, ge=0)  # wait for a turn; beyond it: RESOURCE_EXHAUSTED
    default_task: str = GENERAL_TASK  # for requests that name no task
    # Draft the next proposal while the target verifies this one (router/remote_draft.py), greedy and
    # sampled requests alike.
    lookahead: bool = True
    # ...except for a (task, draft, greedy or sampled) whose lookaheads hit less often than this: they
    # would be draft-device time thrown away (router/lookahead_budget.py; one request in 8 still
    # drafts ahead, to see a recovery). 0: every request drafts ahead.
    lookahead_min_hit_rate: float = Field(0.1, ge=0.0, le=1.0)
    # A lookahead also drafts, in the same passes, the proposal for the verdict likeliest after all
    # accepted: a rejection, with the draft's runner-up as the target's token there (SSD)...
    lookahead_branch: bool = True
    # ...where the draft's own odds of that verdict reach this (below, the branch's draft work would
    # almost always be thrown away): the product of its probabilities of the tokens before the
    # rejection and of its runner-up there.
    lookahead_branch_min_odds: float = Field(0.05, ge=0.0, le=1.0)
    # A request decoding target-only asks its replica for up to this many tokens ahead, answered one
    # by one, so it stays in every batched pass instead of sitting out a round trip per token; at
    # most this many minus one are drawn in vain past a stop. 1: one round trip per token.
    decode_run_tokens: int = Field(8, ge=1, le=256)
    # A client's stream gets a message for every this many committed tokens (at least; the first
    # token's chunk and the last go at once), as vLLM's and SGLang's --stream-interval: a message on
    # a stream costs the router ~25-50 us of CPU whatever it holds (bench/experiments/stream_floor.py), more than
    # the rest of a target-only token's work. Target-only, the replica sends a decode run's tokens
    # in groups of as many (at most half of decode_run_tokens), so the router also wakes and reads
    # once a group. 1: every step's tokens as they are committed.
    stream_interval_tokens: int = Field(1, ge=1, le=256)
    # Learning from finished requests (scoring the draft-free proposers on greedy ones, adding
    # outputs to the suffix proposer's task tries) takes at most this share of one core on average
    # (router/learning_budget.py): every request at low traffic, a sample under load. 0: none.
    learning_cpu_share: float = Field(0.02, ge=0.0, le=1.0)
    # The drafts allowed to serve each task, preferred first. Empty: the zoo's own table.
    tasks: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    # Draft-free proposers (workers/lookup.py): prompt lookup (ngram) and suffix decoding (suffix),
    # run in the router at no device cost. They serve every task beside its drafts, in a `tasks`
    # table the operator wrote too: they cost microseconds, and where a draft loses they are what
    # pays (a table naming only its code draft used to drop them, and on SmolLM2's code prompts AUTO
    # then served target-only, 0.89-1.0x, where the same table with them gave 1.16x). An empty
    # tuple turns them off everywhere; `as_written` for some tasks.
    draft_free: tuple[str, ...] = DRAFT_FREE
    # Tasks whose `tasks` entry is taken exactly as written: no draft-free proposer beside its
    # drafts unless the entry names one. The per-task off switch.
    as_written: tuple[str, ...] = ()
    ngram: NgramConfig = NgramConfig()
    suffix: SuffixConfig = SuffixConfig()
    # Offer AUTO a token tree of each task's draft and the draft-free proposers (``tree``), proposed
    # at once and verified in one pass. Off by default: on CPUs, where a pass's width costs ~0.14 of
    # a target step per token, no tree beat the best single proposer (bench zoo, demo zoo, SmolLM2),
    # and exploring it cost the first requests. A request may always ask for one (draft: tree).
    trees: bool = False
    # Tokens a tree may hold: its width is verify work (about free on a GPU, not on a CPU).
    tree_max_tokens: int = Field(24, ge=2, le=256)
    # Offer AUTO a cascade of each task's draft model (``cascade``) in the zoo's table: prompt
    # lookup's guesses, which the draft verifies as it drafts, proposing past k down the ones it
    # takes (workers/drafting.py). The policy then serves it for the tasks where it measures faster
    # than the draft alone and the draft-free proposers. An operator's `tasks` table offers it where
    # an entry names it; a request may always ask for one (draft: cascade).
    cascades: bool = False
    # Prompt lookup's guesses a cascade's proposal verifies, at most (and so its length past k).
    cascade_guesses: int = Field(CASCADE_GUESSES, ge=1, le=MAX_K - 1)
    # A guess the cascade's draft gives at least this probability is proposed as it is; below, the
    # draft draws its own token. 1: the draft's own tokens only (the guesses save its passes).
    cascade_min_p: float = Field(CASCADE_MIN_P, ge=0.0, le=1.0)
    # Request segments (a user segment, a tenant, a product surface) counted under their own names
    # in metrics and GetStats: a request's segment (GenerateRequest.segment; OpenAI's
    # metadata.segment or user) is counted as itself where listed here, as "other" otherwise, so
    # a label's values stay bounded whatever clients send. Empty: every named segment is "other".
    segments: tuple[str, ...] = ()
    # A sample of finished requests per task (prompt and output), for re-distilling drafts from the
    # traffic they serve (router/traffic_sample.py; `specserve distill --sample`). Off unless its
    # dir is set: it stores request text.
    traffic_sample: TrafficSampleConfig = TrafficSampleConfig()
    # How often workers re-register and how long an entry lives without that.
    heartbeat_seconds: float = Field(2.0, gt=0)
    timeouts: TimeoutsConfig = TimeoutsConfig()
    policy: PolicyConfig = PolicyConfig()

    @model_validator(mode="after")
    def _known_proposers(self) -> RouterConfig:
        unknown = [name for name in self.draft_free if name not in DRAFT_FREE]
        if unknown:
            raise ValueError(f"router.draft_free names {unknown}; the draft-free proposers are {', '.join(DRAFT_FREE)}")
        return self

    @model_validator(mode="after")
    def _segment_names(self) -> RouterConfig:
        bad = [name for name in self.segments if not SEGMENT_NAME.fullmatch(name) or name == OTHER_SEGMENT]
        if bad:
            raise ValueError(f"router.segments names {bad}: a segment is 1-64 letters, digits, '_', '.' or '-', "
                             f"starting with a letter or digit, and not {OTHER_SEGMENT!r} (what the rest count as)")
        if len(set(self.segments)) < len(self.segments) or len(self.segments) > MAX_SEGMENTS:
            raise ValueError(f"router.segments must list at most {MAX_SEGMENTS} different names, got "
                             f"{len(self.segments)} ({len(set(self.segments))} different)")
        return self
