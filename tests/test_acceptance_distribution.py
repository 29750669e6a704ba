"""The acceptance rule's output distribution, on synthetic targets and drafts: no model, no engine.

A synthetic model is a table of next-token distributions after every prefix of up to k tokens over
a vocabulary of a few tokens, so the target's distribution over sequences of k + 1 tokens is known
exactly. Each case draws N proposals of k tokens from the draft's table with the serving sampler,
verifies all N in one ``verify_batch`` call, and completes each committed prefix to k + 1 tokens
by target-only sampling (what the following steps do; they are lossless by induction). A lossless
rule leaves those sequences distributed exactly as the target's. Checked per case:
- the joint distribution of the k + 1 tokens, the first committed token's (accepted or recovered)
  and the bonus token's, each by total variation and chi-square (``assert_distributed_as``);
- the first draft's acceptance rate against its exact value ``sum_t min(p(t), q(t))`` (Hoeffding);
- the batch's first rows against the plain reference implementation (same uniforms, same verdicts).
Two deliberately broken uses of the rule must fail the same checks, so the tolerances have teeth.
Fixed seeds make every test deterministic; the tolerances say how far a correct sampler could drift.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from scipy.stats import chisquare

from specserve.workers.acceptance import SparseDist, Outcome, sample, sparsify, verify_batch, warp
from specserve.workers.sampling import SamplingParams
from acceptance_reference import verify_reference

DRAWS = 200_000  # proposals per case, all verified in one call
# A correct sampler exceeds the total-variation bound with probability at most DELTA and fails the
# chi-square test with probability at most CHI_SQUARE_LEVEL: over the 53 such checks below, 0.5%.
DELTA = 1e-6
CHI_SQUARE_LEVEL = 1e-4
REFERENCE_ROWS = 300  # rows of each batch replayed through the plain reference implementation


# Statistics ------------------------------------------------------------------------------------


def tv_bound(probs: torch.Tensor, n: int) -> float:
    """How far a correct sampler's empirical distribution may lie from ``probs`` in total variation.

    E|freq_j - p_j| <= sd = sqrt(p_j (1 - p_j) / n), so E[TV] <= 0.5 sum_j sqrt(p_j (1 - p_j) / n)
    (<= 0.5 sqrt(M / n) for M outcomes, by Cauchy-Schwarz). TV moves by at most 1/n when one draw
    changes, so McDiarmid adds sqrt(ln(1/DELTA) / (2n)) at probability DELTA. For independent draws
    from unequal distributions the variances only shrink (concavity), so ``probs`` may be their mean.
    """
    probs = probs.double()
    expected_tv = 0.5 * float((probs * (1 - probs) / n).sqrt().sum())
    return expected_tv + math.sqrt(math.log(1 / DELTA) / (2 * n))


def distribution_gap(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float, float]:
    """(TV, its bound, chi-square p-value) of outcome counts [M] against probabilities [M]."""
    n = int(counts.sum())
    probs = probs.double() / probs.double().sum()
    tv = 0.5 * float((counts.double() / n - probs).abs().sum())
    observed, expected = _pool(counts.double(), probs * n)
    # One bin left: a single possible outcome, fully checked by the zero-probability draws.
    pvalue = float(chisquare(observed, expected).pvalue) if len(observed) > 1 else 1.0
    return tv, tv_bound(probs, n), pvalue


def assert_distributed_as(counts: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    """counts: [M] draws of each outcome; probs: [M] the exact distribution they should follow."""
    impossible = int(counts[probs == 0].sum())
    assert impossible == 0, f"{what}: {impossible} draws of outcomes with probability 0"
    tv, bound, pvalue = distribution_gap(counts, probs)
    assert tv < bound, f"{what}: TV {tv:.4f} exceeds {bound:.4f}"
    assert pvalue > CHI_SQUARE_LEVEL, f"{what}: chi-square p-value {pvalue:.2e}"


def _pool(observed: torch.Tensor, expected: torch.Tensor, minimum: float = 5.0):
    """Merge outcomes with expected counts under ``minimum`` into one bin, so chi-square is valid."""
    small = expected < minimum
    if expected[small].sum() > 0:
        observed = torch.cat([observed[~small], observed[small].sum().reshape(1)])
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    else:  # only outcomes with probability 0, which were never drawn
        observed, expected = observed[~small], expected[~small]
    return observed.numpy(), (expected * observed.sum() / expected.sum()).numpy()  # equal totals


# Synthetic models ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """A synthetic target and draft over one vocabulary of V tokens, for proposals of k tokens.

    Level i holds the next-token distributions after every prefix of i tokens, the prefix
    t_0 .. t_{i-1} at row sum_j t_j V^(i-1-j).
    """

    p: tuple[torch.Tensor, ...]  # k+1 levels, level i [V^i, V]
    q: tuple[SparseDist, ...]  # k levels, level i [V^i, m]

    @property
    def vocab(self) -> int:
        return self.p[0].shape[-1]

    @property
    def k(self) -> int:
        return len(self.q)


LOGIT_SCALE = 1.0  # target logits ~ N(0, 1): with temperatures 0.5..1.3, rows from flat to peaked
DRAFT_NOISE = 1.0  # draft logits = target logits + N(0, 1): a related, imperfect draft


def logits_tree(gen, vocab: int, depth: int) -> list[torch.Tensor]:
    """Random logits after every prefix of 0..depth-1 tokens: level i [V^i, V]."""
    return [torch.randn(vocab**i, vocab, generator=gen) * LOGIT_SCALE for i in range(depth)]


def warped(logits: torch.Tensor, params: SamplingParams, allowed: slice = slice(None)) -> torch.Tensor:
    """warp() as a request's params would, with no mass outside the ``allowed`` tokens."""
    outside = torch.ones(logits.shape[-1], dtype=torch.bool)
    outside[allowed] = False
    return warp(logits.masked_fill(outside, -math.inf), params)


