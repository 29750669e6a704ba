"""The fast acceptance math against the plain reference, on the same random inputs."""

import torch
import pytest

from specserve.workers.acceptance import (one_hot, residual, sample, sample_sparse, sparsify, verify, verify_greedy,
                                          warp)
from specserve.workers.sampling import SamplingParams
from acceptance_reference import sample_reference, verify_reference, warp_reference

SETTINGS = [
    SamplingParams(),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.5, top_k=7, top_p=0.9),
]


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_warp_matches_reference(params):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(20, 50, generator=gen) * 3
    fast = warp(logits, params)
    for row, expected in zip(fast, (warp_reference(r.tolist(), params) for r in logits)):
        assert torch.allclose(row, torch.tensor(expected, dtype=torch.float32), atol=1e-6)
        assert abs(float(row.sum()) - 1) < 1e-5


def random_case(gen, k, vocab, support, params):
    """Target probabilities, draft tokens drawn from a sparse q, and the uniforms of one step."""
    p = warp(torch.randn(k + 1, vocab, generator=gen) * 2, params)
    q = sparsify(warp(torch.randn(k, vocab, generator=gen) * 2, params), support)
    draft = torch.tensor([
        int(q.ids[i, torch.multinomial(q.probs[i], 1, generator=gen)]) for i in range(k)
    ])
    return p, draft, q, torch.rand(k + 1, generator=gen)


@pytest.mark.parametrize("params", SETTINGS[1:], ids=str)
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_verify_matches_reference(params, k):
    gen = torch.Generator().manual_seed(k)
    outcomes = set()
    for _ in range(150):
        p, draft, q, u = random_case(gen, k, vocab=40, support=12, params=params)
        q_dicts = [dict(zip(q.ids[i].tolist(), q.probs[i].tolist())) for i in range(k)]
        expected = verify_reference(p.double().tolist(), draft.tolist(), q_dicts, u.tolist())
        assert verify(p, draft, q, u) == expected
        outcomes.add(expected.num_accepted)
    assert len(outcomes) > 1, "the cases should exercise both acceptance and rejection"


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_shortcut_is_the_one_hot_case(k):
    gen = torch.Generator().manual_seed(100 + k)
    for _ in range(100):
        logits = torch.randn(k + 1, 30, generator=gen)
        argmax = logits.argmax(-1)
        # Drafts that agree with the target for a random prefix, then guess.
        draft = torch.where(torch.rand(k, generator=gen) < 0.7, argmax[:k], torch.randint(0, 30, (k,), generator=gen))
        fast = verify_greedy(argmax, draft)
        general = verify(warp(logits, SamplingParams()), draft, one_hot(draft), torch.rand(k + 1, generator=gen))
        assert fast == general


def test_sample_matches_reference_and_skips_zero_mass():
    gen = torch.Generator().manual_seed(7)
    probs = torch.tensor([0.0, 0.25, 0.0, 0.5, 0.25, 0.0])
    edges = torch.tensor([0.0, 0.999999999, 1 - 2**-53, 1.0], dtype=torch.float64)  # 1.0: u*total rounded up
    u = torch.cat([torch.rand(500, generator=gen).double(), edges])
    tokens = sample(probs.expand(len(u), -1), u)  # one row per uniform
    assert tokens.tolist() == [sample_reference(probs.tolist(), x) for x in u.tolist()]
    assert bool((probs[tokens] > 0).all())


def test_sample_sparse_draws_the_ids_of_sample():
    q = sparsify(torch.tensor([[0.1, 0.4, 0.0, 0.2, 0.3]]), 4)  # ids [1, 4, 3, 0]
    for u in torch.linspace(0, 0.999, 50, dtype=torch.float64).tolist():
        assert sample_sparse(q, u) == int(q.ids[0, sample_reference(q.probs[0].tolist(), u)])


def test_sparsify_is_an_exact_normalised_truncation():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]])
    q = sparsify(probs, 2)
    assert q.ids.tolist() == [[1, 3]]
    assert torch.allclose(q.probs, torch.tensor([[4 / 7, 3 / 7]]))
    assert torch.allclose(q.densify(4), torch.tensor([[0, 4 / 7, 0, 3 / 7]]))


def test_rejection_rule_in_closed_form():
    """P(first committed token = t) = q(t) min(1, p(t)/q(t)) + P(reject) residual(t) = p(t), exactly.

    q(t) min(1, p/q) = min(p, q); P(reject) = 1 - sum min(p, q). Sparse and dense q alike.
    """
    gen = torch.Generator().manual_seed(11)
    for support in (1, 3, 10, 40):
        p = warp(torch.randn(25, 40, generator=gen) * 2, SamplingParams(temperature=1.0))  # [25, V]
        q = sparsify(warp(torch.randn(25, 40, generator=gen) * 3, SamplingParams(temperature=1.0)), support)
        accepted = torch.minimum(p, q.densify(40))  # [25, V]
        committed = accepted + (1 - accepted.sum(-1, keepdim=True)) * residual(p, q)
        assert torch.allclose(committed, p, atol=1e-6)


def test_a_drafts_uniforms_are_keyed_by_position_and_independent_across_drafts_and_seeds():
    """workers/seeds.py: a pure function of (seed, draft, position), uniform on [0, 1)."""
    from specserve.workers.seeds import DraftDraws

    draws = DraftDraws(7, "sql")
    us = [draws.uniform(n) for n in range(20_000)]
    assert us[:50] == [DraftDraws(7, "sql").uniform(n) for n in range(50)]  # the same wherever drafted
    assert all(0.0 <= u < 1.0 for u in us)
    # Uniform: mean and variance within 5 standard errors of 1/2 and 1/12, and every tenth filled.
    n, mean = len(us), sum(us) / len(us)
    assert abs(mean - 0.5) < 5 * (1 / 12 / n) ** 0.5
    assert abs(sum((u - mean) ** 2 for u in us) / n - 1 / 12) < 5 * (1 / 180 / n) ** 0.5
    assert min(sum(int(u * 10) == d for u in us) for d in range(10)) > n / 10 * 0.9
    # Independent of the next position, another draft and another seed: correlations near 0.
    def corr(a, b):
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        cov = sum((x - ma) * (y - mb) for x, y in zip(a, b)) / len(a)
        return cov / (sum((x - ma) ** 2 for x in a) / len(a) * sum((y - mb) ** 2 for y in b) / len(b)) ** 0.5
    for other in (us[1:] + us[:1], [DraftDraws(7, "math").uniform(i) for i in range(n)],
                  [DraftDraws(8, "sql").uniform(i) for i in range(n)]):
        assert abs(corr(us, other)) < 5 / n ** 0.5
