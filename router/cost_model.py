"""The speculative-decoding cost model of Leviathan et al. (2023), section 3, with the costs we measure.

alpha: per-token acceptance probability; k: draft tokens per target pass; c: the cost of one draft
token relative to one target-only step. The paper takes a verify pass of k+1 tokens to cost one
target step; `w` is what each verified token adds on top (0 in the paper; measured by the router,
since on real hardware a wider pass is not free). The policy (which draft, which k, speculate or not)
and the reports compare measured speedups against these numbers.
"""

from __future__ import annotations


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """E[tokens committed per target pass] = (1 - alpha^(k+1)) / (1 - alpha)."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"alpha must be in [0, 1] and k >= 0, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, c: float, k: int, w: float = 0.0, saturated: bool = False) -> float:
    """Speedup over target-only decoding: E[tokens per pass] / (cost of a step in target steps).

    Drafting and verifying one after the other, a step costs k c + 1 + k w. With the target
    saturated (other requests waiting on it), the draft's time hides behind their verification and
    what counts is the target's own work per step, 1 + k w.
    """
    if c < 0 or w < 0:
        raise ValueError(f"c and w must be >= 0, got c={c}, w={w}")
    step = 1 + k * w + (0.0 if saturated else k * c)
    return expected_tokens_per_pass(alpha, k) / step


def best_k(alpha: float, c: float, k_min: int, k_max: int, w: float = 0.0, saturated: bool = False) -> tuple[int, float]:
    """The k in [k_min, k_max] with the highest expected speedup, and that speedup (ties: smaller k)."""
    return max(((k, expected_speedup(alpha, c, k, w, saturated)) for k in range(k_min, k_max + 1)),
               key=lambda pair: (pair[1], -pair[0]))
