"""A prompt's token ids, as every path (engine, router, bench) encodes them."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """Prompt ids as the model saw documents in training: starting with BOS when it has one."""
    ids = tokenizer.encode(prompt)
    if tokenizer.bos_token_id is not None and (not ids or ids[0] != tokenizer.bos_token_id):
        ids = [tokenizer.bos_token_id] + ids
    return ids
