"""`specserve validate`: proof, on your own prompts, that speculation changes nothing, and what it buys.

Speculative decoding keeps the target's output only if every part of the path does its job: the
draft reports the exact q it sampled from, the verifier applies the rejection rule, caches roll
back, the router commits what was verified (DESIGN.md, invariant 1). ``validate`` checks the whole
path on your models and prompts, in this process or through a running service (``--address``):

1. Greedy identity. Each prompt is decoded greedily by the target alone and with speculation (with
   each draft its task may use, or the one picked by ``--draft NAME``); the token ids must be
   identical. A mismatch is reported with its first differing position.
2. Sampled equivalence. At each temperature, each prompt is sampled ``samples`` times by the target
   alone and as many times with speculation (per draft), every request with its own seed derived
   from ``--seed``; the first ``positions`` output tokens of the two sides are compared by the
   two-sample test below.
3. What it buys, per task and draft: the acceptance alpha (greedy, and per temperature), the cost
   ratio c measured here, the speedup the cost model expects from them (at the k used and at its
   best k) and the greedy speedup measured (the two paths run alternately, prompt by prompt).
   Greedy acceptance per task and draft is the profile the routing policy can start from
   (``--profile``, read by ``models.priors`` / ``specserve serve --priors``).

The two-sample test
-------------------
H0 (lossless): for every prompt, the first tokens of an output have the same distribution with
speculation as without. Leviathan et al.'s rule guarantees it: the output has the target's
distribution whatever the draft proposed. One test per (task, draft, temperature), the task's
prompts its strata (``two_sample.py``): Pearson's chi-square of homogeneity between the two sides,
over every (position, token) pair of the first ``positions`` tokens (an output that ended early has
the outcome "ended" there), summed over the prompts; its null distribution comes from relabelling
each prompt's samples between the sides at random. Under H0 a prompt's samples are independent
and identically distributed on both sides (each request has its own seed), so they are
exchangeable and the permutation p-value is exact at any sample size: no pooling, no asymptotics,
which matters because sampled outputs are diverse (most tokens are seen once or twice in a few
dozen samples, where the chi-square approximation fails and pooling rare tokens leaves nothing to
compare: on the tiny zoo, pooling left no test at all). The family-wise tolerance is
``FAMILY_ALPHA`` = 0.01 (``--alpha``) with Bonferroni over the m tests: each rejects at p <= 0.01 /
m, so a lossless path fails a run with probability at most 1% whatever the dependence between the
tests (the target-only samples of a prompt are shared by its drafts). Each test relabels
``RELABELLINGS_PER_LEVEL`` / (0.01 / m) times. In process a run is deterministic given ``--seed``;
through a service, as far as its seeded sampling is (it is, per request). Without ``--seed`` a
run takes a fresh seed (the report gives it): with a fixed default, a pair that draws an unlucky
sample would fail every run alike.

Power. The test sees a change of the distribution of the first tokens that stands out of the
noise of ``samples`` draws per prompt and side: a q misreported by the draft, a wrong residual or
bonus distribution, a cache not rolled back (the later positions), state leaking between requests.
Measured (more in ``tests/test_validate.py``'s docstring): a draft that reports the one-hot q of its
argmax while it samples from its full q (the greedy branch's q leaking into sampling) was rejected
on every seed tried, on the tiny zoo (2 prompts, 40 samples) and on the demo zoo at the defaults
(10 of 16 tests, up to 20 standard deviations above the null's mean, the critical value ~4); a
draft whose truncated q is not renormalised was rejected on the tiny zoo (60 samples), not on the
demo zoo, whose drafts' top 32 tokens hold nearly all their mass. It cannot see a change after the
first ``positions`` tokens, or one small against the noise: on the tiny zoo's near-uniform target,
reporting q as uniform over its support moves the first token's distribution by a total variation
of ~0.02, which takes thousands of samples.
A one-hot q of the token actually sampled is not a bug: accepting it with probability p(x) and
resampling from p without x is lossless (the rule's one-hot case), and the test passes it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import secrets
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from specserve.router.cost_model import best_k, expected_speedup
from specserve.router.proposers import RESERVED
from specserve.workers.acceptance import SamplingParams
from specserve.workers.request import DEFAULT_K, MAX_K, GenerationParams
from specserve.workers.stats import SpecStats
from specserve.workers.zoo.presets import GENERAL_DRAFT
from specserve.workers.zoo.zoo import Zoo

from .config import ModelsConfig
from .model_args import OwnModels, add_model_arguments, own_models, split_choice
from .two_sample import permutation_test

FAMILY_ALPHA = 0.01  # probability that a lossless path fails the run (Bonferroni over the tests)
# Relabellings per test: this many times what the smallest p-value that rejects needs, so that a
# clear difference is not lost to the resolution of the p-value (and a test's p is precise to ~30%).
RELABELLINGS_PER_LEVEL = 10
DEFAULT_TEMPERATURES = (0.7, 1.0)
# Per prompt, side, draft and temperature: the demo zoo's 8 held-out prompts (2 drafts each) at the
# two default temperatures take about a minute with it on one core (1,536 requests).
DEFAULT_SAMPLES = 32
MIN_SAMPLES = 10  # below it a test has no power to speak of (and too few distinct relabellings to reach its level)
DEFAULT_GREEDY_TOKENS = 64
ZOO_PROMPTS_PER_TASK = 2  # held-out prompts per task when no --prompts file is given
ENDED = -1  # the outcome of a position after the output ended
DEFAULT_ZOO = ModelsConfig().zoo  # the service's, as every command's


# --- what is decoded, and how ------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    text: str
    task: str | None = None  # None: the default task in process; through a service, it classifies the prompt


@dataclass(frozen=True)
class Run:
    """One request (greedy at temperature 0)."""

    prompt: Prompt
    speculation: bool
    draft: str | None = None  # with speculation: the draft (None: the service's choice)
    temperature: float = 0.0
    max_tokens: int = DEFAULT_GREEDY_TOKENS
    seed: int = 0


@dataclass(frozen=True)
class Decoded:
    token_ids: list[int]
    seconds: float  # wall time of the request
    stats: SpecStats
    task: str  # the task it was served as
    draft: str  # the draft that served it; "": the target alone
    k: int  # the k it started with; 0: the target alone


Decoder = Callable[[Run], Decoded]


def engine_decoder(engine, k: int) -> Decoder:
    """Runs on the in-process engine (``workers/engine.py``), every speculative one at ``k``."""
    def decode(run: Run) -> Decoded:
        params = GenerationParams(max_tokens=run.max_tokens, sampling=SamplingParams(temperature=run.temperature),
                                  seed=run.seed, k=k, speculation=run.speculation)
        start = time.perf_counter()
        done = engine.generate(run.prompt.text, params, draft=run.draft).complete()
        return Decoded(done.token_ids, time.perf_counter() - start, done.stats, run.prompt.task or "",
                       done.draft or "", k if done.draft else 0)
    return decode


def service_decoder(client, k: int | None) -> Decoder:
    """Runs through a service's client API: speculation ON or OFF, the draft and (None) k the policy's."""
    from specserve.proto.v1 import specserve_pb2 as pb

    from .client import stats_from_message

    def decode(run: Run) -> Decoded:
        request = pb.GenerateRequest(prompt=run.prompt.text, task=run.prompt.task or "", max_tokens=run.max_tokens,
                                     temperature=run.temperature, seed=run.seed,
                                     draft=(run.draft or "") if run.speculation else "",
                                     speculation=pb.SPECULATION_ON if run.speculation else pb.SPECULATION_OFF)
        if k is not None:
            request.k = k
        start = time.perf_counter()
        response = client.generate(request)
        s = response.stats
        return Decoded(list(response.token_ids), time.perf_counter() - start, stats_from_message(s), s.task, s.draft,
                       s.k if s.draft else 0)
    return decode


# --- the prompts file --------------------------------------------------------------------------------


def read_prompts(path: Path) -> list[Prompt]:
    """JSON lines ({"prompt": ..., "task": ...}, the task optional) when the first non-blank line starts
    with "{"; otherwise plain text, one prompt per non-blank line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"--prompts {path}: no such file") from None
    except UnicodeDecodeError:
        raise ValueError(f"--prompts {path}: not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"--prompts {path}: cannot read it ({exc.strerror or exc})") from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ValueError(f'--prompts {path} holds no prompts: give one per line, or JSON lines {{"prompt": ..., '
                         f'"task": ...}}')
    if not lines[0][1].lstrip().startswith("{"):
        return [Prompt(line) for _, line in lines]
    return [_json_prompt(f"--prompts {path}, line {number}", line) for number, line in lines]


