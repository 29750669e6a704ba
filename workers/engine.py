"""The in-process speculative decoder: propose, verify, commit, emit.

The same loop runs target-only decoding (an empty proposal each step), so the two paths share the
target's forward pass, its sampling rule and its stop handling, and differ only in the draft.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .acceptance import Verdict
from .drafting import DRAFT_MAX_SUPPORT, DraftSession, Proposal
from .loading import ModelSpec, load_model, load_tokenizer
from .request import GenerationParams
from .stats import SpecStats
from .stopping import Chunk, OutputAssembler
from .tokenizer_check import check_compatible
from .verifying import TargetSession


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: SpecStats
    draft: str | None


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """Prompt ids as the model saw documents in training: starting with BOS when it has one."""
    ids = tokenizer.encode(prompt)
    if tokenizer.bos_token_id is not None and (not ids or ids[0] != tokenizer.bos_token_id):
        ids = [tokenizer.bos_token_id] + ids
    return ids


def request_generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """Independent generators for the verifier's and the draft's draws, both derived from the seed.

    Independence matters for losslessness: the acceptance uniforms must not be correlated with the
    draws that produced the draft tokens.
    """
    draft_seed = int.from_bytes(hashlib.sha256(f"draft:{seed}".encode()).digest()[:8], "little") >> 1
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(draft_seed)


def replacement_seed(seed: int, kind: str, replacement: int) -> int:
    """The seed of a request's ``replacement``-th replacement session on a worker of ``kind``: one
    derived from the request's, never equal to another. A replacement must not replay draws the
    request has already used; a draft reusing its uniforms, say, would draw tokens that depend on
    the ones before them, and q would no longer be the distribution they came from."""
    if not replacement:
        return seed
    return int.from_bytes(hashlib.sha256(f"{kind}:{replacement}:{seed}".encode()).digest()[:8], "little") >> 1


class SpecEngine:
    """A target model, its tokenizer and any number of named drafts, all in this process."""

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        drafts: dict[str, PreTrainedModel],
        draft_max_support: int = DRAFT_MAX_SUPPORT,
    ) -> None:
        self.target = target
        self.tokenizer = tokenizer
        self.drafts = drafts
        self.draft_max_support = draft_max_support  # tokens a sampling draft's q keeps (see drafting.py)
        self.context_window = int(target.config.max_position_embeddings)

    @classmethod
    def load(cls, target: ModelSpec, drafts: dict[str, ModelSpec]) -> SpecEngine:
        """Load models and refuse any draft whose tokenizer is not the target's."""
        tokenizer = load_tokenizer(target.source)
        for name, spec in drafts.items():
            check_compatible(tokenizer, load_tokenizer(spec.source))
        return cls(load_model(target), tokenizer, {name: load_model(spec) for name, spec in drafts.items()})

    def generate(self, prompt: str | list[int], params: GenerationParams, draft: str | None = None) -> Generation:
        prompt_ids = encode_prompt(self.tokenizer, prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids or (isinstance(prompt, str) and not prompt):
            raise ValueError("prompt must not be empty")
        if len(prompt_ids) + params.max_tokens > self.context_window:
            raise ValueError(
                f"prompt is {len(prompt_ids)} tokens and max_tokens is {params.max_tokens}: together they "
                f"exceed the context window of {self.context_window} tokens; shorten the prompt or lower max_tokens"
            )
        if params.speculation and draft not in self.drafts:
            raise ValueError(f"unknown draft {draft!r}; available: {', '.join(sorted(self.drafts))}")
        return Generation(self, prompt_ids, params, draft if params.speculation else None)


class Generation:
    """One request in flight. Iterate for chunks as they are committed; ``complete()`` drains it."""

    def __init__(self, engine: SpecEngine, prompt_ids: list[int], params: GenerationParams, draft: str | None):
        self.params = params
        self.draft = draft
        self.stats = SpecStats(seed=params.resolved_seed())
        verify_gen, draft_gen = request_generators(self.stats.seed)
        self.target = TargetSession(engine.target, prompt_ids, params.sampling, verify_gen)
        self.drafter = (
            DraftSession(engine.drafts[draft], prompt_ids, params.sampling, draft_gen, engine.draft_max_support)
            if draft else None
        )
        self.output = OutputAssembler(engine.tokenizer, params.max_tokens, params.stop)

    def __iter__(self) -> Iterator[Chunk]:
        while not self.output.finish_reason:
            proposal = self._propose()
            verdict = self._verify(proposal)
            tokens = self._commit(proposal, verdict)
            yield self.output.add(tokens)  # emit

    def complete(self) -> Completion:
        for _ in self:
            pass
        out = self.output
        return Completion(out.text, out.token_ids, out.finish_reason or "length", self.stats, self.draft)

    def _propose(self) -> Proposal:
        # k + 1 tokens may be committed per step; never draft past max_tokens.
        k = min(self.params.k, self.output.remaining - 1)
        if not self.drafter or k < 1:
            return Proposal.empty()
        start = time.perf_counter()
        proposal = self.drafter.propose(k)
        self.stats.draft_seconds += time.perf_counter() - start
        self.stats.draft_passes += k
        return proposal

    def _verify(self, proposal: Proposal) -> Verdict:
        start = time.perf_counter()
        verdict = self.target.verify(proposal)
        self.stats.verify_seconds += time.perf_counter() - start
        self.stats.record_step(len(proposal.ids), verdict.num_accepted)
        return verdict

    def _commit(self, proposal: Proposal, verdict: Verdict) -> list[int]:
        if self.drafter:
            self.drafter.commit(proposal, verdict)
        return proposal.ids[: verdict.num_accepted] + [verdict.token]
