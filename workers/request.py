"""What one generation request asks for, validated once, with every default defined here."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from .grammar_spec import GrammarSpec
from .sampling import LogitsProcessing, SamplingParams

MAX_TOKENS_LIMIT = 4096  # per request; bounds a request's KV cache and its time on a replica
MAX_K = 16  # proposals per verify step; beyond ~8 acceptance decays faster than passes are saved
DEFAULT_K = 4  # a good k at alpha ~0.7-0.8 and c ~0.05 (Leviathan et al., fig. 3)
# A cascade's guesses (prompt lookup's, which its draft model verifies in a proposal's first pass),
# at most: past k where the draft draws them, so about the most of a repeated text one proposal
# carries (workers/drafting.py; measured: docs/pages/benchmarks.md, cascades).
CASCADE_GUESSES = 8
# A guess the cascade's draft gives at least this probability is proposed as it is; below, the
# draft draws its own token (workers/drafting.py). 0: every guess it can draw (on the demo zoo the
# fastest on code and math, 0.02 on sql; a veto at 0.1 lost up to 0.7x on code: benchmarks.md).
CASCADE_MIN_P = 0.0
DEFAULT_MAX_TOKENS = 128
MAX_STOP_STRINGS = 8
MAX_STOP_LENGTH = 64
MAX_TOP_LOGPROBS = 20  # alternatives per token at most (OpenAI's chat API allows 20)
GENERAL_TASK = "general"  # the task of requests that name none, and the zoo's draft for it (trained on every task)


@dataclass(frozen=True)
class GenerationParams:
    """Everything about a request except its prompt and its model choice."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None  # None: a fresh random seed, reported back in the stats
    stop: tuple[str, ...] = ()
    k: int = DEFAULT_K
    speculation: bool = True
    # The target's logprob of each output token with this many likeliest alternatives (0..20;
    # workers/logprobs.py); None: none.
    logprobs: int | None = None
    # Presence and frequency penalties and a logit bias (workers/processors.py): the output is the
    # processed target's.
    processing: LogitsProcessing = field(default_factory=LogitsProcessing)
    # Structured output (workers/grammar.py): the output is the target's constrained to it.
    grammar: GrammarSpec | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens must be 1..{MAX_TOKENS_LIMIT}, got {self.max_tokens}")
        if not 1 <= self.k <= MAX_K:
            raise ValueError(f"k must be 1..{MAX_K}, got {self.k}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be 0..2^63-1, got {self.seed}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be 0..{MAX_TOP_LOGPROBS} (alternatives per token), got {self.logprobs}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        for s in self.stop:
            if not 1 <= len(s) <= MAX_STOP_LENGTH:
                raise ValueError(f"each stop string must be 1..{MAX_STOP_LENGTH} characters, got {len(s)}")

    def resolved_seed(self) -> int:
        return self.seed if self.seed is not None else secrets.randbits(62)
