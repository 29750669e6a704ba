"""Turning committed tokens into client output: incremental text, EOS, stop strings, max_tokens.

Text is decoded incrementally: each new token's text is the difference between decoding a short
window of recent tokens with and without it (vLLM's method), so a step costs the same at token 4000
as at token 4, and the result equals decoding all tokens at once (with a byte-level tokenizer such
as the zoo's; a byte-fallback decoder turns a byte already decoded as a character into U+FFFD when a
later byte makes their run invalid UTF-8, and text already streamed cannot follow). Streamed text is
held back while it could still turn out to be the start of a stop string or of a multi-byte
character, so nothing emitted is ever taken back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from .logprobs import TokenLogprobs

REPLACEMENT_CHAR = "\ufffd"  # what a decoder yields for an unfinished UTF-8 sequence


@dataclass
class Chunk:
    """Output committed by one step: new token ids, new text, and whether the request ended."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "eos", "stop" (a stop string), "length" (max_tokens), "grammar"
    logprobs: TokenLogprobs | None = None  # of token_ids, where the request asks (workers/logprobs.py)

    def followed_by(self, later: Chunk) -> Chunk:
        """This chunk and the next one as one: what the two steps committed, in order."""
        logprobs = (self.logprobs.followed_by(later.logprobs)
                    if self.logprobs is not None and later.logprobs is not None else None)
        return Chunk(self.token_ids + later.token_ids, self.text + later.text, later.finish_reason, logprobs)


class OutputAssembler:
    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, max_tokens: int, stop: tuple[str, ...] = ()
    ) -> None:
        self.max_tokens = max_tokens
        self.stop = stop
        self.eos_token_id = tokenizer.eos_token_id
        # A fast tokenizer's Rust decode, called directly: with clean-up off, transformers' decode
        # returns exactly its text, after type checks and conversions that cost more than it does.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode = ((lambda ids: backend.decode(ids, skip_special_tokens=False)) if backend is not None
                        else (lambda ids: tokenizer.decode(ids, clean_up_tokenization_spaces=False)))
        self.token_ids: list[int] = []
        self.logprobs: TokenLogprobs | None = None  # of token_ids, once a step brought some
        self.text = ""  # all text so far (final once finished); may end in an unfinished character
        self._settled = ""  # the text of token_ids[:_read]: complete characters only
        self._prefix = 0  # token_ids[_prefix:_read] is the context window re-decoded for each new token
        self._read = 0
        self.emitted = 0  # characters of self.text already handed out
        self.finish_reason: str | None = None

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.token_ids)

    def add(self, tokens: list[int], logprobs: TokenLogprobs | None = None, ended: str = "") -> Chunk:
        """Append committed tokens (with their ``logprobs``) up to the first stop condition; return
        what may be emitted. ``ended``: the text ends after them whatever they are, and why (the
        target's word: a grammar that can take no further token)."""
        chunk = Chunk()
        for token in tokens:
            self._add_one(token, chunk)
            if self.finish_reason:
                break
        if ended and not self.finish_reason:
            self.finish_reason = ended
        if logprobs is not None:  # those of the tokens kept (an end of text is no output token)
            chunk.logprobs = logprobs.first(len(chunk.token_ids))
            self.logprobs = chunk.logprobs if self.logprobs is None else self.logprobs.followed_by(chunk.logprobs)
        chunk.finish_reason = self.finish_reason
        stable = len(self.text) if self.finish_reason else self._stable_length()
        chunk.text = self.text[self.emitted : stable]
        self.emitted = max(self.emitted, stable)
        return chunk

    def _add_one(self, token: int, chunk: Chunk) -> None:
        if token == self.eos_token_id:
            self.finish_reason = "eos"
            return
        self.token_ids.append(token)
        chunk.token_ids.append(token)
        searched_from = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        pending = self._decode_tail()  # first: it may move text into _settled
        self.text = self._settled + pending
        hits = [i for s in self.stop if (i := self.text.find(s, searched_from)) >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.finish_reason = "stop"
        elif len(self.token_ids) >= self.max_tokens:
            self.finish_reason = "length"

    # Not `tokenizers.decoders.DecodeStream`, though it runs this same method in Rust: it gives no
    # text for an unfinished character, which the stop-string search and a final text that ends
    # mid-character need, and it raises (InvalidPrefix) once a byte-fallback decoder turns a byte it
    # already decoded into U+FFFD; so this re-decode would have to stay behind it. In front of it, it
    # saved 6-11 us of 12-17 a token, most of it in transformers' decode wrapper (bench/detokenize.py, removed; in git history),
    # which ``_decode`` now skips.
    def _decode_tail(self) -> str:
        """Text of the tokens after ``_read``, decoded in the context of the window before them."""
        window = self._decode(self.token_ids[self._prefix : self._read])
        tail = self._decode(self.token_ids[self._prefix :])[len(window) :]
        if not tail.endswith(REPLACEMENT_CHAR):  # complete: later tokens cannot change it
            self._settled += tail
            self._prefix, self._read = self._read, len(self.token_ids)
            return ""
        return tail

    def _stable_length(self) -> int:
        """Characters safe to emit: not an unfinished character, not a possible stop-string start."""
        end = len(self.text.rstrip(REPLACEMENT_CHAR))
        for s in self.stop:
            for n in range(min(len(s) - 1, end), 0, -1):
                if self.text.endswith(s[:n], 0, end):
                    end = min(end, end - n)
                    break
        return max(end, self.emitted)
