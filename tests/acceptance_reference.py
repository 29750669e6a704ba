"""Plain reference implementation of the acceptance rule, written for reading, not speed.

Python lists and floats, one position at a time, straight from the paper. The tests feed it the
same uniforms as ``acceptance.verify`` and require the same decisions.
"""

from __future__ import annotations

import math

from specserve.workers.acceptance import Outcome, TreeVerdict
from specserve.workers.sampling import SamplingParams


def warp_reference(logits: list[float], params: SamplingParams) -> list[float]:
    """Temperature, then top-k, then top-p, over one row of logits."""
    if params.greedy:
        best = max(range(len(logits)), key=lambda i: (logits[i], -i))  # first maximum, like argmax
        return [1.0 if i == best else 0.0 for i in range(len(logits))]
    scaled = [x / params.temperature for x in logits]
    if 0 < params.top_k < len(scaled):
        kth = sorted(scaled, reverse=True)[params.top_k - 1]
        scaled = [x if x >= kth else -math.inf for x in scaled]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]
    total = sum(weights)
    probs = [w / total for w in weights]
    if params.top_p < 1.0:
        order = sorted(range(len(probs)), key=lambda i: -probs[i])
        kept, mass = set(), 0.0
        for i in order:
            if mass >= params.top_p:
                break
            kept.add(i)
            mass += probs[i]
        probs = [pr if i in kept else 0.0 for i, pr in enumerate(probs)]
        total = sum(probs)
        probs = [pr / total for pr in probs]
    return probs


def sample_reference(probs: list[float], u: float) -> int:
    """Walk the cumulative distribution until it passes u * total."""
    threshold = u * sum(probs)
    cumulative = 0.0
    last_with_mass = max(i for i, pr in enumerate(probs) if pr > 0)
    for i, pr in enumerate(probs):
        cumulative += pr
        if cumulative > threshold and pr > 0:
            return i
    return last_with_mass


def verify_reference(
    p: list[list[float]],  # k+1 rows of target probabilities
    draft_ids: list[int],  # k proposed tokens
    q: list[dict[int, float]],  # k sparse draft distributions, token id -> probability
    uniforms: list[float],  # k+1 uniforms
) -> Outcome:
    """Accept x_i with probability min(1, p(x_i)/q(x_i)); resample the first rejection from
    norm(max(0, p - q)); when every draft is accepted, draw the bonus token from p."""
    k = len(draft_ids)
    for i, x in enumerate(draft_ids):
        p_x, q_x = p[i][x], q[i].get(x, 0.0)
        if uniforms[i] * q_x < p_x:
            continue
        leftover = [max(0.0, p[i][t] - q[i].get(t, 0.0)) for t in range(len(p[i]))]
        if sum(leftover) <= 1e-12:
            leftover = p[i]
        return Outcome(i, sample_reference(leftover, uniforms[k]))
    return Outcome(k, sample_reference(p[k], uniforms[k]))


def verify_tree_reference(
    p: list[list[float]],  # T+1 rows: at the root, then after each node
    tokens: list[int],
    parents: list[int],
    q: list[dict[int, float]],  # per node, the distribution its token was drawn from
    uniforms: list[float],  # T+1
) -> TreeVerdict:
    """From the root: try each child in turn, accepting x with probability min(1, r(x)/q(x)) and
    otherwise replacing r by norm(max(0, r - q)); no child accepted: draw the token from r."""
    node, path = -1, []
    while True:
        r = list(p[node + 1])
        for child in [c for c, parent in enumerate(parents) if parent == node]:
            x = tokens[child]
            if uniforms[child] * q[child].get(x, 0.0) < r[x]:
                node = child
                path.append(child)
                break
            leftover = [max(0.0, r[t] - q[child].get(t, 0.0)) for t in range(len(r))]
            total = sum(leftover)
            r = [v / total for v in leftover] if total > 1e-12 else r
        else:
            return TreeVerdict(tuple(path), sample_reference(r, uniforms[len(tokens)]))
