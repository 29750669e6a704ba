"""Acceptance math for speculative decoding: pure tensor code, no models, no Ray, no gRPC.

Glossary (Leviathan et al. 2023; Chen et al. 2023)
- target distribution ``p``: the target's next-token distribution after the request's temperature,
  top-k and top-p, exactly what target-only decoding samples from (``warp``).
- draft distribution ``q``: the distribution the draft actually sampled its token from. The draft
  samples from its own truncated distribution, so ``q`` is sparse and exact: ``SparseDist``.
- accepted tokens: the longest prefix of draft tokens ``x_i`` passing ``u_i * q(x_i) < p(x_i)``,
  i.e. accepted with probability ``min(1, p(x_i) / q(x_i))``.
- recovered token: at the first rejected position, a sample from ``norm(max(0, p - q))``.
- bonus token: when all k drafts are accepted, a sample from ``p`` at position k.
Every verify step therefore commits ``num_accepted + 1`` tokens, and the committed sequence has the
target's distribution whatever the draft proposed.

Randomness is explicit: every sample is an inverse-CDF draw from a uniform the caller takes from the
request's own ``torch.Generator``, so the plain reference implementation
(``tests/acceptance_reference.py``) can be fed the same uniforms and must make the same decisions.
``verify_batch`` applies the rule to a batch of proposals at once; ``verify``, the serving path,
is its batch of one, and the distribution tests draw many thousands in one call.
Greedy decoding (temperature 0) is the one-hot case of the same rule; ``verify_greedy`` is its
shortcut that never materialises a vocabulary-sized distribution.

Token trees (SpecInfer): a proposal may be a tree, several candidates per position from several
proposers, verified in one target pass. ``verify_tree`` walks it from the root: at each node its
children are tried in order by recursive rejection (each child x_i, drawn from its own q_i, is
accepted with probability min(1, r(x_i) / q_i(x_i)), and on rejection r becomes norm(max(0, r - q_i)),
r starting as p); the first accepted child is the next node, and when none is, the final token is
drawn from what r has become. Each stage is the one-candidate rule against the current r, so the
committed token has exactly p's distribution whatever the candidates were, as long as each was drawn
from its q independently of the others (deterministic candidates, one-hot q, always are).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .sampling import SamplingParams

@dataclass(frozen=True)
class SparseDist:
    """Rows of a sparse distribution: ``probs[..., j]`` is the probability of token ``ids[..., j]``.

    Padding entries carry probability 0 (their id is irrelevant). Rows sum to 1.
    """

    ids: torch.Tensor  # [..., m] int64: [k, m] for one proposal, [B, k, m] for a batch of them
    probs: torch.Tensor  # [..., m] float32

    def densify(self, vocab_size: int) -> torch.Tensor:
        dense = self.probs.new_zeros(*self.ids.shape[:-1], vocab_size)
        return dense.scatter_add_(-1, self.ids, self.probs)  # [..., V]


@dataclass(frozen=True)
class Outcome:
    """The verdict of one verify step: ``num_accepted`` draft tokens kept, then ``token``."""

    num_accepted: int
    token: int  # the recovered token, or the bonus token when every draft was accepted
    path: tuple[int, ...] = ()  # a token tree's accepted nodes, root first (a chain: its first num_accepted)


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target-side next-token probabilities after temperature, top-k, top-p (in that order).

    logits: [n, V]. Returns [n, V] float32 rows summing to 1; one-hot argmax rows when greedy.
    """
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]  # [n, 1]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        probs = _nucleus(probs, params.top_p)
    return probs


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [n, V]
    mass_before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly more likely tokens
    keep_sorted = mass_before < top_p  # the first token always has mass_before 0
    keep = torch.zeros_like(keep_sorted).scatter_(1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


def sparsify(probs: torch.Tensor, max_support: int) -> SparseDist:
    """The draft's sampling distribution: ``probs`` truncated to its top ``max_support`` tokens.

    probs: [n, V]. The truncated rows are renormalised, and the draft samples from exactly this
    distribution, so it is also the exact ``q`` the verifier needs: nothing is approximated.
    """
    top = torch.topk(probs, min(max_support, probs.shape[-1]), dim=-1)
    kept = top.values.float()
    return SparseDist(top.indices, kept / kept.sum(-1, keepdim=True))


def one_hot(token_ids: torch.Tensor) -> SparseDist:
    """q of a draft that proposes its argmax: all mass on the proposed token. token_ids: [n]."""
    return SparseDist(token_ids.reshape(-1, 1).long(), torch.ones(token_ids.numel(), 1))


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws, one per row. probs: [..., V] (rows need not sum to 1); u: [...] in [0, 1).

    Returns [...] int64 indices, never one of an entry without mass.
    """
    cdf = probs.double().cumsum(-1)  # [..., V]
    index = torch.searchsorted(cdf, (u.double() * cdf[..., -1]).unsqueeze(-1), right=True).squeeze(-1)
    # Rounding can push u*total up to the total (u within 2^-53 of 1): no index found, and the last
    # entry with mass is the right answer. Rare, so the extra pass over the rows runs only then.
    past_end = index == probs.shape[-1]
    if past_end.any():
        last = torch.where(probs > 0, torch.arange(probs.shape[-1], device=probs.device), -1).amax(-1)
        index = torch.where(past_end, last, index)
    return index


def sample_sparse(q: SparseDist, u: float) -> int:
    """Inverse-CDF draw from a single-row SparseDist (the draft's own sampling step)."""
    return int(q.ids[0, sample(q.probs[0], torch.tensor(u, dtype=torch.float64))])


def residual(p: torch.Tensor, q: SparseDist) -> torch.Tensor:
    """norm(max(0, p - q)) row by row. p: [..., V]; q: [..., m]. Falls back to p where p == q numerically."""
    r = (p - q.densify(p.shape[-1])).clamp_min(0.0)
    total = r.sum(-1, keepdim=True)
    # Rejection is impossible when p == q; a zero residual can only come from rounding.
    return torch.where(total > 1e-12, r / total, p)


def verify_batch(
    p: torch.Tensor,  # [B, k+1, V] target probabilities (warped) at each draft position + bonus
    draft_ids: torch.Tensor,  # [B, k] proposed tokens
    q: SparseDist,  # [B, k, m] distributions the draft tokens were sampled from
    uniforms: torch.Tensor,  # [B, k+1] uniforms in [0, 1): k acceptance tests + the final draw
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling over B independent proposals of k tokens each, vectorised.

    Returns (num_accepted [B], token [B]): the accepted prefix lengths, then the recovered or bonus tokens.
    """
    B, k = draft_ids.shape
    if p.shape[:2] != (B, k + 1) or q.ids.shape[:2] != (B, k) or uniforms.shape != (B, k + 1):
        raise ValueError(f"shape mismatch: p {tuple(p.shape)}, draft_ids {tuple(draft_ids.shape)}, "
                         f"q {tuple(q.ids.shape)}, uniforms {tuple(uniforms.shape)}; want [B, k+1, V], "
                         f"[B, k], [B, k, m], [B, k+1]")
    p_x = p[:, :k].gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)  # [B, k]
    q_x = (q.probs * (q.ids == draft_ids.unsqueeze(-1))).sum(-1)  # [B, k]
    accepted = uniforms[:, :k] * q_x < p_x  # [B, k]; never accepts a token p gives no mass
    n = accepted.long().cumprod(-1).sum(-1)  # [B]
    # The final draw: from the residual at the first rejection, or from p when n == k (the bonus).
    rows, pad = torch.arange(B), (0, 0, 0, 1)  # q gets a position k without mass: nothing was proposed there
    p_n = p[rows, n]  # [B, V]
    q_n = SparseDist(F.pad(q.ids, pad)[rows, n], F.pad(q.probs, pad)[rows, n])  # [B, m]
    final = torch.where((n < k).unsqueeze(-1), residual(p_n, q_n), p_n)  # [B, V]
    return n, sample(final, uniforms[:, k])


def verify(
    p: torch.Tensor,  # [k+1, V] target probabilities (warped) at each draft position + bonus
    draft_ids: torch.Tensor,  # [k] proposed tokens
    q: SparseDist,  # [k, m] distributions the draft tokens were sampled from
    uniforms: torch.Tensor,  # [k+1] uniforms in [0, 1): k acceptance tests + the final draw
) -> Outcome:
    """One request's verify step: ``verify_batch`` over a batch of one."""
    n, token = verify_batch(p[None], draft_ids[None], SparseDist(q.ids[None], q.probs[None]), uniforms[None])
    return Outcome(int(n[0]), int(token[0]))


def verify_greedy(target_argmax: torch.Tensor, draft_ids: torch.Tensor) -> Outcome:
    """Greedy verification: keep drafts while they equal the target's argmax.

    target_argmax: [k+1] argmax of the target logits at each position; draft_ids: [k].
    """
    k = draft_ids.shape[0]
    mismatch = (target_argmax[:k] != draft_ids).nonzero()
    n = int(mismatch[0]) if mismatch.numel() else k
    return Outcome(n, int(target_argmax[n]))


@dataclass(frozen=True)
class TreeVerdict:
    """Outcome of verifying a token tree: the accepted nodes from the root down, then ``token``."""

    path: tuple[int, ...]  # node indices, each the previous one's child
    token: int  # the recovered token, or the bonus token after a leaf


def children_of(parents: Sequence[int]) -> dict[int, list[int]]:
    """Each node's children in proposal order; -1 is the root (the last committed token).
    A parent must come before its children."""
    children: dict[int, list[int]] = {-1: []}
    for node, parent in enumerate(parents):
        if not -1 <= parent < node:
            raise ValueError(f"node {node}'s parent must be -1 or an earlier node, got {parent}")
        children.setdefault(parent, []).append(node)
        children.setdefault(node, [])
    return children


def verify_tree(
    p: torch.Tensor,  # [T+1, V] target probabilities (warped): row 0 at the root, row 1+i after node i
    tokens: Sequence[int],  # [T] each node's token
    parents: Sequence[int],  # [T] each node's parent node, -1 for the root's children
    q: SparseDist,  # [T, m] the distribution each node's token was drawn from
    uniforms: torch.Tensor,  # [T+1] node i's acceptance test uses uniforms[i]; the final draw uniforms[T]
) -> TreeVerdict:
    """Recursive rejection down the tree (see the module docstring)."""
    T = len(tokens)
    if p.shape[0] != T + 1 or len(parents) != T or q.ids.shape[0] != T or uniforms.shape != (T + 1,):
        raise ValueError(f"shape mismatch: p {tuple(p.shape)}, {len(tokens)} tokens, {len(parents)} parents, "
                         f"q {tuple(q.ids.shape)}, uniforms {tuple(uniforms.shape)}; want [T+1, V], T, T, [T, m], [T+1]")
    children = children_of(parents)
    node, path = -1, []
    while True:
        r = p[node + 1]  # [V]
        for child in children[node]:
            q_child = SparseDist(q.ids[child], q.probs[child])  # [m]
            x = tokens[child]
            q_x = float(q_child.probs[q_child.ids == x].sum())
            if float(uniforms[child]) * q_x < float(r[x]):
                break
            r = residual(r, q_child)
        else:
            return TreeVerdict(tuple(path), int(sample(r, uniforms[T])))
        node = child
        path.append(node)


def verify_tree_greedy(target_argmax: torch.Tensor, tokens: Sequence[int], parents: Sequence[int]) -> TreeVerdict:
    """Greedy: follow the child whose token is the target's argmax, as long as there is one.
    target_argmax: [T+1], row 0 at the root, row 1+i after node i."""
    children = children_of(parents)
    node, path = -1, []
    while True:
        best = int(target_argmax[node + 1])
        node = next((c for c in children[node] if tokens[c] == best), None)
        if node is None:
            return TreeVerdict(tuple(path), best)
        path.append(node)