def _json_prompt(where: str, line: str) -> Prompt:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg}); a file whose first line starts with {{ is read as "
                         f"JSON lines, one object per line") from None
    if not isinstance(doc, dict):
        raise ValueError(f'{where}: expected an object {{"prompt": ..., "task": ...}}, got {type(doc).__name__}')
    if unknown := sorted(set(doc) - {"prompt", "task"}):
        raise ValueError(f'{where}: unknown keys {unknown}; a line holds "prompt" and, optionally, "task"')
    prompt, task = doc.get("prompt"), doc.get("task")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f'{where}: "prompt" must be a non-empty string')
    if task is not None and (not isinstance(task, str) or not task):
        raise ValueError(f'{where}: "task" must be a non-empty string when given')
    return Prompt(prompt, task)


# --- the checks -----------------------------------------------------------------------------------------


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


def validate(decode: Decoder, prompts: list[Prompt], arms: list[list[str | None]], settings: Settings,
             progress: Callable[[str], None] = lambda line: None) -> Report:
    """Every check on ``prompts``; ``arms[i]``: the drafts prompt i is run with (None: the service's choice)."""
    if len(arms) != len(prompts) or not all(arms):
        raise ValueError("every prompt needs at least one draft to run with")
    if settings.seed is None:  # a fixed default would fail the same pair on every run once it is unlucky
        settings = replace(settings, seed=secrets.randbits(62))
    clock = [time.perf_counter()]
    progress(f"greedy: {len(prompts)} prompts, {sum(map(len, arms))} runs with speculation, each against the target "
             f"alone")
    tasks, mismatches, pairings = _greedy(decode, prompts, arms, settings)
    clock.append(time.perf_counter())
    outcomes = {}
    for temperature in settings.temperatures:
        progress(f"sampling at temperature {temperature}: {settings.samples} samples per prompt, side and draft")
        outcomes[temperature] = _sample(decode, prompts, arms, settings, temperature, pairings)
    clock.append(time.perf_counter())
    tests = _tests(outcomes, tasks, arms, settings)
    clock.append(time.perf_counter())
    seconds = dict(zip(("greedy", "sampled", "tests"), np.diff(clock).tolist(), strict=True))
    return Report(settings, len(prompts), sum(map(len, arms)), mismatches, tests, list(pairings.values()), seconds)


