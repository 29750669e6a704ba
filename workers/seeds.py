"""A request's randomness: its verifier's generator, its drafts' uniforms, and replacements' seeds.

Pure derivations from the request's seed, so the router (which hands seeds to the workers) needs no
model code to compute them.

A draft's uniforms are keyed by sequence position, not drawn in turn: the token a draft samples at
position n from a given prefix is a function of that prefix and (seed, draft, n) alone. So a
proposal drafted ahead (while the target verifies the one before) is token for token the one the
draft would draft afresh once the verdict comes, and a sampled request's output does not depend on
whether its lookahead hit, or on the router or the in-process engine running it.

Still lossless: the acceptance rule needs each examined draft token drawn from its q with a uniform
independent of everything examined before. A position's uniform is examined at most once: a draft
token at n is examined only in the verify step that commits position n (accepted, or replaced by
the target's token), and positions never uncommit. A draft that ran past the verdict drew tokens no
one examined (rejected earlier in the chain, or a lookahead that missed); drafting those positions
again from the new prefix with the same uniforms uses them for the first time that counts.
"""

from __future__ import annotations

import hashlib

import torch


def _derive(label: str) -> int:
    """A 63-bit seed from ``label``, independent of any other label's."""
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "little") >> 1


def verifier_generator(seed: int) -> torch.Generator:
    """The verifier's acceptance uniforms, drawn in turn: one per examined position and step."""
    return torch.Generator().manual_seed(seed)


_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers whose outputs pass as independent."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class DraftDraws:
    """One draft's uniforms in one request, by sequence position (see the module's note).

    Derived from the seed and the draft's name, so two drafts of one request (a token tree's
    members) draw independently of each other, and of the verifier, whose seed is the request's."""

    def __init__(self, seed: int, draft: str) -> None:
        self.key = _derive(f"draft:{draft}:{seed}")

    def uniform(self, position: int) -> float:
        """U[0, 1) with 53 random bits, for the token at ``position`` (0: the first prompt token)."""
        return (_mix64(self.key ^ _mix64(position)) >> 11) * 2.0 ** -53


def replacement_seed(seed: int, kind: str, replacement: int) -> int:
    """The seed of a request's ``replacement``-th replacement session on a worker of ``kind``: one
    derived from the request's, never equal to another. A replacement must not replay draws the
    request has already used; a draft reusing its uniforms, say, would draw tokens that depend on
    the ones before them, and q would no longer be the distribution they came from."""
    if not replacement:
        return seed
    return _derive(f"{kind}:{replacement}:{seed}")
