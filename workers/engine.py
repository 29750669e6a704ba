"""The in-process speculative decoder: propose, verify, commit, emit.

The same loop runs target-only decoding (an empty proposal each step), so the two paths share the
target's forward pass, its sampling rule and its stop handling, and differ only in the draft. Its
bookkeeping (``decoding.py``) is the router's session's too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .acceptance import Verdict
from .decoding import Completion, Decoding
from .drafting import DRAFT_MAX_SUPPORT, DraftSession, Proposal
from .kv_cache import session_capacity
from .loading import ModelSpec, load_model, load_tokenizer
from .prompt import encode_prompt
from .request import GenerationParams
from .seeds import request_generators
from .ragged_pass import use_pooled_attention
from .stats import SpecStats
from .steps import private_sequence, run_alone
from .stopping import Chunk, OutputAssembler
from .tokenizer_check import check_compatible
from .verifying import TargetSession


class SpecEngine:
    """A target model, its tokenizer and any number of named drafts, all in this process."""

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        drafts: dict[str, PreTrainedModel],
        draft_max_support: int = DRAFT_MAX_SUPPORT,
    ) -> None:
        self.target = use_pooled_attention(target)
        self.tokenizer = tokenizer
        self.drafts = {name: use_pooled_attention(model) for name, model in drafts.items()}
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
        self.decoding = Decoding(engine.tokenizer, prompt_ids, params, params.resolved_seed())
        verify_gen, draft_gen = request_generators(self.decoding.stats.seed)
        capacity = session_capacity(len(prompt_ids), params.max_tokens, engine.context_window)
        self.target_model, self.draft_model = engine.target, engine.drafts.get(draft)
        self.target_pool, sequence = private_sequence(self.target_model, prompt_ids, capacity)
        self.target = TargetSession(sequence, params.sampling, verify_gen)
        self.drafter = None
        if draft:
            self.draft_pool, sequence = private_sequence(self.draft_model, prompt_ids, capacity)
            self.drafter = DraftSession(sequence, params.sampling, draft_gen, engine.draft_max_support)

    @property
    def stats(self) -> SpecStats:
        return self.decoding.stats

    @property
    def output(self) -> OutputAssembler:
        return self.decoding.output

    def __iter__(self) -> Iterator[Chunk]:
        while not self.decoding.finished:
            proposal = self._propose()
            verdict = self._verify(proposal)
            yield self._commit(proposal, verdict)  # emit

    def complete(self) -> Completion:
        for _ in self:
            pass
        return self.decoding.completion(self.draft)

    def _propose(self) -> Proposal:
        k = self.decoding.draft_length(self.params.k)
        if not self.drafter or k < 1:
            return Proposal.empty()
        start = time.perf_counter()
        proposal = run_alone(self.draft_model, self.draft_pool, self.drafter.step(k))
        self.decoding.record_draft(len(proposal.ids), time.perf_counter() - start)
        return proposal

    def _verify(self, proposal: Proposal) -> Verdict:
        start = time.perf_counter()
        verdict = run_alone(self.target_model, self.target_pool, self.target.step(proposal))
        self.decoding.record_verify(len(proposal.ids), verdict.num_accepted, time.perf_counter() - start)
        return verdict

    def _commit(self, proposal: Proposal, verdict: Verdict) -> Chunk:
        if self.drafter:
            self.drafter.commit(proposal, verdict)
        return self.decoding.commit(proposal.ids, verdict.num_accepted, verdict.token)
