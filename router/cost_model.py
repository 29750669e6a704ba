"""The speculative-decoding cost model of Leviathan et al. (2023), section 3.

alpha: per-token acceptance probability; k: draft tokens per target pass; c: the cost of one draft
step relative to one target step. The policy (which draft, which k, speculate or not) and the
reports compare measured speedups against these numbers.
"""

from __future__ import annotations


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """E[tokens committed per target pass] = (1 - alpha^(k+1)) / (1 - alpha)."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"alpha must be in [0, 1] and k >= 0, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, c: float, k: int) -> float:
    """Speedup over target-only decoding when drafting and verifying run one after the other:
    E[tokens per pass] / (k c + 1)."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    return expected_tokens_per_pass(alpha, k) / (k * c + 1)