def noisy_draft(vocab: int, k: int, params: SamplingParams, support: int,
                target_tokens: slice = slice(None), draft_tokens: slice = slice(None)) -> Callable:
    """A target and a draft that sees its logits through noise, warps them with the request's
    params and samples from the top ``support`` tokens, as serving drafts do (``sparsify``)."""

    def build(gen) -> Pair:
        logits = logits_tree(gen, vocab, k + 1)
        p = [warped(level, params, target_tokens) for level in logits]
        q = [warped(level + DRAFT_NOISE * torch.randn(level.shape, generator=gen), params, draft_tokens)
             for level in logits[:k]]
        return Pair(tuple(p), tuple(sparsify(level, support) for level in q))

    return build


def grammar_masked(vocab: int, k: int, params: SamplingParams, support: int, mask_q: bool) -> Callable:
    """Structured output (workers/grammar.py): after every prefix a grammar allows its own random
    subset of the tokens (at least one); the target's p is masked to it and renormalised, and the
    draft's q is masked too (``mask_q``: a draft that follows the grammar) or not (one that does
    not: its forbidden tokens must then be rejected, with the residual drawn within the mask)."""

    def build(gen) -> Pair:
        logits = logits_tree(gen, vocab, k + 1)
        allowed = [torch.rand(level.shape, generator=gen) < 0.5 for level in logits]
        for level in allowed:  # a grammar that can continue: some token allowed in every row
            level[torch.arange(len(level)), torch.randint(vocab, (len(level),), generator=gen)] = True
        p = [warp(level.masked_fill(~mask, -math.inf), params) for level, mask in zip(logits, allowed)]
        q = []
        for level, mask in zip(logits[:k], allowed):
            noisy = level + DRAFT_NOISE * torch.randn(level.shape, generator=gen)
            q.append(warp(noisy.masked_fill(~mask, -math.inf) if mask_q else noisy, params))
        return Pair(tuple(p), tuple(sparsify(level, support) for level in q))

    return build


def same_as_target(vocab: int, k: int, params: SamplingParams) -> Callable:
    """A draft whose q is the target's p, bit for bit."""

    def build(gen) -> Pair:
        p = [warp(level, params) for level in logits_tree(gen, vocab, k + 1)]
        return Pair(tuple(p), tuple(SparseDist(torch.arange(vocab).expand_as(level), level) for level in p[:k]))

    return build


