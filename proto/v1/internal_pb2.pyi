from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class End(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    END_NONE: _ClassVar[End]
    END_DONE: _ClassVar[End]
    END_CANCEL: _ClassVar[End]
    END_ENDED: _ClassVar[End]
END_NONE: End
END_DONE: End
END_CANCEL: End
END_ENDED: End

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class SparseRow(_message.Message):
    __slots__ = ("ids", "probs")
    IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class SessionOpen(_message.Message):
    __slots__ = ("session_id", "prompt_ids", "sampling", "max_new_tokens", "task", "grammar", "target", "draft")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: Sampling
    max_new_tokens: int
    task: str
    grammar: Grammar
    target: TargetOpen
    draft: DraftOpen
    def __init__(self, session_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., task: _Optional[str] = ..., grammar: _Optional[_Union[Grammar, _Mapping]] = ..., target: _Optional[_Union[TargetOpen, _Mapping]] = ..., draft: _Optional[_Union[DraftOpen, _Mapping]] = ...) -> None: ...

class TargetOpen(_message.Message):
    __slots__ = ("aux_layers", "decode_group", "logprobs", "top_logprobs", "processing", "on_verifier", "on_verifier_depth")
    AUX_LAYERS_FIELD_NUMBER: _ClassVar[int]
    DECODE_GROUP_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_FIELD_NUMBER: _ClassVar[int]
    ON_VERIFIER_FIELD_NUMBER: _ClassVar[int]
    ON_VERIFIER_DEPTH_FIELD_NUMBER: _ClassVar[int]
    aux_layers: _containers.RepeatedScalarFieldContainer[int]
    decode_group: int
    logprobs: bool
    top_logprobs: int
    processing: Processing
    on_verifier: str
    on_verifier_depth: int
    def __init__(self, aux_layers: _Optional[_Iterable[int]] = ..., decode_group: _Optional[int] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., processing: _Optional[_Union[Processing, _Mapping]] = ..., on_verifier: _Optional[str] = ..., on_verifier_depth: _Optional[int] = ...) -> None: ...

class DraftOpen(_message.Message):
    __slots__ = ("model", "alternatives", "cascade", "cascade_min_p")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    CASCADE_FIELD_NUMBER: _ClassVar[int]
    CASCADE_MIN_P_FIELD_NUMBER: _ClassVar[int]
    model: str
    alternatives: bool
    cascade: int
    cascade_min_p: float
    def __init__(self, model: _Optional[str] = ..., alternatives: _Optional[bool] = ..., cascade: _Optional[int] = ..., cascade_min_p: _Optional[float] = ...) -> None: ...

class Grammar(_message.Message):
    __slots__ = ("compiled", "output_start")
    COMPILED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_START_FIELD_NUMBER: _ClassVar[int]
    compiled: str
    output_start: int
    def __init__(self, compiled: _Optional[str] = ..., output_start: _Optional[int] = ...) -> None: ...

class Processing(_message.Message):
    __slots__ = ("bias_ids", "bias_values", "presence_penalty", "frequency_penalty", "output_start")
    BIAS_IDS_FIELD_NUMBER: _ClassVar[int]
    BIAS_VALUES_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_START_FIELD_NUMBER: _ClassVar[int]
    bias_ids: _containers.RepeatedScalarFieldContainer[int]
    bias_values: _containers.RepeatedScalarFieldContainer[float]
    presence_penalty: float
    frequency_penalty: float
    output_start: int
    def __init__(self, bias_ids: _Optional[_Iterable[int]] = ..., bias_values: _Optional[_Iterable[float]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., output_start: _Optional[int] = ...) -> None: ...

class Logprobs(_message.Message):
    __slots__ = ("chosen", "top_ids", "top_logprobs")
    CHOSEN_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    chosen: _containers.RepeatedScalarFieldContainer[float]
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, chosen: _Optional[_Iterable[float]] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class HiddenStates(_message.Message):
    __slots__ = ("start", "rows", "width", "dtype", "data")
    START_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    start: int
    rows: int
    width: int
    dtype: str
    data: bytes
    def __init__(self, start: _Optional[int] = ..., rows: _Optional[int] = ..., width: _Optional[int] = ..., dtype: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class Verdict(_message.Message):
    __slots__ = ("num_accepted", "token", "path")
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    num_accepted: int
    token: int
    path: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, num_accepted: _Optional[int] = ..., token: _Optional[int] = ..., path: _Optional[_Iterable[int]] = ...) -> None: ...

class DraftStep(_message.Message):
    __slots__ = ("keep", "append", "k", "min_confidence", "min_tokens", "aux", "drop_previous", "guess", "fork", "adopt")
    KEEP_FIELD_NUMBER: _ClassVar[int]
    APPEND_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    MIN_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    AUX_FIELD_NUMBER: _ClassVar[int]
    DROP_PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    GUESS_FIELD_NUMBER: _ClassVar[int]
    FORK_FIELD_NUMBER: _ClassVar[int]
    ADOPT_FIELD_NUMBER: _ClassVar[int]
    keep: int
    append: _containers.RepeatedScalarFieldContainer[int]
    k: int
    min_confidence: float
    min_tokens: int
    aux: HiddenStates
    drop_previous: bool
    guess: bool
    fork: Fork
    adopt: bool
    def __init__(self, keep: _Optional[int] = ..., append: _Optional[_Iterable[int]] = ..., k: _Optional[int] = ..., min_confidence: _Optional[float] = ..., min_tokens: _Optional[int] = ..., aux: _Optional[_Union[HiddenStates, _Mapping]] = ..., drop_previous: _Optional[bool] = ..., guess: _Optional[bool] = ..., fork: _Optional[_Union[Fork, _Mapping]] = ..., adopt: _Optional[bool] = ...) -> None: ...

class Fork(_message.Message):
    __slots__ = ("keep", "token", "k")
    KEEP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    keep: int
    token: int
    k: int
    def __init__(self, keep: _Optional[int] = ..., token: _Optional[int] = ..., k: _Optional[int] = ...) -> None: ...

class DraftRequest(_message.Message):
    __slots__ = ("open", "step")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    open: SessionOpen
    step: DraftStep
    def __init__(self, open: _Optional[_Union[SessionOpen, _Mapping]] = ..., step: _Optional[_Union[DraftStep, _Mapping]] = ...) -> None: ...

class Proposal(_message.Message):
    __slots__ = ("ids", "q", "seconds", "pass_info", "parents", "refused", "runner_up", "token_p", "runner_up_p", "branch")
    IDS_FIELD_NUMBER: _ClassVar[int]
    Q_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PASS_INFO_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    RUNNER_UP_FIELD_NUMBER: _ClassVar[int]
    TOKEN_P_FIELD_NUMBER: _ClassVar[int]
    RUNNER_UP_P_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    q: _containers.RepeatedCompositeFieldContainer[SparseRow]
    seconds: float
    pass_info: PassInfo
    parents: _containers.RepeatedScalarFieldContainer[int]
    refused: str
    runner_up: _containers.RepeatedScalarFieldContainer[int]
    token_p: _containers.RepeatedScalarFieldContainer[float]
    runner_up_p: _containers.RepeatedScalarFieldContainer[float]
    branch: Proposal
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., q: _Optional[_Iterable[_Union[SparseRow, _Mapping]]] = ..., seconds: _Optional[float] = ..., pass_info: _Optional[_Union[PassInfo, _Mapping]] = ..., parents: _Optional[_Iterable[int]] = ..., refused: _Optional[str] = ..., runner_up: _Optional[_Iterable[int]] = ..., token_p: _Optional[_Iterable[float]] = ..., runner_up_p: _Optional[_Iterable[float]] = ..., branch: _Optional[_Union[Proposal, _Mapping]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("open", "step", "decode")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    open: SessionOpen
    step: Proposal
    decode: int
    def __init__(self, open: _Optional[_Union[SessionOpen, _Mapping]] = ..., step: _Optional[_Union[Proposal, _Mapping]] = ..., decode: _Optional[int] = ...) -> None: ...

class PassInfo(_message.Message):
    __slots__ = ("tokens", "sessions", "queue_seconds")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    sessions: int
    queue_seconds: float
    def __init__(self, tokens: _Optional[int] = ..., sessions: _Optional[int] = ..., queue_seconds: _Optional[float] = ...) -> None: ...

class VerifyReply(_message.Message):
    __slots__ = ("verdict", "seconds", "pass_info", "refused", "aux", "cached_tokens", "logprobs", "ended", "next")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PASS_INFO_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    AUX_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    seconds: float
    pass_info: PassInfo
    refused: str
    aux: HiddenStates
    cached_tokens: int
    logprobs: Logprobs
    ended: str
    next: Proposal
    def __init__(self, verdict: _Optional[_Union[Verdict, _Mapping]] = ..., seconds: _Optional[float] = ..., pass_info: _Optional[_Union[PassInfo, _Mapping]] = ..., refused: _Optional[str] = ..., aux: _Optional[_Union[HiddenStates, _Mapping]] = ..., cached_tokens: _Optional[int] = ..., logprobs: _Optional[_Union[Logprobs, _Mapping]] = ..., ended: _Optional[str] = ..., next: _Optional[_Union[Proposal, _Mapping]] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerState(_message.Message):
    __slots__ = ("worker_id", "models", "live_sessions", "resources", "pid", "kv_reserved_bytes", "kv_budget_bytes", "kv_pool_bytes", "passes", "pass_tokens", "pass_sessions", "max_pass_sessions", "prefix_sessions", "prefix_hits", "prefix_prompt_tokens", "prefix_reused_tokens", "kv_cached_bytes", "prefix_evictions", "device_busy_seconds", "device_simulated", "device_overrun_seconds")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    KV_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_POOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    PASS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PASS_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_PASS_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HITS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_SIMULATED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_OVERRUN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    models: _containers.RepeatedScalarFieldContainer[str]
    live_sessions: int
    resources: _containers.ScalarMap[str, float]
    pid: int
    kv_reserved_bytes: int
    kv_budget_bytes: int
    kv_pool_bytes: int
    passes: int
    pass_tokens: int
    pass_sessions: int
    max_pass_sessions: int
    prefix_sessions: int
    prefix_hits: int
    prefix_prompt_tokens: int
    prefix_reused_tokens: int
    kv_cached_bytes: int
    prefix_evictions: int
    device_busy_seconds: float
    device_simulated: bool
    device_overrun_seconds: float
    def __init__(self, worker_id: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., live_sessions: _Optional[int] = ..., resources: _Optional[_Mapping[str, float]] = ..., pid: _Optional[int] = ..., kv_reserved_bytes: _Optional[int] = ..., kv_budget_bytes: _Optional[int] = ..., kv_pool_bytes: _Optional[int] = ..., passes: _Optional[int] = ..., pass_tokens: _Optional[int] = ..., pass_sessions: _Optional[int] = ..., max_pass_sessions: _Optional[int] = ..., prefix_sessions: _Optional[int] = ..., prefix_hits: _Optional[int] = ..., prefix_prompt_tokens: _Optional[int] = ..., prefix_reused_tokens: _Optional[int] = ..., kv_cached_bytes: _Optional[int] = ..., prefix_evictions: _Optional[int] = ..., device_busy_seconds: _Optional[float] = ..., device_simulated: _Optional[bool] = ..., device_overrun_seconds: _Optional[float] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("model", "ids", "start")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    model: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    start: int
    def __init__(self, model: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., start: _Optional[int] = ...) -> None: ...

class ScoreReply(_message.Message):
    __slots__ = ("positions", "matches", "seconds")
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    positions: int
    matches: int
    seconds: float
    def __init__(self, positions: _Optional[int] = ..., matches: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("session", "message", "end", "code", "details")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    session: int
    message: bytes
    end: End
    code: int
    details: str
    def __init__(self, session: _Optional[int] = ..., message: _Optional[bytes] = ..., end: _Optional[_Union[End, str]] = ..., code: _Optional[int] = ..., details: _Optional[str] = ...) -> None: ...

class Frames(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[Frame]
    def __init__(self, frames: _Optional[_Iterable[_Union[Frame, _Mapping]]] = ...) -> None: ...