def _greedy(decode: Decoder, prompts: list[Prompt], arms: list[list[str | None]],
            settings: Settings) -> tuple[list[str], list[Mismatch], dict[tuple[str, str], Pairing]]:
    """Each prompt by the target alone, then with each of its drafts: (each prompt's task as served,
    the mismatches, the pairings). Alternating keeps both paths under the same machine load."""
    for speculation in (False, True):  # first calls pay one-off costs: keep them out of the timings
        decode(Run(prompts[0], speculation, arms[0][0], max_tokens=settings.max_tokens, seed=settings.seed))
    tasks, mismatches, pairings = [], [], {}
    for i, (prompt, drafts) in enumerate(zip(prompts, arms, strict=True)):
        off = decode(Run(prompt, False, max_tokens=settings.max_tokens, seed=settings.seed))
        tasks.append(off.task)
        for draft in drafts:
            on = decode(Run(prompt, True, draft, max_tokens=settings.max_tokens, seed=settings.seed))
            pairing = pairings.setdefault((on.task, on.draft), Pairing(on.task, on.draft))
            pairing.add(on, off)
            if on.token_ids != off.token_ids:
                j = next((j for j, (x, y) in enumerate(zip(on.token_ids, off.token_ids)) if x != y),
                         min(len(on.token_ids), len(off.token_ids)))
                mismatches.append(Mismatch(i, on.task, on.draft, j, _token_at(on.token_ids, j),
                                           _token_at(off.token_ids, j)))
    return tasks, mismatches, pairings


def _token_at(ids: list[int], j: int) -> int | None:
    return ids[j] if j < len(ids) else None


