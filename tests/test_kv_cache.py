"""Rollback after a rejection is bookkeeping, and leaves the cache exactly as a fresh prefill would."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specserve.workers.kv_cache import STEP_ROOM, session_capacity
from specserve.workers.kv_pool import KVShape
from specserve.workers.ragged_pass import use_pooled_attention

from cached_lm import CachedLM


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
    the logits then equal a fresh prefill of what stands (a session's sequence in the KV pool)."""
    import pytest

    from specserve.workers.ragged_pass import run_pass
    from specserve.workers.steps import private_sequence

    m = use_pooled_attention(model())
    prompt, proposal = [1, 5, 9], [20, 21, 22, 23]
    pool, seq = private_sequence(m, prompt, 64)

    def catch_up(extra=()):
        segment = seq.segment(list(extra), len(extra) + 1, room=64)
        logits = run_pass(m, pool, [segment])[0]
        seq.ran(segment)
        return logits

    catch_up(proposal[:-1])  # the draft fed its own proposal while drafting it
    seq.resync(proposal, keep=len(prompt) + 4, append=[])  # lookahead: assume all 4 accepted
    catch_up([40, 41])  # and draft two more
    seq.resync([40, 41], keep=len(prompt) + 1, append=[50])  # the verdict: 1 accepted, then 50
    assert seq.committed == prompt + [20, 50]
    assert torch.allclose(catch_up()[-1:], CachedLM(m).extend(prompt + [20, 50]), atol=1e-5)
    with pytest.raises(ValueError, match="keep must be 1..7"):
        seq.resync([60, 61], keep=8, append=[])
    # A rewind into the cache with nothing appended (a lookahead that drafted past a shorter next
    # proposal): the last kept token runs again, for the logits after it.
    catch_up([70, 71, 72])
    seq.resync([70, 71, 72], keep=len(prompt) + 3, append=[])
    assert seq.segment([], 1, room=64).tokens == [70]
    assert torch.allclose(catch_up()[-1:], CachedLM(m).extend(prompt + [20, 50, 70]), atol=1e-5)


def test_a_session_cache_never_grows_past_its_reserved_length():
    """The bound a worker's KV budget rests on: the buffer stops at max_length (no doubling past
    it), and a sequence longer than that is refused rather than allowed to grow."""
    m = model()
    lm = CachedLM(m, max_length=300)
    lm.extend(list(range(1, 81)) * 2)  # 160 positions: the initial 256
    lm.extend(list(range(1, 81)) + list(range(1, 28)))  # 267: doubling would give 512
    layer = lm.cache.layers[0]
    assert layer._key_buffer.shape[-2] == 300
    buffer_bytes = sum(b.numel() * b.element_size() for l in lm.cache.layers for b in (l._key_buffer, l._value_buffer))
    assert buffer_bytes == 300 * KVShape.of(m).bytes_per_position
    with pytest.raises(ValueError, match="past the 300 it reserved"):
        lm.extend(list(range(1, 40)))


def test_session_capacity_counts_prompt_output_and_the_step_in_flight():
    assert session_capacity(100, 50, 1024) == 150 + STEP_ROOM
    assert session_capacity(100, 0, 1024) == 1024 + STEP_ROOM  # output length unknown: the context window
