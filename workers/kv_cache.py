"""One sequence's KV cache beside its model, with rollback as bookkeeping.

The cache always holds a prefix of the session's committed tokens plus, transiently, the tokens of
the step in flight. Rolling back after a rejection is ``DynamicCache.crop`` with the number of
tokens to drop: a slice of each layer's key/value tensors (a view, no copy), measured in
microseconds by ``tests/test_kv_cache.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel


class CachedLM:
    """A causal LM bound to the KV cache of one sequence."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.length = 0  # tokens whose keys/values are in the cache

    @torch.inference_mode()
    def extend(self, token_ids: Sequence[int], logits_wanted: int = 1) -> torch.Tensor:
        """Run ``token_ids`` after the cached prefix; return logits of the last ``logits_wanted``.

        Returns [logits_wanted, V] float32. Only those rows go through the LM head, so a long
        prefill costs no vocabulary-sized work per prompt token.
        """
        if not token_ids:
            raise ValueError("extend needs at least one token")
        device = self.model.device
        out = self.model(
            input_ids=torch.tensor([list(token_ids)], device=device),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=logits_wanted,
        )
        self.length += len(token_ids)
        return out.logits[0, -logits_wanted:].float().cpu()

    def catch_up(self, committed: Sequence[int], extra: Sequence[int] = ()) -> torch.Tensor:
        """Feed the committed tokens the cache lacks, then ``extra``; logits for every ``extra``
        position plus the one after the last committed token: [len(extra) + 1, V]."""
        pending = list(committed[self.length :]) + list(extra)
        return self.extend(pending, logits_wanted=len(extra) + 1)

    def rollback(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens (a no-op if already shorter)."""
        if length < self.length:
            self.cache.crop(length - self.length)  # crop takes minus the number of tokens to drop
            self.length = length
