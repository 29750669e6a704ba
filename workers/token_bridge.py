"""A draft of another tokenizer: its tokens turned into the target's, losslessly.

Speculative decoding compares token ids, so a draft must propose the target's tokens with the exact
q it drew them from. A draft of another vocabulary (another model family) does that through the
**token-level intersection** (Timor et al., ICML 2025; vLLM's cross-vocabulary drafting): the draft
draws only among its tokens whose bytes are also one target token (its logits masked to them), and
each drawn token is proposed as that target token. q over target ids is then exactly the masked,
warped distribution it drew from, so the rejection rule keeps the target's distribution, sampled as
well as greedy, whatever the draft's quality.

What the draft reads is the request's text: the target's committed tokens decoded and encoded again
with the draft's tokenizer after every verify pass. Only the tail changes (a BPE merges across the
last token or two); the draft keeps the prefix its cache holds and runs the rest.

Why not turn the draft's own drafting into target tokens through text instead (decode its tokens,
encode the text with the target's tokenizer)? The target tokens of a partial text are not the
tokens of the whole (the tail re-merges), and the probability of a target token is a sum over every
draft tokenisation of it: q is not computable exactly, so such proposals could serve greedy
requests only (one-hot q). The intersection keeps an exact q for both, at the cost of proposals the
draft cuts at its tokens' boundaries where the target's tokens are longer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from transformers import PreTrainedTokenizerBase

from .acceptance import SparseDist
from .drafting import DraftTokens
from .loading import load_tokenizer
from .tokenizer_check import TokenizerMismatch, check_compatible

log = logging.getLogger("specserve.workers")

# A draft's cache for a request holds this many of its tokens per target position: a smaller
# vocabulary cuts the same text finer. Past it the request goes on target-only (ProposerGone).
DRAFT_TOKENS_PER_TARGET = 2
# Below this share of the draft's vocabulary in common, a draft proposes little the target can
# accept: a bridge that small is refused with the figures.
MIN_SHARED = 0.05


class BridgeError(ValueError):
    """A draft cannot serve the target across their tokenizers (the message says why)."""


@lru_cache(maxsize=1)
def _byte_level_table() -> dict[str, int]:
    """The GPT-2 byte-level alphabet: the printable character each byte is written as, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def byte_level(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether its tokens are written in the GPT-2 byte alphabet (its decoder is ByteLevel)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    return "ByteLevel" in json.dumps(json.loads(backend.to_str()).get("decoder"))


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> dict[int, bytes | None]:
    """Each id's bytes as it decodes in running text; None where that is not one fixed string (a
    special token: it matches only the same special token of the other side, by its content).
    Decided per tokenizer: a byte-level BPE's (GPT-2, Llama 3, SmolLM2, the zoo) through the byte
    alphabet; otherwise SentencePiece's byte fallback (``<0x0A>``) as its byte, '▁' as a space, and
    any other piece as its UTF-8."""
    special = set(tokenizer.all_special_ids)
    table = _byte_level_table() if byte_level(tokenizer) else None
    out: dict[int, bytes | None] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id in special:
            out[token_id] = None
        elif table is not None and all(ch in table for ch in token):
            out[token_id] = bytes(table[ch] for ch in token)
        elif table is None and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            out[token_id] = bytes([int(token[3:5], 16)])
        else:
            out[token_id] = token.replace("\u2581", " ").encode()
    return out


@dataclass(frozen=True)
class TokenBridge:
    """The intersection of a draft's vocabulary with the target's, and the text between them."""

    target: PreTrainedTokenizerBase = field(repr=False)
    draft: PreTrainedTokenizerBase = field(repr=False)
    to_target: torch.Tensor = field(repr=False)  # [draft vocab] the target id of each draft id; -1 where none
    mask: torch.Tensor = field(repr=False)  # [draft vocab] 0 where shared, -inf elsewhere: added to its logits
    shared: int  # draft tokens in common

    @classmethod
    def between(cls, target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase,
                draft_vocab: int | None = None) -> TokenBridge:
        """``draft_vocab``: the draft model's logit width (often padded past its tokenizer)."""
        by_bytes: dict[bytes, int] = {}
        for target_id, raw in sorted(token_bytes(target).items()):  # two of the same bytes: the lower id
            if raw is not None:
                by_bytes.setdefault(raw, target_id)
        target_special = {tok: i for tok, i in zip(target.all_special_tokens, target.all_special_ids)}
        draft_bytes = token_bytes(draft)
        width = draft_vocab or max(draft_bytes) + 1  # one entry per row of the draft's logits
        to_target = torch.full((width,), -1, dtype=torch.long)
        special = dict(zip(draft.all_special_ids, draft.all_special_tokens))
        for draft_id, raw in draft_bytes.items():
            if draft_id >= width:  # a tokenizer's token the model has no logit for
                continue
            found = target_special.get(special[draft_id]) if raw is None else by_bytes.get(raw)
            if found is not None:
                to_target[draft_id] = found
        shared = int((to_target >= 0).sum())
        if shared < MIN_SHARED * len(draft_bytes):
            raise BridgeError(f"the draft's tokenizer shares {shared} of its {len(draft_bytes)} tokens with the "
                              f"target's ({shared / max(1, len(draft_bytes)):.1%}, under {MIN_SHARED:.0%}): "
                              "it could propose almost nothing the target accepts")
        mask = torch.where(to_target >= 0, 0.0, float("-inf"))
        return cls(target, draft, to_target, mask, shared)

    def describe(self) -> str:
        return (f"another tokenizer: {self.shared} of the draft's {len(self.draft)} tokens are target tokens; "
                "it drafts among those (an exact q) and reads the text re-encoded")

    def encode(self, target_ids: Sequence[int]) -> list[int]:
        """The draft's tokens of the text the target's ``target_ids`` decode to."""
        text = self.target.decode(list(target_ids))
        ids = self.draft.encode(text, add_special_tokens=False)
        return ids or self.draft.encode(" ", add_special_tokens=False)

    def proposal(self, drafted: DraftTokens, committed: Sequence[int] = ()) -> DraftTokens:
        """A proposal of draft ids (drawn under ``mask``) as the target's ids, q unchanged. A
        support entry of no target token has probability 0 and becomes id 0 (it is never drawn).
        ``committed``: the target's ids it follows, which the intersection does not read (a
        conversion through text does: bench/bridge_modes.py)."""
        if not drafted.ids:
            return drafted
        ids = self.to_target[torch.tensor(drafted.ids)]
        if bool((ids < 0).any()):
            raise AssertionError(f"drafted {drafted.ids} outside the shared vocabulary: the mask was not applied")
        support = self.to_target[drafted.q.ids.cpu()].clamp(min=0)
        return DraftTokens(ids.tolist(), SparseDist(support, drafted.q.probs), drafted.parents)


def bridge_if_needed(target: PreTrainedTokenizerBase, source: str, draft_vocab: int, name: str) -> TokenBridge | None:
    """None where the draft at ``source`` speaks the target's tokenizer; else the bridge between
    them, logged with what it shares (BridgeError where they share too little)."""
    draft = load_tokenizer(source)
    try:
        check_compatible(target, draft)
        return None
    except TokenizerMismatch as exc:
        why = str(exc)
    try:
        bridge = TokenBridge.between(target, draft, draft_vocab)
    except BridgeError as exc:
        raise BridgeError(f"draft {name!r} ({source}) has another tokenizer ({why}), and {exc}") from None
    log.info("draft %s has %s", name, bridge.describe())
    return bridge


def bridged_capacity(capacity: int, prompt: int, draft_prompt: int) -> int:
    """The positions a bridged draft's cache takes for a target session of ``capacity`` whose
    prompt of ``prompt`` tokens is ``draft_prompt`` of the draft's: the prompt as it is, and
    DRAFT_TOKENS_PER_TARGET a position for the rest."""
    return draft_prompt + DRAFT_TOKENS_PER_TARGET * max(0, capacity - prompt)