def _sample(decode: Decoder, prompts: list[Prompt], arms: list[list[str | None]], settings: Settings,
            temperature: float, pairings: dict[tuple[str, str], Pairing]) -> dict[tuple, np.ndarray]:
    """(prompt, draft, speculation) -> [samples, positions] first tokens of each sample (ENDED past
    the end), the two sides interleaved sample by sample; every request has a seed of its own."""
    rows: dict[tuple[int, str | None, bool], list[list[int]]] = defaultdict(list)
    n = settings.positions
    for i, (prompt, drafts) in enumerate(zip(prompts, arms, strict=True)):
        for s in range(settings.samples):
            for draft, speculation in [(None, False)] + [(draft, True) for draft in drafts]:
                seed = _seed(settings.seed, temperature, i, draft, speculation, s)
                out = decode(Run(prompt, speculation, draft, temperature, n, seed))
                rows[(i, draft, speculation)].append(out.token_ids[:n] + [ENDED] * (n - len(out.token_ids[:n])))
                if speculation:
                    pairing = pairings.setdefault((out.task, out.draft), Pairing(out.task, out.draft))
                    pairing.sampled[temperature].add(out.stats)
    return {key: np.array(value, dtype=np.int64) for key, value in rows.items()}


def _tests(outcomes: dict[float, dict], tasks: list[str], arms: list[list[str | None]],
           settings: Settings) -> list[SampledTest]:
    """One permutation test per (task, draft, temperature), the task's prompts its strata."""
    groups: dict[tuple[str, str | None], list[int]] = defaultdict(list)
    for i, drafts in enumerate(arms):
        for draft in drafts:
            groups[(tasks[i], draft)].append(i)
    m = len(groups) * len(outcomes)
    level = settings.family_alpha / max(1, m)
    relabellings = math.ceil(RELABELLINGS_PER_LEVEL / level)
    tests = []
    for temperature, sampled in outcomes.items():
        for (task, draft), members in groups.items():
            rng = np.random.default_rng(_seed(settings.seed, "relabel", temperature, task, draft))
            result = permutation_test([(sampled[(i, draft, True)], sampled[(i, None, False)]) for i in members],
                                      relabellings, rng)
            critical = result.critical(level)
            tests.append(SampledTest(task, draft or "", temperature, round(result.statistic, 3), result.p_value,
                                     round(critical, 3), round(result.z(), 2), round(result.z(critical), 2),
                                     relabellings))
    return tests


def _seed(*parts) -> int:
    """A request's seed, derived from the run's seed and what the request is: never equal to another's."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


# --- which models and drafts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalModels:
    target: str
    drafts: dict[str, str]  # name -> source
    tasks: dict[str, tuple[str, ...]]  # task -> its draft models, preferred first
    default_task: str | None  # for prompts without one
    zoo: Zoo | None = None  # when the models are a zoo's


def local_models(zoo_name: str | None, own: OwnModels, default_task: str | None) -> LocalModels:
    """The zoo's models and task table, or your own (--target, --draft NAME=SOURCE, --task TASK=...).
    The draft-free proposers of a table are left out: they run in a service's router, not here."""
    from .local import open_zoo

    if own.target:
        if zoo_name:
            raise ValueError("--zoo and --target both name the target: give one")
        if not own.drafts:
            raise ValueError("--target alone has nothing to validate: give its drafts with --draft NAME=SOURCE")
        for task, names in own.tasks.items():
            if unknown := [n for n in names if n not in own.drafts and n not in RESERVED]:
                raise ValueError(f"--task {task}= names drafts {unknown}; drafts given: {', '.join(own.drafts)}")
        table = {task: tuple(n for n in names if n in own.drafts) for task, names in own.tasks.items()}
        target, drafts, zoo = own.target, dict(own.drafts), None
        table = table or {name: (name,) for name in drafts}
    else:
        if own.drafts or own.tasks:
            raise ValueError("--draft NAME=SOURCE and --task TASK=... validate your own models: give --target too")
        zoo = open_zoo(zoo_name or DEFAULT_ZOO)
        target, drafts = str(zoo.target_dir), {name: str(zoo.draft_dir(name)) for name in zoo.draft_names}
        table = {task: tuple(names) for task, names in zoo.manifest["task_drafts"].items()}
        if GENERAL_DRAFT in drafts:  # prompts of no particular task, as the service's table has it
            table.setdefault(GENERAL_DRAFT, (GENERAL_DRAFT,))
    if default_task is None:  # as the service's: the zoo's general task, or the first of your own
        default_task = next(iter(table)) if own.target else GENERAL_DRAFT if GENERAL_DRAFT in table else None
    return LocalModels(target, drafts, table, default_task, zoo)


