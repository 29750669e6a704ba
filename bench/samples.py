"""One measured decode: the raw record every figure of the report is derived from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

# Paths of the greedy section. Each prompt is decoded on every path back to back, so that machine
# noise hits all of them alike; every output is compared with `off`'s.
OFF = "off"  # the service, target only (speculation OFF)
TASK = "task"  # the service, the task's own draft, fixed k
TASK_ADAPTIVE = "task_adaptive"  # the service, the task's own draft, the policy's k and schedule (its defaults)
ROUTED = "routed"  # the service with nothing but the prompt: classifier, policy, adaptive k
GENERAL = "general"  # the service, the general draft forced, fixed k
ENGINE_OFF = "engine_off"  # the in-process engine, target only, one thread pinned like the target replica
ENGINE_TASK = "engine_task"  # the in-process engine, the task's draft, fixed k, same thread
HF_ASSISTED = "hf_assisted"  # transformers assisted generation, the task's draft, its default schedule
NGRAM = "ngram"  # the service, prompt lookup in the router (draft-free), the policy's k
SUFFIX = "suffix"  # the service, suffix decoding in the router (draft-free), the policy's k
TREE = "tree"  # the service, the task's draft, prompt lookup and suffix decoding as one token tree
GREEDY_PATHS = (OFF, TASK, TASK_ADAPTIVE, ROUTED, GENERAL, NGRAM, SUFFIX, TREE, ENGINE_OFF, ENGINE_TASK, HF_ASSISTED)
PROPOSER_PATHS = (TASK_ADAPTIVE, NGRAM, SUFFIX, TREE, ROUTED)  # each proposer alone, the tree, the policy's choice
AUTO = "auto"  # load section: the service's default (speculation AUTO, nothing but the prompt)
# Load section, beside OFF and AUTO: the same requests on the same target model, run by
OFF_UNBATCHED = "off_unbatched"  # the service with batching off (one session per pass), speculation OFF
PEER_STATIC = "peer_static"  # transformers generate(), a static left-padded batch of `concurrency` prompts
PEER_BATCH = "peer_generate_batch"  # transformers generate_batch() (continuous batching), at most `concurrency` at once
LOAD_PATHS = (OFF, AUTO, OFF_UNBATCHED, PEER_STATIC, PEER_BATCH)


@dataclass
class Sample:
    section: str  # greedy | sampling | load
    task: str  # the prompt's task (its bench/prompts file), not what the router resolved
    path: str  # one of GREEDY_PATHS, or for sampling TASK/OFF, for load one of LOAD_PATHS
    prompt: int  # index into the task's prompts
    repeat: int = 0
    tokens: int = 0
    seconds: float = 0.0  # wall time seen by the caller, request to last token
    first_token_seconds: float | None = None  # streamed requests (load section)
    first_chunk_tokens: int = 0  # the tokens of its first chunk (streamed requests)
    identical: bool | None = None  # output equals the target-only output of the same prompt (None: none to compare)
    temperature: float = 0.0
    concurrency: int = 0  # load section: clients running at once (a peer's batch size)
    started: float = 0.0  # load section: seconds from the level's start to this request's
    proposed: int = 0
    drafted: int = 0  # tokens the draft computed: proposed, lookaheads' guesses, and wasted
    wasted: int = 0  # drafted ahead by lookaheads that missed
    lookaheads: int = 0  # proposals drafted ahead while the target verified
    lookahead_hits: int = 0  # of those, the verdict they assumed came: used as they were
    branch_hits: int = 0  # of those, by the branch beside the lookahead (the rejection it assumed came)
    accepted: int = 0
    rejections: int = 0
    target_passes: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    k: int = 0  # the k the request started with (0: target only)
    draft: str = ""  # the draft that served it ("" = target only)
    resolved_task: str = ""  # what the router resolved the task to (routed requests)
    token_ids: list[int] = field(default_factory=list, repr=False)  # not saved: compared, then dropped

    def record(self) -> dict:
        row = asdict(self)
        del row["token_ids"]
        return row

    @classmethod
    def from_record(cls, row: dict) -> Sample:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})
