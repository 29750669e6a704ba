"""What `specserve validate` checks with (its settings) and what a run found: per task and draft its
greedy pairing, the mismatches, the sampled tests, and the report (JSON and the summary)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from specserve.router.cost_model import best_k, expected_speedup
from specserve.workers.sampling import SamplingParams
from specserve.workers.proposer_kinds import RESERVED
from specserve.workers.request import DEFAULT_K, MAX_K
from specserve.workers.stats import SpecStats

from .validate_runs import DEFAULT_GREEDY_TOKENS, Decoded

FAMILY_ALPHA = 0.01  # probability that a lossless path fails the run (Bonferroni over the tests)
DEFAULT_TEMPERATURES = (0.7, 1.0)
# Per prompt, side, draft and temperature: the demo zoo's 8 held-out prompts (2 drafts each) at the
# two default temperatures take about a minute with it on one core (1,536 requests).
DEFAULT_SAMPLES = 32
MIN_SAMPLES = 10  # below it a test has no power to speak of (and too few distinct relabellings to reach its level)


@dataclass(frozen=True)
class Settings:
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    samples: int = DEFAULT_SAMPLES  # per prompt, side, draft and temperature
    positions: int = DEFAULT_K + 2  # output tokens compared: a whole step of k drafts and its bonus, then one more
    max_tokens: int = DEFAULT_GREEDY_TOKENS  # greedy outputs' length
    seed: int | None = None  # every request's seed derives from it; None: a fresh one (the report says which)
    family_alpha: float = FAMILY_ALPHA

    def __post_init__(self) -> None:
        for t in self.temperatures:
            if t == 0:
                raise ValueError("--temperatures: greedy is always checked; give sampling temperatures (> 0)")
            SamplingParams(temperature=t)  # refuses what a request would refuse, with its message
        if self.samples < MIN_SAMPLES:
            raise ValueError(f"--samples must be >= {MIN_SAMPLES} (below, the tests have no power to speak of), "
                             f"got {self.samples}")
        if self.positions < 1 or self.max_tokens < 1:
            raise ValueError(f"--positions and --max-tokens must be >= 1, got {self.positions} and {self.max_tokens}")
        if not 0 < self.family_alpha < 1:
            raise ValueError(f"the family-wise alpha must be in (0, 1), got {self.family_alpha}")


@dataclass
class Pairing:
    """One task and draft: its greedy runs with speculation against the target alone, prompt by prompt."""

    task: str
    draft: str
    on: SpecStats = field(default_factory=SpecStats)
    off: SpecStats = field(default_factory=SpecStats)
    seconds_on: float = 0.0
    seconds_off: float = 0.0
    prompts: int = 0
    identical: int = 0
    ks: Counter = field(default_factory=Counter)
    sampled: dict[float, SpecStats] = field(default_factory=lambda: defaultdict(SpecStats))  # temperature -> ON runs

    def add(self, on: Decoded, off: Decoded) -> None:
        """One prompt's greedy runs with speculation (``on``) and without."""
        self.on.add(on.stats)
        self.off.add(off.stats)
        self.seconds_on += on.seconds
        self.seconds_off += off.seconds
        self.prompts += 1
        self.identical += on.token_ids == off.token_ids
        self.ks[on.k] += 1

    @property
    def cost_ratio(self) -> float:
        """c: one draft forward pass over one target-only forward pass, as `specserve demo` measures it."""
        return self.on.cost_ratio(self.off)

    @property
    def k(self) -> int:
        return self.ks.most_common(1)[0][0] if self.ks else 0

    def as_dict(self) -> dict:
        """Greedy figures are None where there were no greedy runs (through a service, a draft its
        policy chose only for samples)."""
        sampled = {str(t): round(s.alpha, 4) for t, s in sorted(self.sampled.items())}
        row = {"task": self.task, "draft": self.draft or None, "prompts": self.prompts, "identical": self.identical,
               "alpha_sampled": sampled, "k": self.k}
        greedy = ("alpha", "acceptance_rate", "tokens_per_pass", "cost_ratio", "expected_speedup", "best_k",
                  "best_expected_speedup", "measured_speedup")
        if not self.prompts:
            return row | dict.fromkeys(greedy)
        alpha, c = self.on.alpha, self.cost_ratio
        k_best, best = best_k(alpha, c, 1, MAX_K)
        return row | {"alpha": round(alpha, 4), "acceptance_rate": round(self.on.acceptance_rate, 4),
                      "tokens_per_pass": round(self.on.tokens_per_pass, 3), "cost_ratio": round(c, 4),
                      "expected_speedup": round(expected_speedup(alpha, c, self.k), 3) if self.k else None,
                      "best_k": k_best, "best_expected_speedup": round(best, 3),
                      "measured_speedup": round(self.seconds_off / self.seconds_on, 3) if self.seconds_on else None}


@dataclass(frozen=True)
class Mismatch:
    prompt: int  # index in the prompts
    task: str
    draft: str
    position: int  # the first output token that differs
    on: int | None  # the token there with speculation (None: the output had ended)
    off: int | None


@dataclass(frozen=True)
class SampledTest:
    """One task, draft and temperature: the permutation test of its prompts' samples (two_sample.py)."""

    task: str
    draft: str  # as asked for ("": the service's choice)
    temperature: float
    statistic: float  # Pearson's chi-square over every position and token, summed over the prompts
    p_value: float
    critical: float  # the statistic rejects above it (the null's quantile at the test's level)
    z: float  # the statistic's distance above its null's mean, in the null's standard deviations
    z_critical: float  # the critical value's, likewise: the test rejects where z > z_critical
    permutations: int


