"""What a benchmark run measures and how much of it: every default defined once, here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specserve.workers.request import DEFAULT_K

DEFAULT_ZOO = "bench"  # the zoo whose cost ratio (c ~ 0.05-0.08) resembles a real target/draft pair
RESULTS_DIR = Path("bench/results")


@dataclass(frozen=True)
class BenchSettings:
    zoo: str = DEFAULT_ZOO
    out: Path = RESULTS_DIR  # a run writes out/<timestamp>/
    prompts: int = 6  # held-out prompts per task in the greedy section
    repeats: int = 1  # passes over those prompts; every pass adds one sample per prompt and path
    warm_up: int = 8  # routed requests per task before measuring (cycling over prompts never measured), so the
    # policy is past its first exploration, as a service that has seen traffic is
    max_tokens: int = 96
    k: int = DEFAULT_K  # the fixed k of the task-draft, general-draft, engine runs (HF uses its own)
    temperatures: tuple[float, ...] = (0.7, 1.0)
    sampled_prompts: int = 3  # per task and temperature
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    load_requests: int = 16  # per concurrency level and speculation mode
    address: str | None = None  # a running service instead of an embedded cluster
    peer: bool = True  # HF assisted generation (in this process)
    seed: int = 1234  # sampled requests' seeds start here
    service_overrides: dict = field(default_factory=dict)  # Serve config args for the embedded service

    def __post_init__(self) -> None:
        positive = {"prompts": self.prompts, "repeats": self.repeats, "max_tokens": self.max_tokens, "k": self.k,
                    "sampled_prompts": self.sampled_prompts, "load_requests": self.load_requests}
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.warm_up < 0:
            raise ValueError(f"warm_up must be 0 or more, got {self.warm_up}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency levels must be 1 or more, got {self.concurrency}")
        if any(not 0.0 < t <= 2.0 for t in self.temperatures):
            raise ValueError(f"temperatures must be in (0, 2], got {self.temperatures}")


@dataclass
class Goal:
    """One of the issue's goals: what is measured, the threshold, and whether this run met it."""

    name: str
    threshold: str
    measured: float | None
    met: bool | None  # None: not measured in this run
    detail: str = ""
    unit: str = "x"  # "x": a ratio; "%": a fraction


@dataclass(frozen=True)
class Goals:
    """The targets the report measures itself against (issue 5)."""

    speedup: dict[str, float] = field(default_factory=lambda: {"sql": 2.5, "math": 2.5, "code": 2.0, "prose": 1.3})
    speedup_floor: float = 0.95  # on any task
    of_bound: float = 0.90  # achieved / Leviathan bound
    over_peer: float = 1.3  # faster than HF assisted generation, same models
    load_level: int = 8  # with this many clients AUTO is never below OFF in throughput or p99
