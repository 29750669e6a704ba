"""Rollback after a rejection is bookkeeping, and leaves the cache exactly as a fresh prefill would."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specserve.workers.kv_cache import CachedLM


def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=1024)).eval()


def test_logits_after_rollback_equal_a_fresh_prefill():
    m = model()
    prompt, proposal, next_token = [1, 5, 9, 14, 2], [33, 34, 35, 36, 37], 60
    lm = CachedLM(m)
    lm.extend(prompt)
    lm.extend(proposal, logits_wanted=len(proposal))  # verify 5 drafts
    lm.rollback(len(prompt) + 2)  # the third draft was rejected
    after = lm.extend([next_token])
    fresh = CachedLM(m).extend(prompt + proposal[:2] + [next_token])
    assert lm.length == len(prompt) + 3 == lm.cache.get_seq_length()
    assert torch.allclose(after, fresh, atol=1e-5)


def test_rollback_truncates_a_view_without_copying():
    lm = CachedLM(model())
    lm.extend(list(range(1, 21)))
    keys_before = lm.cache.layers[0].keys
    lm.rollback(12)
    keys_after = lm.cache.layers[0].keys
    assert keys_after.shape[-2] == 12 and lm.length == 12
    # Same storage, same start: a length change, not an allocation and copy.
    assert keys_after.data_ptr() == keys_before.data_ptr()
    assert keys_after.untyped_storage().data_ptr() == keys_before.untyped_storage().data_ptr()


def test_rollback_beyond_length_is_a_no_op():
    lm = CachedLM(model())
    lm.extend([1, 2, 3])
    lm.rollback(10)
    assert lm.length == 3 == lm.cache.get_seq_length()


def test_appending_writes_into_the_buffer_without_reallocating():
    lm = CachedLM(model())
    lm.extend([1, 2, 3, 4])
    storage = lm.cache.layers[0].keys.untyped_storage().data_ptr()
    for token in range(5, 40):  # one decode step at a time, with rollbacks between
        lm.extend([token, token + 1], logits_wanted=2)
        lm.rollback(lm.length - 1)
    assert lm.cache.layers[0].keys.untyped_storage().data_ptr() == storage
    assert lm.length == lm.cache.get_seq_length() == 39


def test_growing_past_capacity_with_rollbacks_matches_a_fresh_prefill():
    """Steps of 1-5 tokens with random rejections, across several doublings of the buffer."""
    m = model()
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 97, (700,), generator=gen).tolist()
    lm, committed = CachedLM(m), 1
    lm.extend(tokens[:1])
    while committed < 600:  # > 2 doublings of the initial 256 positions
        n = int(torch.randint(1, 6, (1,), generator=gen))
        lm.extend(tokens[committed : committed + n], logits_wanted=n)
        kept = int(torch.randint(0, n + 1, (1,), generator=gen))
        lm.rollback(committed + kept)
        committed += kept
    after = lm.extend(tokens[committed : committed + 1])
    assert torch.allclose(after, CachedLM(m).extend(tokens[: committed + 1]), atol=1e-5)
    assert lm.length == lm.cache.get_seq_length() == committed + 1


def test_resync_rewinds_a_lookahead_to_what_the_verdict_kept():
    """A lookahead commits a whole proposal and drafts on; a verdict that kept less rewinds it, and
    the logits then equal a fresh prefill of what stands."""
    import pytest

    from specserve.workers.kv_cache import SequenceCache

    m = model()
    prompt, proposal = [1, 5, 9], [20, 21, 22, 23]
    seq = SequenceCache(m, prompt)
    seq.catch_up(proposal[:-1])  # the draft fed its own proposal while drafting it
    seq.resync(proposal, keep=len(prompt) + 4, append=[])  # lookahead: assume all 4 accepted
    seq.catch_up([40, 41])  # and draft two more
    seq.resync([40, 41], keep=len(prompt) + 1, append=[50])  # the verdict: 1 accepted, then 50
    assert seq.committed == prompt + [20, 50]
    assert torch.allclose(seq.catch_up(), CachedLM(m).extend(prompt + [20, 50]), atol=1e-5)
    with pytest.raises(ValueError, match="keep must be 1..7"):
        seq.resync([60, 61], keep=8, append=[])
