"""What requests really got at each load: the cost model's prediction checked on the wall clock.

The model prices a step with c, w and r measured at whatever load the requests behind them ran at.
Under load what a speculating request waits for grows in ways it does not see (drafts whose device
is shared, round trips through a busy router): on the 2-core development host, at 8 clients, sql
requests speculating at alpha 0.94 ran at 11-13 tokens/s while target-only ones ran at 36-58. So
the policy also keeps the realized speed (tokens over seconds, request to last token) of
speculating requests per (task, proposer) and of target-only requests by load level (sessions per
replica in powers of two, faded per request), and passes over a proposer where, at the nearest
level measured on both sides at or below the current load, its requests ran slower. Per proposer,
not per task: on the bench zoo, prose requests forced onto its poor draft ran at 0.4x while
prompt lookup ran at 2.5x, and a check per task had kept AUTO's prose target-only.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

HALF_LIFE_REQUESTS = 32  # a level's speeds follow the last few dozen requests seen at it
TARGET_ONLY = ("", "")  # every task's target-only requests together, as (task, proposer)


def level(pressure: float) -> int:
    """Sessions per replica in powers of two: 1, 2-3, 4-7, 8-15, ..."""
    return int(math.log2(max(1.0, pressure)))


@dataclass
class Speed:
    """Faded sums over the requests of one kind at one level."""

    tokens: float = 0.0
    seconds: float = 0.0
    requests: int = 0  # seen, unfaded

    def add(self, tokens: int, seconds: float) -> None:
        fade = 0.5 ** (1 / HALF_LIFE_REQUESTS)
        self.tokens = self.tokens * fade + tokens
        self.seconds = self.seconds * fade + seconds
        self.requests += 1

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


@dataclass
class LoadCheck:
    """Realized decode speeds by load level: each (task, proposer)'s requests, and every task's
    target-only requests together (a target-only token costs the same whatever the task: the same
    model, the same passes). Speeds are taken after the first chunk, so that prefill and prompt
    length, which differ between tasks, do not count."""

    min_requests: int  # on each side, at a level, before the level counts
    speeds: dict[tuple[str, str, int], Speed] = field(default_factory=dict)  # (task, proposer, level); ("", "", level): target-only

    def record(self, task: str, proposer: str | None, pressure: float, tokens: int, seconds: float) -> None:
        """A finished request's decode speed; ``proposer`` None: it was served target-only."""
        if tokens > 0 and seconds > 0:
            who = (task, proposer) if proposer else TARGET_ONLY
            self.speeds.setdefault((*who, level(pressure)), Speed()).add(tokens, seconds)

    def ratio(self, task: str, proposer: str, pressure: float) -> float | None:
        """The proposer's requests' over target-only tokens/s, for the task, at the nearest level at
        or below ``pressure`` measured on both sides (speculation loses more, not less, as load
        grows); None: none yet."""
        for at in range(level(pressure), -1, -1):
            spec, plain = self._counted((task, proposer), at), self._counted(TARGET_ONLY, at)
            if spec and plain and plain.rate:
                return spec.rate / plain.rate
        return None

    def _counted(self, who: tuple[str, str], at: int) -> Speed | None:
        speed = self.speeds.get((*who, at))
        return speed if speed and speed.requests >= self.min_requests else None
