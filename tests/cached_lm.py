"""One sequence's KV cache beside its model, with rollback as bookkeeping: the plain reference the
tests check the workers' pooled passes against (tests/test_batching.py, test_token_tree.py,
test_kv_cache.py). Workers keep their sessions' caches in a shared pool instead (workers/kv_pool.py,
workers/ragged_pass.py).

The cache holds a prefix of the session's committed tokens plus, transiently, the tokens of the step
in flight. Each layer's keys and values live in a buffer that grows by doubling; the model sees views
of the first ``length`` positions. Appending writes into the buffer (amortised O(1), where
transformers' ``DynamicLayer`` concatenates, copying the whole cache on every step), and rolling back
after a rejection only moves ``length``: no allocation, no copy (tests/test_kv_cache.py).

Its buffers never grow past the length it was given (``max_length``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

INITIAL_CAPACITY = 256  # positions per layer before the first doubling: most prompts + outputs fit


class PreallocatedLayer(DynamicLayer):
    """A cache layer whose ``keys``/``values`` are views into a doubling buffer of at most
    ``max_length`` positions (None: unbounded)."""

    max_length: int | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer = self._value_buffer = None
        self._length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self._length, self._length + key_states.shape[-2]  # states: [B, H, n, D]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._grow(key_states, value_states, end)
        self._key_buffer[..., start:end, :].copy_(key_states)
        self._value_buffer[..., start:end, :].copy_(value_states)
        self._set_length(end)
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the number of tokens to drop, got {tokens_to_remove}")
        if self.is_initialized and tokens_to_remove:
            self._set_length(max(0, self._length + tokens_to_remove))

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        old = self._key_buffer.shape[-2] if self._key_buffer is not None else 0
        capacity = max(needed, 2 * old, INITIAL_CAPACITY)
        if self.max_length is not None:
            if needed > self.max_length:
                raise ValueError(f"the session needs {needed} positions, past the {self.max_length} it reserved")
            capacity = min(capacity, self.max_length)
        keys = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if self._length:  # the one copy: when capacity doubles, not per step
            keys[..., : self._length, :].copy_(self._key_buffer[..., : self._length, :])
            values[..., : self._length, :].copy_(self._value_buffer[..., : self._length, :])
        self._key_buffer, self._value_buffer = keys, values

    def _set_length(self, length: int) -> None:
        self._length = length
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]


def new_cache(model: PreTrainedModel, max_length: int | None = None) -> DynamicCache:
    """A cache for ``model`` whose full-attention layers are PreallocatedLayers of ``max_length``.

    Other layer kinds (sliding-window, linear-attention, shared-KV layers of hybrid models) keep
    transformers' own implementation, whose crop semantics they depend on.
    """
    cache = DynamicCache(config=model.config)
    cache.layers = [_preallocated(max_length) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _preallocated(max_length: int | None) -> PreallocatedLayer:
    layer = PreallocatedLayer()
    layer.max_length = max_length
    return layer


class CachedLM:
    """A causal LM bound to the KV cache of one sequence."""

    def __init__(self, model: PreTrainedModel, max_length: int | None = None) -> None:
        self.model = model
        self.cache = new_cache(model, max_length)
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
