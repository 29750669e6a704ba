"""Two samples of token sequences, drawn in strata: could they come from the same distribution?
Pure: numpy only, no models, no I/O.

Glossary
    stratum     one setting both samples were drawn under (for ``specserve validate``: a prompt),
                with a distribution of its own; side A and side B each have draws in it
    outcome     a draw's first J tokens, one row (an output that ended early is padded with a
                sentinel, so "ended" is an outcome of that position like any token)
    column      one (position, token) pair seen in a stratum
    H0          in every stratum, A's and B's draws have the same distribution

The statistic is Pearson's chi-square of homogeneity of each stratum's two sides, over every
column, summed over positions and strata: sum (A_c - s T_c)^2 / (s (1 - s) T_c), with T_c the
column's count on both sides and s the share of the stratum's draws that are A's. Nothing is pooled:
its null distribution comes from permutations, not from the chi-square approximation, so it holds
however many tokens are rare. Under H0 a stratum's draws are exchangeable between the sides, so
relabelling them at random (keeping each side's size) gives the statistic's exact null
distribution; each stratum is relabelled independently. The p-value (1 + #{null >= observed}) /
(1 + P) over P relabellings is valid at any sample size (Phipson & Smyth 2010): P(p <= a) <= a.

Without pooling the test keeps its power where outputs are diverse (many tokens each seen once or
twice): it is then driven by collisions, tokens drawn more often on one side than the other, the
regime where Pearson's statistic behaves like Chan et al.'s optimal closeness tester (2014)
(their statistic differs from it by the number of columns, which relabelling leaves unchanged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CHUNK_ELEMENTS = 4_000_000  # relabellings x columns computed at once (bounds memory)


@dataclass(frozen=True)
class PermutationTest:
    statistic: float
    null: np.ndarray  # [P] the statistic under each relabelling, sorted in decreasing order

    @property
    def permutations(self) -> int:
        return len(self.null)

    @property
    def p_value(self) -> float:
        return (1 + self._at_least(self.statistic)) / (1 + self.permutations)

    def critical(self, level: float) -> float:
        """The value the statistic must exceed for p <= level (inf: P is too small to reach it)."""
        allowed = math.floor(level * (1 + self.permutations) + 1e-9) - 1  # null values >= it a rejection allows
        return float(self.null[allowed]) if 0 <= allowed < self.permutations else math.inf

    def z(self, value: float | None = None) -> float:
        """``value`` (default: the statistic) in standard deviations of the null above its mean: the
        statistic's and the critical value's side by side give a test's margin."""
        value = self.statistic if value is None else value
        sd = float(self.null.std())
        return (value - float(self.null.mean())) / sd if sd > 0 else 0.0

    def _at_least(self, value: float) -> int:
        # Sorted decreasingly: count the entries >= value, with a relative tolerance for rounding.
        return int(np.searchsorted(-self.null, -value * (1 - 1e-9) if value > 0 else -value, side="right"))


def permutation_test(strata: list[tuple[np.ndarray, np.ndarray]], permutations: int,
                     rng: np.random.Generator) -> PermutationTest:
    """``strata``: per stratum (A's outcomes [n_a, J], B's [n_b, J]) as integer arrays."""
    if permutations < 1:
        raise ValueError(f"permutations must be >= 1, got {permutations}")
    observed, null = 0.0, np.zeros(permutations)
    for a, b in strata:
        stratum_observed, stratum_null = _stratum(np.asarray(a), np.asarray(b), permutations, rng)
        observed += stratum_observed
        null += stratum_null
    return PermutationTest(observed, -np.sort(-null))


def _stratum(a: np.ndarray, b: np.ndarray, permutations: int, rng: np.random.Generator) -> tuple[float, np.ndarray]:
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or not len(a) or not len(b):
        raise ValueError(f"a stratum needs draws on both sides, of the same width: got {a.shape} and {b.shape}")
    outcomes = np.concatenate([a, b])  # [N, J]
    columns = np.concatenate([outcomes[:, j, None] == np.unique(outcomes[:, j])[None, :]
                              for j in range(outcomes.shape[1])], axis=1).astype(np.float32)  # [N, C]
    totals = columns.sum(0, dtype=np.float64)  # [C]
    share = len(a) / len(outcomes)
    labels = np.zeros(len(outcomes), dtype=np.float32)
    labels[: len(a)] = 1.0  # [N]: 1 for A's draws
    observed = _pearson(labels[None, :] @ columns, totals, share)[0]
    null = np.empty(permutations)
    step = max(1, CHUNK_ELEMENTS // columns.shape[1])
    for start in range(0, permutations, step):
        relabelled = rng.permuted(np.tile(labels, (min(step, permutations - start), 1)), axis=1)  # [p, N]
        null[start:start + len(relabelled)] = _pearson(relabelled @ columns, totals, share)
    return float(observed), null


def _pearson(counts_a: np.ndarray, totals: np.ndarray, share: float) -> np.ndarray:
    """counts_a: [p, C] A's count per column under p labellings; totals: [C]. Returns [p]."""
    return (((counts_a - share * totals) ** 2) / (share * (1 - share) * totals)).sum(-1)
