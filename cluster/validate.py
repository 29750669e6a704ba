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

The modules: ``validate_runs.py`` (prompts, requests and decoders), ``validate_report.py`` (settings
and what a run found), ``two_sample.py`` (the test), ``validate_models.py`` (which models, in
process); the command is ``commands/validate.py``.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from .two_sample import permutation_test
from .validate_report import Mismatch, Pairing, Report, SampledTest, Settings
from .validate_runs import Decoder, Prompt, Run

# Relabellings per test: this many times what the smallest p-value that rejects needs, so that a
# clear difference is not lost to the resolution of the p-value (and a test's p is precise to ~30%).
RELABELLINGS_PER_LEVEL = 10
ENDED = -1  # the outcome of a position after the output ended


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
