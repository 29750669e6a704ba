"""The zoo's byte-level BPE tokenizer, trained on every task's corpus.

Byte-level means any string encodes (no unknown token), which the service relies on: a client's
prompt may hold any Unicode. One tokenizer serves the target and every draft, as speculative
decoding requires (see ``tokenizer_check``).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
# The conversation format the zoo's served target reads (`/v1/chat/completions`): each turn as its
# role's marker, a line of its own, then its text; the tools first, as JSON, where a request has
# them. The zoo's models were trained on raw text, not on conversations, so a chat's answer is a
# continuation of that text (as good as its completion would be), but a client's first chat call
# works. Plain text, no special tokens: byte-level BPE encodes it as any text.
CHAT_TEMPLATE = ("{%- if tools %}<|tools|>\n{{ tools | tojson }}\n{% endif -%}"
                 "{%- for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor -%}"
                 "{%- if add_generation_prompt %}<|assistant|>\n{% endif -%}")


def train_tokenizer(texts: Iterable[str], vocab_size: int, specials: tuple[str, ...] = (BOS, EOS, PAD)
                    ) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of ``vocab_size`` tokens (special tokens included, at the first ids
    in ``specials``' order) on ``texts``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is unknown
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    # Left padding: batched generation (on-policy data, evaluation) continues every row at its end.
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD, padding_side="left"
    )
