"""Token-tree verification on synthetic targets and candidates: no model, no engine.

A synthetic target over a small vocabulary gives the distribution of the first token and of the
second given the first. Each draw builds a tree of candidates as several proposers would (two
deterministic ones with one-hot q, one sampled from a sparse q; children of their own below), runs
``verify_tree`` with fresh uniforms, and completes the committed tokens to two by target-only
sampling. Lossless verification leaves the two tokens distributed exactly as the target's. Checked:
- the joint distribution of the two tokens (TV bound and chi-square, as the chain's tests);
- the fast rule against the plain reference on the same uniforms;
- a chain given as a tree decides exactly as ``verify``, and greedy follows the target's argmax;
- a deliberately broken rule (a rejected candidate's mass not removed) fails the same check.
"""

from __future__ import annotations

import pytest
import torch

from specserve.workers import acceptance
from specserve.workers.acceptance import (SparseDist, children_of, one_hot, sample, sparsify, verify, verify_tree,
                                          verify_tree_greedy, warp)
from specserve.workers.sampling import SamplingParams
from acceptance_reference import verify_tree_reference

from test_acceptance_distribution import assert_distributed_as, distribution_gap

V = 6
DRAWS = 30_000
PARAMS = SamplingParams(temperature=1.0, top_p=0.95)


def target(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p of the first token [V] and of the second after each first token [V, V]."""
    g = torch.Generator().manual_seed(seed)
    first = warp(torch.randn(1, V, generator=g) * 1.5, PARAMS)[0]
    second = warp(torch.randn(V, V, generator=g) * 1.5, PARAMS)
    return first, second


def draft_table(seed: int) -> tuple[SparseDist, SparseDist]:
    """A sampled proposer's q: of the first token [1, m] and of the second after each first [V, m]."""
    g = torch.Generator().manual_seed(seed + 100)
    first = sparsify(warp(torch.randn(1, V, generator=g), PARAMS), 4)
    second = sparsify(warp(torch.randn(V, V, generator=g), PARAMS), 4)
    return first, second


def draw_tree(g: torch.Generator, q_first: SparseDist, q_second: SparseDist, built: dict | None = None):
    """Candidates at depth 1: tokens 0 and 1 (deterministic), then one sampled from q_first (its own
    node even when it repeats a deterministic token); below each, one deterministic child and below
    the sampled one also a sampled child. ``built``: the q rows of each tree already built, by its
    sampled first token (they depend on nothing else), to build each once over many draws."""
    sampled = int(q_first.ids[0, sample(q_first.probs[0], torch.rand((), generator=g, dtype=torch.float64))])
    row = SparseDist(q_second.ids[sampled : sampled + 1], q_second.probs[sampled : sampled + 1])
    below = int(row.ids[0, sample(row.probs[0], torch.rand((), generator=g, dtype=torch.float64))])
    # Nodes: 0, its child 2, 1, its child 3, the sampled one, its child 3 and its sampled child.
    tokens = [0, 2, 1, 3, sampled, 3, below]
    parents = [-1, 0, -1, 2, -1, 4, 4]
    if built is not None and sampled in built:
        return tokens, parents, built[sampled]
    rows = [one_hot(torch.tensor([t])) for t in tokens[:4]] + [q_first, one_hot(torch.tensor([3])), row]
    width = max(r.ids.shape[1] for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    probs = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        ids[i, : r.ids.shape[1]], probs[i, : r.probs.shape[1]] = r.ids[0], r.probs[0]
    q = SparseDist(ids, probs)
    if built is not None:
        built[sampled] = q
    return tokens, parents, q


def target_rows(first: torch.Tensor, second: torch.Tensor, tokens: list[int], parents: list[int]) -> torch.Tensor:
    """p at the root, then after each node ([T+1, V]); depth-2 nodes get an arbitrary row (their
    children would be third tokens, which the check does not look at)."""
    rows = [first]
    for token, parent in zip(tokens, parents, strict=True):
        rows.append(second[token] if parent == -1 else first)
    return torch.stack(rows)


def two_token_counts(seed: int, rule=verify_tree) -> tuple[torch.Tensor, torch.Tensor]:
    first, second = target(seed)
    q_first, q_second = draft_table(seed)
    g = torch.Generator().manual_seed(seed + 7)
    counts = torch.zeros(V * V)
    built: dict[int, SparseDist] = {}
    rows: dict[tuple[int, ...], torch.Tensor] = {}  # p of each tree, by its tokens (its parents are fixed)
    for _ in range(DRAWS):
        tokens, parents, q = draw_tree(g, q_first, q_second, built)
        if tuple(tokens) not in rows:
            rows[tuple(tokens)] = target_rows(first, second, tokens, parents)
        verdict = rule(rows[tuple(tokens)], tokens, parents, q, torch.rand(len(tokens) + 1, generator=g))
        committed = [tokens[i] for i in verdict.path] + [verdict.token]
        if len(committed) == 1:  # what the next step would draw, target-only
            committed.append(int(sample(second[committed[0]], torch.rand((), generator=g))))
        counts[committed[0] * V + committed[1]] += 1
    return counts, (first[:, None] * second).reshape(-1)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])  # a second seed: slow suite, 16 s
