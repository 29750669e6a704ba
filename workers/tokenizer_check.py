"""Refuse a draft whose tokenizer is not the target's.

Speculative decoding compares token ids across two models, so the draft must speak exactly the
target's vocabulary: the same token for every id, the same special tokens, the same encoding of text.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

# Texts chosen to exercise what tokenizers disagree on: whitespace runs, code, digits, non-ASCII.
SAMPLE_TEXTS = (
    "def add(a, b):\n    return a + b\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 21 GROUP BY name;",
    "Question: 12 * 7 = 84. The answer is 84.",
    "The quick brown fox jumps over the lazy dog.\n\n  Indented\ttext.",
    "naïve café – “quotes” 日本語 🙂",
)
SPECIAL_TOKEN_ATTRS = ("bos_token", "eos_token", "pad_token", "unk_token")


class TokenizerMismatch(ValueError):
    """The draft's tokenizer differs from the target's."""


def check_compatible(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> None:
    """Raise TokenizerMismatch naming the first difference; return None when they agree."""
    _check_vocab(target, draft)
    for attr in SPECIAL_TOKEN_ATTRS:
        if getattr(target, attr) != getattr(draft, attr):
            raise TokenizerMismatch(
                f"special token {attr} differs: target {getattr(target, attr)!r}, draft {getattr(draft, attr)!r}"
            )
    for text in SAMPLE_TEXTS:
        t_ids, d_ids = target.encode(text), draft.encode(text)
        if t_ids != d_ids:
            at = next((i for i, (a, b) in enumerate(zip(t_ids, d_ids)) if a != b), min(len(t_ids), len(d_ids)))
            raise TokenizerMismatch(
                f"tokenizers encode {text!r} differently from token {at}: "
                f"target {target.convert_ids_to_tokens(t_ids[at:at + 1])}, draft {draft.convert_ids_to_tokens(d_ids[at:at + 1])}"
            )


def _check_vocab(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase) -> None:
    t_vocab, d_vocab = target.get_vocab(), draft.get_vocab()
    t_by_id = {i: tok for tok, i in t_vocab.items()}
    d_by_id = {i: tok for tok, i in d_vocab.items()}
    for token_id in sorted(t_by_id.keys() | d_by_id.keys()):  # added tokens may have sparse ids
        t_tok, d_tok = t_by_id.get(token_id), d_by_id.get(token_id)
        if t_tok != d_tok:
            raise TokenizerMismatch(
                f"vocabularies differ at token id {token_id}: target {t_tok!r}, draft {d_tok!r} "
                f"(target has {len(t_vocab)} tokens, draft {len(d_vocab)}); "
                "a draft must use the target's tokenizer (distill it with `specserve distill`)"
            )