@dataclass
class Report:
    settings: Settings
    prompts: int
    greedy_runs: int
    mismatches: list[Mismatch]
    tests: list[SampledTest]
    pairings: list[Pairing]
    seconds: dict[str, float]

    @property
    def test_alpha(self) -> float:
        """Each test's level: the family-wise alpha split over the tests (Bonferroni)."""
        return self.settings.family_alpha / max(1, len(self.tests))

    @property
    def rejected(self) -> list[SampledTest]:
        return [t for t in self.tests if t.p_value <= self.test_alpha]

    @property
    def equivalent(self) -> bool:
        return not self.mismatches and not self.rejected

    @property
    def profile(self) -> dict[str, dict[str, float]]:
        """Greedy acceptance per task and draft model (the routing policy's priors; the zoo's manifest
        holds the same measure): draft-free proposers are scored by the router on its own traffic."""
        profile: dict[str, dict[str, float]] = {}
        for p in self.pairings:
            if p.draft and p.draft not in RESERVED and p.on.accepted + p.on.rejections:
                profile.setdefault(p.task, {})[p.draft] = round(p.on.alpha, 4)
        return profile

    def as_dict(self) -> dict:
        s = self.settings
        return {
            "equivalent": self.equivalent,
            "settings": {"prompts": self.prompts, "temperatures": list(s.temperatures), "samples": s.samples,
                         "positions": s.positions, "greedy_tokens": s.max_tokens, "seed": s.seed,
                         "family_alpha": s.family_alpha, "tests": len(self.tests), "test_alpha": self.test_alpha},
            "greedy": {"runs": self.greedy_runs, "identical": not self.mismatches,
                       "mismatches": [vars(m) for m in self.mismatches]},
            "sampled": {"rejected": len(self.rejected),
                        "tests": [vars(t) | {"rejected": t.p_value <= self.test_alpha} for t in self.tests]},
            "tasks": [p.as_dict() for p in self.pairings],
            "profile": self.profile,
            "seconds": {name: round(v, 2) for name, v in self.seconds.items()},
        }

    def summary(self) -> str:
        s = self.settings
        differ = (f"{len(self.mismatches)} of {self.greedy_runs} differ: " + "; ".join(
            f"prompt {m.prompt} ({m.task}, draft {m.draft or 'none'}) from token {m.position}: {m.on} with "
            f"speculation, {m.off} without" for m in self.mismatches[:5]) if self.mismatches else "all token-identical")
        lines = [f"greedy: {self.prompts} prompts, {self.greedy_runs} runs with speculation against the target alone "
                 f"({s.max_tokens} tokens): {differ}"]
        if self.tests:
            worst = min(self.tests, key=lambda t: (t.p_value, -t.z))
            shown = sorted(self.rejected, key=lambda t: -t.z)[:5]
            verdict = (f"{len(self.rejected)} reject: " + "; ".join(map(_test_line, shown)) if shown
                       else f"none rejects; the closest: {_test_line(worst)}")
            lines.append(f"sampled: temperatures {', '.join(map(str, s.temperatures))}, {s.samples} samples per "
                         f"prompt, side and draft, first {s.positions} tokens, seed {s.seed}: {len(self.tests)} "
                         f"permutation tests at family-wise alpha {s.family_alpha} (each at p <= "
                         f"{self.test_alpha:.2g}, {self.tests[0].permutations} relabellings): {verdict}")
        temps = "".join(f" {'T' + str(t):>6}" for t in s.temperatures)
        header = (f"{'task':<10} {'draft':<10} {'prompts':>7} {'same':>5} {'alpha':>6}{temps} {'c':>6} {'k':>2} "
                  f"{'expected':>8} {'best k':>10} {'measured':>8}")
        lines += ["", header, "-" * len(header)]
        for p in self.pairings:
            d = p.as_dict()
            sampled = "".join(f" {_figure(d['alpha_sampled'].get(str(t)), '.2f'):>6}" for t in s.temperatures)
            best = f"{d['best_k']}: {d['best_expected_speedup']:.2f}x" if d["best_k"] else "-"
            lines.append(f"{p.task:<10} {p.draft or '-':<10} {p.prompts:>7} {p.identical:>5} "
                         f"{_figure(d['alpha'], '.2f'):>6}{sampled} {_figure(d['cost_ratio'], '.3f'):>6} "
                         f"{d['k'] or '-':>2} {_figure(d['expected_speedup'], '.2f', 'x'):>8} {best:>10} "
                         f"{_figure(d['measured_speedup'], '.2f', 'x'):>8}")
        lines += ["same: prompts whose greedy output with speculation was token-identical; alpha: greedy per-token",
                  "acceptance (T...: sampled, per temperature); c: draft step / target step measured here; expected:",
                  "Leviathan et al.'s speedup from alpha, c and k (drafting and verifying in turn); best k: the k it",
                  "would pick and its speedup; measured: target-only time / speculative time, greedy, run alternately.",
                  ""]
        if self.equivalent:
            lines.append("EQUIVALENT: speculation changed nothing these checks can see on these prompts.")
        else:
            lines.append("NOT EQUIVALENT: speculation changed the output (see above); do not serve this pair as is.")
            if not self.mismatches:
                lines.append(f"(A lossless path fails the sampled tests by chance in at most {s.family_alpha:.0%} of "
                             f"runs: a real difference fails again with another seed. This run: --seed {s.seed}.)")
        return "\n".join(lines)


def _figure(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def _test_line(t: SampledTest) -> str:
    draft = t.draft or "(the service's choice)"
    return (f"{t.task}, draft {draft}, T {t.temperature}: chi2 {t.statistic:.1f}, {t.z:.1f} sd above its null's "
            f"mean (rejects above {t.critical:.1f}, {t.z_critical:.1f} sd), p {t.p_value:.2g}")
