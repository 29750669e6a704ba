"""How the target alone would pick a token: the request's sampling parameters and logits processing
(penalties, a logit bias: workers/processors.py applies them), checked where they are made. Plain
data, apart from the acceptance rule that applies them (workers/acceptance.py), so that requests and
configs are made and checked without importing torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

GREEDY_TEMPERATURE = 0.0
# Below this, logits / temperature overflows float32 for ordinary logits (1e-39 gave NaN rows) and
# sampling is indistinguishable from greedy anyway: such requests are refused, not silently mangled.
MIN_TEMPERATURE = 0.01


@dataclass(frozen=True)
class SamplingParams:
    """How the target alone would pick a token. temperature 0 means greedy (argmax)."""

    temperature: float = GREEDY_TEMPERATURE
    top_k: int = 0  # 0 = no top-k truncation
    top_p: float = 1.0  # 1.0 = no nucleus truncation

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and (self.greedy or self.temperature >= MIN_TEMPERATURE)):
            raise ValueError(f"temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, "
                             f"got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == GREEDY_TEMPERATURE


MAX_PENALTY = 2.0  # OpenAI's range for presence and frequency penalties: -2..2
MAX_BIAS = 100.0  # ...and for a logit bias: -100..100
MAX_BIASED_TOKENS = 300


@dataclass(frozen=True)
class LogitsProcessing:
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ValueError(f"{name} must be -{MAX_PENALTY:g}..{MAX_PENALTY:g}, got {value}")
        if len(self.logit_bias) > MAX_BIASED_TOKENS:
            raise ValueError(f"logit_bias takes at most {MAX_BIASED_TOKENS} tokens, got {len(self.logit_bias)}")
        for token, bias in self.logit_bias:
            if token < 0 or not -MAX_BIAS <= bias <= MAX_BIAS:
                raise ValueError(f"logit_bias maps token ids >= 0 to -{MAX_BIAS:g}..{MAX_BIAS:g}, got {token}: {bias}")

    @property
    def active(self) -> bool:
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty)


NO_PROCESSING = LogitsProcessing()