def local_arms(models: LocalModels, prompts: list[Prompt], draft: str | None) -> tuple[list[Prompt], list[list[str]]]:
    """Each prompt with its task resolved, and the drafts it is run with: the one picked, or every
    draft model its task may use."""
    if draft is not None and draft not in models.drafts:
        raise ValueError(f"--draft {draft!r} is not a draft of these models: {', '.join(models.drafts)}")
    resolved, arms = [], []
    for i, prompt in enumerate(prompts):
        task = prompt.task or models.default_task
        if task is None:
            raise ValueError(f"prompt {i} ({prompt.text[:40]!r}) has no task, and these models have no default "
                             f"task: give each prompt one (JSON lines) or --task TASK")
        if task not in models.tasks:
            raise ValueError(f"prompt {i}: unknown task {task!r}; these models' tasks: {', '.join(models.tasks)} "
                             f"(define one with --task {task}=DRAFT)")
        drafts = [draft] if draft else list(models.tasks[task])
        if not drafts:
            raise ValueError(f"task {task!r} has no draft model to validate here (its draft-free proposers run in a "
                             f"service: validate them with --address)")
        resolved.append(replace(prompt, task=task))
        arms.append(drafts)
    return resolved, arms


def zoo_prompts(zoo: Zoo) -> list[Prompt]:
    return [Prompt(text, task) for task in zoo.tasks for text in zoo.prompts(task)[:ZOO_PROMPTS_PER_TASK]]


# --- the command line -----------------------------------------------------------------------------------


DESCRIPTION = """\
Prove on your own prompts that speculation changes nothing, and measure what it buys. Greedy: every
prompt decoded by the target alone and with speculation (each draft its task may use, or --draft
NAME) must give identical token ids. Sampled: at each temperature, --samples outputs per prompt with
speculation and as many without, each with its own seed, are compared on their first --positions
tokens: one permutation test of Pearson's chi-square per task, draft and temperature (the task's
prompts as strata; exact at any sample size), at a family-wise alpha of --alpha (Bonferroni over the
tests), so a lossless path fails at most that often. Also per task and draft: acceptance, the cost
ratio c, the expected (cost model) and the measured speedup. Runs the models in this process (the
zoo's, or --target with --draft NAME=SOURCE), or goes through a running service (--address). Writes
a JSON report (stdout, or --out) and a summary on stderr. Exit status: 0 equivalent, 1 not
equivalent (a greedy mismatch, or a sampled test that rejects), 2 bad input."""