def sequence_probs(pair: Pair) -> torch.Tensor:
    """Exact target-only probability of every sequence of k+1 tokens, indexed by its code: [V^(k+1)]."""
    probs = torch.ones(1, dtype=torch.float64)
    for level in pair.p:
        level = level.double() / level.double().sum(-1, keepdim=True)  # what inverse-CDF draws follow
        probs = (probs[:, None] * level).reshape(-1)
    return probs


def codes(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Row of each prefix in its level: tokens [N, i] -> [N]."""
    powers = vocab ** torch.arange(tokens.shape[1] - 1, -1, -1)  # [i]
    return (tokens * powers).sum(-1)


# One speculative step, batched -----------------------------------------------------------------


def propose(pair: Pair, uniforms: torch.Tensor) -> tuple[torch.Tensor, SparseDist]:
    """Every row drafts k tokens, each from q after its own prefix (the draft's inverse-CDF
    sampler, ``sample_sparse``, batched). uniforms: [N, k]. Returns draft ids [N, k] and q [N, k, m]."""
    draft = torch.zeros(uniforms.shape, dtype=torch.long)
    ids, probs = [], []
    for i, level in enumerate(pair.q):
        row = codes(draft[:, :i], pair.vocab)
        ids.append(level.ids[row])  # [N, m]
        probs.append(level.probs[row])  # [N, m]
        draft[:, i] = ids[-1].gather(-1, sample(probs[-1], uniforms[:, i]).unsqueeze(-1)).squeeze(-1)
    return draft, SparseDist(torch.stack(ids, 1), torch.stack(probs, 1))


def target_rows(pair: Pair, draft: torch.Tensor) -> torch.Tensor:
    """p after each prefix of each proposal, as the target's one pass over it gives: [N, k+1, V]."""
    return torch.stack([level[codes(draft[:, :i], pair.vocab)] for i, level in enumerate(pair.p)], 1)


def complete(pair: Pair, draft: torch.Tensor, num_accepted: torch.Tensor, token: torch.Tensor,
             uniforms: torch.Tensor) -> torch.Tensor:
    """The step's committed tokens (accepted drafts, then the recovered or bonus token), then
    target-only draws up to k+1 tokens. uniforms: [N, k+1], one per position. Returns [N, k+1]."""
    n = draft.shape[0]
    sequences = torch.cat([draft, draft.new_zeros(n, 1)], 1)
    sequences[torch.arange(n), num_accepted] = token
    for i, level in enumerate(pair.p):
        after_step = i > num_accepted  # [N]
        target_only = sample(level[codes(sequences[:, :i], pair.vocab)], uniforms[:, i])
        sequences[:, i] = torch.where(after_step, target_only, sequences[:, i])
    return sequences


@dataclass(frozen=True)
class Trial:
    pair: Pair
    p: torch.Tensor  # [N, k+1, V]
    draft: torch.Tensor  # [N, k]
    q: SparseDist  # [N, k, m]
    uniforms: torch.Tensor  # [N, k+1] the verify step's
    num_accepted: torch.Tensor  # [N]
    token: torch.Tensor  # [N] recovered or bonus
    sequences: torch.Tensor  # [N, k+1] committed, then completed by the target alone


# (case id, builder): the target's sampling params, k and the draft's truncation vary together.
T1 = SamplingParams(temperature=1.0)
CASES = {
    "k1-t1-dense-q": noisy_draft(12, 1, T1, support=12),
    "k1-t1-q-top1": noisy_draft(12, 1, T1, support=1),
    "k1-t1-q-top3": noisy_draft(12, 1, T1, support=3),
    "k1-q-equals-p": same_as_target(12, 1, T1),
    "k1-q-disjoint-from-p": noisy_draft(12, 1, T1, 12, target_tokens=slice(0, 6), draft_tokens=slice(6, 12)),
    "k1-p-top3-dense-q": noisy_draft(12, 1, SamplingParams(temperature=1.0, top_k=3), support=12),
    "k1-t0.7-topk5-q-top4": noisy_draft(12, 1, SamplingParams(temperature=0.7, top_k=5), support=4),
    "k1-t1.3-topp0.8-q-top4": noisy_draft(12, 1, SamplingParams(temperature=1.3, top_p=0.8), support=4),
    "k1-t0.5-topk7-topp0.9-q-top4": noisy_draft(12, 1, SamplingParams(temperature=0.5, top_k=7, top_p=0.9), 4),
    "k2-t1-topp0.9": noisy_draft(4, 2, SamplingParams(temperature=1.0, top_p=0.9), support=4),
    "k3-t0.7-topk3-q-top2": noisy_draft(4, 3, SamplingParams(temperature=0.7, top_k=3), support=2),
    "k3-q-equals-p": same_as_target(4, 3, T1),
    "k4-t1.3-topk3-topp0.9-q-top3": noisy_draft(4, 4, SamplingParams(temperature=1.3, top_k=3, top_p=0.9), 3),
    "k8-t0.8-q-top1": noisy_draft(2, 8, SamplingParams(temperature=0.8), support=1),
    # An EAGLE-3 head's q: no mass outside its reduced vocabulary (workers/heads/), the target's p
    # over every token; its truncation may reach past the vocabulary into zero-mass tokens.
    "k1-t1-q-reduced-vocab": noisy_draft(12, 1, T1, support=12, draft_tokens=slice(0, 8)),
    "k3-t0.7-q-reduced-vocab-top2": noisy_draft(4, 3, SamplingParams(temperature=0.7), support=2,
                                                draft_tokens=slice(0, 3)),
    # A grammar's mask, its own after every prefix, on p and q alike, or on p alone.
    "k3-t1-grammar-masks-p-and-q": grammar_masked(4, 3, T1, support=4, mask_q=True),
    "k3-t0.8-topp0.9-grammar-masks-p-only": grammar_masked(4, 3, SamplingParams(temperature=0.8, top_p=0.9),
                                                           support=4, mask_q=False),
}


@functools.cache
def trial(case: str) -> Trial:
    gen = torch.Generator().manual_seed(0)  # cases of one vocabulary and k share the target's logits
    pair = CASES[case](gen)
    draft, q = propose(pair, torch.rand(DRAWS, pair.k, generator=gen))
    p = target_rows(pair, draft)
    uniforms = torch.rand(DRAWS, pair.k + 1, generator=gen)
    num_accepted, token = verify_batch(p, draft, q, uniforms)
    sequences = complete(pair, draft, num_accepted, token, torch.rand(DRAWS, pair.k + 1, generator=gen))
    return Trial(pair, p, draft, q, uniforms, num_accepted, token, sequences)


@pytest.fixture(scope="module", autouse=True)
def _forget_trials():
    yield
    trial.cache_clear()  # some hundreds of MB


# Tests -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_committed_sequences_have_the_target_distribution(case):
    t = trial(case)
    outcomes = t.pair.vocab ** (t.pair.k + 1)
    counts = torch.bincount(codes(t.sequences, t.pair.vocab), minlength=outcomes)
    assert_distributed_as(counts, sequence_probs(t.pair), "sequences of k+1 tokens")


@pytest.mark.parametrize("case", CASES)
def test_first_committed_token_has_the_target_distribution(case):
    """Position 0 is the accepted first draft or the token recovered from the residual there."""
    t = trial(case)
    assert_distributed_as(torch.bincount(t.sequences[:, 0], minlength=t.pair.vocab), t.pair.p[0][0],
                          "first committed token")


@pytest.mark.parametrize("case", CASES)
def test_bonus_token_has_the_target_distribution(case):
    """Given that every draft was accepted, the bonus token follows p after the whole proposal."""
    t = trial(case)
    all_accepted = t.num_accepted == t.pair.k
    if not all_accepted.any():
        pytest.skip("no proposal was accepted whole (the disjoint draft)")
    expected = t.p[all_accepted, t.pair.k].double().sum(0)  # [V] each bonus draw's p, summed
    assert_distributed_as(torch.bincount(t.token[all_accepted], minlength=t.pair.vocab), expected, "bonus token")


@pytest.mark.parametrize("case", CASES)
def test_first_draft_acceptance_rate(case):
    """P(accept x_0) = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x)), within Hoeffding's
    sqrt(ln(2/DELTA) / (2N))."""
    t = trial(case)
    p0, q0 = t.pair.p[0][0].double(), t.pair.q[0].densify(t.pair.vocab)[0].double()
    exact = float(torch.minimum(p0, q0).sum())
    rate = float((t.num_accepted > 0).double().mean())
    assert abs(rate - exact) < math.sqrt(math.log(2 / DELTA) / (2 * DRAWS)), f"rate {rate:.4f}, exact {exact:.4f}"


@pytest.mark.parametrize("case", CASES)
def test_batch_verdicts_match_reference(case):
    t = trial(case)
    for r in range(REFERENCE_ROWS):
        q = [dict(zip(t.q.ids[r, i].tolist(), t.q.probs[r, i].tolist())) for i in range(t.pair.k)]
        expected = verify_reference(t.p[r].double().tolist(), t.draft[r].tolist(), q, t.uniforms[r].tolist())
        assert Outcome(int(t.num_accepted[r]), int(t.token[r])) == expected, f"row {r}"


def test_draft_equal_to_target_accepts_every_draft():
    # u * q(x) < p(x) = q(x) for every u < 1: no rejection, not even by rounding.
    assert bool((trial("k3-q-equals-p").num_accepted == 3).all())
    assert bool((trial("k1-q-equals-p").num_accepted == 1).all())


def test_draft_disjoint_from_target_accepts_nothing():
    # p(x) = 0 for every draft token, so u * q(x) < p(x) never holds: every token is recovered.
    assert bool((trial("k1-q-disjoint-from-p").num_accepted == 0).all())


def test_cases_both_accept_and_reject():
    """Most cases must exercise both branches, or their distribution checks prove little."""
    for case in CASES:
        if "equals" not in case and "disjoint" not in case:
            rates = trial(case).num_accepted.double().mean() / trial(case).pair.k
            assert 0.05 < float(rates) < 0.95, f"{case}: mean acceptance {float(rates):.3f}"


# The checks have teeth ---------------------------------------------------------------------------


def test_a_draft_misreporting_q_is_caught():
    """The draft samples from its top 2 tokens but tells the verifier its untruncated q: the rule then
    over-accepts those two tokens (as if q(x) were smaller) and the first token drifts from p."""
    vocab = 12
    pair = noisy_draft(vocab, 1, T1, support=2)(torch.Generator().manual_seed(100))
    told = noisy_draft(vocab, 1, T1, support=vocab)(torch.Generator().manual_seed(100)).q[0]  # same draft, [1, V]
    gen = torch.Generator().manual_seed(101)
    draft, _ = propose(pair, torch.rand(DRAWS, 1, generator=gen))
    q_told = SparseDist(told.ids.expand(DRAWS, 1, vocab), told.probs.expand(DRAWS, 1, vocab))  # [N, 1, V]
    num_accepted, token = verify_batch(target_rows(pair, draft), draft, q_told, torch.rand(DRAWS, 2, generator=gen))
    first = torch.where(num_accepted > 0, draft[:, 0], token)
    tv, bound, pvalue = distribution_gap(torch.bincount(first, minlength=vocab), pair.p[0][0])
    assert tv > bound and pvalue < CHI_SQUARE_LEVEL, (tv, bound, pvalue)


def test_acceptance_uniforms_reused_from_the_draft_are_caught():
    """The uniform that drew x is reused for its acceptance test: a token early in q's order comes
    with a small u and is accepted too often: the verifier's uniforms must be independent of the draft's."""
    pair = CASES["k3-t0.7-topk3-q-top2"](torch.Generator().manual_seed(100))
    gen = torch.Generator().manual_seed(101)
    uniforms = torch.rand(DRAWS, pair.k + 1, generator=gen)
    draft, q = propose(pair, uniforms[:, : pair.k])
    num_accepted, token = verify_batch(target_rows(pair, draft), draft, q, uniforms)
    sequences = complete(pair, draft, num_accepted, token, torch.rand(DRAWS, pair.k + 1, generator=gen))
    counts = torch.bincount(codes(sequences, pair.vocab), minlength=pair.vocab ** (pair.k + 1))
    tv, bound, pvalue = distribution_gap(counts, sequence_probs(pair))
    assert tv > bound and pvalue < CHI_SQUARE_LEVEL, (tv, bound, pvalue)
