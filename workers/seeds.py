"""A request's randomness: the seeds of its verifier's and its draft's generators, and of replacements.

Pure derivations from the request's seed, so the router (which hands seeds to the workers) needs no
model code to compute them.
"""

from __future__ import annotations

import hashlib

import torch


def _derive(label: str) -> int:
    """A 63-bit seed from ``label``, independent of any other label's."""
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "little") >> 1


def request_generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """Independent generators for the verifier's and the draft's draws, both derived from the seed.

    Independence matters for losslessness: the acceptance uniforms must not be correlated with the
    draws that produced the draft tokens.
    """
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(_derive(f"draft:{seed}"))


def replacement_seed(seed: int, kind: str, replacement: int) -> int:
    """The seed of a request's ``replacement``-th replacement session on a worker of ``kind``: one
    derived from the request's, never equal to another. A replacement must not replay draws the
    request has already used; a draft reusing its uniforms, say, would draw tokens that depend on
    the ones before them, and q would no longer be the distribution they came from."""
    if not replacement:
        return seed
    return _derive(f"{kind}:{replacement}:{seed}")
