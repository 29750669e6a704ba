from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Speculation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPECULATION_AUTO: _ClassVar[Speculation]
    SPECULATION_ON: _ClassVar[Speculation]
    SPECULATION_OFF: _ClassVar[Speculation]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_GRAMMAR: _ClassVar[FinishReason]
SPECULATION_AUTO: Speculation
SPECULATION_ON: Speculation
SPECULATION_OFF: Speculation
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_GRAMMAR: FinishReason

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "task", "speculation", "draft", "k", "logprobs", "logit_bias", "presence_penalty", "frequency_penalty", "structured_output", "segment")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    task: str
    speculation: Speculation
    draft: str
    k: int
    logprobs: int
    logit_bias: _containers.ScalarMap[int, float]
    presence_penalty: float
    frequency_penalty: float
    structured_output: StructuredOutput
    segment: str
    def __init__(self, prompt: _Optional[str] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., task: _Optional[str] = ..., speculation: _Optional[_Union[Speculation, str]] = ..., draft: _Optional[str] = ..., k: _Optional[int] = ..., logprobs: _Optional[int] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., structured_output: _Optional[_Union[StructuredOutput, _Mapping]] = ..., segment: _Optional[str] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "lark")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    LARK_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    lark: str
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., lark: _Optional[str] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("logprob", "top_ids", "top_logprobs")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class GenerateStats(_message.Message):
    __slots__ = ("task", "draft", "proposed_tokens", "accepted_tokens", "target_passes", "seed", "draft_seconds", "verify_seconds", "total_seconds", "first_token_seconds", "rejections", "lookaheads", "lookahead_hits", "task_source", "task_confidence", "route", "k", "target_resumes", "draft_reopens", "target_full_refusals", "drafted_tokens", "wasted_draft_tokens", "branch_hits", "cached_prompt_tokens", "target_replica", "target_pick", "segment")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PASSES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEADS_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_HITS_FIELD_NUMBER: _ClassVar[int]
    TASK_SOURCE_FIELD_NUMBER: _ClassVar[int]
    TASK_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    TARGET_RESUMES_FIELD_NUMBER: _ClassVar[int]
    DRAFT_REOPENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FULL_REFUSALS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WASTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BRANCH_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_REPLICA_FIELD_NUMBER: _ClassVar[int]
    TARGET_PICK_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    task: str
    draft: str
    proposed_tokens: int
    accepted_tokens: int
    target_passes: int
    seed: int
    draft_seconds: float
    verify_seconds: float
    total_seconds: float
    first_token_seconds: float
    rejections: int
    lookaheads: int
    lookahead_hits: int
    task_source: str
    task_confidence: float
    route: str
    k: int
    target_resumes: int
    draft_reopens: int
    target_full_refusals: int
    drafted_tokens: int
    wasted_draft_tokens: int
    branch_hits: int
    cached_prompt_tokens: int
    target_replica: str
    target_pick: str
    segment: str
    def __init__(self, task: _Optional[str] = ..., draft: _Optional[str] = ..., proposed_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., target_passes: _Optional[int] = ..., seed: _Optional[int] = ..., draft_seconds: _Optional[float] = ..., verify_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ..., first_token_seconds: _Optional[float] = ..., rejections: _Optional[int] = ..., lookaheads: _Optional[int] = ..., lookahead_hits: _Optional[int] = ..., task_source: _Optional[str] = ..., task_confidence: _Optional[float] = ..., route: _Optional[str] = ..., k: _Optional[int] = ..., target_resumes: _Optional[int] = ..., draft_reopens: _Optional[int] = ..., target_full_refusals: _Optional[int] = ..., drafted_tokens: _Optional[int] = ..., wasted_draft_tokens: _Optional[int] = ..., branch_hits: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., target_replica: _Optional[str] = ..., target_pick: _Optional[str] = ..., segment: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "stats", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    stats: GenerateStats
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stats: _Optional[_Union[GenerateStats, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "stats", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    stats: GenerateStats
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stats: _Optional[_Union[GenerateStats, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TaskStats(_message.Message):
    __slots__ = ("task", "draft", "requests", "proposed_tokens", "accepted_tokens", "target_passes", "output_tokens", "acceptance_rate", "tokens_per_pass", "alpha", "cost_ratio", "k", "expected_speedup", "decision", "reason", "scored_tokens", "alpha_per_position", "step_cost", "unloaded_k", "drafted_tokens", "wasted_draft_tokens", "sampled_requests")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PASSES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_PASS_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    COST_RATIO_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SCORED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ALPHA_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    STEP_COST_FIELD_NUMBER: _ClassVar[int]
    UNLOADED_K_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WASTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    task: str
    draft: str
    requests: int
    proposed_tokens: int
    accepted_tokens: int
    target_passes: int
    output_tokens: int
    acceptance_rate: float
    tokens_per_pass: float
    alpha: float
    cost_ratio: float
    k: int
    expected_speedup: float
    decision: str
    reason: str
    scored_tokens: int
    alpha_per_position: _containers.RepeatedScalarFieldContainer[float]
    step_cost: float
    unloaded_k: int
    drafted_tokens: int
    wasted_draft_tokens: int
    sampled_requests: int
    def __init__(self, task: _Optional[str] = ..., draft: _Optional[str] = ..., requests: _Optional[int] = ..., proposed_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., target_passes: _Optional[int] = ..., output_tokens: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., tokens_per_pass: _Optional[float] = ..., alpha: _Optional[float] = ..., cost_ratio: _Optional[float] = ..., k: _Optional[int] = ..., expected_speedup: _Optional[float] = ..., decision: _Optional[str] = ..., reason: _Optional[str] = ..., scored_tokens: _Optional[int] = ..., alpha_per_position: _Optional[_Iterable[float]] = ..., step_cost: _Optional[float] = ..., unloaded_k: _Optional[int] = ..., drafted_tokens: _Optional[int] = ..., wasted_draft_tokens: _Optional[int] = ..., sampled_requests: _Optional[int] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("kind", "worker_id", "address", "models", "live_sessions", "node_id", "pass_widths", "pass_seconds", "prefix_prompt_tokens", "prefix_reused_tokens")
    KIND_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PASS_WIDTHS_FIELD_NUMBER: _ClassVar[int]
    PASS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    worker_id: str
    address: str
    models: _containers.RepeatedScalarFieldContainer[str]
    live_sessions: int
    node_id: str
    pass_widths: _containers.RepeatedScalarFieldContainer[int]
    pass_seconds: _containers.RepeatedScalarFieldContainer[float]
    prefix_prompt_tokens: int
    prefix_reused_tokens: int
    def __init__(self, kind: _Optional[str] = ..., worker_id: _Optional[str] = ..., address: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., live_sessions: _Optional[int] = ..., node_id: _Optional[str] = ..., pass_widths: _Optional[_Iterable[int]] = ..., pass_seconds: _Optional[_Iterable[float]] = ..., prefix_prompt_tokens: _Optional[int] = ..., prefix_reused_tokens: _Optional[int] = ...) -> None: ...

class PassStats(_message.Message):
    __slots__ = ("kind", "steps", "mean_sessions", "p50_sessions", "mean_tokens", "p50_tokens", "mean_queue_seconds", "p50_queue_seconds")
    KIND_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MEAN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    P50_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MEAN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    P50_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEAN_QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    P50_QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    steps: int
    mean_sessions: float
    p50_sessions: float
    mean_tokens: float
    p50_tokens: float
    mean_queue_seconds: float
    p50_queue_seconds: float
    def __init__(self, kind: _Optional[str] = ..., steps: _Optional[int] = ..., mean_sessions: _Optional[float] = ..., p50_sessions: _Optional[float] = ..., mean_tokens: _Optional[float] = ..., p50_tokens: _Optional[float] = ..., mean_queue_seconds: _Optional[float] = ..., p50_queue_seconds: _Optional[float] = ...) -> None: ...

class LoadPricing(_message.Message):
    __slots__ = ("sessions", "pass_fixed_seconds", "pass_seconds_per_token", "saturated")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PASS_FIXED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PASS_SECONDS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SATURATED_FIELD_NUMBER: _ClassVar[int]
    sessions: float
    pass_fixed_seconds: float
    pass_seconds_per_token: float
    saturated: bool
    def __init__(self, sessions: _Optional[float] = ..., pass_fixed_seconds: _Optional[float] = ..., pass_seconds_per_token: _Optional[float] = ..., saturated: _Optional[bool] = ...) -> None: ...

class ServiceStats(_message.Message):
    __slots__ = ("tasks", "workers", "requests_in_flight", "requests_rejected", "requests_queued", "passes", "load", "router", "ready", "waiting_for", "segments", "canaries")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_REJECTED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_QUEUED_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    ROUTER_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CANARIES_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStats]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    requests_in_flight: int
    requests_rejected: int
    requests_queued: int
    passes: _containers.RepeatedCompositeFieldContainer[PassStats]
    load: LoadPricing
    router: str
    ready: bool
    waiting_for: str
    segments: _containers.RepeatedCompositeFieldContainer[SegmentStats]
    canaries: _containers.RepeatedCompositeFieldContainer[CanaryStats]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskStats, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., requests_in_flight: _Optional[int] = ..., requests_rejected: _Optional[int] = ..., requests_queued: _Optional[int] = ..., passes: _Optional[_Iterable[_Union[PassStats, _Mapping]]] = ..., load: _Optional[_Union[LoadPricing, _Mapping]] = ..., router: _Optional[str] = ..., ready: _Optional[bool] = ..., waiting_for: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[SegmentStats, _Mapping]]] = ..., canaries: _Optional[_Iterable[_Union[CanaryStats, _Mapping]]] = ...) -> None: ...

class CanaryStats(_message.Message):
    __slots__ = ("draft", "version", "source", "tasks", "share", "state", "reason", "base_requests", "canary_requests", "base_alpha", "canary_alpha", "base_speedup", "canary_speedup", "z", "z_needed", "looks", "max_looks", "started_unix", "finished_unix")
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BASE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CANARY_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BASE_ALPHA_FIELD_NUMBER: _ClassVar[int]
    CANARY_ALPHA_FIELD_NUMBER: _ClassVar[int]
    BASE_SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    CANARY_SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    Z_FIELD_NUMBER: _ClassVar[int]
    Z_NEEDED_FIELD_NUMBER: _ClassVar[int]
    LOOKS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOOKS_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_FIELD_NUMBER: _ClassVar[int]
    draft: str
    version: str
    source: str
    tasks: _containers.RepeatedScalarFieldContainer[str]
    share: float
    state: str
    reason: str
    base_requests: int
    canary_requests: int
    base_alpha: float
    canary_alpha: float
    base_speedup: float
    canary_speedup: float
    z: float
    z_needed: float
    looks: int
    max_looks: int
    started_unix: float
    finished_unix: float
    def __init__(self, draft: _Optional[str] = ..., version: _Optional[str] = ..., source: _Optional[str] = ..., tasks: _Optional[_Iterable[str]] = ..., share: _Optional[float] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., base_requests: _Optional[int] = ..., canary_requests: _Optional[int] = ..., base_alpha: _Optional[float] = ..., canary_alpha: _Optional[float] = ..., base_speedup: _Optional[float] = ..., canary_speedup: _Optional[float] = ..., z: _Optional[float] = ..., z_needed: _Optional[float] = ..., looks: _Optional[int] = ..., max_looks: _Optional[int] = ..., started_unix: _Optional[float] = ..., finished_unix: _Optional[float] = ...) -> None: ...

class SegmentStats(_message.Message):
    __slots__ = ("task", "draft", "segment", "requests", "proposed_tokens", "accepted_tokens", "rejections", "target_passes", "output_tokens", "alpha", "tokens_per_pass", "expected_speedup", "k")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PASSES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_PASS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    task: str
    draft: str
    segment: str
    requests: int
    proposed_tokens: int
    accepted_tokens: int
    rejections: int
    target_passes: int
    output_tokens: int
    alpha: float
    tokens_per_pass: float
    expected_speedup: float
    k: int
    def __init__(self, task: _Optional[str] = ..., draft: _Optional[str] = ..., segment: _Optional[str] = ..., requests: _Optional[int] = ..., proposed_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., rejections: _Optional[int] = ..., target_passes: _Optional[int] = ..., output_tokens: _Optional[int] = ..., alpha: _Optional[float] = ..., tokens_per_pass: _Optional[float] = ..., expected_speedup: _Optional[float] = ..., k: _Optional[int] = ...) -> None: ...