PROMPTS_HELP = ('the prompts: JSON lines, one {"prompt": ..., "task": ...} per line ("task" optional), or plain text, '
                "one prompt per line (a file whose first line starts with { is read as JSON lines). A prompt without "
                "a task takes --task TASK, else, in process, the default task (the zoo's general, or the first of "
                "--task TASK=... or --draft NAME=...); through a service it is classified. Default: "
                f"{ZOO_PROMPTS_PER_TASK} held-out prompts per task of the zoo")


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `specserve validate` on the CLI's subcommands."""
    d = Settings()
    parser = commands.add_parser("validate", help="prove on your prompts that speculation changes nothing; "
                                                  "measure acceptance and speedup", description=DESCRIPTION)
    parser.add_argument("--zoo", metavar="NAME_OR_DIR",
                        help=f"a zoo preset name or a zoo directory (default: {DEFAULT_ZOO}, unless --target)")
    add_model_arguments(parser, choosing=True)
    parser.add_argument("--address", metavar="HOST:PORT",
                        help="validate a running `specserve serve` (its own models) instead of models in this process")
    parser.add_argument("--prompts", type=Path, metavar="FILE", help=PROMPTS_HELP)
    parser.add_argument("--temperatures", type=_temperatures, default=d.temperatures, metavar="T,T",
                        help=f"sampling temperatures (default: {','.join(map(str, d.temperatures))})")
    parser.add_argument("--samples", type=int, default=d.samples,
                        help=f"samples per prompt, side (speculation on / off), draft and temperature; >= "
                             f"{MIN_SAMPLES} (default: %(default)s: about a minute on the demo zoo's 8 prompts)")
    parser.add_argument("--positions", type=int,
                        help="output tokens compared per sample (default: k + 2, a whole verify step and the next "
                             "token)")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens,
                        help="greedy output length per prompt (default: %(default)s)")
    parser.add_argument("--k", type=int, help=f"draft tokens per target pass (default: {DEFAULT_K} in process; "
                                              f"through a service, its policy's)")
    parser.add_argument("--alpha", type=float, default=d.family_alpha,
                        help="family-wise tolerance: a lossless path fails the sampled tests with at most this "
                             "probability (default: %(default)s)")
    parser.add_argument("--seed", type=int,
                        help="every request's seed derives from it, so a run in process is repeatable (default: a "
                             "fresh one, given in the report)")
    parser.add_argument("--threads", type=int, help="torch threads in this process (default: torch's)")
    parser.add_argument("--out", type=Path, metavar="FILE", help="write the JSON report here (default: stdout)")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="when equivalent, write {task: {draft: greedy acceptance}} here: the routing policy's "
                             "starting point (`specserve serve --priors FILE`, or models.priors in the config)")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    task, task_table = split_choice(args.task, "--task")
    draft, draft_sources = split_choice(args.draft, "--draft")
    own = own_models(args.target, draft_sources, task_table)
    k = DEFAULT_K if args.k is None and not args.address else args.k
    settings = Settings(temperatures=args.temperatures, samples=args.samples,
                        positions=(k or DEFAULT_K) + 2 if args.positions is None else args.positions,
                        max_tokens=args.max_tokens, seed=args.seed, family_alpha=args.alpha)
    if args.k is not None:
        GenerationParams(k=args.k)  # refuses what a request would refuse, with its message
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    for path in (args.out, args.profile):
        if path is not None and (path.is_dir() or not path.parent.is_dir()):
            raise ValueError(f"{path} must be a file in an existing directory")
    say = lambda line: print(f"validate: {line}", file=sys.stderr, flush=True)  # noqa: E731
    if args.address:
        report = _through_service(args, own, task, draft, k, settings, say)
    else:
        report = _in_process(args, own, task, draft, k, settings, say)
    doc = json.dumps(report.as_dict(), indent=2)
    if args.out:
        args.out.write_text(doc + "\n")
    else:
        print(doc)
    print(report.summary(), file=sys.stderr)
    if args.profile:
        if report.equivalent:
            args.profile.write_text(json.dumps(report.profile, indent=2) + "\n")
            print(f"profile written to {args.profile}: serve with --priors {args.profile}", file=sys.stderr)
        else:
            print(f"no profile written to {args.profile}: the pair is not equivalent", file=sys.stderr)
    return 0 if report.equivalent else 1


def _in_process(args, own, task, draft, k, settings, say) -> Report:
    from specserve.workers.engine import SpecEngine
    from specserve.workers.loading import ModelSpec

    models = local_models(args.zoo, own, task)
    prompts = _prompts(args.prompts, models.zoo)
    prompts, arms = local_arms(models, prompts, draft)
    used = {name for drafts in arms for name in drafts}
    say(f"loading the target and drafts {', '.join(sorted(used))} in this process")
    engine = SpecEngine.load(ModelSpec(models.target, threads=args.threads),
                             {name: ModelSpec(models.drafts[name], threads=args.threads) for name in sorted(used)})
    return validate(engine_decoder(engine, k), prompts, arms, settings, say)


def _through_service(args, own, task, draft, k, settings, say) -> Report:
    from .client import SpecServeClient
    from .local import open_zoo

    if own.given or args.threads:
        raise ValueError("--target, --draft/--task NAME=... and --threads load models in this process; a running "
                         "service (--address) serves its own")
    prompts = _prompts(args.prompts, open_zoo(args.zoo) if args.zoo else None)
    prompts = [p if p.task else replace(p, task=task) for p in prompts]
    client = SpecServeClient(args.address)
    try:
        say(f"through the service at {args.address}")
        return validate(service_decoder(client, k), prompts, [[draft] for _ in prompts], settings, say)
    finally:
        client.close()


def _prompts(path: Path | None, zoo: Zoo | None) -> list[Prompt]:
    if path is not None:
        return read_prompts(path)
    if zoo is None:
        raise ValueError("give --prompts FILE (the zoo's held-out prompts are the default only for a zoo's models)")
    return zoo_prompts(zoo)


def _temperatures(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