def test_the_committed_tokens_have_the_targets_distribution(seed):
    counts, probs = two_token_counts(seed)
    assert_distributed_as(counts, probs, f"two tokens through a tree, seed {seed}")


def test_a_broken_rule_that_keeps_a_rejected_candidates_mass_fails_the_check(monkeypatch):
    monkeypatch.setattr(acceptance, "residual", lambda p, q: p)  # rejection no longer removes q from r
    counts, probs = two_token_counts(0)
    tv, bound, _ = distribution_gap(counts, probs)
    assert tv > bound, (tv, bound)


def test_the_fast_rule_decides_as_the_reference_does():
    first, second = target(3)
    q_first, q_second = draft_table(3)
    g = torch.Generator().manual_seed(11)
    for _ in range(300):
        tokens, parents, q = draw_tree(g, q_first, q_second)
        p = target_rows(first, second, tokens, parents)
        u = torch.rand(len(tokens) + 1, generator=g)
        q_dicts = [{} for _ in tokens]  # padding entries (probability 0) may repeat an id: sum, not overwrite
        for i, row in enumerate(q_dicts):
            for token, mass in zip(q.ids[i].tolist(), q.probs[i].tolist(), strict=True):
                row[token] = row.get(token, 0.0) + mass
        assert verify_tree(p, tokens, parents, q, u) == verify_tree_reference(
            p.double().tolist(), tokens, parents, q_dicts, u.tolist())


def test_a_chain_given_as_a_tree_decides_as_verify():
    g = torch.Generator().manual_seed(5)
    for k in (1, 3, 6):
        for _ in range(100):
            p = warp(torch.randn(k + 1, V, generator=g), PARAMS)
            q = sparsify(warp(torch.randn(k, V, generator=g), PARAMS), 3)
            ids = [int(q.ids[i, sample(q.probs[i], torch.rand((), generator=g))]) for i in range(k)]
            u = torch.rand(k + 1, generator=g)
            chain = verify(p, torch.tensor(ids), q, u)
            tree = verify_tree(p, ids, list(range(-1, k - 1)), q, u)
            assert (len(tree.path), tree.token) == (chain.num_accepted, chain.token)
            assert tree.path == tuple(range(chain.num_accepted))


def test_greedy_follows_the_targets_argmax_down_the_tree():
    # root -> {5, 2}; 2 -> {1, 4}; 4 -> {0}. The target's argmax: 2 at the root, then 4, then 3.
    tokens, parents = [5, 2, 1, 4, 0], [-1, -1, 1, 1, 3]
    argmax = torch.tensor([2, 9, 4, 9, 3, 9])  # rows: root, then after each node
    assert verify_tree_greedy(argmax, tokens, parents) == acceptance.TreeVerdict((1, 3), 3)
    assert verify_tree_greedy(torch.tensor([7, 0, 0, 0, 0, 0]), tokens, parents).path == ()


def test_a_tree_must_list_parents_before_children():
    assert children_of([-1, 0, 0, -1]) == {-1: [0, 3], 0: [1, 2], 1: [], 2: [], 3: []}
    with pytest.raises(ValueError, match="earlier node"):
        children_of([-1, 2, 0])
